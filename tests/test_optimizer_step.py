"""The optimizer step teams wrote, in both backends, in this process: every step's rate from
the --learning_rate_schedule (with warm-up), each replica's gradients clipped by
--clip_global_norm before the all-reduce, and the weights where the reference loop ends.

One replica here (memory data), where clipping before or after the all-reduce is the same:
launch.parity's negative control tells the two apart at 2 workers
(tests/launch/proofs/test_parity.py).
"""

import dataclasses
import json

import numpy as np
import pytest

from launch.proofs import reference
from tests.conftest import (assert_ends_where_the_reference_ends, memory_input_fn,
                            trained_weights, with_initial_weights)
from trainers import keras_trainer
from trainers import model_dir as layout
from trainers.config import Config

STEPS = 6


def _config(tmp_path) -> Config:
  return with_initial_weights(Config(
      train_steps=STEPS, global_batch_size=32, eval_batch_size=50, log_every_steps=2,
      checkpoint_every_steps=3, backup_every_steps=2, deterministic=True,
      learning_rate_schedule="piecewise", boundaries="2,4", values="0.2,0.1,0.05",
      warmup_steps=2, clip_global_norm=0.5, record_dir=str(tmp_path / "record")), tmp_path)


def _backend(name):
  if name == "keras":
    return keras_trainer.Backend
  from trainers import estimator_trainer  # noqa: PLC0415 -- needs tf.estimator.
  return estimator_trainer.Backend


@pytest.mark.parametrize("backend", ["keras", pytest.param("estimator",
                                                           marks=pytest.mark.estimator)])
def test_each_step_trains_at_the_schedules_rate_with_clipped_gradients(backend, tmp_path):
  config = _config(tmp_path)
  trained = trained_weights(_backend(backend), config, tmp_path / "model")
  assert_ends_where_the_reference_ends(config, trained)
  with open(tmp_path / "record" / layout.LOSSES_FILE) as f:
    rates = json.load(f)["learning_rates"]
  assert rates == [reference.rate(config, i) for i in range(STEPS)]
  assert rates == pytest.approx([0.0, 0.1, 0.2, 0.1, 0.1, 0.05])
  # The norm clips (else this would prove nothing), and clipping moves the weights.
  clipped = []
  _, unclipped = reference.train_reference(dataclasses.replace(config, clip_global_norm=None),
                                           1, memory_input_fn(config.global_batch_size),
                                           clipped=clipped)
  reference.train_reference(config, 1, memory_input_fn(config.global_batch_size),
                            clipped=clipped)
  assert sum(clipped) >= STEPS // 2, clipped
  assert max(float(np.max(np.abs(trained[n] - unclipped[n]))) for n in trained) > 1e-4
