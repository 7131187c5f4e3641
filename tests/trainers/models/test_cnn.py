"""trainers.models.cnn: the default model's fixed names and seeded weights."""

import numpy as np
import tensorflow as tf

from trainers import model as model_lib
from trainers.config import Config

NAMES = ["conv/kernel", "conv/bias", "hidden/kernel", "hidden/bias", "logits/kernel",
         "logits/bias"]


def test_names_are_fixed_and_the_seed_fixes_the_weights():
  a, b, c = (model_lib.get_weights(model_lib.build(Config(seed=seed))) for seed in (1, 1, 2))
  assert list(a) == NAMES
  assert all(np.array_equal(a[n], b[n]) for n in NAMES)
  assert not np.array_equal(a["conv/kernel"], c["conv/kernel"])
  # Built again in a graph (as the Estimator does), the names are the same.
  with tf.Graph().as_default():
    assert [model_lib.weight_name(w) for w in model_lib.build(Config(seed=1)).weights] == NAMES
