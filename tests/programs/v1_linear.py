"""A team's `tf.compat.v1.estimator.LinearClassifier`, as the converter meets one: a
feature of its own name, the default optimizer (v1 Ftrl), the v1 head's summed loss, on
TFDS MNIST, under MultiWorkerMirroredStrategy when TF_CONFIG names a cluster. It imports
nothing of this project.

    python -m launch.local --workers=2 -- python v1_linear.py --model_dir=DIR \
        --data_dir=TFDS_DIR --train_steps=60
"""

import argparse

import tensorflow as tf
import tensorflow_datasets as tfds

BATCH = 64


def input_fn(data_dir, input_context=None):
  dataset = tfds.load("mnist", split="train", data_dir=data_dir, download=False,
                      as_supervised=True)
  batch = BATCH
  if input_context:
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    batch = input_context.get_per_replica_batch_size(BATCH)
  dataset = dataset.map(
      lambda image, label: ({"pixels": tf.cast(image, tf.float32) / 255.0}, label))
  return dataset.shuffle(10_000, seed=7).repeat().batch(batch, drop_remainder=True)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--data_dir")
  parser.add_argument("--train_steps", type=int, default=60)
  args = parser.parse_args()
  config = tf.estimator.RunConfig(
      model_dir=args.model_dir, save_checkpoints_steps=args.train_steps,
      train_distribute=tf.distribute.MultiWorkerMirroredStrategy())
  estimator = tf.compat.v1.estimator.LinearClassifier(
      n_classes=10, config=config,
      feature_columns=[tf.feature_column.numeric_column("pixels", shape=[28, 28, 1])])
  tf.estimator.train_and_evaluate(
      estimator,
      tf.estimator.TrainSpec(lambda input_context=None: input_fn(args.data_dir, input_context),
                             max_steps=args.train_steps),
      tf.estimator.EvalSpec(lambda: input_fn(args.data_dir), steps=1))


if __name__ == "__main__":
  main()
