"""`cnn_bn`: convolutions with BatchNorm, and Dropout before the logits.

Conv2D(32, 3)-BN-ReLU-MaxPool, Conv2D(64, 3)-BN-ReLU-MaxPool, Flatten, Dense(128)-BN-ReLU,
Dropout(`dropout`), Dense(`outputs`) logits (10, or 1 for a binary or regression head). The
convolutions and the hidden layer have no bias (BatchNorm's beta is the shift). BatchNorm's
moving mean and variance are non-trainable weights that training updates: Keras through
the layer's own updates, the Estimator through UPDATE_OPS (estimator_trainer.make_model_fn).
Each replica normalizes with its own batch's statistics; the saved moving statistics are the
mean over the replicas.
"""

import tf_keras

from data import mnist
from trainers import model

BN_MOMENTUM = 0.9  # Keras's 0.99 averages over ~100 steps: too slow for a 1,500-step run.


def build(seed: int, init: model.Init, dropout: float = 0.25,
          outputs: int = mnist.NUM_CLASSES) -> tf_keras.Model:
  """The model, `outputs` logits (the head's width); kernels seeded by `seed` plus their
  position, BatchNorm from 1 and 0."""
  layers = tf_keras.layers

  def kernel(layer: str, offset: int):
    return init(f"{layer}/kernel", tf_keras.initializers.GlorotUniform(seed=seed + offset))

  def batch_norm(x, name: str):
    x = model.batch_normalization(init, name, BN_MOMENTUM)(x)
    return layers.ReLU(name=f"{name}_relu")(x)

  inputs = tf_keras.Input(shape=mnist.IMAGE_SHAPE, name="image")
  x = inputs
  for i, filters in enumerate((32, 64), start=1):
    x = layers.Conv2D(filters, 3, use_bias=False, name=f"conv{i}",
                      kernel_initializer=kernel(f"conv{i}", i - 1))(x)
    x = batch_norm(x, f"bn{i}")
    x = layers.MaxPooling2D(name=f"pool{i}")(x)
  x = layers.Flatten(name="flatten")(x)
  x = layers.Dense(128, use_bias=False, name="hidden", kernel_initializer=kernel("hidden", 2))(x)
  x = batch_norm(x, "bn_hidden")
  x = layers.Dropout(dropout, seed=seed, name="dropout")(x)
  logits = layers.Dense(outputs, name="logits", kernel_initializer=kernel("logits", 3),
                        bias_initializer=init("logits/bias", "zeros"))(x)
  return tf_keras.Model(inputs, logits, name="mnist_cnn_bn")


SPEC = model.ModelSpec(name="cnn_bn", build=build, options={"dropout": 0.25},
                       deterministic_options={"dropout": 0.0})
