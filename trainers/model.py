"""The one model both backends train, and the outputs both export."""

from typing import Dict

import tensorflow as tf
import tf_keras

from data import mnist


def build_model(seed: int) -> tf_keras.Model:
  """A small CNN: Conv2D(32, 3)-MaxPool-Flatten-Dense(64)-Dense(10) logits.

  Layer names are fixed so the Estimator's name-based checkpoints are stable
  however often the model is built in a graph; initializers are seeded per
  layer so every backend and process starts from the same weights.

  Args:
    seed: initializer seed.

  Returns:
    An uncompiled Keras model mapping float images (B, 28, 28, 1) to logits (B, 10).
  """

  def kernel_init(offset: int) -> tf_keras.initializers.Initializer:
    return tf_keras.initializers.GlorotUniform(seed=seed + offset)

  layers = tf_keras.layers
  inputs = tf_keras.Input(shape=mnist.IMAGE_SHAPE, name="image")
  x = layers.Conv2D(32, 3, activation="relu", kernel_initializer=kernel_init(0), name="conv")(inputs)
  x = layers.MaxPooling2D(name="pool")(x)
  x = layers.Flatten(name="flatten")(x)
  x = layers.Dense(64, activation="relu", kernel_initializer=kernel_init(1), name="hidden")(x)
  logits = layers.Dense(mnist.NUM_CLASSES, kernel_initializer=kernel_init(2), name="logits")(x)
  return tf_keras.Model(inputs, logits, name="mnist_cnn")


def serving_outputs(logits: tf.Tensor) -> Dict[str, tf.Tensor]:
  """The serving signature's outputs, the same in both backends' SavedModels."""
  return {
      "classes": tf.argmax(logits, axis=-1),
      "probabilities": tf.nn.softmax(logits),
      "logits": logits,
  }
