"""Test helper: a port's spec serving signatures of its own (`ModelSpec.signatures`), one of
each method the Estimator gives an export output: Classify (`serving_default`, serialized
tf.Examples of `pixels`), Regress (`regression`) and Predict (`predict`, the image tensor).

    --model=tests.signed_port:SPEC
"""

import tensorflow as tf
import tf_keras

from trainers.model import Init, ModelSpec


def build(seed: int, init: Init) -> tf_keras.Model:
  pixels = tf_keras.Input(shape=(28, 28, 1), name="pixels")
  flat = tf_keras.layers.Flatten(name="flatten")(pixels)
  logits = tf_keras.layers.Dense(
      10, name="logits", kernel_initializer=init("logits/kernel", tf_keras.initializers.
                                                 GlorotUniform(seed)),
      bias_initializer=init("logits/bias", "zeros"))(flat)
  return tf_keras.Model(pixels, logits, name="signed_port")


def signatures(model: tf_keras.Model):
  def parse(serialized):
    spec = {"pixels": tf.io.FixedLenFeature([28, 28, 1], tf.float32)}
    return tf.io.parse_example(serialized, spec)["pixels"]

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
  def classify(inputs):
    scores = tf.nn.softmax(model(parse(inputs), training=False))
    classes = tf.broadcast_to(tf.constant([str(i).encode() for i in range(10)]),
                              tf.shape(scores))
    return {"classes": classes, "scores": scores}

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
  def regress(inputs):
    return {"outputs": tf.cast(tf.argmax(model(parse(inputs), training=False), -1),
                               tf.float32)}

  @tf.function(input_signature=[tf.TensorSpec([None, 28, 28, 1], tf.float32, name="pixels")])
  def predict(pixels):
    logits = model(pixels, training=False)
    return {"class_ids": tf.argmax(logits, -1), "logits": logits}

  return {"serving_default": classify, "regression": regress, "predict": predict}


SPEC = ModelSpec("signed_port", build, signatures=signatures)
