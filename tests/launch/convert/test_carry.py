"""launch.convert.carry and python -m launch.convert: checkpoints carried between the backends."""

import dataclasses
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from typing import Dict

import numpy as np
import pytest
import tensorflow as tf

from launch.convert import assign
from launch.convert import carry
from launch.convert.kinds import ConversionError, Kind
from launch.proofs import runs
from launch.proofs import serving_check
from tests.conftest import ESTIMATOR_MISSING, REPO, memory_input_fn, run_module
from trainers import checkpoints
from trainers import keras_trainer
from trainers import loop
from trainers import model_dir as layout
from trainers import optimizers
from trainers import run_record
from trainers import serving
from trainers.config import Config

if ESTIMATOR_MISSING:
  pytest.skip(ESTIMATOR_MISSING, allow_module_level=True)
from tests import legacy_model
from trainers import estimator_trainer

# One pytest-xdist worker runs this module (--dist loadgroup): its fixtures train once.
pytestmark = pytest.mark.xdist_group("convert_carry")

STEPS = 3
TRAIN_FLAGS = ["--global_batch_size=32", "--eval_batch_size=50", "--log_every_steps=1",
               f"--checkpoint_every_steps={STEPS}"]


def _config(data_dir: str, **changes) -> Config:
  return Config(**{"train_steps": STEPS, "global_batch_size": 32, "eval_batch_size": 50,
                   "log_every_steps": 1, "checkpoint_every_steps": STEPS, "data_dir": data_dir,
                   **changes})


def _read_checkpoint(model_dir: str) -> Dict[str, np.ndarray]:
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(model_dir))
  return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def _write_estimator_checkpoint(values: Dict[str, np.ndarray], model_dir: str, step: int) -> None:
  """A name-based checkpoint of exactly `values`, as an Estimator's Saver writes it."""
  with tf.Graph().as_default():
    variables = {name: tf.compat.v1.Variable(value, name=f"v{i}")
                 for i, (name, value) in enumerate(values.items())}
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      tf.compat.v1.train.Saver(variables).save(session, os.path.join(model_dir, "model.ckpt"),
                                               global_step=step, write_meta_graph=False)


def _leftovers(target: pathlib.Path):
  """Staging directories a conversion left beside its target."""
  return [p.name for p in target.parent.iterdir() if p.name.startswith(f".{target.name}.tmp-")]


@pytest.fixture(scope="module")
def estimator_dir(tiny_data_dir, tmp_path_factory) -> str:
  """An Estimator model_dir at step 3, trained as a user would (summary.json, export)."""
  model_dir = tmp_path_factory.mktemp("estimator") / "run"
  result = run_module("trainers.estimator_main", [f"--model_dir={model_dir}",
                                                  f"--data_dir={tiny_data_dir}",
                                                  f"--train_steps={STEPS}", *TRAIN_FLAGS])
  assert result.returncode == 0, result.stderr[-3000:]
  return str(model_dir)


@pytest.fixture(scope="module")
def keras_dir(estimator_dir, tmp_path_factory) -> str:
  """estimator_dir converted to Keras, in this process."""
  target = tmp_path_factory.mktemp("converted") / "keras"
  conversion = carry.estimator_to_keras(estimator_dir, str(target))
  assert conversion.step == STEPS and not conversion.ignored
  return str(target)


@pytest.mark.slow
def test_round_trip_is_bit_identical_and_the_estimator_resumes(estimator_dir, keras_dir,
                                                              tiny_data_dir, tmp_path):
  original = _read_checkpoint(estimator_dir)
  assert checkpoints.resume_problem("keras", keras_dir, Config()) is None
  back = str(tmp_path / "estimator")
  conversion = carry.keras_to_estimator(keras_dir, back)

  assert checkpoints.resume_problem("estimator", back, Config()) is None
  # Every Estimator variable was carried: weights, their Momentum slots, the step.
  entries = assign.estimator_accounting(tf.train.latest_checkpoint(estimator_dir), Config())
  assert sorted(e.kind for e in entries) == ["slot"] * 6 + ["step"] + ["weight"] * 6
  assert len(conversion.mapped) == 13 and conversion.step == STEPS
  assert np.abs(original["conv/kernel/Momentum"]).max() > 0  # Momentum is state here.
  restored = _read_checkpoint(back)
  assert sorted(restored) == sorted(original)
  for name, value in original.items():
    assert restored[name].dtype == value.dtype, name
    assert np.array_equal(restored[name], value), name

  # The Estimator goes on from the converted checkpoint: step 3 to 6.
  summary = loop.train_and_evaluate(
      estimator_trainer.Backend, _config(tiny_data_dir, train_steps=2 * STEPS), back,
      strategy=tf.distribute.MirroredStrategy(["/cpu:0"]))
  assert summary["global_step"] == 2 * STEPS
  starts = [r for r in runs.read_progress(back) if r["event"] == "start"]
  assert [r["from_step"] for r in starts] == [STEPS]


def _serves_alike(export_dir, keras_dir, config, out_dir):
  """The checks that fail when the Estimator's export and an export of the converted Keras
  checkpoint are sent the tiny test split's 200 images as tf.Examples."""
  converted = serving_check.export_keras_checkpoint(keras_dir, config, str(out_dir))
  checks = serving_check.compare(export_dir, converted, lambda: serving_check.test_images(config),
                                 serving.feature_name(config), atol=1e-5)
  assert any(c.where == "200 test images" for c in checks)
  return [c.name for c in checks if not c.passed]


def test_estimator_export_and_converted_keras_serve_the_same(estimator_dir, keras_dir,
                                                               tiny_data_dir, tmp_path):
  with open(os.path.join(estimator_dir, layout.SUMMARY_FILE)) as f:
    export_dir = json.load(f)["export_dir"]
  assert _serves_alike(export_dir, keras_dir, _config(tiny_data_dir), tmp_path / "served") == []

  # Negative control: a checkpoint one bias off is caught.
  tampered = _read_checkpoint(estimator_dir)
  tampered["logits/bias"] = tampered["logits/bias"] + 1.0
  _write_estimator_checkpoint(tampered, str(tmp_path / "tampered"), STEPS)
  carry.estimator_to_keras(str(tmp_path / "tampered"), str(tmp_path / "tampered-keras"))
  failed = _serves_alike(export_dir, str(tmp_path / "tampered-keras"), _config(tiny_data_dir),
                         tmp_path / "served-tampered")
  assert "max |diff|, answers predict/logits, estimator vs keras" in failed


@pytest.mark.slow
def test_cli_converts_and_keras_resumes_from_it(estimator_dir, tiny_data_dir, tmp_path):
  target = tmp_path / "keras"
  result = run_module("launch.convert", [f"--from_estimator={estimator_dir}",
                                         f"--to_keras={target}"])
  assert result.returncode == 0, result.stderr[-3000:]
  rows = {line.split()[0]: line.split()[2:] for line in result.stdout.splitlines()
          if " -> " in line}
  assert rows["conv/kernel/Momentum"] == [
      "model/optimizer/_variables/1/.ATTRIBUTES/VARIABLE_VALUE", "(slot)"]
  assert rows["global_step"] == [checkpoints.KERAS_STEP_KEY, "(step)"]
  assert len(rows) == 1 + 13  # The header and every variable.
  assert f"Step: {STEPS}" in result.stdout and f"Output directory: {target}" in result.stdout
  assert "Ignored (not carried):\n  none" in result.stdout
  # The run record comes along, for the new backend: no --allow_config_change needed.
  assert run_record.read(str(target)) == {**run_record.read(estimator_dir), "backend": "keras"}

  # Resumed with no flag but where the data is and how far: the rest is the record's.
  result = run_module("trainers.keras_main", [f"--model_dir={target}",
                                              f"--data_dir={tiny_data_dir}",
                                              f"--train_steps={2 * STEPS}"])
  assert result.returncode == 0, result.stderr[-3000:]
  assert "records: --global_batch_size=32 " in result.stderr
  assert json.loads(result.stdout.strip().splitlines()[-1])["global_step"] == 2 * STEPS
  assert f"Training from step {STEPS} to {2 * STEPS}." in result.stderr
  # --decay_steps=0: the schedule follows the longer --train_steps, and the run says so.
  assert f"the learning-rate schedule: {STEPS} steps in the run, {2 * STEPS} now" in result.stderr


def test_unmapped_variable_fails_naming_it_and_the_fix(estimator_dir, tmp_path):
  values = _read_checkpoint(estimator_dir)
  values["extra/kernel"] = np.ones((7, 7), np.float32)
  source = tmp_path / "extra"
  _write_estimator_checkpoint(values, str(source), STEPS)
  target = tmp_path / "keras"

  result = run_module("launch.convert", [f"--from_estimator={source}", f"--to_keras={target}"])
  assert result.returncode == 2
  assert result.stderr.startswith("error: ")
  assert "extra/kernel [7, 7]" in result.stderr
  assert '"extra/kernel": null' in result.stderr  # The --assignment_map entry that fixes it.
  assert not target.exists() and not _leftovers(target)

  # With that entry it converts, and says what it dropped.
  conversion = carry.estimator_to_keras(str(source), str(target),
                                          assignment_map={"extra/kernel": None})
  assert [i.name for i in conversion.ignored] == ["extra/kernel"]


def test_wrong_shape_and_missing_slot_fail(estimator_dir, tmp_path):
  values = _read_checkpoint(estimator_dir)
  del values["hidden/bias/Momentum"]
  _write_estimator_checkpoint(values, str(tmp_path / "no-slot"), STEPS)
  with pytest.raises(ConversionError,
                     match=r"hidden/bias its --optimizer=momentum Momentum slot"):
    carry.estimator_to_keras(str(tmp_path / "no-slot"), str(tmp_path / "a"))
  with pytest.raises(ConversionError, match=r"conv/kernel has shape \[3, 3, 1, 32\], but "
                     r"the model weight logits/bias"):
    carry.estimator_to_keras(estimator_dir, str(tmp_path / "b"),
                               assignment_map={"conv/kernel": "logits/bias",
                                               "logits/bias": None})
  assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_non_empty_target_and_missing_source_are_refused(estimator_dir, keras_dir, tmp_path):
  target = tmp_path / "taken"
  target.mkdir()
  (target / "keep.txt").write_text("mine")
  for run, source in ((carry.estimator_to_keras, estimator_dir),
                      (carry.keras_to_estimator, keras_dir)):
    with pytest.raises(ConversionError, match="exists and is not empty"):
      run(source, str(target))
  assert [p.name for p in target.iterdir()] == ["keep.txt"]
  assert (target / "keep.txt").read_text() == "mine" and not _leftovers(target)

  empty = tmp_path / "empty"
  with pytest.raises(ConversionError, match=f"No checkpoint in {empty}"):
    carry.estimator_to_keras(str(empty), str(tmp_path / "out"))
  with pytest.raises(ConversionError, match="is a keras checkpoint"):
    carry.estimator_to_keras(keras_dir, str(tmp_path / "out"))
  assert not (tmp_path / "out").exists()


def test_legacy_names_convert_through_the_map_and_predict_the_same(tiny_data_dir, tmp_path):
  config = _config(tiny_data_dir)
  legacy_dir = tmp_path / "legacy"
  export_dir = legacy_model.train_and_export(config, str(legacy_dir))
  target = tmp_path / "keras"

  with pytest.raises(ConversionError) as failure:
    carry.estimator_to_keras(str(legacy_dir), str(target), config=config)
  message = str(failure.value)
  assert "6 variable(s) map to no model weight: model/conv2d/bias [32], model/conv2d/kernel " \
      "[3, 3, 1, 32]," in message
  for old, new in legacy_model.ASSIGNMENT_MAP.items():  # Shapes are unique: the whole fix.
    assert f'"{old}": "{new}"' in message
  assert not target.exists() and not _leftovers(target)

  # --inspect proposes that map (each entry a guess by shape: the names differ).
  inspected = run_module("launch.convert", [f"--inspect={legacy_dir}", "--inspect_format=json"])
  assert inspected.returncode == 0, inspected.stderr[-3000:]
  proposal = json.loads(inspected.stdout)
  assert proposal["assignment_map"] == legacy_model.ASSIGNMENT_MAP
  assert set(proposal["matched_by"].values()) == {"shape (guess)"}
  kinds = {v["name"]: v["kind"] for v in proposal["variables"]}
  assert kinds["model/dense_1/kernel/Momentum"] == "slot" and kinds["global_step"] == "step"
  text = run_module("launch.convert", [f"--inspect={legacy_dir}"]).stdout
  assert '"model/conv2d/kernel": "conv/kernel"' in text and "Check these" in text

  map_file = tmp_path / "map.json"
  map_file.write_text(json.dumps(proposal["assignment_map"]))
  assignment_map = assign.load_assignment_map(str(map_file))
  conversion = carry.estimator_to_keras(str(legacy_dir), str(target),
                                          assignment_map=assignment_map, config=config)
  assert ("model/dense_1/kernel/Momentum", "slot") in [(m.source, m.kind)
                                                       for m in conversion.mapped]
  assert _serves_alike(export_dir, str(target), config, tmp_path / "served") == []

  # Read backwards, the same map writes the legacy names again, bit for bit.
  back = tmp_path / "legacy-again"
  carry.keras_to_estimator(str(target), str(back), assignment_map=assignment_map)
  original, restored = _read_checkpoint(str(legacy_dir)), _read_checkpoint(str(back))
  assert sorted(restored) == sorted(original)
  assert all(np.array_equal(restored[k], original[k]) for k in original)


def test_cli_rejects_bad_directions_and_bad_maps(estimator_dir, tmp_path):
  both = run_module("launch.convert", [f"--from_estimator={estimator_dir}",
                                       f"--to_keras={tmp_path / 'k'}",
                                       f"--from_keras={tmp_path / 'k'}",
                                       f"--to_estimator={tmp_path / 'e'}"])
  neither = run_module("launch.convert", [])
  half = run_module("launch.convert", [f"--from_estimator={estimator_dir}"])
  for result in (both, neither, half):
    assert result.returncode == 2
    assert "Give exactly one direction" in result.stderr

  bad = tmp_path / "map.json"
  bad.write_text("{not json")
  result = run_module("launch.convert", [f"--from_estimator={estimator_dir}",
                                         f"--to_keras={tmp_path / 'k'}",
                                         f"--assignment_map={bad}"])
  assert result.returncode == 2
  assert f"error: --assignment_map={bad}" in result.stderr
  assert not (tmp_path / "k").exists() and not (tmp_path / "e").exists()


@pytest.mark.slow
def test_a_batchnorm_model_round_trips_its_moving_statistics_without_slots(tiny_data_dir,
                                                                           tmp_path):
  model_dir = tmp_path / "estimator"
  result = run_module("trainers.estimator_main", [
      f"--model_dir={model_dir}", f"--data_dir={tiny_data_dir}", f"--train_steps={STEPS}",
      "--model=cnn_bn", *TRAIN_FLAGS])
  assert result.returncode == 0, result.stderr[-3000:]
  config = Config(model="cnn_bn")
  original = _read_checkpoint(str(model_dir))
  assert not np.array_equal(original["bn1/moving_mean"], np.zeros(32))  # Trained: state.
  assert "bn1/moving_mean/Momentum" not in original
  keras = tmp_path / "keras"
  # As a user converts it: the model comes from the source's run.json.
  result = run_module("launch.convert", [f"--from_estimator={model_dir}", f"--to_keras={keras}"])
  assert result.returncode == 0, result.stderr[-3000:]
  assert "bn1/moving_mean" in result.stdout
  assert checkpoints.resume_problem("keras", str(keras), config) is None
  back = tmp_path / "back"
  carry.keras_to_estimator(str(keras), str(back), config=config)
  restored = _read_checkpoint(str(back))
  assert sorted(restored) == sorted(original)
  assert all(np.array_equal(restored[name], value) for name, value in original.items())
  # 17 weights (6 moving statistics), 11 momentum slots, the step.
  kinds = [m.kind for m in carry.keras_to_estimator(str(keras), str(tmp_path / "again"),
                                                      config=config).mapped]
  assert (kinds.count("weight"), kinds.count("slot"), kinds.count("step")) == (17, 11, 1)


@pytest.mark.slow
def test_cli_refuses_a_run_recorded_with_another_optimizer_than_it_holds(estimator_dir,
                                                                         tmp_path):
  source = tmp_path / "adam"
  shutil.copytree(estimator_dir, source)
  record = run_record.read(str(source))
  run_record.write(str(source), {**record, "optimizer": "adam"})
  result = run_module("launch.convert", [f"--from_estimator={source}",
                                         f"--to_keras={tmp_path / 'k'}"])
  assert result.returncode == 2, result.stderr[-3000:]
  assert ("was trained with --optimizer=momentum, not --optimizer=adam" in result.stderr
          and "--reset_slots" in result.stderr)
  assert "Traceback" not in result.stderr and not (tmp_path / "k").exists()
  run_record.write(str(source), {**record, "model": "dnn",
                                 "optimizer": run_record.CANNED_OPTIMIZER})
  result = run_module("launch.convert", [f"--from_estimator={source}",
                                         f"--to_keras={tmp_path / 'k'}"])
  assert result.returncode == 2, result.stderr[-3000:]
  assert "is not a checkpoint of --model=dnn with these settings" in result.stderr
  assert "Traceback" not in result.stderr and not (tmp_path / "k").exists()


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam", "ftrl", "rmsprop"])
def test_every_optimizers_state_goes_across_and_back_unchanged(optimizer, tmp_path):
  # Momentum is the fixtures' above. rmsprop at its default momentum 0 keeps no momentum
  # slot in Keras: v1's goes back as zeros, which that momentum never reads.
  config = Config(train_steps=STEPS, global_batch_size=32, eval_batch_size=50,
                  log_every_steps=1, checkpoint_every_steps=STEPS, optimizer=optimizer)
  source = tmp_path / "estimator"
  loop.train_and_evaluate(estimator_trainer.Backend, config, str(source),
                          strategy=tf.distribute.MirroredStrategy(["/cpu:0"]),
                          input_fn=memory_input_fn(config.global_batch_size))
  original = _read_checkpoint(str(source))
  there = carry.estimator_to_keras(str(source), str(tmp_path / "keras"), config=config)
  keras = _read_checkpoint(str(tmp_path / "keras"))
  for m in there.mapped:
    np.testing.assert_array_equal(keras[m.destination], original[m.source], err_msg=m.source)
  slots = {m.source for m in there.mapped if m.kind == Kind.SLOT}
  expected = {n for n in original if n.rsplit("/", 1)[-1] in optimizers.kept_slots(config)}
  assert slots == expected and (optimizer == "sgd") == (not slots)
  back = carry.keras_to_estimator(str(tmp_path / "keras"), str(tmp_path / "back"),
                                    config=config)
  returned = _read_checkpoint(str(tmp_path / "back"))
  assert set(returned) == set(original)
  for name, value in returned.items():
    zeroed = any(i.name == name for i in back.ignored)
    np.testing.assert_array_equal(value, np.zeros_like(original[name]) if zeroed
                                  else original[name], err_msg=name)


@pytest.mark.parametrize("settings, slot, counter", [
    ({"model": "linear_v1", "feature_name": "pixels"},
     "linear/linear/linear_model/pixels/weights/Ftrl", None),
    ({"model": "dnn_v1", "hidden_units": "8", "dnn_optimizer": "adam"},
     "dnn/dnn/hiddenlayer_0/kernel/Adam", "dnn/head/dnn/beta1_power"),
    # Two optimizers, minimizing outside the parts' scopes; the twin's two step counts.
    ({"model": "wide_deep_v1", "hidden_units": "8"}, "dnn/hiddenlayer_0/kernel/Adagrad", None),
    ({"model": "wide_deep_v1", "hidden_units": "8", "linear_optimizer": "adam"},
     "linear/linear_model/image/weights/Adam_1", "head/beta1_power"),
])
def test_a_v1_canned_run_goes_across_and_back_unchanged(settings, slot, counter, tmp_path):
  # A tf.compat.v1.estimator class trained under a strategy names its slots and Adam's
  # counters under the scope it minimizes in: read, and written back so.
  config = Config(train_steps=STEPS, global_batch_size=32, eval_batch_size=50,
                  log_every_steps=1, checkpoint_every_steps=STEPS, **settings)
  source = tmp_path / "estimator"
  loop.train_and_evaluate(estimator_trainer.Backend, config, str(source),
                          strategy=tf.distribute.MirroredStrategy(["/cpu:0"]),
                          input_fn=memory_input_fn(config.global_batch_size))
  original = _read_checkpoint(str(source))
  assert slot in original, sorted(original)
  assert [n for n in original if n.endswith("/beta1_power")] == ([counter] if counter else [])
  there = carry.estimator_to_keras(str(source), str(tmp_path / "keras"), config=config)
  assert not there.ignored and {m.source for m in there.mapped} == set(original), there
  carry.keras_to_estimator(str(tmp_path / "keras"), str(tmp_path / "back"), config=config)
  returned = _read_checkpoint(str(tmp_path / "back"))
  assert set(returned) == set(original)
  for name, value in returned.items():
    np.testing.assert_array_equal(value, original[name], err_msg=name)


def test_a_v1_canned_run_goes_to_other_part_optimizers_with_reset_slots(tmp_path):
  trained = Config(model="wide_deep_v1", hidden_units="8", train_steps=STEPS,
                   global_batch_size=32, eval_batch_size=50, checkpoint_every_steps=STEPS)
  source = tmp_path / "estimator"
  loop.train_and_evaluate(estimator_trainer.Backend, trained, str(source),
                          strategy=tf.distribute.MirroredStrategy(["/cpu:0"]),
                          input_fn=memory_input_fn(trained.global_batch_size))
  original = _read_checkpoint(str(source))
  other = dataclasses.replace(trained, dnn_optimizer="adam", linear_optimizer="rmsprop")
  with pytest.raises(ConversionError, match="trained with --dnn_optimizer=adagrad, not "
                     "--dnn_optimizer=adam"):
    carry.estimator_to_keras(str(source), str(tmp_path / "refused"), config=other)
  there = carry.estimator_to_keras(str(source), str(tmp_path / "keras"), config=other,
                                     reset_slots=True)
  # The weights and the step carried; Adagrad's and Ftrl's slots not, each saying so.
  slots = {n for n in original if n.endswith(("/Adagrad", "/Ftrl", "/Ftrl_1"))}
  assert len(slots) == 8  # 4 DNN weights, 2 linear ones with 2 slots each.
  assert {m.source for m in there.mapped} == set(original) - slots
  assert {i.name for i in there.ignored} == slots
  # Back, with the source's optimizers, reset: v1's starting state, by the v1 class's names.
  carry.keras_to_estimator(str(tmp_path / "keras"), str(tmp_path / "back"), config=trained,
                             reset_slots=True)
  returned = _read_checkpoint(str(tmp_path / "back"))
  assert set(returned) == set(original)
  for name, value in returned.items():
    if name.endswith(("/Adagrad", "/Ftrl")):
      np.testing.assert_array_equal(value, np.full_like(value, 0.1), err_msg=name)
    elif name.endswith("/Ftrl_1"):
      np.testing.assert_array_equal(value, np.zeros_like(value), err_msg=name)
    else:
      np.testing.assert_array_equal(value, original[name], err_msg=name)


def test_adam_in_both_v1_parts_is_refused(tmp_path):
  both = Config(model="wide_deep_v1", dnn_optimizer="adam", linear_optimizer="adam")
  with pytest.raises(ConversionError, match="with Adam in both parts is not carried"):
    carry.estimator_to_keras(str(tmp_path / "nothing"), str(tmp_path / "keras"), config=both)
  assert not (tmp_path / "keras").exists()


def _without_slots(estimator_dir: str, model_dir: str) -> Dict[str, np.ndarray]:
  """estimator_dir's checkpoint as plain gradient descent leaves one: no slots."""
  values = {k: v for k, v in _read_checkpoint(estimator_dir).items() if "Momentum" not in k}
  _write_estimator_checkpoint(values, model_dir, STEPS)
  return values


def test_another_optimizers_state_stops_it_unless_the_slots_are_reset(estimator_dir, keras_dir,
                                                                      tmp_path):
  # An ordinary Estimator program trained with GradientDescentOptimizer, into a momentum run.
  source = tmp_path / "sgd"
  values = _without_slots(estimator_dir, str(source))
  with pytest.raises(ConversionError) as failure:
    carry.estimator_to_keras(str(source), str(tmp_path / "a"))
  assert "was trained with --optimizer=sgd, not --optimizer=momentum" in str(failure.value)
  assert "--reset_slots" in str(failure.value) and not (tmp_path / "a").exists()
  plain = carry.estimator_to_keras(str(source), str(tmp_path / "a"),
                                     config=Config(optimizer="sgd"))
  assert plain.step == STEPS and not plain.reset

  # Reset: the weights and the step carry; momentum's slots start at zeros, each listed.
  reset = carry.estimator_to_keras(str(source), str(tmp_path / "b"), reset_slots=True)
  assert sorted(r.name for r in reset.reset) == sorted(f"{w}/Momentum" for w in values
                                                       if w != "global_step")
  assert {r.reason for r in reset.reset} == {"starts at 0"}
  carried = _read_checkpoint(str(tmp_path / "b"))
  for m in reset.mapped:
    np.testing.assert_array_equal(carried[m.destination], values[m.source])

  # Adam into Adagrad, from Keras: the Keras checkpoint's slot names tell the optimizer.
  config = Config(optimizer="adagrad")
  with pytest.raises(ConversionError, match=r"was trained with --optimizer=sgd or "
                     r"--optimizer=momentum, not --optimizer=adagrad"):
    carry.keras_to_estimator(keras_dir, str(tmp_path / "c"), config=config)
  back = carry.keras_to_estimator(keras_dir, str(tmp_path / "c"), config=config,
                                    reset_slots=True)
  written = _read_checkpoint(str(tmp_path / "c"))
  assert {r.name: r.reason for r in back.reset}["conv/kernel/Adagrad"] == "starts at 0.1"
  assert sorted(written) == sorted(k.replace("Momentum", "Adagrad")
                                   for k in _read_checkpoint(estimator_dir))
  assert sum("--reset_slots" in i.reason for i in back.ignored) == 6  # The Momentum slots.


def test_cli_resets_the_slots_and_records_the_new_optimizer(estimator_dir, tmp_path):
  target = tmp_path / "k"
  result = run_module("launch.convert", [f"--from_estimator={estimator_dir}",
                                         f"--to_keras={target}", "--optimizer=adam",
                                         "--reset_slots"])
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Reset (--reset_slots" in result.stdout and "beta1_power: starts at 0.9" in result.stdout
  record = run_record.read(str(target))
  assert record["optimizer"] == "adam" and record["beta2"] == 0.999 and "momentum" not in record
  assert checkpoints.resume_problem("keras", str(target), Config(optimizer="adam")) is None


def _with_newer_checkpoint(estimator_dir: str, tmp_path: pathlib.Path) -> pathlib.Path:
  """A copy of estimator_dir with a checkpoint one step newer than its own."""
  source = tmp_path / "source"
  shutil.copytree(estimator_dir, source)
  values = _read_checkpoint(str(source))
  _write_estimator_checkpoint({**values, "global_step": np.int64(STEPS + 1)}, str(source),
                              STEPS + 1)
  return source


def test_a_newest_checkpoint_that_does_not_load_is_skipped_saying_which(estimator_dir,
                                                                        tmp_path):
  source = _with_newer_checkpoint(estimator_dir, tmp_path)
  newest = source / f"model.ckpt-{STEPS + 1}"
  data = next(source.glob(f"{newest.name}.data-*"))
  data.write_bytes(data.read_bytes()[:64])  # Truncated, as a full disk leaves it.
  (source / "checkpoint").unlink()  # And no index: the newest is found by listing.
  conversion = carry.estimator_to_keras(str(source), str(tmp_path / "a"))
  assert conversion.step == STEPS and [s.name for s in conversion.skipped] == [str(newest)]
  assert "does not load" in conversion.skipped[0].reason

  data.unlink()  # A data file missing, and an index that does not parse.
  (source / "checkpoint").write_text("model_checkpoint_path: {")
  result = run_module("launch.convert", [f"--from_estimator={source}",
                                         f"--to_keras={tmp_path / 'b'}"])
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Skipped (newer checkpoints that do not load):" in result.stdout
  assert f"Step: {STEPS}" in result.stdout

  for path in source.glob("model.ckpt-*.data-*"):  # None loads: exit 2 naming each.
    path.write_bytes(b"")
  before = {p.name: p.read_bytes() for p in source.iterdir() if p.is_file()}
  result = run_module("launch.convert", [f"--from_estimator={source}",
                                         f"--to_keras={tmp_path / 'c'}"])
  assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
  assert f"No checkpoint in {source} loads: {newest.name}:" in result.stderr
  assert f"model.ckpt-{STEPS}:" in result.stderr
  assert not (tmp_path / "c").exists() and not _leftovers(tmp_path / "c")
  # The source is read, never changed: nothing in it is moved aside or rewritten.
  assert {p.name: p.read_bytes() for p in source.iterdir() if p.is_file()} == before


def test_a_keras_backup_newer_than_the_newest_checkpoint_stops_it(keras_dir, tmp_path):
  source = tmp_path / "interrupted"
  shutil.copytree(keras_dir, source)
  # What an interrupted fit leaves: a BackupAndRestore backup 2 steps past ckpt-3.
  model = keras_trainer.compile_model(Config())
  model.optimizer.build(model.trainable_variables)
  tf.train.Checkpoint(model=model).restore(
      tf.train.latest_checkpoint(str(source))).assert_existing_objects_matched()
  model.optimizer.iterations.assign_add(2)
  model.get_layer("logits").bias.assign_add(tf.ones([10]))
  backup = tf.train.Checkpoint(model=model, ckpt_saved_epoch=tf.Variable(0, dtype=tf.int64),
                               ckpt_saved_batch=tf.Variable(1, dtype=tf.int64))
  tf.train.CheckpointManager(backup, str(source / layout.BACKUP_SUBDIR / "chief"),
                             max_to_keep=1).save()
  with pytest.raises(ConversionError, match=f"backup at step {STEPS + 2}, newer than "
                     r"its newest checkpoint .*ckpt-3 \(step 3\).*--from_backup"):
    carry.keras_to_estimator(str(source), str(tmp_path / "a"))
  assert not (tmp_path / "a").exists()

  result = run_module("launch.convert", [f"--from_keras={source}", "--from_backup",
                                         f"--to_estimator={tmp_path / 'a'}"])
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"Step: {STEPS + 2}" in result.stdout
  written = _read_checkpoint(str(tmp_path / "a"))
  np.testing.assert_array_equal(written["logits/bias"], model.get_layer("logits").bias.numpy())


@pytest.mark.parametrize("direction", ["to_keras", "to_estimator"])
def test_a_map_sending_two_variables_to_one_weight_is_refused(direction, estimator_dir,
                                                              keras_dir, tmp_path):
  map_file = tmp_path / "map.json"
  map_file.write_text(json.dumps({"conv/bias": "logits/bias", "logits/bias": "logits/bias"}))
  source = (f"--from_estimator={estimator_dir}" if direction == "to_keras"
            else f"--from_keras={keras_dir}")
  result = run_module("launch.convert", [source, f"--{direction}={tmp_path / 'out'}",
                                         f"--assignment_map={map_file}"])
  assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
  assert "maps both 'conv/bias' and 'logits/bias' to 'logits/bias'" in result.stderr
  assert not (tmp_path / "out").exists()


def test_an_empty_target_is_used_as_it_is(estimator_dir, keras_dir, tmp_path):
  for run, source, target in ((carry.estimator_to_keras, estimator_dir, tmp_path / "k"),
                              (carry.keras_to_estimator, keras_dir, tmp_path / "e")):
    target.mkdir(mode=0o750)  # A mounted volume, or a directory made for the run.
    os.chmod(target, 0o750)
    inode = target.stat().st_ino
    conversion = run(source, str(target))
    assert (target.stat().st_ino, target.stat().st_mode & 0o777) == (inode, 0o750)
    assert os.path.dirname(conversion.output) == str(target)
    assert not [n for n in os.listdir(target) if n.startswith(".")]
    backend = "keras" if target.name == "k" else "estimator"
    assert checkpoints.resume_problem(backend, str(target), Config()) is None


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_cli_stopped_by_a_signal_removes_its_staging_directory(signum, estimator_dir,
                                                               tmp_path):
  # The signal goes as soon as the staging directory appears; the conversion's last steps
  # are short and may still finish first: then the target must be whole. Up to 5 tries
  # for one that lands mid-conversion.
  finished = []
  for attempt in range(5):
    target = tmp_path / f"k{attempt}"
    process = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-m", "launch.convert", f"--from_estimator={estimator_dir}",
         f"--to_keras={target}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=REPO, env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"})
    deadline = time.monotonic() + 120
    while not _leftovers(target) and process.poll() is None and time.monotonic() < deadline:
      time.sleep(0.002)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert "Traceback" not in stderr and not _leftovers(target), stderr[-3000:]
    if target.exists():  # Whole: written before the signal landed.
      assert checkpoints.resume_problem("keras", str(target), Config()) is None
      assert process.returncode in (0, -signum, 128 + signum), stderr[-3000:]
      finished.append(process.returncode)
      continue
    assert process.returncode == 128 + signum, stderr[-3000:]
    assert f"interrupted by {signal.Signals(signum).name}; {target} was not written" in stderr
    return
  pytest.fail(f"every conversion finished before the signal landed: exits {finished}")


def test_cli_asks_for_the_optimizer_of_a_keras_model_dir_without_a_record(keras_dir, tmp_path):
  source = tmp_path / "keras"
  shutil.copytree(keras_dir, source)
  (source / run_record.RECORD_FILE).unlink()
  result = run_module("launch.convert", [f"--from_keras={source}",
                                         f"--to_estimator={tmp_path / 'e'}"])
  assert result.returncode == 2 and "give --optimizer" in result.stderr, result.stderr[-3000:]
  assert not (tmp_path / "e").exists()
  result = run_module("launch.convert", [f"--from_keras={source}", "--optimizer=momentum",
                                         f"--to_estimator={tmp_path / 'e'}"])
  assert result.returncode == 0, result.stderr[-3000:]


def _train_on(module: str, model_dir, data_dir: str, steps: int, *extra: str) -> dict:
  """The run's summary; it went on from where the model_dir stood (STEPS below `steps`)."""
  result = run_module(module, [f"--model_dir={model_dir}", f"--data_dir={data_dir}",
                               f"--train_steps={steps}", *TRAIN_FLAGS, *extra], timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"Training from step {steps - STEPS} to {steps}." in result.stderr, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


def _convert_cli(source_flag: str, source, target_flag: str, target) -> None:
  result = run_module("launch.convert", [f"{source_flag}={source}", f"{target_flag}={target}"])
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"Output directory: {target}" in result.stdout


@pytest.mark.slow  # Four runs of a cluster with a ps task: out of the quick tier.
def test_a_parameter_server_run_goes_on_in_the_other_backend_on_either_strategy(
    tiny_data_dir, tmp_path):
  # The variables on a ps task are the same variables by name: what is carried does not
  # depend on where they lived. Each leg resumes the step the other side saved.
  estimator_ps = tmp_path / "estimator-ps"
  _train_on("trainers.estimator_main", estimator_ps, tiny_data_dir, STEPS, "--ps=1")
  assert (estimator_ps / "logs" / "ps-0.log").exists()
  resumed = {}
  for name, extra in (("keras-ps", ["--ps=1"]), ("keras", [])):
    _convert_cli("--from_estimator", estimator_ps, "--to_keras", tmp_path / name)
    resumed[name] = _train_on("trainers.keras_main", tmp_path / name, tiny_data_dir,
                              2 * STEPS, *extra)
    assert resumed[name]["global_step"] == 2 * STEPS, name
  # And back: Keras's parameter-server run to an Estimator on MWMS.
  _convert_cli("--from_keras", tmp_path / "keras-ps", "--to_estimator", tmp_path / "estimator")
  summary = _train_on("trainers.estimator_main", tmp_path / "estimator", tiny_data_dir,
                      3 * STEPS)
  assert summary["global_step"] == 3 * STEPS
