"""An ordinary team's Estimator program, as it runs before the move to Keras.

    python docs/examples/team_estimator.py --model_dir=/tmp/team --train_steps=1000

Nothing here knows this project: Keras layers inside its own model_fn, a v1 Adam at a
constant rate, its own input_fn (100 examples a worker per step), eval_metric_ops, a hook
that logs each step's loss, a serving receiver and tf.estimator.train_and_evaluate.
`team_program.py` names its parts for the project (`--estimator_program=team_program:PROGRAM`),
`team_port.py` is its Keras port, and docs/MIGRATION.md, "Prove your port", holds one to
the other.
"""

import argparse
import json
import os

import tensorflow as tf
import tensorflow_datasets as tfds
import tf_keras

BATCH_PER_WORKER = 100


def input_fn(mode, input_context=None, data_dir=None):
  """MNIST from TFDS ($TFDS_DATA_DIR): the train split shuffled and repeated, the test split
  once; each worker reads its shard, 100 examples a step."""
  training = mode == tf.estimator.ModeKeys.TRAIN
  dataset = tfds.load("mnist", split="train" if training else "test", data_dir=data_dir,
                      as_supervised=True)
  if input_context is not None:
    dataset = dataset.shard(input_context.num_input_pipelines,
                            input_context.input_pipeline_id)
  dataset = dataset.map(lambda image, label: ({"pixels": tf.cast(image, tf.float32) / 255.0},
                                              label))
  if training:
    dataset = dataset.shuffle(10_000, seed=7).repeat()
  return dataset.batch(BATCH_PER_WORKER, drop_remainder=training).prefetch(2)


class LossLogHook(tf.estimator.SessionRunHook):
  """Appends each step's global step and loss to `<model_dir>/team_hook.jsonl`."""

  def __init__(self, loss, model_dir):
    self._loss, self._path = loss, os.path.join(model_dir, "team_hook.jsonl")

  def before_run(self, run_context):
    return tf.estimator.SessionRunArgs(
        {"step": tf.compat.v1.train.get_global_step(), "loss": self._loss})

  def after_run(self, run_context, run_values):
    with open(self._path, "a") as f:
      # The step read before the update: the one this run trains.
      f.write(json.dumps({"step": int(run_values.results["step"]) + 1,
                          "loss": float(run_values.results["loss"])}) + "\n")


def model_fn(features, labels, mode, params, config):
  """A small convolutional classifier: Keras layers, a v1 Adam, eval_metric_ops, a hook."""
  layers = tf_keras.layers
  model = tf_keras.Sequential([
      layers.Conv2D(16, 5, activation="relu"),
      layers.MaxPooling2D(2),
      layers.Flatten(),
      layers.Dense(64, activation="relu"),
      layers.Dropout(params["dropout"]),
      layers.Dense(10),
  ])
  training = mode == tf.estimator.ModeKeys.TRAIN
  logits = model(features["pixels"], training=training)
  classes = tf.argmax(logits, axis=-1)
  if mode == tf.estimator.ModeKeys.PREDICT:
    predictions = {"classes": classes, "probabilities": tf.nn.softmax(logits)}
    return tf.estimator.EstimatorSpec(
        mode, predictions=predictions,
        export_outputs={"serving_default": tf.estimator.export.PredictOutput(predictions)})
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  if mode == tf.estimator.ModeKeys.EVAL:
    probabilities, one_hot = tf.nn.softmax(logits), tf.one_hot(labels, 10)
    return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={
        "accuracy": tf.compat.v1.metrics.accuracy(labels, classes),
        "mean_true_probability": tf.compat.v1.metrics.mean(
            tf.reduce_sum(probabilities * one_hot, axis=-1)),
        "auc_pr": tf.compat.v1.metrics.auc(one_hot, probabilities, curve="PR",
                                           summation_method="careful_interpolation"),
        "precision_at_3": tf.compat.v1.metrics.precision_at_k(labels, logits, k=3),
        "mean_per_class_accuracy": tf.compat.v1.metrics.mean_per_class_accuracy(
            labels, classes, num_classes=10),
    })
  optimizer = tf.compat.v1.train.AdamOptimizer(params["learning_rate"])
  train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                    training_chief_hooks=[LossLogHook(loss, config.model_dir)])


def serving_input_receiver_fn():
  """Serving takes a batch of 28x28x1 images in [0, 1]."""
  pixels = tf.compat.v1.placeholder(tf.float32, [None, 28, 28, 1], name="pixels")
  return tf.estimator.export.ServingInputReceiver({"pixels": pixels}, {"pixels": pixels})


PARAMS = {"learning_rate": 1e-4, "dropout": 0.3}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--train_steps", type=int, default=1000)
  args = parser.parse_args()
  estimator = tf.estimator.Estimator(
      model_fn, params=PARAMS,
      config=tf.estimator.RunConfig(model_dir=args.model_dir, tf_random_seed=1,
                                    keep_checkpoint_max=5))
  tf.estimator.train_and_evaluate(
      estimator,
      tf.estimator.TrainSpec(lambda input_context=None: input_fn("train", input_context),
                             max_steps=args.train_steps),
      tf.estimator.EvalSpec(lambda: input_fn("eval"), steps=None,
                            exporters=[tf.estimator.LatestExporter(
                                "team", serving_input_receiver_fn)]))


if __name__ == "__main__":
  main()
