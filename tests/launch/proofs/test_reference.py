"""launch.proofs.reference: the hand-written loop, checked by hand, and each written-out
update rule against its tf.compat.v1.train optimizer."""

import math
import os

import numpy as np
import pytest
import tensorflow as tf

from launch.proofs import reference
from tests.trainers import test_optimizers
from tests.trainers import test_schedules
from tests.conftest import memory_input_fn
from trainers import optimizers
from trainers import model as model_lib
from trainers.config import Config

CONFIG = Config(train_steps=2, global_batch_size=32, learning_rate=0.1, momentum=0.9)


def _gradients(weights, images, labels):
  model = model_lib.build(Config(seed=0), weights)
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=model(images, training=True)))
  grads = tape.gradient(loss, model.trainable_variables)
  return float(loss), {model_lib.weight_name(v): g.numpy()
                       for v, g in zip(model.trainable_variables, grads)}


@pytest.mark.parametrize("any_batch_size", [False, True])
def test_two_workers_step_on_their_concatenated_batches_with_v1_momentum(any_batch_size):
  input_fn = memory_input_fn(CONFIG.global_batch_size)
  losses, got = reference.train_reference(CONFIG, 2, input_fn=input_fn,
                                          any_batch_size=any_batch_size)
  shards = [iter(input_fn("train", tf.distribute.InputContext(2, i, 2))) for i in range(2)]
  weights = model_lib.get_weights(model_lib.build(CONFIG))
  accum = {n: np.zeros_like(w) for n, w in weights.items()}
  want_losses = []
  for step in range(CONFIG.train_steps):
    batches = [next(s) for s in shards]
    loss, grads = _gradients(weights, tf.concat([b[0] for b in batches], 0),
                             tf.concat([b[1] for b in batches], 0))
    rate = 0.1 * 0.5 * (1 + math.cos(math.pi * step / CONFIG.train_steps))
    for n in weights:
      accum[n] = 0.9 * accum[n] + grads[n]
      weights[n] = weights[n] - rate * accum[n]
    want_losses.append(loss)
  np.testing.assert_allclose(losses, want_losses, rtol=1e-6)
  for n in weights:
    np.testing.assert_allclose(got[n], weights[n], atol=1e-6, err_msg=n)


# Compiled, as the reference runs them, these rules step bit for bit as the v1 kernels; Ftrl's
# powers and RMSProp's square root of a sum round otherwise than the fused kernels do.
BIT_FOR_BIT = {"sgd", "momentum", "adagrad", "adam"}


@pytest.mark.parametrize("name", sorted(reference.UPDATES))
def test_each_written_out_rule_compiled_steps_as_its_v1_optimizer(name):
  settings = test_optimizers.hyperparameters(name, test_optimizers.OTHER_SETTINGS[name])
  pair = optimizers.PAIRS[name]
  want = test_optimizers.v1_steps(lambda rate: pair.v1(rate, **settings))
  update = reference.UPDATES[name]
  variable = tf.Variable(test_optimizers.INITIAL)
  slots = [tf.Variable(s) for s in update.slots(variable, settings)]
  config = Config(train_steps=test_optimizers.STEPS, decay_steps=test_optimizers.DECAY_STEPS,
                  learning_rate=test_optimizers.RATE)
  apply = tf.function(lambda gradient, rate: update.apply(variable, gradient, slots, rate,
                                                          settings))
  for step, gradient in enumerate(test_optimizers.GRADIENTS):
    apply(tf.constant(gradient), tf.constant(reference.rate(config, step), tf.float32))
  np.testing.assert_allclose(variable.numpy(), want, rtol=0,
                             atol=0 if name in BIT_FOR_BIT else 1e-6)


@pytest.mark.parametrize("case", test_schedules.CASES)
def test_each_written_out_schedule_is_v1s_to_the_bit_as_the_estimators_graph_runs_it(case):
  # The v1 functions' own values, in the Estimator's graph; written out, the reference's.
  config = test_schedules.config_of(case)
  want = test_schedules.v1_rates(config)
  got = np.array([reference.rate(config, i) for i in range(test_schedules.STEPS)], np.float32)
  np.testing.assert_array_equal(got, want)


def test_the_reference_computes_with_a_workers_threads_in_a_child_when_this_process_differs(
    tiny_data_dir):
  # Two workers on this machine's cores: each computes with fewer threads than this
  # process, which a child takes instead (issue 66: the threads order a kernel's sums).
  threads = reference.distribute.intra_op_threads(2)
  config = Config(data_dir=tiny_data_dir, train_steps=2, global_batch_size=8, seed=3,
                  clip_global_norm=0.01)
  ours = tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count()
  if ours == threads:
    pytest.skip(f"this process already computes with {threads} intra-op threads")
  child = reference._child(threads)  # pylint: disable=protected-access
  assert child.submit(tf.config.threading.get_intra_op_parallelism_threads).result() == threads
  losses, weights, clipped = reference.train_as_workers(config, 2)
  assert len(losses) == 2 and clipped == [2, 2], clipped  # Both replicas' clipped, each step.
  assert sorted(weights) == sorted(model_lib.get_weights(model_lib.build(config)))
  assert all(np.isfinite(w).all() for w in weights.values())
