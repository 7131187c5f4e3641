"""The independent reference: a plain GradientTape loop in one process, no strategy.

It takes one step per global batch, made of the N workers' per-replica batches in
worker order, with the update of tf.compat.v1.train.MomentumOptimizer and cosine
decay written out by hand. Each worker's batch goes through the model on its own,
as each replica's does under the strategy: BatchNorm normalizes it with its own
statistics and updates that replica's own moving statistics, and the weights returned
hold their mean over the replicas (what both backends save: a read averages them).
"""

import math
from typing import List, Optional, Tuple

import tensorflow as tf

from data import mnist
from trainers import inputs
from trainers import model as model_lib
from trainers.config import Config


def v1_cosine_rate(config: Config, step: int) -> float:
  """tf.compat.v1.train.cosine_decay's rate at `step` (0-based), written out."""
  done = min(step, config.schedule_steps()) / config.schedule_steps()
  return config.learning_rate * 0.5 * (1 + math.cos(math.pi * done))


def train_reference(config: Config, num_workers: int,
                    input_fn: Optional[inputs.InputFn] = None, *, any_batch_size: bool = False
                    ) -> Tuple[List[float], model_lib.Weights]:
  """Trains `config.train_steps` steps as N workers' data would.

  Args:
    config: hyperparameters (init_weights, seed and data as the backends use them).
    num_workers: how many worker pipelines to read, one batch of each per step.
    input_fn: defaults to the shared MNIST input_fn.
    any_batch_size: compile the step for batches of any size rather than the one it
      is given: the same arithmetic, which Grappler and the kernels order otherwise.
      How far the two end apart is the reference's rounding floor (launch.parity).

  Returns:
    Each step's global-batch loss (before its update) and the final weights.
  """
  inputs.setup_determinism(config)
  input_fn = input_fn or inputs.default_input_fn(config)
  pipelines = [iter(input_fn(mnist.TRAIN, tf.distribute.InputContext(num_workers, i,
                                                                     num_workers)))
               for i in range(num_workers)]
  model = model_lib.build(config, model_lib.initial_weights(config.init_weights))
  model_spec = model_lib.spec(config)
  summed = model_spec.loss_reduction == model_lib.SUM
  variables, statistics = model.trainable_variables, model.non_trainable_variables
  accumulators = [tf.Variable(tf.zeros_like(v)) for v in variables]
  replica_statistics = [[tf.Variable(s) for s in statistics] for _ in pipelines]

  # Compiled, as both backends' steps are: on CPU, Grappler fuses a convolution with its
  # BatchNorm, which rounds otherwise than eager ops do (1.8e-5 apart after 6 steps).
  def step(batches, rate):
    # As each replica does under the strategy: the gradient of its own batch's mean
    # loss over the replicas (or of its sum), then the sum of the replicas' gradients,
    # in worker order.
    replica_losses, replica_gradients = [], []
    for (images, labels), own in zip(batches, replica_statistics):
      for statistic, value in zip(statistics, own):
        statistic.assign(value)
      with tf.GradientTape() as tape:
        logits = model(images, training=True)
        if summed:
          loss = scaled = tf.reduce_sum(model_spec.loss(labels, logits))
        else:
          loss = tf.reduce_mean(model_spec.loss(labels, logits))
          scaled = loss / len(batches)
      replica_gradients.append(tape.gradient(scaled, variables))
      replica_losses.append(loss)
      for statistic, value in zip(statistics, own):
        value.assign(statistic)
    for variable, accumulator, *gradients in zip(variables, accumulators, *replica_gradients):
      accumulator.assign(config.momentum * accumulator + tf.add_n(gradients))
      variable.assign_sub(rate * accumulator)
    # Equal per-replica batches: the mean of their means is the global batch's mean.
    return tf.add_n(replica_losses) / (1 if summed else len(replica_losses))

  signature = None
  if any_batch_size:
    signature = [[tf.nest.map_structure(lambda s: tf.TensorSpec([None, *s.shape[1:]], s.dtype),
                                        p.element_spec) for p in pipelines],
                 tf.TensorSpec([], tf.float32)]
  step = tf.function(step, input_signature=signature)
  losses = []
  for i in range(config.train_steps):
    batches = [next(p) for p in pipelines]
    losses.append(float(step(batches, tf.constant(v1_cosine_rate(config, i), tf.float32))))
  for statistic, *values in zip(statistics, *replica_statistics):
    statistic.assign(tf.add_n(values) / len(values))
  return losses, model_lib.get_weights(model)
