"""The one model both backends train, its weights by name, and the outputs both export."""

from typing import Dict, Mapping, Optional

import numpy as np
import tensorflow as tf
import tf_keras

from data import mnist

Weights = Dict[str, np.ndarray]


def build_model(seed: int, initial_weights: Optional[Mapping[str, np.ndarray]] = None
                ) -> tf_keras.Model:
  """A small CNN: Conv2D(32, 3)-MaxPool-Flatten-Dense(64)-Dense(10) logits.

  Layer names are fixed, so a weight's name ("conv/kernel", ...) is the same
  in Keras and in the Estimator's name-based checkpoints however often the
  model is built in a graph; initializers are seeded per layer so every
  backend and process starts from the same weights.

  Args:
    seed: initializer seed.
    initial_weights: if given, every weight starts from this value instead,
      keyed by `weight_name`. Constant initializers (not a restore) make this
      work the same in eager Keras and in the Estimator's graph.

  Returns:
    An uncompiled Keras model mapping float images (B, 28, 28, 1) to logits (B, 10).
  """

  def init(name: str, offset: Optional[int]) -> tf_keras.initializers.Initializer:
    if initial_weights is not None:
      return tf_keras.initializers.Constant(initial_weights[name])
    if offset is None:
      return tf_keras.initializers.Zeros()
    return tf_keras.initializers.GlorotUniform(seed=seed + offset)

  def weights(layer: str, offset: int) -> Dict[str, tf_keras.initializers.Initializer]:
    return {"kernel_initializer": init(f"{layer}/kernel", offset),
            "bias_initializer": init(f"{layer}/bias", None)}

  layers = tf_keras.layers
  inputs = tf_keras.Input(shape=mnist.IMAGE_SHAPE, name="image")
  x = layers.Conv2D(32, 3, activation="relu", name="conv", **weights("conv", 0))(inputs)
  x = layers.MaxPooling2D(name="pool")(x)
  x = layers.Flatten(name="flatten")(x)
  x = layers.Dense(64, activation="relu", name="hidden", **weights("hidden", 1))(x)
  logits = layers.Dense(mnist.NUM_CLASSES, name="logits", **weights("logits", 2))(x)
  return tf_keras.Model(inputs, logits, name="mnist_cnn")


def weight_name(variable: tf.Variable) -> str:
  """A weight's name in Keras ("conv/kernel:0") and in Estimator checkpoints ("conv/kernel").

  This is the one place the two backends' variables are mapped onto each other.
  """
  return variable.name.split(":")[0]


def get_weights(model: tf_keras.Model) -> Weights:
  return {weight_name(w): w.numpy() for w in model.weights}


def save_weights_npz(path: str, weights: Mapping[str, np.ndarray]) -> None:
  with open(path, "wb") as f:
    np.savez(f, **weights)


def load_weights_npz(path: str) -> Weights:
  with np.load(path) as data:
    return {name: data[name] for name in data.files}


def serving_outputs(logits: tf.Tensor) -> Dict[str, tf.Tensor]:
  """The serving signature's outputs, the same in both backends' SavedModels."""
  return {
      "classes": tf.argmax(logits, axis=-1),
      "probabilities": tf.nn.softmax(logits),
      "logits": logits,
  }


def eval_sums(model: tf_keras.Model, images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
  """[summed cross-entropy, correct predictions, examples] of one test batch.

  Summed over batches and divided by the example count, these give the same
  per-example mean loss and accuracy as Keras `evaluate`.
  """
  logits = model(images, training=False)
  losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
  correct = tf.cast(tf.equal(tf.argmax(logits, -1), labels), tf.float32)
  return tf.stack([tf.reduce_sum(losses), tf.reduce_sum(correct),
                   tf.cast(tf.size(labels), tf.float32)])


def initial_weights(path: Optional[str]) -> Optional[Weights]:
  """The weights in the `.npz` file at `path` (--init_weights), or None to initialize
  from the seed."""
  return load_weights_npz(path) if path else None
