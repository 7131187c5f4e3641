"""What each `tf.compat.v1.metrics` function gives on MNIST, against this project's Keras
metric for it (trainers/v1_metrics.py) and Keras's stock metric of the same name: the numbers
behind docs/MIGRATION.md's table of metric definitions (`python -m launch.metric_gaps`).

The default CNN is trained `steps` steps with Keras, then each row's function is fed the
whole test split's labels and logits, batch by batch, as an evaluator feeds it: the v1
function in a graph, this project's metric and Keras's stock one eagerly. A row passes when
this project's metric is within `atol` of the v1 function; the stock metric's gap is
measured, not held to anything: it is what a team that swapped names would see move.
"""

import dataclasses
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf
import tf_keras

from data import mnist
from trainers import heads
from trainers import inputs
from trainers import keras_trainer
from trainers import model as model_lib
from trainers import v1_metrics as v1
from trainers.config import Config

SEVEN = 7  # The binary rows' class: seven against the other digits.
Feed = Callable[[tf.Tensor, tf.Tensor], Tuple[tf.Tensor, ...]]


def _classes(labels, logits):
  return labels, tf.argmax(logits, -1)


def _scores(labels, logits):
  return tf.one_hot(labels, mnist.NUM_CLASSES), tf.nn.softmax(logits)


def _seven_scores(labels, logits):
  return tf.cast(tf.equal(labels, SEVEN), tf.float32), tf.nn.softmax(logits)[:, SEVEN]


def _seven_classes(labels, logits):
  return tf.equal(labels, SEVEN), tf.equal(tf.argmax(logits, -1), SEVEN)


def _true_probability(labels, logits):
  return tf.reduce_sum(tf.nn.softmax(logits) * tf.one_hot(labels, mnist.NUM_CLASSES), -1)


def _logits(labels, logits):
  return labels, logits


@dataclasses.dataclass(frozen=True)
class Row:
  """One function as a team's model_fn called it, and Keras's stock metric of its name."""
  key: str
  metric: v1.Metric
  fed: str  # What it is fed, in words.
  stock: Optional[Callable[[], tf_keras.metrics.Metric]]  # None: Keras has none.
  stock_feed: Optional[Feed] = None  # What the stock metric is fed, if not the same.


def rows() -> List[Row]:
  """The table's rows: every function of trainers/v1_metrics.py, fed as model_fns feed it."""
  metrics, m = tf_keras.metrics, v1.Metric
  return [
      Row("accuracy", m("accuracy", of=_classes), "labels, argmax",
          lambda: metrics.SparseCategoricalAccuracy(), _logits),
      Row("auc", m("auc", of=_scores), "one-hot, softmax", metrics.AUC),
      Row("auc PR", m("auc", of=_scores, curve="PR"), "one-hot, softmax",
          lambda: metrics.AUC(curve="PR")),
      Row("auc PR careful_interpolation",
          m("auc", of=_scores, curve="PR", summation_method="careful_interpolation"),
          "one-hot, softmax", lambda: metrics.AUC(curve="PR")),
      Row("auc minoring", m("auc", of=_scores, summation_method="minoring"),
          "one-hot, softmax", lambda: metrics.AUC(summation_method="minoring")),
      Row("auc, 7 vs rest", m("auc", of=_seven_scores), "is 7, P(7)", metrics.AUC),
      Row("precision, 7 vs rest", m("precision", of=_seven_scores), "is 7, P(7)",
          metrics.Precision),
      Row("precision, 7 vs rest, classes", m("precision", of=_seven_classes),
          "is 7, argmax is 7", metrics.Precision),
      Row("recall, 7 vs rest", m("recall", of=_seven_scores), "is 7, P(7)", metrics.Recall),
      Row("true_positives, 7 vs rest", m("true_positives", of=_seven_scores), "is 7, P(7)",
          metrics.TruePositives),
      Row("false_negatives, 7 vs rest", m("false_negatives", of=_seven_scores), "is 7, P(7)",
          metrics.FalseNegatives),
      Row("sensitivity_at_specificity 0.99",
          m("sensitivity_at_specificity", of=_seven_scores, specificity=0.99), "is 7, P(7)",
          lambda: metrics.SensitivityAtSpecificity(0.99)),
      Row("specificity_at_sensitivity 0.99",
          m("specificity_at_sensitivity", of=_seven_scores, sensitivity=0.99), "is 7, P(7)",
          lambda: metrics.SpecificityAtSensitivity(0.99)),
      Row("precision_at_k 3", m("precision_at_k", of=_logits, k=3), "labels, logits",
          lambda: metrics.Precision(top_k=3), _scores),
      Row("recall_at_k 2", m("recall_at_k", of=_logits, k=2), "labels, logits",
          lambda: metrics.SparseTopKCategoricalAccuracy(2)),
      Row("mean_per_class_accuracy", m("mean_per_class_accuracy", of=_classes, num_classes=10),
          "labels, argmax", None),
      Row("mean_iou", m("mean_iou", of=_classes, num_classes=10), "labels, argmax",
          lambda: metrics.MeanIoU(10)),
      Row("mean_squared_error", m("mean_squared_error", of=_scores), "one-hot, softmax",
          metrics.MeanSquaredError),
      Row("root_mean_squared_error", m("root_mean_squared_error", of=_scores),
          "one-hot, softmax", metrics.RootMeanSquaredError),
      Row("mean_absolute_error", m("mean_absolute_error", of=_scores), "one-hot, softmax",
          metrics.MeanAbsoluteError),
      Row("mean", m("mean", of=_true_probability), "P(label)", metrics.Mean),
      Row("percentage_below 0.5", m("percentage_below", of=_true_probability, threshold=0.5),
          "P(label)", None),
  ]


@dataclasses.dataclass(frozen=True)
class Measured:
  key: str
  fed: str
  v1: float
  ours: float
  stock: Optional[float]
  stock_name: str

  def passed(self, atol: float) -> bool:
    return abs(self.ours - self.v1) <= atol


def predictions(config: Config, steps: int) -> List[Tuple[np.ndarray, np.ndarray]]:
  """The test split's (labels, logits) by eval batch, from the default CNN trained `steps`
  steps with Keras (no strategy)."""
  model = model_lib.build(config)
  model.compile(optimizer=keras_trainer.make_optimizer(config),
                loss=keras_trainer.make_loss(config))
  input_fn = inputs.default_input_fn(config)
  model.fit(input_fn(mnist.TRAIN, None), steps_per_epoch=steps, epochs=1, verbose=0)
  return [(labels.numpy(), model(images, training=False).numpy())
          for images, labels in input_fn(mnist.EVAL, None)]


def _v1_values(batches, table: List[Row]) -> Dict[str, float]:
  """Every row's v1 function, in one graph, updated by each batch as an evaluator does."""
  with tf.Graph().as_default():
    labels = tf.compat.v1.placeholder(tf.int64, [None])
    logits = tf.compat.v1.placeholder(tf.float32, [None, mnist.NUM_CLASSES])
    ops = {row.key: row.metric.estimator_op(heads.DIGITS, labels, logits) for row in table}
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.local_variables_initializer())
      for y, z in batches:
        session.run([update for _, update in ops.values()], {labels: y, logits: z})
      return {k: float(v) for k, v in session.run({k: v for k, (v, _) in ops.items()}).items()}


def measure(batches, table: Optional[List[Row]] = None) -> List[Measured]:
  """Each row on `batches` of (labels, logits): v1's value, this project's, Keras's stock."""
  table = table or rows()
  want = _v1_values(batches, table)
  measured = []
  for row in table:
    ours = row.metric.keras_metric(row.key, heads.DIGITS)
    stock = row.stock() if row.stock else None
    for y, z in batches:
      y, z = tf.constant(y), tf.constant(z)
      ours.update_state(y, z)
      if stock is not None:
        fed = (row.stock_feed or row.metric.of)(y, z)
        stock.update_state(*(fed if isinstance(fed, tuple) else (fed,)))
    measured.append(Measured(row.key, row.fed, want[row.key], float(ours.result()),
                             None if stock is None else float(stock.result()),
                             "none" if stock is None else type(stock).__name__))
  return measured


def format_table(measured: List[Measured], atol: float) -> str:
  rows_ = ["| v1 function, as called | fed | v1 | this project's Keras metric | "
           "Keras's stock metric | stock | stock - v1 |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
  for m in measured:
    ours = f"{m.ours:.7g} ({'PASS' if m.passed(atol) else 'FAIL'}, {abs(m.ours - m.v1):.1g})"
    stock = "-" if m.stock is None else f"{m.stock:.7g}"
    gap = "-" if m.stock is None else f"{m.stock - m.v1:+.2g}"
    rows_.append(f"| {m.key} | {m.fed} | {m.v1:.7g} | {ours} | {m.stock_name} | {stock} | "
                 f"{gap} |")
  return "\n".join(rows_)
