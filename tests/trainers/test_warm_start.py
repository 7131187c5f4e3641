"""trainers.warm_start, and checkpoint retention: both backends in this process (an injected
strategy and memory data) start from another run's checkpoint, and keep the same ones."""

import dataclasses
import json
import types

import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import REPO, checkpoint_values, memory_input_fn, run_module
from trainers import checkpoints
from trainers import keras_trainer
from trainers import loop
from trainers import model as model_lib
from trainers import warm_start
from trainers.config import Config

# cnn_bn: BatchNorm's moving statistics are variables only the list form reaches.
CONFIG = Config(model="cnn_bn", train_steps=2, global_batch_size=16, eval_batch_size=50,
                log_every_steps=2, checkpoint_every_steps=2, backup_every_steps=2, seed=3)


def _backend(name):
  if name == "keras":
    return keras_trainer.Backend
  from trainers import estimator_trainer
  return estimator_trainer.Backend


def _train(backend, config, model_dir):
  loop.train_and_evaluate(_backend(backend), config, str(model_dir),
                          strategy=tf.distribute.MirroredStrategy(["/cpu:0"]),
                          input_fn=memory_input_fn(config.global_batch_size))
  return str(model_dir)


def _step(path, step):
  return next(p for p in checkpoints.find(path) if checkpoints.checkpoint_step(p)[1] == step)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
  """A trained model_dir of each backend (seed 9, so nothing starts as a target does)."""
  config = dataclasses.replace(CONFIG, seed=9)
  made = {"keras": _train("keras", config, tmp_path_factory.mktemp("keras_source"))}
  if tf.__version__.startswith("2.15"):
    made["estimator"] = _train("estimator", config, tmp_path_factory.mktemp("estimator_source"))
  return made


@pytest.fixture(scope="module")
def renamed(sources, tmp_path_factory):
  """The Keras source's weights under other names, in a name-based checkpoint (a team's
  program's, say): (its path, the map from this model's names to them)."""
  from trainers import estimator_trainer
  values = checkpoint_values(checkpoints.newest(sources["keras"]))
  model_names = model_lib.graph_model(CONFIG).shapes
  old = {name: f"team/{name.replace('/', '_')}" for name in model_names}
  directory = tmp_path_factory.mktemp("renamed")
  path = estimator_trainer.warm_start_from({old[n]: values[n] for n in old}, str(directory))
  return path.ckpt_to_initialize_from, old


FORMS = {
    # WarmStartSettings' default: every trainable variable, BatchNorm's statistics left fresh.
    "regex": None,
    # The list form reaches them.
    "list": '[".*"]',
}


@pytest.mark.slow
@pytest.mark.estimator
@pytest.mark.parametrize("target", ["keras", "estimator"])
@pytest.mark.parametrize("source, form", [("keras", "regex"), ("estimator", "list"),
                                          ("renamed", "list")])
def test_a_warm_started_runs_first_weights_are_the_sources(target, source, form, sources,
                                                            renamed, tmp_path):
  if source == "renamed":
    start, old = renamed
    map_file = tmp_path / "map.json"
    map_file.write_text(json.dumps(old))
    config = dataclasses.replace(CONFIG, warm_start_from=start, warm_start_vars=FORMS[form],
                                 warm_start_map=str(map_file))
    want = {n: checkpoint_values(start)[o] for n, o in old.items()}
  else:
    config = dataclasses.replace(CONFIG, warm_start_from=sources[source],
                                 warm_start_vars=FORMS[form])
    want = checkpoint_values(checkpoints.newest(sources[source]))
  model_dir = _train(target, config, tmp_path / "run")
  first = checkpoint_values(_step(model_dir, 0))  # Both backends save step 0.
  own = model_lib.get_weights(model_lib.build(CONFIG))  # What the seed alone starts.
  trainable = set(model_lib.graph_model(CONFIG).trainable)
  for name in own:
    started = form == "list" or name in trainable
    np.testing.assert_array_equal(first[name], want[name] if started else own[name],
                                  err_msg=name)
  # The optimizer starts fresh: an Estimator's slots are zeros at step 0 (Keras makes its
  # own at the first step).
  for name, value in first.items():
    if name.endswith("/Momentum"):
      assert not value.any(), name


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["keras", pytest.param("estimator",
                                                            marks=pytest.mark.estimator)])
def test_a_resumed_run_does_not_warm_start(backend, sources, caplog):
  config = dataclasses.replace(CONFIG, warm_start_from=sources["keras"])
  resumed = sources["estimator" if backend == "estimator" else "keras"]
  caplog.set_level("INFO", logger="absl")  # Whatever an earlier test set absl's verbosity to.
  assert warm_start.for_run(backend, config, resumed) is None
  assert "Not warm starting" in caplog.text and resumed in caplog.text


def test_the_selection_is_warm_start_settings(sources):
  shapes = {"conv1/kernel": (3,), "bn1/gamma": (1,), "bn1/moving_mean": (1,), "xconv": (1,)}
  trainable = {"conv1/kernel", "bn1/gamma", "xconv"}
  assert warm_start.select(shapes, trainable, ".*") == ["conv1/kernel", "bn1/gamma", "xconv"]
  assert warm_start.select(shapes, trainable, "conv") == ["conv1/kernel"]  # From the start.
  assert warm_start.select(shapes, trainable, "bn1/") == ["bn1/gamma"]
  assert warm_start.select(shapes, trainable, ["bn1/"]) == ["bn1/gamma", "bn1/moving_mean"]
  assert warm_start.select(shapes, trainable, ["bn1/moving_mean$"]) == []  # Matched on name:0.


def test_a_keras_checkpoint_is_read_by_its_variables_names_without_the_optimizers(sources):
  names = warm_start.source_names(checkpoints.newest(sources["keras"]))
  assert sorted(names) == sorted(model_lib.graph_model(CONFIG).shapes)


@pytest.mark.parametrize("change, message", [
    ({"warm_start_vars": "nothing"}, "--warm_start_vars=nothing selects none of model "
     "cnn_bn's trainable variables"),
    ({"warm_start_map": {"dense/kernel": "conv1/kernel"}}, "maps dense/kernel, which is not a "
     "variable of model cnn_bn"),
    ({"warm_start_vars": "conv", "warm_start_map": {"logits/bias": "logits/bias"}},
     "maps logits/bias, which --warm_start_vars does not select"),
    ({"warm_start_map": {"conv1/kernel": "conv1/kernel_old"}}, "has no variable "
     "conv1/kernel_old for conv1/kernel"),
    ({"warm_start_map": {"conv1/kernel": "conv2/kernel"}}, "conv2/kernel has shape [3, 3, 32, "
     "64] in"),
    ({"warm_start_from": "/nonexistent"}, "--warm_start_from=/nonexistent: no such directory"),
    ({"warm_start_map": "/nonexistent.json"}, "--warm_start_map=/nonexistent.json: No such "
     "file"),
])
def test_a_warm_start_that_cannot_be_done_names_the_flag(change, message, sources, tmp_path):
  if isinstance(change.get("warm_start_map"), dict):  # Written here.
    (tmp_path / "map.json").write_text(json.dumps(change["warm_start_map"]))
    change = {**change, "warm_start_map": str(tmp_path / "map.json")}
  config = dataclasses.replace(CONFIG, **{"warm_start_from": sources["keras"], **change})
  with pytest.raises(warm_start.WarmStartError) as raised:
    warm_start.plan("keras", config)
  assert message in str(raised.value)


def test_a_checkpoint_that_does_not_load_names_the_flag(tmp_path):
  (tmp_path / "model.ckpt-5.index").write_bytes(b"not a checkpoint")
  config = dataclasses.replace(CONFIG, warm_start_from=str(tmp_path))
  with pytest.raises(warm_start.WarmStartError, match="does not load"):
    warm_start.plan("keras", config)


def test_a_bad_map_exits_2_before_any_task_starts(sources, tiny_data_dir, tmp_path):
  (tmp_path / "map.json").write_text(json.dumps({"dense/kernel": "conv1/kernel"}))
  result = run_module("trainers.keras_main", [
      f"--data_dir={tiny_data_dir}", f"--model_dir={tmp_path / 'model'}", "--workers=2",
      "--model=cnn_bn", f"--warm_start_from={sources['keras']}",
      f"--warm_start_map={tmp_path / 'map.json'}"], timeout=120)
  assert result.returncode == 2, result.stderr[-2000:]
  assert "--warm_start_map=" in result.stderr and "Traceback" not in result.stderr
  assert not (tmp_path / "model").exists()


@pytest.mark.slow
@pytest.mark.estimator
@pytest.mark.parametrize("keep, kept", [(2, [4, 6]), (0, [0, 2, 4, 6])])
def test_both_backends_keep_the_same_checkpoints(keep, kept, tmp_path):
  config = dataclasses.replace(CONFIG, model="cnn", train_steps=6, keep_checkpoint_max=keep)
  for backend in ("keras", "estimator"):
    model_dir = _train(backend, config, tmp_path / backend)
    steps = [checkpoints.checkpoint_step(p)[1] for p in checkpoints.find(model_dir)]
    assert steps == kept, backend


@pytest.mark.estimator
def test_retention_is_the_flag_else_the_programs_else_3(monkeypatch):
  assert checkpoints.retention(Config()) == (3, None)
  assert checkpoints.retention(Config(keep_checkpoint_max=0)) == (None, None)
  monkeypatch.syspath_prepend(str(REPO / "docs" / "examples"))
  program = Config(estimator_program="team_program:PROGRAM", model="team_port:SPEC")
  assert checkpoints.retention(program) == (5, None)
  assert checkpoints.retention(dataclasses.replace(program, keep_checkpoint_max=1)) == (1, None)


def test_a_programs_hours_rule_reaches_both_backends(tmp_path, monkeypatch):
  # keep_checkpoint_every_n_hours keeps by wall time, so no run compares its steps: each
  # backend is shown to be given it (the Saver and CheckpointManager apply the same rule).
  (tmp_path / "hourly_program.py").write_text(
      "from trainers.program import EstimatorProgram\n"
      "PROGRAM = EstimatorProgram(model_fn=lambda features, labels, mode: None,\n"
      "                           run_config={'keep_checkpoint_every_n_hours': 2})\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  config = Config(estimator_program="hourly_program:PROGRAM", keep_checkpoint_max=4)
  assert checkpoints.retention(config) == (4, 2)
  steps = types.SimpleNamespace(reporter=None)  # Only the callbacks' list is read.
  saves = keras_trainer.training_callbacks(config, str(tmp_path / "backup"),
                                           str(tmp_path / "model"), True, steps)[1]
  assert saves._retention == (4, 2)  # pylint: disable=protected-access
  if tf.__version__.startswith("2.15"):
    from trainers import estimator_trainer
    assert estimator_trainer._retention(config) == {  # pylint: disable=protected-access
        "keep_checkpoint_max": 4, "keep_checkpoint_every_n_hours": 2}
