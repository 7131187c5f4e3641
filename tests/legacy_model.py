"""Test helper: an Estimator model_fn written the old way, with the shared model's architecture.

tf.compat.v1.layers in a variable scope name the weights `model/conv2d/kernel`,
`model/dense/kernel`, `model/dense_1/kernel`, ...: a checkpoint that
launch.convert maps onto the shared model only through an assignment map.
Optimizer, schedule and loss are trainers.estimator_trainer.make_model_fn's.
"""

import os
from typing import Dict

import tensorflow as tf

from data import mnist
from data.mnist import pipeline
from trainers import serving
from trainers.config import Config

ASSIGNMENT_MAP: Dict[str, str] = {
    "model/conv2d/kernel": "conv/kernel",
    "model/conv2d/bias": "conv/bias",
    "model/dense/kernel": "hidden/kernel",
    "model/dense/bias": "hidden/bias",
    "model/dense_1/kernel": "logits/kernel",
    "model/dense_1/bias": "logits/bias",
}


def make_legacy_model_fn(config: Config):
  """Conv2D(32, 3, relu)-MaxPool-Flatten-Dense(64, relu)-Dense(10), v1 layers, v1 momentum."""

  def model_fn(features, labels, mode):
    with tf.compat.v1.variable_scope("model"):
      x = tf.compat.v1.layers.conv2d(features, 32, 3, activation=tf.nn.relu)
      x = tf.compat.v1.layers.max_pooling2d(x, 2, 2)
      x = tf.compat.v1.layers.flatten(x)
      x = tf.compat.v1.layers.dense(x, 64, activation=tf.nn.relu)
      logits = tf.compat.v1.layers.dense(x, mnist.NUM_CLASSES)
    if mode == tf.estimator.ModeKeys.PREDICT:
      predicted = serving.predictions(logits)
      return tf.estimator.EstimatorSpec(
          mode, predictions=predicted, export_outputs=serving.estimator_export_outputs(predicted))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == tf.estimator.ModeKeys.EVAL:
      return tf.estimator.EstimatorSpec(mode, loss=loss)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    learning_rate = tf.compat.v1.train.cosine_decay(
        config.initial_learning_rate(), global_step, config.schedule_steps())
    optimizer = tf.compat.v1.train.MomentumOptimizer(learning_rate,
                                                     config.hyperparameters()["momentum"])
    train_op = optimizer.minimize(loss, global_step=global_step)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  return model_fn


def train_and_export(config: Config, model_dir: str) -> str:
  """Trains the legacy Estimator `config.train_steps` steps; returns its SavedModel's path."""
  estimator = tf.estimator.Estimator(
      make_legacy_model_fn(config), model_dir=model_dir,
      config=tf.estimator.RunConfig(tf_random_seed=config.seed))
  estimator.train(lambda: pipeline.input_fn(mnist.TRAIN, None,
                                            global_batch_size=config.global_batch_size,
                                            data_dir=config.data_dir, seed=config.seed),
                  max_steps=config.train_steps)
  receiver = serving.estimator_receiver_fn(serving.IMAGE, as_dict=False)
  return estimator.export_saved_model(os.path.join(model_dir, "export"), receiver).decode()
