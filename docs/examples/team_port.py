"""The Keras port of team_estimator.py's model_fn, as a spec (docs/MIGRATION.md, "Bring your
model"): the same layers, named, each weight's initializer through `init`.

The port's recipe is given as flags, what the model_fn's optimizer does: `--optimizer=adam
--learning_rate=1e-4 --learning_rate_schedule=constant`. team_map.json maps the program's
variable names (Keras's automatic ones in its graph) to the port's. `signatures` serves what
the program's export serves: its export_outputs, under its receiver's input. `metrics`
declares the program's eval_metric_ops by their tf.compat.v1.metrics functions (its
`accuracy` is the head's own), which Keras then computes as v1 does.
"""

import tensorflow as tf
import tf_keras

from trainers import v1_metrics as v1
from trainers.model import Init, ModelSpec


def build(seed: int, init: Init, dropout: float = 0.3) -> tf_keras.Model:
  layers = tf_keras.layers

  def weights(layer: str, offset: int):
    return {"kernel_initializer": init(f"{layer}/kernel",
                                       tf_keras.initializers.GlorotUniform(seed=seed + offset)),
            "bias_initializer": init(f"{layer}/bias", "zeros")}

  pixels = tf_keras.Input(shape=(28, 28, 1), name="pixels")
  x = layers.Conv2D(16, 5, activation="relu", name="conv", **weights("conv", 0))(pixels)
  x = layers.MaxPooling2D(2, name="pool")(x)
  x = layers.Flatten(name="flatten")(x)
  x = layers.Dense(64, activation="relu", name="hidden", **weights("hidden", 1))(x)
  x = layers.Dropout(dropout, name="dropout")(x)
  logits = layers.Dense(10, name="logits", **weights("logits", 2))(x)
  return tf_keras.Model(pixels, logits, name="team_port")


def signatures(model: tf_keras.Model):
  """The program's `serving_default`: PredictOutput of classes and probabilities, from a
  batch of images named `pixels`."""

  @tf.function(input_signature=[tf.TensorSpec([None, 28, 28, 1], tf.float32, name="pixels")])
  def serve(pixels):
    logits = model(pixels, training=False)
    return {"classes": tf.argmax(logits, axis=-1), "probabilities": tf.nn.softmax(logits)}

  return {"serving_default": serve}


def true_probability(labels, logits):
  """Each example's probability of its own digit, as the program's `mean_true_probability`
  averages it."""
  return tf.reduce_sum(tf.nn.softmax(logits) * tf.one_hot(labels, 10), axis=-1)


METRICS = {
    "mean_true_probability": v1.Metric("mean", of=true_probability),
    # The head feeds auc one-hot labels and the softmax, as the program does.
    "auc_pr": v1.Metric("auc", curve="PR", summation_method="careful_interpolation"),
    "precision_at_3": v1.Metric("precision_at_k", k=3),
    "mean_per_class_accuracy": v1.Metric("mean_per_class_accuracy", num_classes=10),
}

SPEC = ModelSpec(name="team_port", build=build, options={"dropout": 0.3},
                 deterministic_options={"dropout": 0.0}, signatures=signatures,
                 metrics=METRICS)
