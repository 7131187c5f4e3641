"""A spec's own loss and its reduction: both backends train with them as the reference does.

The spec here is the CNN with a label-smoothed cross-entropy, summed over the batch
(as the v1 canned Estimators reduce theirs). Summing makes each gradient the global
batch's size times the mean's, so with v1 momentum a summed run at learning rate r
steps as a mean run at r times the batch size does: that ties the reference's
reduction to arithmetic, and the backends are tied to the reference.
"""

import dataclasses
import json

import numpy as np
import pytest

from data import mnist

from tests.conftest import memory_input_fn, trained_weights, with_initial_weights
from trainers import keras_trainer
from trainers import model as model_lib
from trainers import model_dir as layout
from trainers.config import Config

SPECS = """
import tensorflow as tf
from trainers import model
from trainers.models import cnn

def smoothed(labels, logits):
  targets = 0.9 * tf.one_hot(tf.cast(labels, tf.int32), 10) + 0.01
  return tf.nn.softmax_cross_entropy_with_logits(labels=targets, logits=logits)

SUMMED = model.ModelSpec(name="summed", build=cnn.build, loss=smoothed,
                         loss_reduction=model.SUM)
MEANED = model.ModelSpec(name="meaned", build=cnn.build, loss=smoothed)
"""
BATCH = 32


@pytest.fixture
def config(tmp_path, monkeypatch):
  (tmp_path / "loss_specs.py").write_text(SPECS)
  monkeypatch.syspath_prepend(str(tmp_path))
  return with_initial_weights(Config(
      model="loss_specs:SUMMED", train_steps=4, global_batch_size=BATCH, learning_rate=0.1 / BATCH,
      eval_batch_size=50, log_every_steps=2, checkpoint_every_steps=4, deterministic=True),
      tmp_path)


def _reference(config):
  from launch.proofs import reference  # noqa: PLC0415 -- the tools' layer, above trainers.
  return reference.train_reference(config, 1, memory_input_fn(BATCH))


def test_the_reference_sums_what_the_spec_sums(config):
  summed_losses, summed = _reference(config)
  meaned_losses, meaned = _reference(dataclasses.replace(
      config, model="loss_specs:MEANED", learning_rate=config.learning_rate * BATCH))
  np.testing.assert_allclose(summed_losses, BATCH * np.asarray(meaned_losses), rtol=1e-5)
  for name, value in meaned.items():
    np.testing.assert_allclose(summed[name], value, atol=2e-5, err_msg=name)


def _check_backend(backend, config, tmp_path):
  config = dataclasses.replace(config, record_dir=str(tmp_path / "record"))
  trained = trained_weights(backend, config, tmp_path / "model")
  want_losses, want = _reference(config)
  with open(tmp_path / "record" / layout.LOSSES_FILE) as f:
    np.testing.assert_allclose(json.load(f)["losses"], want_losses, rtol=1e-5)
  assert sorted(trained) == sorted(want)
  for name, value in want.items():
    np.testing.assert_allclose(trained[name], value, atol=1e-5, err_msg=name)


def test_keras_trains_with_the_specs_summed_loss(config, tmp_path):
  _check_backend(keras_trainer.Backend, config, tmp_path)


@pytest.mark.estimator
def test_the_estimator_trains_with_the_specs_summed_loss(config, tmp_path):
  from trainers import estimator_trainer  # noqa: PLC0415 -- needs tf.estimator.
  _check_backend(estimator_trainer.Backend, config, tmp_path)


def test_evaluation_reports_the_mean_of_the_specs_loss(config):
  weights = model_lib.load_weights_npz(config.init_weights)
  metrics = keras_trainer.evaluate_weights(config, weights, memory_input_fn(BATCH))
  model = model_lib.build(config, weights)
  images, labels = next(iter(memory_input_fn(BATCH)(mnist.EVAL).unbatch().batch(1000)))
  want = float(np.mean(model_lib.spec(config).loss(labels, model(images)).numpy()))
  assert metrics["loss"] == pytest.approx(want, rel=1e-5)
