"""`cnn`, the default model: Conv2D(32, 3)-MaxPool-Flatten-Dense(64)-Dense(outputs) logits (10,
or 1 for a binary or regression head)."""

import tf_keras

from data import mnist
from trainers import model


def build(seed: int, init: model.Init, outputs: int = mnist.NUM_CLASSES) -> tf_keras.Model:
  """The CNN, `outputs` logits (the head's width); each layer's kernel seeded by `seed` plus
  its position, biases zero."""
  layers = tf_keras.layers

  def weights(layer: str, offset: int):
    return {"kernel_initializer": init(f"{layer}/kernel",
                                       tf_keras.initializers.GlorotUniform(seed=seed + offset)),
            "bias_initializer": init(f"{layer}/bias", "zeros")}

  inputs = tf_keras.Input(shape=mnist.IMAGE_SHAPE, name="image")
  x = layers.Conv2D(32, 3, activation="relu", name="conv", **weights("conv", 0))(inputs)
  x = layers.MaxPooling2D(name="pool")(x)
  x = layers.Flatten(name="flatten")(x)
  x = layers.Dense(64, activation="relu", name="hidden", **weights("hidden", 1))(x)
  logits = layers.Dense(outputs, name="logits", **weights("logits", 2))(x)
  return tf_keras.Model(inputs, logits, name="mnist_cnn")


SPEC = model.ModelSpec(name="cnn", build=build)
