"""An example of bringing your own model: a team's tf.compat.v1.layers model_fn, reused.

    PYTHONPATH=docs/examples python -m trainers.keras_main --workers=2 --model=my_model:SPEC
    PYTHONPATH=docs/examples python -m trainers.estimator_main --model=my_model:SPEC
    PYTHONPATH=docs/examples python -m launch.parity --model=my_model:SPEC

`legacy_forward` is the forward pass of an Estimator model_fn as a team wrote it, with
tf.compat.v1.layers under `variable_scope("legacy")`; only its initializers changed, to
`init(...)`. `LegacyForward` runs it inside a Keras layer through
`track_tf1_style_variables`, which keeps the variables it makes as the layer's weights,
with the names the model_fn gave them ("legacy/conv/kernel"): the Estimator's old
checkpoints and this spec's agree by name. docs/MIGRATION.md, "Bring your model", goes
through it step by step.
"""

import tensorflow as tf
import tf_keras
# tf_keras's own decorator (what tf.compat.v1.keras.utils names with TF_USE_LEGACY_KERAS=1):
# TensorFlow 2.15's tf.compat.v1.keras is the separate keras package, whose decorator
# adds the regularization losses of tf_keras layers to nothing.
from tf_keras.api._v1.keras.utils import track_tf1_style_variables

from trainers.model import Init, ModelSpec


def legacy_forward(images, training, seed: int, init: Init, dropout: float):
  """The model_fn's layers: Conv2D(16, 5)-MaxPool-Dense(128)-Dropout-Dense(10) logits."""
  layers = tf.compat.v1.layers

  def weights(name: str, offset: int):
    return {"kernel_initializer": init(f"legacy/{name}/kernel",
                                       tf.compat.v1.glorot_uniform_initializer(seed=seed + offset)),
            "bias_initializer": init(f"legacy/{name}/bias", "zeros")}

  x = layers.conv2d(images, 16, 5, activation=tf.nn.relu, name="conv", **weights("conv", 0))
  x = layers.max_pooling2d(x, 2, 2, name="pool")
  x = layers.flatten(x, name="flatten")
  x = layers.dense(x, 128, activation=tf.nn.relu, name="hidden", **weights("hidden", 1))
  x = layers.dropout(x, rate=dropout, training=training, seed=seed, name="dropout")
  return layers.dense(x, 10, name="logits", **weights("logits", 2))


class LegacyForward(tf_keras.layers.Layer):
  """`legacy_forward` as a Keras layer: its variables are this layer's weights."""

  def __init__(self, seed: int, init: Init, dropout: float, **kwargs):
    super().__init__(**kwargs)
    self._seed, self._init, self._dropout = seed, init, dropout

  @track_tf1_style_variables
  def call(self, images, training=None):
    # AUTO_REUSE: in the Estimator's graph the model is called more than once, and each
    # call must find the variables the first made (eager Keras reuses them by name anyway).
    with tf.compat.v1.variable_scope("legacy", reuse=tf.compat.v1.AUTO_REUSE):
      return legacy_forward(images, False if training is None else training, self._seed,
                            self._init, self._dropout)


def build(seed: int, init: Init, dropout: float = 0.4) -> tf_keras.Model:
  images = tf_keras.Input(shape=(28, 28, 1), name="image")
  logits = LegacyForward(seed, init, dropout, name="legacy_forward")(images)
  return tf_keras.Model(images, logits, name="legacy_cnn")


SPEC = ModelSpec(name="legacy_cnn", build=build, options={"dropout": 0.4},
                 deterministic_options={"dropout": 0.0})
