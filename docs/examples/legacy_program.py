"""The tf.compat.v1.layers program my_model.py's spec came from, run as it is.

    PYTHONPATH=docs/examples python -m launch.parity --workers=1,2 \\
        --estimator_program=legacy_program:PROGRAM --model=my_model:SPEC \\
        --optimizer=momentum --learning_rate=0.05 --decay_steps=2000

Its model_fn reads `params` (the rate, the dropout, the schedule's length) and reads the
project's MNIST input (images as features): the program names no input_fn. Its variables
keep their names in the port ("legacy/conv/kernel"), so no --assignment_map is needed.
"""

import tensorflow as tf

from trainers.program import EstimatorProgram


def model_fn(features, labels, mode, params):
  """Conv2D(16, 5)-MaxPool-Dense(128)-Dropout-Dense(10), momentum on a cosine schedule."""
  layers = tf.compat.v1.layers
  training = mode == tf.estimator.ModeKeys.TRAIN
  with tf.compat.v1.variable_scope("legacy"):
    x = layers.conv2d(features, 16, 5, activation=tf.nn.relu, name="conv")
    x = layers.max_pooling2d(x, 2, 2, name="pool")
    x = layers.flatten(x, name="flatten")
    x = layers.dense(x, 128, activation=tf.nn.relu, name="hidden")
    x = layers.dropout(x, rate=params["dropout"], training=training, name="dropout")
    logits = layers.dense(x, 10, name="logits")
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions={"classes": tf.argmax(logits, -1)})
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  if mode == tf.estimator.ModeKeys.EVAL:
    return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={
        "accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, -1))})
  global_step = tf.compat.v1.train.get_or_create_global_step()
  rate = tf.compat.v1.train.cosine_decay(params["learning_rate"], global_step,
                                         params["decay_steps"])
  optimizer = tf.compat.v1.train.MomentumOptimizer(rate, momentum=0.9)
  # tf.compat.v1.layers' dropout has no moving statistics, but a team's code keeps this.
  with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
    train_op = optimizer.minimize(loss, global_step=global_step)
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


PROGRAM = EstimatorProgram(
    model_fn=model_fn,
    params={"learning_rate": 0.05, "dropout": 0.4, "decay_steps": 2000},
    deterministic_params={"dropout": 0.0},
)
