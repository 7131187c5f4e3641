"""trainers.inputs: the shared input_fn bound to a run's batch sizes, and its seeds."""

import numpy as np
import tensorflow as tf

from data import mnist
from trainers import inputs
from trainers.config import Config


def _first_labels(config: Config) -> np.ndarray:
  inputs.setup_determinism(config)
  _, labels = next(iter(inputs.default_input_fn(config)(mnist.TRAIN, None)))
  return labels.numpy()


def test_the_input_is_bound_to_the_batch_sizes_and_the_seed_fixes_the_order(tiny_data_dir):
  config = Config(global_batch_size=32, eval_batch_size=50, data_dir=tiny_data_dir, seed=3)
  input_fn = inputs.default_input_fn(config)
  images, _ = next(iter(input_fn(mnist.TRAIN, None)))
  assert images.shape == (32, 28, 28, 1) and images.dtype == tf.float32
  assert next(iter(input_fn(mnist.EVAL, None)))[0].shape[0] == 50
  first = _first_labels(config)
  assert (_first_labels(config) == first).all()
  other = Config(**{**config.__dict__, "seed": 4})
  assert not (_first_labels(other) == first).all()
