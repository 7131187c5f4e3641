"""The tf.compat.v1.train optimizers and the tf_keras optimizers that update as they do.

An Estimator `model_fn` trains with a v1 optimizer; its tf_keras namesake updates
otherwise, and a team that swaps one for the other sees its numbers drift. Each name
here gives the v1 optimizer (`v1`), the tf_keras optimizer set or subclassed to follow
the same update rule (`keras`), and the stock tf_keras one for comparison (`stock`).
`tests/trainers/test_optimizers.py` proves each pair within 1e-6 over 10 scheduled steps, and
measures how far the stock optimizer lands. What differs, and the setting or override
that removes it:

- sgd: nothing.
- momentum: v1 multiplies its accumulator by the current rate; Keras folds each step's
  rate into its velocity, so under a schedule they part (`V1MomentumSGD`).
- adagrad: Keras adds epsilon (1e-7) inside the square root, v1 adds none; next to the
  0.1 initial accumulator it is below float32's resolution (epsilon=0 all the same).
- adam: epsilon 1e-8 in v1, 1e-7 in Keras; v1 computes 1 - beta in float32 and keeps
  beta^t as a running product, Keras takes 1 - beta in double and tf.pow (`V1Adam`).
- ftrl: the same rule and defaults, written with pow where v1's kernel takes sqrt.
- rmsprop: v1 starts its mean square at ones, Keras at zeros; epsilon 1e-10 against
  1e-7 (`V1RMSprop`).

The learning rate is a schedule in both: Keras reads it at `iterations`, v1 at the
global step, the same step.
"""

from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tf_keras

from trainers.config import Config


class V1MomentumSGD(tf_keras.optimizers.SGD):
  """SGD with momentum, updating exactly as tf.compat.v1.train.MomentumOptimizer.

  v1: accum = momentum * accum + grad; var -= lr * accum.
  Keras SGD: velocity = momentum * velocity - lr * grad; var += velocity.
  The two agree while the learning rate is constant; under a schedule, v1
  applies today's rate to the whole accumulator, Keras folds each step's rate
  into the velocity.
  """

  def update_step(self, gradient, variable):
    lr = tf.cast(self.learning_rate, variable.dtype)
    momentum = tf.cast(self.momentum, variable.dtype)
    accum = self.momentums[self._index_dict[self._var_key(variable)]]
    accum.assign(momentum * accum + gradient)
    variable.assign_sub(lr * accum)


class V1Adam(tf_keras.optimizers.Adam):
  """Adam updating exactly as tf.compat.v1.train.AdamOptimizer (epsilon 1e-8).

  v1 keeps beta1^t and beta2^t as variables, multiplied by beta once a step after the
  last weight's update, and computes 1 - beta in float32. Keras takes tf.pow of the
  step and 1 - beta in double: 6e-7 apart after 10 steps even with v1's epsilon.
  """

  def __init__(self, learning_rate: Any = 0.001, epsilon: float = 1e-8, **kwargs):
    super().__init__(learning_rate, epsilon=epsilon, **kwargs)

  def build(self, var_list):
    # tf-keras calls build on every apply_gradients: make the powers once.
    if getattr(self, "_built", False):
      return
    super().build(var_list)
    self._powers = [self.add_variable((), initializer=tf_keras.initializers.Constant(beta),
                                      name=name)
                    for name, beta in (("beta1_power", self.beta_1), ("beta2_power", self.beta_2))]
    self._last_index = len(var_list) - 1

  def update_step(self, gradient, variable):
    dtype = variable.dtype
    lr = tf.cast(self.learning_rate, dtype)
    beta_1, beta_2 = tf.constant(self.beta_1, dtype), tf.constant(self.beta_2, dtype)
    beta_1_power, beta_2_power = self._powers
    index = self._index_dict[self._var_key(variable)]
    m, v = self._momentums[index], self._velocities[index]
    alpha = lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)
    m.assign_add((gradient - m) * (1 - beta_1))
    v.assign_add((tf.square(gradient) - v) * (1 - beta_2))
    variable.assign_sub((m * alpha) / (tf.sqrt(v) + self.epsilon))
    if index == self._last_index:  # Weights update in order: this one is the step's last.
      beta_1_power.assign(beta_1_power * beta_1)
      beta_2_power.assign(beta_2_power * beta_2)


class V1RMSprop(tf_keras.optimizers.RMSprop):
  """RMSprop updating as tf.compat.v1.train.RMSPropOptimizer: the mean square starts at
  ones (Keras: zeros, a first step 3x larger), epsilon 1e-10."""

  def __init__(self, learning_rate: Any = 0.001, epsilon: float = 1e-10, **kwargs):
    super().__init__(learning_rate, epsilon=epsilon, **kwargs)

  def add_variable_from_reference(self, model_variable, variable_name, shape=None,
                                  initial_value=None):
    # The mean square starts at ones as the slot's initial value, not by an assignment
    # after it is made: a restore deferred to the slot's creation would be overwritten.
    if variable_name == "velocity" and initial_value is None:
      initial_value = tf.ones(model_variable.shape, model_variable.dtype)
    return super().add_variable_from_reference(model_variable, variable_name, shape,
                                               initial_value)


class Pair(NamedTuple):
  """One optimizer, each of its three ways, from a learning rate (or schedule) and the
  optimizer's hyperparameters as keywords named as Config's fields."""
  v1: Callable[..., tf.compat.v1.train.Optimizer]
  keras: Callable[..., tf_keras.optimizers.Optimizer]
  stock: Callable[..., tf_keras.optimizers.Optimizer]


def _keras_ftrl(lr: Any, l1: float, l2: float, **kw: float) -> tf_keras.optimizers.Ftrl:
  return tf_keras.optimizers.Ftrl(lr, l1_regularization_strength=l1,
                                  l2_regularization_strength=l2, **kw)


PAIRS: Dict[str, Pair] = {
    "sgd": Pair(tf.compat.v1.train.GradientDescentOptimizer, tf_keras.optimizers.SGD,
                tf_keras.optimizers.SGD),
    "momentum": Pair(tf.compat.v1.train.MomentumOptimizer, V1MomentumSGD,
                     tf_keras.optimizers.SGD),
    "adagrad": Pair(tf.compat.v1.train.AdagradOptimizer,
                    lambda lr, **kw: tf_keras.optimizers.Adagrad(lr, epsilon=0.0, **kw),
                    tf_keras.optimizers.Adagrad),
    "adam": Pair(lambda lr, beta1, beta2, epsilon: tf.compat.v1.train.AdamOptimizer(
                     lr, beta1, beta2, epsilon),
                 lambda lr, beta1, beta2, epsilon: V1Adam(lr, beta_1=beta1, beta_2=beta2,
                                                          epsilon=epsilon),
                 # Keras's own epsilon: what a team gets by swapping the name.
                 lambda lr, beta1, beta2, epsilon: tf_keras.optimizers.Adam(
                     lr, beta_1=beta1, beta_2=beta2)),
    "ftrl": Pair(lambda lr, l1, l2, **kw: tf.compat.v1.train.FtrlOptimizer(
                     lr, l1_regularization_strength=l1, l2_regularization_strength=l2, **kw),
                 _keras_ftrl, _keras_ftrl),
    "rmsprop": Pair(lambda lr, rho, momentum, epsilon: tf.compat.v1.train.RMSPropOptimizer(
                        lr, decay=rho, momentum=momentum, epsilon=epsilon),
                    lambda lr, rho, momentum, epsilon: V1RMSprop(
                        lr, rho=rho, momentum=momentum, epsilon=epsilon),
                    lambda lr, rho, momentum, epsilon: tf_keras.optimizers.RMSprop(
                        lr, rho=rho, momentum=momentum)),
}


def _others(config: Config) -> Dict[str, float]:
  """The optimizer's hyperparameters but the learning rate (a schedule's, given apart)."""
  return {k: v for k, v in config.hyperparameters().items() if k != "learning_rate"}


def v1_optimizer(config: Config, learning_rate: Any) -> tf.compat.v1.train.Optimizer:
  """`config.optimizer` as tf.compat.v1.train makes it (the Estimator's), at `learning_rate`
  (a tensor: the schedule's rate at the global step)."""
  return PAIRS[config.optimizer].v1(learning_rate, **_others(config))


def keras_optimizer(config: Config, learning_rate: Any) -> tf_keras.optimizers.Optimizer:
  """The tf_keras optimizer that updates as `v1_optimizer(config, ...)` does, at
  `learning_rate` (a schedule, read at its `iterations`)."""
  return PAIRS[config.optimizer].keras(learning_rate, **_others(config))


class Slot(NamedTuple):
  """One slot of an optimizer (a value per trainable variable) in both backends."""
  v1: str  # The v1 slot's name: its checkpoint variable is `<variable>/<v1>`.
  keras: str  # The Keras twin's attribute listing it, one per variable in build order.


# Each optimizer's slots, in v1's order. The Keras twin keeps no other state but the step
# and (adam) V1Adam's powers of beta, v1's `beta1_power` and `beta2_power`. Not state,
# though Keras makes them: plain SGD's `momentums` (the last update, which a momentum of 0
# never reads), and RMSprop's `_momentums` only exist when its momentum is not 0 (v1's
# `RMSProp_1` always does: with momentum 0 it too holds the last update, never read).
SLOTS: Dict[str, Tuple[Slot, ...]] = {
    "sgd": (),
    "momentum": (Slot("Momentum", "momentums"),),
    "adagrad": (Slot("Adagrad", "_accumulators"),),
    "adam": (Slot("Adam", "_momentums"), Slot("Adam_1", "_velocities")),
    "ftrl": (Slot("Ftrl", "_accumulators"), Slot("Ftrl_1", "_linears")),
    "rmsprop": (Slot("RMSProp", "_velocities"), Slot("RMSProp_1", "_momentums")),
}


def unread_slots(config: Config) -> List[Tuple[Slot, str]]:
  """The v1 slots the Keras twin does not keep for these settings, as none is ever read,
  and why: rmsprop's momentum, at 0."""
  if config.optimizer == "rmsprop" and config.hyperparameters()["momentum"] == 0:
    return [(SLOTS["rmsprop"][1], "RMSProp's momentum slot, which a momentum of 0 never reads")]
  return []


def kept_slots(config: Config) -> Tuple[str, ...]:
  """The v1 names of the slots both backends keep for these settings."""
  unread = {slot for slot, _ in unread_slots(config)}
  return tuple(slot.v1 for slot in SLOTS[config.optimizer] if slot not in unread)


def keras_slots(config: Config, optimizer: tf_keras.optimizers.Optimizer,
                variables: List[tf.Variable]) -> Dict[str, List[tf.Variable]]:
  """The Keras twin's slots of `variables` (the model's trainable ones) by v1 slot name,
  those `kept_slots` names, built if they are not yet."""
  optimizer.build(variables)  # Creates the slots (a no-op once built).
  index = optimizer._index_dict  # pylint: disable=protected-access
  kept = [slot for slot in SLOTS[config.optimizer] if slot.v1 in kept_slots(config)]
  return {slot.v1: [getattr(optimizer, slot.keras)[index[optimizer._var_key(v)]]  # pylint: disable=protected-access
                    for v in variables] for slot in kept}


def trained_with(state: List[str]) -> Optional[str]:
  """The optimizer whose v1 state these names (slots, `beta1_power`) are, if one is; no
  state at all is plain gradient descent's."""
  for name, slots in SLOTS.items():
    names = {slot.v1 for slot in slots} | ({"beta1_power", "beta2_power"} if name == "adam"
                                           else set())
    if set(state) <= names:
      return name
  return None


def v1_initial_state(config: Config, shapes: Mapping[str, Sequence[int]]
                     ) -> Dict[str, np.ndarray]:
  """`v1_optimizer(config)`'s state as it starts, for float32 variables of these names and
  shapes: each slot by its checkpoint name (`conv/kernel/Adagrad`), and Adam's powers."""
  with tf.Graph().as_default():
    variables = [tf.compat.v1.Variable(tf.zeros(shape), name=name)
                 for name, shape in shapes.items()]
    optimizer = v1_optimizer(config, learning_rate=0.0)
    optimizer.apply_gradients([(tf.zeros_like(v), v) for v in variables])  # Makes the slots.
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())  # The update is not run.
      return {v.op.name: session.run(v) for v in optimizer.variables()}
