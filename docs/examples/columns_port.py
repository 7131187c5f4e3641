"""The Keras port of columns_estimator.py's model_fn, as a spec (docs/MIGRATION.md, "Feature
columns"): its columns, unchanged, through the project's twins of `input_layer`
(`columns.DenseFeaturesTwin`) and of `linear_model` (`columns.LinearModelTwin`), which give
the same ids, dense tensors and weight layout; its dense layers named as
`tf.compat.v1.layers.dense` names them, so columns_map.json is short.

The recipe is given as flags, what the model_fn's optimizer does: `--optimizer=adagrad
--learning_rate=0.05 --learning_rate_schedule=constant`. `signatures` serves what the
program's export serves: its PredictOutput, from serialized tf.Examples parsed as the
program's parsing receiver parses them.
"""

import columns_estimator
import tensorflow as tf
import tf_keras

from trainers import columns
from trainers.model import Init, ModelSpec


def build(seed: int, init: Init, hidden_units: str = "32") -> tf_keras.Model:
  inputs = columns.keras_inputs(columns_estimator.FEATURE_SPEC)
  x = columns.DenseFeaturesTwin(columns_estimator.DEEP, name="input_layer",
                                init=columns.seeded(init, seed))(inputs)
  names = [f"dense_{i}" if i else "dense" for i in range(len(hidden_units.split(",")) + 1)]
  for i, units in enumerate(hidden_units.split(",")):
    x = tf_keras.layers.Dense(int(units), activation="relu", name=names[i],
                              **_weights(init, names[i], seed + i))(x)
  logits = tf_keras.layers.Dense(10, name=names[-1], **_weights(init, names[-1], seed + 99))(x)
  wide = columns.LinearModelTwin(columns_estimator.WIDE, 10, name="linear_model", init=init)
  return tf_keras.Model(inputs, tf_keras.layers.Add(name="logits")([logits, wide(inputs)]),
                        name="columns_port")


def _weights(init: Init, layer: str, seed: int):
  return {"kernel_initializer": init(f"{layer}/kernel",
                                     tf_keras.initializers.GlorotUniform(seed=seed)),
          "bias_initializer": init(f"{layer}/bias", "zeros")}


def signatures(model: tf_keras.Model):
  """The program's `serving_default`: PredictOutput of classes and probabilities, from a
  batch of serialized tf.Examples named `examples`."""

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
  def serve(examples):
    logits = model(tf.io.parse_example(examples, columns_estimator.FEATURE_SPEC),
                   training=False)
    return {"classes": tf.argmax(logits, axis=-1), "probabilities": tf.nn.softmax(logits)}

  return {"serving_default": serve}


SPEC = ModelSpec(name="columns_port", build=build, options={"hidden_units": "32"},
                 signatures=signatures)
