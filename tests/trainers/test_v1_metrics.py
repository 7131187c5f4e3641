"""trainers.v1_metrics: each declared metric's Keras twin computes what the
tf.compat.v1.metrics function itself computes, over the same batches and weights, edges
included; the heads feed each what the module's table says; bad declarations are refused."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from trainers import heads
from trainers import v1_metrics as v1
from trainers.config import Config

# Each (labels, predictions) as the function takes them.
_PASS = staticmethod(lambda labels, predictions: (labels, predictions))
# Every function, with arguments off their defaults too; what it is fed ("binary": 0/1
# labels and probabilities; "ids": class ids; "scores10": 10 scores; "values").
CASES = {
    "accuracy": ("ids", {}),
    "mean_per_class_accuracy": ("ids", {"num_classes": 10}),
    "mean_iou": ("ids", {"num_classes": 10}),
    "precision": ("binary_ids", {}),
    "recall": ("binary_ids", {}),
    "true_positives": ("binary_ids", {}),
    "false_positives": ("binary_ids", {}),
    "true_negatives": ("binary_ids", {}),
    "false_negatives": ("binary_ids", {}),
    "auc": ("binary", {}),
    "auc_pr": ("binary", {"curve": "PR"}),
    "auc_pr_careful": ("binary", {"curve": "PR", "summation_method": "careful_interpolation"}),
    "auc_minoring": ("binary", {"summation_method": "minoring", "num_thresholds": 50}),
    "auc_majoring_pr": ("binary", {"curve": "PR", "summation_method": "majoring"}),
    "auc_thresholds": ("binary", {"thresholds": [0.7, 0.2, 0.5]}),
    "sensitivity_at_specificity": ("binary", {"specificity": 0.8}),
    "specificity_at_sensitivity": ("binary", {"sensitivity": 0.6, "num_thresholds": 30}),
    "mean_absolute_error": ("binary", {}),
    "mean_squared_error": ("binary", {}),
    "root_mean_squared_error": ("binary", {}),
    "precision_at_k": ("scores10", {"k": 3}),
    "precision_at_k_class": ("scores10", {"k": 2, "class_id": 4}),
    "recall_at_k": ("scores10", {"k": 1}),
    "recall_at_k_class": ("scores10", {"k": 5, "class_id": 0}),
    "mean": ("values", {}),
    "percentage_below": ("values", {"threshold": 0.25}),
}


def _function(case: str) -> str:
  return next(f for f in sorted(v1.FUNCTIONS, key=len, reverse=True) if case.startswith(f))


def _batch(fed: str, size: int, rng, edge: str = ""):
  """(labels, predictions) or (values,) of one batch: random, or an edge's."""
  if fed == "scores10":
    labels = rng.integers(0, 10, size)
    predictions = rng.normal(size=(size, 10)).astype(np.float32)
    if edge == "ties":  # Equal scores: top_k takes the lower class.
      predictions = np.round(predictions)
    return labels.astype(np.int64), predictions
  if fed == "values":
    values = rng.uniform(size=size).astype(np.float32)
    if edge == "ties":
      values = np.full(size, 0.25, np.float32)
    return (values,)
  labels = rng.integers(0, 10 if fed == "ids" else 2, size)
  if edge == "one_class":
    labels = np.zeros(size, np.int64)
  if fed in ("ids", "binary_ids"):
    predictions = rng.integers(0, 10 if fed == "ids" else 2, size)
    return labels.astype(np.int64), predictions.astype(np.int64)
  predictions = rng.uniform(size=size).astype(np.float32)
  if edge == "ties":  # Exactly at v1's thresholds, and at its ends.
    at = np.float32([(i + 1) / 199 for i in range(198)] + [0.0, 1.0])
    predictions = rng.choice(at, size).astype(np.float32)
  return labels.astype(np.float32), predictions


EDGES = {
    "random": dict(sizes=(64, 37, 100)),
    "weighted": dict(sizes=(64, 37, 100), weights="random"),
    "zero_weights": dict(sizes=(64, 37), weights="zeros_some"),
    "one_class": dict(sizes=(50, 50), edge="one_class"),
    "ties": dict(sizes=(80, 80), edge="ties"),
    "empty_batch": dict(sizes=(40, 0, 40)),
}


def _batches(fed: str, edge: str):
  spec, rng = EDGES[edge], np.random.default_rng(7)
  batches = []
  for size in spec["sizes"]:
    tensors = _batch(fed, size, rng, spec.get("edge", ""))
    weights = None
    if spec.get("weights") == "random":
      weights = rng.uniform(0, 3, size).astype(np.float32)
    elif spec.get("weights") == "zeros_some":
      weights = np.where(rng.uniform(size=size) < 0.5, 0.0, 1.0).astype(np.float32)
    batches.append((tensors, weights))
  return batches


def _declared(case: str) -> v1.Metric:
  fed, args = CASES[case]
  of = (lambda labels, values: values) if fed == "values" else (lambda y, p: (y, p))
  return v1.Metric(_function(case), of=of, **args)


def _v1_value(metric: v1.Metric, batches) -> float:
  """The v1 function itself, in a graph, updated by each batch."""
  head = heads.DIGITS
  fed = batches[0][0]
  with tf.Graph().as_default():
    first = tf.compat.v1.placeholder(tf.as_dtype(fed[0].dtype), [None, *fed[0].shape[1:]])
    second = (tf.compat.v1.placeholder(tf.as_dtype(fed[-1].dtype), [None, *fed[-1].shape[1:]]))
    weights = tf.compat.v1.placeholder(tf.float32, [None])
    weighted = batches[0][1] is not None
    value, update = metric.estimator_op(head, first, second, weights if weighted else None)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.local_variables_initializer())
      for tensors, w in batches:
        feed = {first: tensors[0], second: tensors[-1]}
        if weighted:
          feed[weights] = w
        session.run(update, feed)
      return float(session.run(value))


def _keras_value(metric: v1.Metric, batches) -> float:
  keras = metric.keras_metric("m", heads.DIGITS)
  for tensors, w in batches:
    keras.update_state(tf.constant(tensors[0]), tf.constant(tensors[-1]),
                       None if w is None else tf.constant(w))
  return float(keras.result())


@pytest.mark.parametrize("edge", sorted(EDGES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_metric_in_keras_is_the_v1_functions(case, edge):
  metric = _declared(case)
  batches = _batches(CASES[case][0], edge)
  want, got = _v1_value(metric, batches), _keras_value(metric, batches)
  if np.isnan(want):  # A ratio of nothing (no example at k, or none counted).
    assert np.isnan(got)
  else:
    assert got == pytest.approx(want, abs=1e-7, rel=1e-7)


def test_keras_stock_metrics_of_the_same_names_are_not_all_v1s():
  """The negative control: Keras's PR AUC is not v1's default (trapezoids), and
  Keras's precision thresholds a score where v1 casts it to bool."""
  batches = _batches("binary", "random")
  pr = tf_keras.metrics.AUC(curve="PR")
  precision = tf_keras.metrics.Precision()
  for (labels, predictions), _ in batches:
    pr.update_state(labels, predictions)
    precision.update_state(labels, predictions)
  pass_through = lambda y, p: (y, p)  # noqa: E731
  assert abs(float(pr.result()) - _v1_value(v1.Metric("auc", of=pass_through, curve="PR"),
                                            batches)) > 1e-4
  assert abs(float(precision.result()) - _v1_value(v1.Metric("precision", of=pass_through),
                                                   batches)) > 1e-3


def _head_batches(task: str):
  head = heads.head(Config(task=task))
  rng = np.random.default_rng(3)
  for size in (64, 30):
    logits = (rng.normal(size=(size, head.logits_dimension)) * 2).astype(np.float32)
    if head.kind == "regression":
      labels = rng.uniform(size=size).astype(np.float32)
    else:
      labels = rng.integers(0, max(2, head.logits_dimension), size).astype(np.int64)
    yield labels, logits


HEAD_CASES = [
    ("multiclass", "accuracy", {}), ("multiclass", "auc", {"curve": "PR"}),
    ("multiclass", "precision_at_k", {"k": 3}), ("multiclass", "recall_at_k", {"k": 2}),
    ("multiclass", "mean_per_class_accuracy", {}), ("multiclass", "mean_iou", {}),
    ("multiclass", "mean_squared_error", {}),
    ("binary:3", "precision", {}), ("binary:3", "auc", {}),
    ("binary:3", "specificity_at_sensitivity", {"sensitivity": 0.5}),
    ("binary:3", "mean_per_class_accuracy", {}), ("binary:3", "false_negatives", {}),
    ("regression", "mean_absolute_error", {}), ("regression", "root_mean_squared_error", {}),
]


@pytest.mark.parametrize("task,function,args", HEAD_CASES)
def test_a_head_feeds_each_function_its_tables_tensors(task, function, args):
  """What the head feeds both sides; and the Estimator's labels (B,) and Keras's (B, 1)
  give the same value."""
  head = heads.head(Config(task=task))
  metric = v1.Metric(function, **args)
  metric.check(head)
  batches = list(_head_batches(task))
  with tf.Graph().as_default():
    labels = tf.compat.v1.placeholder(tf.as_dtype(batches[0][0].dtype), [None])
    logits = tf.compat.v1.placeholder(tf.float32, [None, head.logits_dimension])
    value, update = metric.estimator_op(head, labels, logits)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.local_variables_initializer())
      for y, z in batches:
        session.run(update, {labels: y, logits: z})
      want = float(session.run(value))
  keras = metric.keras_metric(function, head)
  for y, z in batches:
    keras.update_state(tf.constant(y[:, None]), tf.constant(z))
  assert float(keras.result()) == pytest.approx(want, abs=1e-7, rel=1e-7)


def test_a_compiled_model_reports_them_under_their_keys(tmp_path):
  inputs = tf_keras.Input((10,))
  model = tf_keras.Model(inputs, inputs)
  declared = {"auc_pr": v1.Metric("auc", curve="PR"), "p_at_2": v1.Metric("precision_at_k", k=2),
              "mean_top": v1.Metric("mean", of=lambda y, z: tf.reduce_max(z, -1))}
  model.compile(metrics=[m.keras_metric(k, heads.DIGITS) for k, m in declared.items()],
                loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  rng = np.random.default_rng(0)
  x, y = rng.normal(size=(50, 10)).astype(np.float32), rng.integers(0, 10, 50)
  got = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
  assert set(declared) < set(got)
  assert got["mean_top"] == pytest.approx(float(np.max(x, -1).mean()), rel=1e-6)
  model.save(str(tmp_path / "m"), save_format="tf")  # Loads back where no `of` is.
  loaded = tf_keras.models.load_model(str(tmp_path / "m"), compile=False)
  loaded.compile(metrics=[declared["auc_pr"].keras_metric("auc_pr", heads.DIGITS)],
                 loss=model.loss)
  again = loaded.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
  assert again["auc_pr"] == pytest.approx(got["auc_pr"])


@pytest.mark.parametrize("make,message", [
    (lambda: v1.Metric("auc_pr"), "is not one this project computes"),
    (lambda: v1.Metric("auc", curv="PR"), "takes no argument 'curv'"),
    (lambda: v1.Metric("auc", curve="pr"), "give \"ROC\" or \"PR\""),
    (lambda: v1.Metric("auc", summation_method="simpson"), "careful_interpolation"),
    (lambda: v1.Metric("auc", num_thresholds=1), "at least 2"),
    (lambda: v1.Metric("precision_at_k"), "needs k="),
    (lambda: v1.Metric("precision_at_k", k=0), "k=0"),
    (lambda: v1.Metric("recall_at_k", k=2.5), "whole number"),
    (lambda: v1.Metric("sensitivity_at_specificity", specificity=1.5), "[0, 1]"),
    (lambda: v1.Metric("mean"), "needs of="),
    (lambda: v1.Metric("accuracy", of="labels"), "give a function"),
])
def test_a_bad_declaration_is_refused_naming_the_fix(make, message):
  with pytest.raises(v1.MetricError, match=None) as raised:
    make()
  assert message in str(raised.value)


@pytest.mark.parametrize("task,metric,message", [
    ("regression", v1.Metric("auc"), "give it of="),
    ("multiclass", v1.Metric("precision"), "binary tasks"),
    ("binary:3", v1.Metric("precision_at_k", k=1), "multiclass tasks"),
    ("multiclass", v1.Metric("precision_at_k", k=11), "give k up to 10"),
    ("multiclass", v1.Metric("recall_at_k", k=1, class_id=10), "give class_id up to 9"),
    ("multiclass", v1.Metric("mean_iou", num_classes=5), "at least 10"),
])
def test_a_metric_the_task_cannot_compute_is_refused(task, metric, message):
  with pytest.raises(v1.MetricError) as raised:
    metric.check(heads.head(Config(task=task)))
  assert message in str(raised.value)
