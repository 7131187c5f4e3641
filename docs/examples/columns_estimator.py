"""A team's Estimator program over feature columns: its model_fn, input_fn and receiver.

    PYTHONPATH=docs/examples python -m trainers.estimator_main \\
        --estimator_program=columns_program:PROGRAM --model_dir=/tmp/columns

Its own `model_fn` reads parsed tf.Examples through the v1 feature-column functions a wide
and deep model of its own writes: `tf.compat.v1.feature_column.input_layer` feeds dense
layers (numbers, an indicator, embeddings with two combiners), `linear_model` adds a
wide part's logits (buckets, a vocabulary, a cross, weighted multivalent strings); a v1
Adagrad; an export that parses tf.Examples as its clients send them. Its input reads the
tabular MNIST features (data/mnist/tabular.py stands in for the team's TFRecord files).
`columns_program.py` names it for the project, `columns_port.py` is its Keras port, and
docs/MIGRATION.md, "Feature columns", holds one to the other.
"""

import tensorflow as tf

from data.mnist import pipeline

fc = tf.feature_column
BATCH_PER_WORKER = 100
_CELLS = [f"r{row}c{col}" for row in range(4) for col in range(4)]
_quadrant = fc.categorical_column_with_vocabulary_list(
    "quadrant", ["top_left", "top_right", "bottom_left", "bottom_right"], num_oov_buckets=1)
_strokes = fc.categorical_column_with_vocabulary_list("strokes", _CELLS)
_grid = fc.categorical_column_with_hash_bucket("grid", 500)

WIDE = [
    fc.bucketized_column(fc.numeric_column("ink"), [0.08, 0.12, 0.16, 0.20]),
    _quadrant,
    fc.crossed_column(["quadrant", fc.bucketized_column(fc.numeric_column("center_col"),
                                                        [12.0, 14.0, 16.0])], 40),
    fc.weighted_categorical_column(_strokes, "stroke_ink"),
]
DEEP = [
    fc.numeric_column("ink"),
    fc.numeric_column("height", normalizer_fn=lambda rows: rows / 28.0),
    fc.indicator_column(_quadrant),
    fc.embedding_column(_strokes, 8, combiner="mean"),
    fc.embedding_column(_grid, 6, combiner="sqrtn"),
]
FEATURE_SPEC = fc.make_parse_example_spec(WIDE + DEEP)


def input_fn(mode, input_context=None):
  """Parsed tf.Examples of FEATURE_SPEC and the digits: the train split shuffled and
  repeated, the test split once; each worker reads its shard, 100 examples a step."""
  replicas = input_context.num_replicas_in_sync if input_context else 1
  return pipeline.input_fn(mode, input_context, global_batch_size=BATCH_PER_WORKER * replicas,
                           tabular=FEATURE_SPEC)


def model_fn(features, labels, mode, params):
  """Wide and deep over the columns: dense layers on input_layer, plus linear_model."""
  deep = tf.compat.v1.feature_column.input_layer(features, DEEP)
  for units in params["hidden_units"]:
    deep = tf.compat.v1.layers.dense(deep, units, activation=tf.nn.relu)
  logits = (tf.compat.v1.layers.dense(deep, 10) +
            tf.compat.v1.feature_column.linear_model(features, WIDE, units=10))
  classes = tf.argmax(logits, axis=-1)
  if mode == tf.estimator.ModeKeys.PREDICT:
    predictions = {"classes": classes, "probabilities": tf.nn.softmax(logits)}
    return tf.estimator.EstimatorSpec(
        mode, predictions=predictions,
        export_outputs={"serving_default": tf.estimator.export.PredictOutput(predictions)})
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  if mode == tf.estimator.ModeKeys.EVAL:
    return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={
        "accuracy": tf.compat.v1.metrics.accuracy(labels, classes)})
  optimizer = tf.compat.v1.train.AdagradOptimizer(params["learning_rate"])
  train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def serving_input_receiver_fn():
  """Serving parses serialized tf.Examples of FEATURE_SPEC, as the input does."""
  return tf.estimator.export.build_parsing_serving_input_receiver_fn(FEATURE_SPEC)()


PARAMS = {"learning_rate": 0.05, "hidden_units": [32]}
