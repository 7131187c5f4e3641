"""trainers.schedules: each v1 schedule and its Keras twin give the same rate, to the bit."""

import numpy as np
import pytest
import tensorflow as tf

from trainers import schedules
from trainers.config import Config

# Every schedule, with the settings that change its arithmetic, and BERT's warm-up in front.
CASES = {
    "cosine": {},
    "constant": {"learning_rate_schedule": "constant"},
    "exponential": {"learning_rate_schedule": "exponential", "decay_rate": 0.5,
                    "decay_steps": 7},
    "exponential-staircase": {"learning_rate_schedule": "exponential", "decay_rate": 0.5,
                              "decay_steps": 7, "staircase": True},
    "inverse_time": {"learning_rate_schedule": "inverse_time", "decay_rate": 0.3,
                     "decay_steps": 5},
    "inverse_time-staircase": {"learning_rate_schedule": "inverse_time", "decay_rate": 0.3,
                               "decay_steps": 5, "staircase": True},
    "polynomial": {"learning_rate_schedule": "polynomial", "decay_steps": 40, "power": 2.0},
    "polynomial-cycle": {"learning_rate_schedule": "polynomial", "decay_steps": 40,
                         "end_learning_rate": 0.001, "cycle": True},
    "piecewise": {"learning_rate_schedule": "piecewise", "boundaries": "10,30",
                  "values": "0.1,0.05,0.01"},
    "cosine-warmup": {"warmup_steps": 12},
    "piecewise-warmup": {"learning_rate_schedule": "piecewise", "boundaries": "10,30",
                         "values": "0.1,0.05,0.01", "warmup_steps": 5},
    "exponential-staircase-warmup": {"learning_rate_schedule": "exponential", "decay_rate": 0.5,
                                     "decay_steps": 7, "staircase": True, "warmup_steps": 9},
}
STEPS = 120  # Past every boundary, period, cycle and the end of the decay (train_steps 100).


def config_of(case: str) -> Config:
  config = Config(train_steps=100, **CASES[case])
  config.validate(find_model=False)
  return config


def v1_rates(config: Config) -> np.ndarray:
  """Each step's rate as the Estimator's model_fn computes it, in a graph on global_step."""
  with tf.Graph().as_default():
    step = tf.compat.v1.placeholder(tf.int64, [])
    rate = schedules.v1_rate(config, step)
    with tf.compat.v1.Session() as session:
      return np.array([session.run(rate, {step: i}) for i in range(STEPS)], np.float32)


def keras_rates(config: Config, dtype: tf.DType) -> np.ndarray:
  """Each step's rate as a Keras optimizer computes it: the new ones pass their int64
  iterations, the legacy ones (a canned twin's) cast them to float32 first."""
  schedule = schedules.keras_schedule(config)
  rate = tf.function(lambda step: tf.cast(schedule(step), tf.float32))
  return np.array([rate(tf.constant(i, dtype)).numpy() for i in range(STEPS)], np.float32)


@pytest.mark.parametrize("case", CASES)
def test_the_keras_schedule_gives_the_v1_rate_to_the_bit(case):
  config = config_of(case)
  want = v1_rates(config)
  np.testing.assert_array_equal(keras_rates(config, tf.int64), want)
  np.testing.assert_array_equal(keras_rates(config, tf.float32), want)
  assert len(set(want.tolist())) > (1 if config.learning_rate_schedule != "constant" else 0)


def test_the_warm_up_rises_linearly_then_follows_the_unshifted_schedule():
  rates = v1_rates(config_of("cosine-warmup"))
  plain = v1_rates(config_of("cosine"))
  np.testing.assert_allclose(rates[:12], 0.1 * np.arange(12) / 12, rtol=1e-6)
  np.testing.assert_array_equal(rates[12:], plain[12:])  # Not shifted by the warm-up.
