"""The input both backends read, bound to a run's settings, and the seeds that make both
read the same batches in the same order."""

from typing import Callable, Optional

import tensorflow as tf

from data import mnist
from data.mnist import pipeline
from trainers.config import Config

InputFn = Callable[[str, Optional[tf.distribute.InputContext]], tf.data.Dataset]


def default_input_fn(config: Config) -> InputFn:
  """The shared MNIST input_fn, bound to the config's batch sizes, data and seed."""

  def input_fn(mode: str, input_context: Optional[tf.distribute.InputContext] = None):
    batch = config.global_batch_size if mode == mnist.TRAIN else config.eval_batch_size
    return pipeline.input_fn(mode, input_context, global_batch_size=batch,
                             data_dir=config.data_dir, seed=config.seed,
                             record_dir=config.record_dir)

  return input_fn


def setup_determinism(config: Config) -> None:
  """Op determinism if asked; the global seed that, with the op seed, fixes the shuffle.

  The Estimator sets the same global seed in its graph through
  RunConfig(tf_random_seed), so both backends read the same batches.
  """
  if config.deterministic:
    tf.config.experimental.enable_op_determinism()
  tf.random.set_seed(config.seed)
