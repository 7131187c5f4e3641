"""launch.convert.assign: each variable of an Estimator checkpoint given its place in the
model, or refused naming the map entry that fixes it (shapes only: no checkpoint needed)."""

import json

import pytest

from launch.convert import assign
from launch.convert.kinds import ConversionError, Kind
from trainers import model as model_lib
from trainers.config import Config

CONFIG = Config(optimizer="adam")


def _estimator_shapes(config: Config, rename=()):
  """An Estimator checkpoint's variables for `config` (Adam): weights, slots, counters, step."""
  shapes = {"global_step": (), "beta1_power": (), "beta2_power": ()}
  for name, shape in model_lib.graph_model(config).shapes.items():
    name = dict(rename).get(name, name)
    shapes.update({name: shape, f"{name}/Adam": shape, f"{name}/Adam_1": shape})
  return shapes


def test_every_variable_of_a_checkpoint_of_the_model_has_its_place():
  entries = assign.classify(_estimator_shapes(CONFIG), CONFIG)
  kinds = {e.name: (e.kind, e.weight, e.slot) for e in entries}
  assert kinds["conv/kernel"] == (Kind.WEIGHT, "conv/kernel", "")
  assert kinds["conv/kernel/Adam_1"] == (Kind.SLOT, "conv/kernel", "Adam_1")
  assert kinds["beta2_power"] == (Kind.COUNTER, None, "beta2_power")
  assert kinds["global_step"][0] == Kind.STEP
  assign.check_complete(entries, "ckpt", CONFIG)
  reset = assign.classify(_estimator_shapes(CONFIG), CONFIG, reset_slots=True)
  assert {e.kind for e in reset if e.slot} == {Kind.IGNORED}


def test_a_renamed_weight_is_refused_with_the_map_that_fixes_it_then_carried_by_it():
  shapes = _estimator_shapes(CONFIG, rename=[("hidden/kernel", "dense_1/kernel")])
  entries = assign.classify(shapes, CONFIG)
  with pytest.raises(ConversionError) as refused:
    assign.check_complete(entries, "ckpt", CONFIG)
  message = str(refused.value)
  assert "1 variable(s) map to no model weight: dense_1/kernel [5408, 64]" in message
  assert "(their 2 optimizer slot(s) follow them)" in message
  assert '"dense_1/kernel": "hidden/kernel"' in message
  mapped = assign.classify(shapes, CONFIG, {"dense_1/kernel": "hidden/kernel"})
  assign.check_complete(mapped, "ckpt", CONFIG)
  assert assign.inverse_map({"dense_1/kernel": "hidden/kernel", "x": None}, CONFIG) == {
      "hidden/kernel": "dense_1/kernel"}


def test_another_optimizers_slots_and_bad_maps_are_refused(tmp_path):
  momentum = Config(optimizer="momentum")
  with pytest.raises(ConversionError, match="trained with --optimizer=adam, not "
                     "--optimizer=momentum.*--reset_slots"):
    assign.check_complete(assign.classify(_estimator_shapes(CONFIG), momentum), "ckpt",
                          momentum)
  shapes = _estimator_shapes(CONFIG)
  for bad, why in (({"conv/kernel/Adam": "conv/kernel"}, "a step or slot"),
                   ({"conv/kernel": "nothing"}, "not a weight of the model"),
                   ({"conv/kernel": "hidden/bias", "hidden/bias": "hidden/bias"}, "maps both"),
                   ({"absent": None}, "which the checkpoint does not hold")):
    with pytest.raises(ConversionError, match=why):
      assign.classify(shapes, CONFIG, bad)
  path = tmp_path / "map.json"
  path.write_text(json.dumps(["not", "an", "object"]))
  with pytest.raises(ConversionError, match="must hold a JSON object"):
    assign.load_assignment_map(str(path))
  path.write_text('{"dense_1/kernel": "hidden/kernel", "extra": null}')
  assert assign.load_assignment_map(str(path)) == {"dense_1/kernel": "hidden/kernel",
                                                   "extra": None}
