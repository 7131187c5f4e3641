"""trainers.optimizers: each tf_keras optimizer steps as its tf.compat.v1.train namesake.

Ten steps of a cosine schedule, with gradients that shrink from 1 to 1e-4 (where an
epsilon shows): the v1 optimizer in a graph session, as the Estimator runs it, the
Keras one eagerly. The matched optimizer must land within 1e-6; the stock one is the
negative control where a setting or override matters, and within 1e-6 where none does.
"""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from trainers import config as config_lib
from trainers import optimizers

STEPS, RATE, DECAY_STEPS = 10, 0.05, 20
_RNG = np.random.default_rng(0)
INITIAL = _RNG.normal(size=(200,)).astype(np.float32)
GRADIENTS = [_RNG.normal(scale=s, size=(200,)).astype(np.float32)
             for s in np.geomspace(1.0, 1e-4, STEPS)]
# How far the stock tf_keras optimizer lands, at least, where it differs.
STOCK_APART = {"momentum": 1e-4, "adam": 1e-5, "rmsprop": 0.1}
# Hyperparameters other than the defaults, each of which the matched optimizer must follow.
OTHER_SETTINGS = {"sgd": {}, "momentum": {"momentum": 0.5},
                  "adagrad": {"initial_accumulator_value": 0.3},
                  "adam": {"beta1": 0.8, "beta2": 0.99, "epsilon": 1e-3},
                  "ftrl": {"learning_rate_power": -0.7, "initial_accumulator_value": 0.2,
                           "l1": 0.001, "l2": 0.01},
                  "rmsprop": {"rho": 0.8, "momentum": 0.5, "epsilon": 1e-4}}


def hyperparameters(name, changes=None):
  """The optimizer's hyperparameters but the learning rate: its defaults, then `changes`."""
  defaults = {k: v for k, v in config_lib.OPTIMIZER_DEFAULTS[name].items() if k != "learning_rate"}
  return {**defaults, **(changes or {})}


def v1_steps(make) -> np.ndarray:
  with tf.Graph().as_default():
    variable = tf.compat.v1.get_variable("w", initializer=INITIAL, use_resource=True)
    step = tf.compat.v1.train.get_or_create_global_step()
    gradient = tf.compat.v1.placeholder(tf.float32, INITIAL.shape)
    rate = tf.compat.v1.train.cosine_decay(RATE, step, DECAY_STEPS)
    update = make(rate).apply_gradients([(gradient, variable)], global_step=step)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for value in GRADIENTS:
        session.run(update, {gradient: value})
      return session.run(variable)


def _keras(make) -> np.ndarray:
  variable = tf.Variable(INITIAL)
  optimizer = make(tf_keras.optimizers.schedules.CosineDecay(RATE, DECAY_STEPS))
  for value in GRADIENTS:
    optimizer.apply_gradients([(tf.constant(value), variable)])
  return variable.numpy()


def test_every_optimizer_has_its_three_ways_and_its_defaults():
  assert sorted(optimizers.PAIRS) == sorted(config_lib.OPTIMIZER_DEFAULTS)


@pytest.mark.parametrize("name", sorted(optimizers.PAIRS))
def test_the_matched_keras_optimizer_steps_as_v1_and_the_stock_one_where_it_must_not(name):
  pair, settings = optimizers.PAIRS[name], hyperparameters(name)
  want = v1_steps(lambda rate: pair.v1(rate, **settings))
  assert np.max(np.abs(want - INITIAL)) > 0.05  # It trained.
  matched = np.max(np.abs(_keras(lambda rate: pair.keras(rate, **settings)) - want))
  assert matched <= 1e-6, matched
  stock = np.max(np.abs(_keras(lambda rate: pair.stock(rate, **settings)) - want))
  if name in STOCK_APART:
    assert stock >= STOCK_APART[name], stock
  else:
    assert stock <= 1e-6, stock


@pytest.mark.parametrize("name", sorted(n for n in OTHER_SETTINGS if OTHER_SETTINGS[n]))
def test_the_matched_optimizer_follows_every_hyperparameter(name):
  pair, settings = optimizers.PAIRS[name], hyperparameters(name, OTHER_SETTINGS[name])
  want = v1_steps(lambda rate: pair.v1(rate, **settings))
  defaults = v1_steps(lambda rate: pair.v1(rate, **hyperparameters(name)))
  assert np.max(np.abs(want - defaults)) > 1e-4  # The settings change the steps.
  matched = np.max(np.abs(_keras(lambda rate: pair.keras(rate, **settings)) - want))
  assert matched <= 1e-6, matched


def test_v1_adam_keeps_its_powers_across_steps_and_in_its_variables():
  optimizer = optimizers.V1Adam(0.1)
  variable = tf.Variable([1.0, 2.0])
  for _ in range(3):
    optimizer.apply_gradients([(tf.constant([0.5, -0.5]), variable)])
  powers = {v.name.split("/")[-1].split(":")[0]: v.numpy() for v in optimizer.variables
            if "power" in v.name}
  np.testing.assert_allclose(powers["beta1_power"], 0.9 ** 4, rtol=1e-6)
  np.testing.assert_allclose(powers["beta2_power"], 0.999 ** 4, rtol=1e-6)


def test_v1_rmsprop_resumes_its_mean_square_from_a_checkpoint(tmp_path):
  # Restored before its slots exist, as a resumed run is: the restore fills them when made.
  variable = tf.Variable([1.0, 2.0])
  optimizer = optimizers.V1RMSprop(0.1)
  optimizer.apply_gradients([(tf.constant([0.5, 3.0]), variable)])
  saved = optimizer._velocities[0].numpy()
  assert not np.allclose(saved, 1.0)
  path = tf.train.Checkpoint(variable=variable, optimizer=optimizer).save(str(tmp_path / "c"))
  resumed_variable, resumed = tf.Variable([0.0, 0.0]), optimizers.V1RMSprop(0.1)
  tf.train.Checkpoint(variable=resumed_variable, optimizer=resumed).restore(path)
  resumed.build([resumed_variable])
  np.testing.assert_array_equal(resumed._velocities[0].numpy(), saved)
  # A new one still starts at ones, as v1's does.
  fresh = optimizers.V1RMSprop(0.1)
  fresh.build([tf.Variable([0.0, 0.0])])
  np.testing.assert_array_equal(fresh._velocities[0].numpy(), [1.0, 1.0])


@pytest.mark.parametrize("name", list(config_lib.OPTIMIZER_DEFAULTS))
def test_each_v1_slot_has_its_place_in_the_keras_twin(name, tmp_path):
  # What a v1 optimizer's checkpoint holds besides the weight and the step: <var>/<slot>.
  with tf.Graph().as_default():
    weight = tf.compat.v1.get_variable("w", initializer=tf.ones((3, 2)))
    step = tf.compat.v1.train.get_or_create_global_step()
    config = config_lib.Config(optimizer=name)
    train = optimizers.v1_optimizer(config, 0.1).minimize(tf.reduce_sum(weight ** 2),
                                                          global_step=step)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train)
      path = tf.compat.v1.train.Saver().save(session, str(tmp_path / "ckpt"))
  suffixes = sorted(n[len("w/"):] for n, _ in tf.train.list_variables(path) if n.startswith("w/"))
  assert suffixes == sorted(slot.v1 for slot in optimizers.SLOTS[name])
  variable = tf.Variable(tf.ones((3, 2)))
  slots = optimizers.keras_slots(config, optimizers.keras_optimizer(config, 0.1), [variable])
  # Each one the twin keeps, in the variable's shape; rmsprop's momentum only above 0.
  kept = [s.v1 for s in optimizers.SLOTS[name]
          if not (name == "rmsprop" and s.keras == "_momentums")]
  assert sorted(slots) == sorted(kept)
  assert all(held[0].shape == variable.shape for held in slots.values())
