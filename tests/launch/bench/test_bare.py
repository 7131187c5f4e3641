"""launch.bench.bare: the ceiling loop writes what the bench reads; the probe times every part."""

import dataclasses
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from launch.bench import bare
from launch.bench import measure as bench_measure
from launch.proofs import reference
from launch.proofs import runs
from trainers import inputs
from trainers import keras_trainer
from trainers import model as model_lib
from trainers.config import Config

CONFIG = Config(train_steps=8, global_batch_size=32, eval_batch_size=50, log_every_steps=2,
                checkpoint_every_steps=4, backup_every_steps=4)


def test_the_ceiling_loop_writes_events_and_a_summary(tiny_data_dir, tmp_path):
  config = dataclasses.replace(CONFIG, data_dir=tiny_data_dir)
  summary = bare.train_ceiling_loop(config, str(tmp_path))
  assert runs.read_summary(str(tmp_path)) == summary
  assert config.keras_steps_per_execution() == 2  # Two steps per call.
  assert summary["global_step"] == 8 and 0 <= summary["test_accuracy"] <= 1
  assert summary["backend"] == "ceiling" and summary["workers"] == 1
  # A loss event every 2 steps, an evaluation every 4: what the bench reads.
  assert [e[0] for e in bench_measure.scalar_events(str(tmp_path), "loss")] == [2, 4, 6, 8]
  assert [e[0] for e in bench_measure.scalar_events(str(tmp_path / "eval"), "accuracy")] == [4, 8]


@pytest.mark.slow
def test_the_probe_times_every_part_under_an_injected_strategy(tiny_data_dir, tmp_path,
                                                              monkeypatch):
  config = dataclasses.replace(CONFIG, data_dir=tiny_data_dir)
  out = tmp_path / "costs.json"
  made, real = [], keras_trainer.training_callbacks

  def training_callbacks(*args):
    callbacks = real(*args)
    made.append((args[1], [type(c).__name__ for c in callbacks]))
    return callbacks

  monkeypatch.setattr(keras_trainer, "training_callbacks", training_callbacks)
  costs = bare.probe_step_costs(config, str(out),
                                strategy=tf.distribute.MirroredStrategy(["/cpu:0"]))
  # One fit ran the trainer's callbacks, saving into a directory of its own, now gone.
  [(backup_dir, names)] = made
  assert names[0] == "StepsCallback" and "_Backup" in names
  assert not os.path.exists(backup_dir) and not os.path.exists(os.path.dirname(backup_dir))
  assert json.loads(out.read_text()) == costs
  assert costs["workers"] == 1 and costs["per_replica_batch"] == 32
  assert costs["steps_per_execution"] == 2
  for part in bare.PARTS:
    assert costs[part]["ms"] > 0 and len(costs[part]["windows"]) == bare.PROBE_WINDOWS, part
    assert costs[part]["steps_per_call"] == (
        2 if part.startswith(("step_k", "keras")) else 1), part


def test_the_ceiling_loops_take_their_windows_in_turn(monkeypatch):
  calls = []
  monkeypatch.setattr(bare, "PROBE_STEPS_PER_WINDOW", 1)
  loops = {name: (lambda name=name: calls.append(name), 1, 1) for name in "abc"}
  costs = bare._interleaved_ms_per_step(loops)
  assert "".join(calls) == "abc" + "abc" + "bca" + "cab" + "abc" + "bca"  # Warm-up, then rounds.
  assert all(len(costs[name]["windows"]) == bare.PROBE_WINDOWS for name in "abc")



@pytest.mark.parametrize("changes", [
    {"optimizer": "adam"}, {"optimizer": "ftrl"},
    # A canned model's two parts, each with its legacy optimizer at a constant rate.
    {"model": "wide_deep", "hidden_units": "16", "dnn_optimizer": "rmsprop"}])
def test_the_ceiling_step_applies_the_runs_optimizer(tiny_data_dir, changes, monkeypatch):
  # Against the reference loop's weights after 4 steps: for adam and ftrl, another rule
  # (momentum, say) ends 1e-2 or more away.
  config = dataclasses.replace(CONFIG, data_dir=tiny_data_dir, train_steps=4, **changes)
  _, expected = reference.train_reference(config, 1)
  input_fn = inputs.default_input_fn(config)
  loops = bare._Loops(config, tf.distribute.get_strategy(), input_fn)
  train = loops.train(1)
  for _ in range(4):
    train()
  got = model_lib.get_weights(loops.step.model)
  assert max(float(np.max(np.abs(got[k] - expected[k]))) for k in expected) < 1e-5
  # The Estimator's graph step, timed without it, builds the same optimizer.
  monkeypatch.setattr(bare, "PROBE_STEPS_PER_WINDOW", 1)
  assert bare._session_step_ms(config, input_fn, warmup_calls=1)["ms"] > 0


@pytest.mark.parametrize("model", ["dnn_v1", "wide_deep_v1"])
def test_a_v1_canned_models_graph_step_trains_with_its_v1_optimizers(tiny_data_dir, model,
                                                                       monkeypatch):
  # As the tf.compat.v1.estimator class builds its train op: each part's
  # tf.compat.v1.train optimizer (Adagrad, Ftrl), not the twin's tf_keras one.
  config = dataclasses.replace(CONFIG, data_dir=tiny_data_dir, model=model, hidden_units="16")
  monkeypatch.setattr(bare, "PROBE_STEPS_PER_WINDOW", 1)
  made = []
  minimize = tf.compat.v1.train.Optimizer.minimize
  monkeypatch.setattr(tf.compat.v1.train.Optimizer, "minimize",
                      lambda self, *args, **kwargs: made.append(type(self).__name__)
                      or minimize(self, *args, **kwargs))
  assert bare._session_step_ms(config, inputs.default_input_fn(config),
                               warmup_calls=1)["ms"] > 0
  assert sorted(made) == (["AdagradOptimizer"] if model == "dnn_v1"
                          else ["AdagradOptimizer", "FtrlOptimizer"]), made
