"""The learning-rate schedules both backends train with (`--learning_rate_schedule`).

The Estimator computes each with the tf.compat.v1.train function of its name on
`global_step`, as a team's `model_fn` did (`v1_rate`); Keras with the tf_keras
`LearningRateSchedule` that gives the same rate, to the bit, at the optimizer's step
(`keras_schedule`): the v1 functions are those classes evaluated in a graph. BERT's linear
warm-up (`--warmup_steps`) goes in front of either, written as BERT's optimization.py
writes it: the rate is step / warmup_steps of the starting rate while step < warmup_steps,
then the schedule's at the unshifted step. Both read the step before it is incremented, so
step 0's rate trains the first step. The settings and their checks are in config.py
(`SCHEDULES`, `Config.validate_schedule`); the reference loop writes each rate out on its
own (launch/proofs/reference.py).
"""

from typing import Any, Dict

import tensorflow as tf
import tf_keras

from trainers.config import Config

_SCHEDULES = tf_keras.optimizers.schedules
# The rate's TensorBoard tag in model_dir, each step's rate, in both backends (the
# project's model_fn writes it, as a team's often did; Keras's reporter too).
SUMMARY_TAG = "learning_rate"


def v1_rate(config: Config, global_step: tf.Tensor) -> tf.Tensor:
  """The rate at `global_step` as a `model_fn` computes it, in the Estimator's graph."""
  rate = _v1_schedule(config, global_step)
  if not config.warmup_steps:
    return rate
  return _warmed_up_rate(rate, global_step, config.initial_learning_rate(), config.warmup_steps)


def _v1_schedule(config: Config, step: tf.Tensor) -> Any:
  name, s = config.learning_rate_schedule, config.schedule_settings()
  initial, decay_steps = config.initial_learning_rate(), config.schedule_steps()
  train = tf.compat.v1.train
  if name == "constant":
    return tf.constant(initial, tf.float32)
  if name == "cosine":
    return train.cosine_decay(initial, step, decay_steps)
  if name == "exponential":
    return train.exponential_decay(initial, step, decay_steps, s["decay_rate"], s["staircase"])
  if name == "inverse_time":
    return train.inverse_time_decay(initial, step, decay_steps, s["decay_rate"], s["staircase"])
  if name == "polynomial":
    return train.polynomial_decay(initial, step, decay_steps, s["end_learning_rate"],
                                  s["power"], s["cycle"])
  boundaries, values = config.piecewise()
  return train.piecewise_constant(step, boundaries, values)


class Constant(_SCHEDULES.LearningRateSchedule):
  """One rate at every step, as a schedule: so every rate Keras trains with is one, and is
  read the same way (the optimizer's `learning_rate` is the rate of its last step)."""

  def __init__(self, rate: float):
    super().__init__()
    self._rate = rate

  def __call__(self, step: tf.Tensor) -> tf.Tensor:
    del step
    return tf.constant(self._rate, tf.float32)

  def get_config(self) -> Dict[str, Any]:
    return {"rate": self._rate}


class WarmUp(_SCHEDULES.LearningRateSchedule):
  """BERT's linear warm-up in front of a Keras schedule (see the module's docstring)."""

  def __init__(self, schedule: _SCHEDULES.LearningRateSchedule, initial: float,
               warmup_steps: int):
    super().__init__()
    self._schedule, self._initial, self._warmup_steps = schedule, initial, warmup_steps

  def __call__(self, step: tf.Tensor) -> tf.Tensor:
    return _warmed_up_rate(self._schedule(step), step, self._initial, self._warmup_steps)

  def get_config(self) -> Dict[str, Any]:
    return {"schedule": _SCHEDULES.serialize(self._schedule), "initial": self._initial,
            "warmup_steps": self._warmup_steps}


def _warmed_up_rate(rate: Any, step: tf.Tensor, initial: float, warmup_steps: int) -> tf.Tensor:
  """BERT's warm-up in front of `rate`, op for op as its optimization.py writes it."""
  global_steps_int = tf.cast(step, tf.int32)
  warmup_steps_int = tf.constant(warmup_steps, dtype=tf.int32)
  warmup_percent_done = (tf.cast(global_steps_int, tf.float32)
                         / tf.cast(warmup_steps_int, tf.float32))
  is_warmup = tf.cast(global_steps_int < warmup_steps_int, tf.float32)
  return (1.0 - is_warmup) * rate + is_warmup * (initial * warmup_percent_done)


def keras_schedule(config: Config) -> _SCHEDULES.LearningRateSchedule:
  """The rate Keras trains with: a `LearningRateSchedule` of the optimizer's step."""
  schedule = _keras_schedule(config)
  if config.warmup_steps:
    return WarmUp(schedule, config.initial_learning_rate(), config.warmup_steps)
  return schedule


def _keras_schedule(config: Config) -> _SCHEDULES.LearningRateSchedule:
  name, s = config.learning_rate_schedule, config.schedule_settings()
  initial, decay_steps = config.initial_learning_rate(), config.schedule_steps()
  if name == "constant":
    return Constant(initial)
  if name == "cosine":
    return _SCHEDULES.CosineDecay(initial, decay_steps)
  if name == "exponential":
    return _SCHEDULES.ExponentialDecay(initial, decay_steps, s["decay_rate"], s["staircase"])
  if name == "inverse_time":
    return _SCHEDULES.InverseTimeDecay(initial, decay_steps, s["decay_rate"], s["staircase"])
  if name == "polynomial":
    return _SCHEDULES.PolynomialDecay(initial, decay_steps, s["end_learning_rate"], s["power"],
                                      s["cycle"])
  boundaries, values = config.piecewise()
  return _SCHEDULES.PiecewiseConstantDecay(boundaries, values)
