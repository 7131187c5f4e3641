"""The independent reference: a plain GradientTape loop in one process, no strategy.

It takes one step per global batch made by concatenating the N workers'
per-replica batches in worker order, with the update of
tf.compat.v1.train.MomentumOptimizer and cosine decay written out by hand.
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
                    input_fn: Optional[inputs.InputFn] = None
                    ) -> Tuple[List[float], model_lib.Weights]:
  """Trains `config.train_steps` steps as N workers' data would.

  Args:
    config: hyperparameters (init_weights, seed and data as the backends use them).
    num_workers: how many worker pipelines to read and concatenate.
    input_fn: defaults to the shared MNIST input_fn.

  Returns:
    Each step's global-batch loss (before its update) and the final weights.
  """
  inputs.setup_determinism(config)
  input_fn = input_fn or inputs.default_input_fn(config)
  pipelines = [iter(input_fn(mnist.TRAIN, tf.distribute.InputContext(num_workers, i,
                                                                     num_workers)))
               for i in range(num_workers)]
  model = model_lib.build_model(config.seed, model_lib.initial_weights(config.init_weights))
  variables = model.trainable_variables
  accumulators = [tf.zeros_like(v) for v in variables]
  losses = []
  for step in range(config.train_steps):
    batches = [next(p) for p in pipelines]
    images = tf.concat([b[0] for b in batches], axis=0)
    labels = tf.concat([b[1] for b in batches], axis=0)
    with tf.GradientTape() as tape:
      logits = model(images, training=True)
      loss = tf.reduce_mean(
          tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    gradients = tape.gradient(loss, variables)
    rate = v1_cosine_rate(config, step)
    for i, (variable, gradient) in enumerate(zip(variables, gradients)):
      accumulators[i] = config.momentum * accumulators[i] + gradient
      variable.assign_sub(rate * accumulators[i])
    losses.append(float(loss))
  return losses, model_lib.get_weights(model)
