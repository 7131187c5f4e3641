"""trainers.models.cnn_bn: BatchNorm's moving statistics are trained, saved and compared.

Both backends train it in this process from one initial-weights file, with dropout at 0,
and each must end where the reference loop ends: every weight, the moving mean and
variance included. The negative control is the classic migration bug, a model_fn whose
train op leaves out the layers' updates: its moving statistics never move.
"""

import numpy as np
import pytest
import tensorflow as tf

from launch.tools import harness
from launch.tools import reference
from tests.conftest import memory_input_fn
from trainers import keras_trainer
from trainers import loop
from trainers import model as model_lib
from trainers.config import Config

MOVING = [f"{bn}/{stat}" for bn in ("bn1", "bn2", "bn_hidden")
          for stat in ("moving_mean", "moving_variance")]


def _config(tmp_path) -> Config:
  config = Config(model="cnn_bn", model_options="dropout=0", train_steps=6, global_batch_size=32,
                  eval_batch_size=50, log_every_steps=2, checkpoint_every_steps=3,
                  backup_every_steps=2, deterministic=True)
  path = str(tmp_path / "init.npz")
  model_lib.save_weights_npz(path, model_lib.get_weights(model_lib.build(config)))
  return Config(**{**config.__dict__, "init_weights": path})


def _train(backend, config: Config, model_dir) -> model_lib.Weights:
  summary = loop.train_and_evaluate(backend, config, str(model_dir),
                                    strategy=tf.distribute.MirroredStrategy(["/cpu:0"]),
                                    input_fn=memory_input_fn(config.global_batch_size))
  return harness.backend_weights(backend.name, summary, config)


def _check_against_the_reference(config: Config, trained: model_lib.Weights) -> None:
  _, want = reference.train_reference(config, 1, memory_input_fn(config.global_batch_size))
  assert sorted(trained) == sorted(want)
  initial = model_lib.load_weights_npz(config.init_weights)
  for name in MOVING:
    assert not np.allclose(trained[name], initial[name]), f"{name} never moved"
  diffs = {name: float(np.max(np.abs(trained[name] - value))) for name, value in want.items()}
  assert max(diffs.values()) < 1e-5, diffs


def test_names_include_the_moving_statistics_and_dropout_is_an_option():
  weights = model_lib.get_weights(model_lib.build(Config(model="cnn_bn")))
  assert set(MOVING) <= set(weights) and "conv1/kernel" in weights
  assert not any(name.startswith("dropout") for name in weights)
  rates = {model_lib.build(Config(model="cnn_bn", model_options=o)).get_layer("dropout").rate
           for o in ("", "dropout=0")}
  assert rates == {0.25, 0.0}


def test_keras_updates_the_moving_statistics_as_the_reference_does(tmp_path):
  config = _config(tmp_path)
  _check_against_the_reference(config, _train(keras_trainer.Backend, config, tmp_path / "k"))


@pytest.mark.estimator
def test_the_estimator_runs_update_ops_and_ends_as_the_reference_does(tmp_path):
  from trainers import estimator_trainer  # noqa: PLC0415 -- needs tf.estimator.
  config = _config(tmp_path)
  _check_against_the_reference(config, _train(estimator_trainer.Backend, config,
                                              tmp_path / "e"))


@pytest.mark.estimator
def test_without_update_ops_the_moving_statistics_never_move(tmp_path, monkeypatch):
  # What a model_fn that leaves the layers' updates out of its train op trains:
  # evaluation and serving then normalize with the initial statistics.
  from trainers import estimator_trainer  # noqa: PLC0415 -- needs tf.estimator.
  monkeypatch.setattr(estimator_trainer, "update_ops", lambda model, features: [])
  config = _config(tmp_path)
  trained = _train(estimator_trainer.Backend, config, tmp_path / "e")
  initial = model_lib.load_weights_npz(config.init_weights)
  for name in MOVING:
    np.testing.assert_array_equal(trained[name], initial[name], err_msg=name)
  assert not np.allclose(trained["conv1/kernel"], initial["conv1/kernel"])  # It trained.
