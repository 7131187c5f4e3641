"""The task a run trains for (`--task`) and its head, as a canned Estimator's head has it:
the labels, the model's output width, each example's loss, the metrics evaluation reports,
the predictions and the outputs of the serving signatures.

| --task | label | logits | loss | tensorflow_estimator head |
| --- | --- | --- | --- | --- |
| multiclass | the digit | 10 | softmax cross-entropy | `MultiClassHead(10)` |
| binary:D | 1 if the digit is D, else 0 | 1 | sigmoid cross-entropy | `BinaryClassHead()` |
| regression | the image's ink, the mean of its pixels | 1 | squared error | `RegressionHead()` |

Each head's metrics (`METRIC_KEYS`) are the head's own: the Estimator evaluates with the
head itself (`estimator_head`), Keras with `keras_metrics`, the same Keras metric classes the
TF2 heads update, fed the same values (class ids, the logistic, the labels), so both report
the same names and values. Their `loss` is the per-example mean (trainers/evaluation.py).
A `tf.compat.v1.estimator` canned class's head (`v1`) reports the same keys from
`tf.compat.v1.metrics`: of those only its AUCs are computed otherwise, as
trainers/v1_metrics.py computes `tf.compat.v1.metrics.auc`.

A spec's `build` makes the head's width when it takes `outputs` (`build(seed, init,
outputs=1)`); `trainers/model.py` passes it and checks the model's output.
"""

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf
import tf_keras

from data import mnist
from trainers import v1_metrics
from trainers.config import BINARY, MULTICLASS, REGRESSION, Config, parse_task

# tensorflow_estimator's metric_keys.MetricKeys, each head's, sorted as its results are.
METRIC_KEYS = {
    MULTICLASS: ("accuracy", "average_loss", "loss"),
    BINARY: ("accuracy", "accuracy_baseline", "auc", "auc_precision_recall", "average_loss",
             "label/mean", "loss", "precision", "prediction/mean", "recall"),
    REGRESSION: ("average_loss", "label/mean", "loss", "prediction/mean"),
}
# The serving methods, by the export output the head gives a signature.
CLASSIFY, REGRESS, PREDICT = "classify", "regress", "predict"


@tf_keras.utils.register_keras_serializable(package="trainers")
class HeadMetric(tf_keras.metrics.Metric):
  """One of a head's metrics in Keras, `key` of `--task=task`, updated from (labels,
  logits) as the head updates its own. Registered: a SavedModel compiled with it loads in
  `tf_keras.models.load_model` once this module is imported."""

  def __init__(self, task: str, key: str, v1: bool = False, vocabulary: Sequence[str] = (),
               name: Optional[str] = None, dtype=None):
    super().__init__(name=name or key, dtype=dtype)
    self._task, self._key, self._v1, self._vocabulary = task, key, v1, tuple(vocabulary)
    self._metric, self._update = Head(*parse_task(task), v1=v1,
                                      vocabulary=self._vocabulary)._metric(key)

  def update_state(self, y_true, y_pred, sample_weight=None):
    weights = (None if sample_weight is None
               else tf.reshape(tf.cast(sample_weight, tf.float32), [-1, 1]))
    return self._metric.update_state(**self._update(y_true, y_pred, weights))

  def result(self):
    return self._metric.result()

  def reset_state(self):
    self._metric.reset_state()

  def get_config(self):
    return {**super().get_config(), "task": self._task, "key": self._key, "v1": self._v1,
            "vocabulary": list(self._vocabulary)}


@tf_keras.utils.register_keras_serializable(package="trainers")
class HeadLoss(tf_keras.losses.Loss):
  """The head's loss of `--task=task` with a label `vocabulary`, taking string labels (the
  head looks each up, as the canned head's table does). Registered, as `HeadMetric`."""

  def __init__(self, task: str, vocabulary: Sequence[str], **kwargs):
    super().__init__(**{"name": "loss", **kwargs})
    self._task, self._vocabulary = task, tuple(vocabulary)
    self._head = Head(*parse_task(task), vocabulary=self._vocabulary)

  def call(self, y_true, y_pred):
    return self._head.loss(y_true, y_pred)

  def get_config(self):
    return {**super().get_config(), "task": self._task, "vocabulary": list(self._vocabulary)}


class _Baseline(tf_keras.metrics.Mean):
  """`accuracy_baseline`: the accuracy of always predicting the more frequent class, from the
  labels' mean, as BinaryClassHead computes it (max(total, count - total) / count)."""

  def result(self):
    return tf.math.divide_no_nan(tf.maximum(self.total, self.count - self.total), self.count)


@dataclasses.dataclass(frozen=True)
class Head:
  """A task's head (see the module docstring). `positive`: binary's digit D; `v1`: a
  `tf.compat.v1.estimator` canned class's head, whose metrics are `tf.compat.v1.metrics`;
  `vocabulary`: a classifier's label_vocabulary, the labels and the served classes as its
  strings."""

  kind: str
  positive: Optional[int] = None
  v1: bool = False
  vocabulary: Tuple[str, ...] = ()

  @property
  def logits_dimension(self) -> int:
    return mnist.NUM_CLASSES if self.kind == MULTICLASS else 1

  @property
  def metric_keys(self) -> Tuple[str, ...]:
    return METRIC_KEYS[self.kind]

  def label(self, image: tf.Tensor, digit: tf.Tensor) -> tf.Tensor:
    """One example's label for the task, from its scaled image and its digit: the class
    (its string in the vocabulary), or the regression's target."""
    if self.kind == REGRESSION:
      return tf.reduce_mean(image)
    label = tf.cast(tf.equal(digit, self.positive), tf.int64) if self.kind == BINARY else digit
    return tf.gather(tf.constant(self.vocabulary), label) if self.vocabulary else label

  def _class_ids(self, labels: tf.Tensor) -> tf.Tensor:
    """String labels as their classes' ids, the vocabulary's positions, as the head's
    lookup table gives them; an error for a label outside it."""
    found = tf.equal(labels, tf.constant(self.vocabulary)[tf.newaxis, :])
    known = tf.debugging.assert_equal(
        tf.reduce_any(found, axis=-1), True,
        message="a label outside --label_vocabulary")
    with tf.control_dependencies([known]):
      return tf.argmax(tf.cast(found, tf.int64), axis=-1, output_type=tf.int64)[:, tf.newaxis]

  def _labels(self, labels: tf.Tensor) -> tf.Tensor:
    """Labels as the head processes them: int64 (B, 1) ids, float32 (B, 1) otherwise."""
    labels = tf.reshape(labels, [-1, 1])
    if labels.dtype == tf.string:
      labels = self._class_ids(labels)
    return tf.cast(labels, tf.int64 if self.kind == MULTICLASS else tf.float32)

  def _unweighted_loss(self, labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Each example's loss, (B, 1), by the head's own op."""
    labels = self._labels(labels)
    if self.kind == MULTICLASS:
      return tf.expand_dims(tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels=tf.squeeze(labels, -1), logits=logits), -1)
    if self.kind == BINARY:
      return tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.math.squared_difference(logits, labels)

  def loss(self, labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Each example's loss, (B,): a `ModelSpec.loss`."""
    return tf.squeeze(self._unweighted_loss(labels, logits), -1)

  def keras_loss(self, reduction: str) -> tf_keras.losses.Loss:
    """The loss as Keras's own class computes it (an export compiled with one loads in
    `tf_keras.models.load_model`): the same values as `loss`. Keras's classes take no
    string labels: under a vocabulary, `HeadLoss`."""
    if self.vocabulary:
      return HeadLoss(self.task, self.vocabulary, reduction=reduction)
    if self.kind == MULTICLASS:
      return tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                           reduction=reduction)
    if self.kind == BINARY:
      return tf_keras.losses.BinaryCrossentropy(from_logits=True, reduction=reduction)
    return tf_keras.losses.MeanSquaredError(reduction=reduction)

  def predictions(self, logits: tf.Tensor) -> Dict[str, tf.Tensor]:
    """The head's predictions, by the ops it uses; a vocabulary's strings as the classes."""
    if self.kind == REGRESSION:
      return {"predictions": logits}
    every_row = [tf.shape(logits)[0], 1]
    n_classes = max(2, self.logits_dimension)
    class_range = tf.expand_dims(tf.range(n_classes), 0)
    predicted = {"logits": logits}
    if self.kind == BINARY:
      predicted["logistic"] = tf.math.sigmoid(logits)
      logits = tf.concat((tf.zeros_like(logits), logits), axis=-1)
    class_ids = tf.expand_dims(tf.argmax(logits, axis=-1), axis=-1)
    if self.vocabulary:
      names = tf.constant(self.vocabulary)
      classes, all_classes = tf.gather(names, class_ids), names[tf.newaxis, :]
    else:
      classes, all_classes = tf.strings.as_string(class_ids), tf.strings.as_string(class_range)
    return {**predicted,
            "probabilities": tf.nn.softmax(logits),
            "class_ids": class_ids,
            "classes": classes,
            "all_class_ids": tf.tile(class_range, every_row),
            "all_classes": tf.tile(all_classes, every_row)}

  @property
  def signatures(self) -> Dict[str, str]:
    """Each signature of the head's export, by key, and its method."""
    if self.kind == REGRESSION:
      return {"serving_default": REGRESS, "regression": REGRESS, "predict": PREDICT}
    regress = {"regression": REGRESS} if self.kind == BINARY else {}
    return {"serving_default": CLASSIFY, "classification": CLASSIFY, **regress,
            "predict": PREDICT}

  def signature_outputs(self, predicted: Dict[str, tf.Tensor], method: str
                        ) -> Dict[str, tf.Tensor]:
    """A signature's outputs by its method, as TF Serving names them: Classify's `classes`
    and `scores`, Regress's `outputs` (a binary head's logistic), Predict's every
    prediction."""
    if method == CLASSIFY:
      return {"classes": predicted["all_classes"], "scores": predicted["probabilities"]}
    if method == REGRESS:
      return {"outputs": predicted["predictions" if self.kind == REGRESSION else "logistic"]}
    return dict(predicted)

  @property
  def task(self) -> str:
    """The --task of this head."""
    return f"{BINARY}:{self.positive}" if self.kind == BINARY else self.kind

  def keras_metrics(self) -> List[tf_keras.metrics.Metric]:
    """The head's metrics but `loss` (which Keras's compiled loss reports), each of
    `(labels, logits)`: the ten-class head's Keras's own classes, which compute them alike
    and load in `tf_keras.models.load_model` without this module; the others'
    `HeadMetric`s (under a vocabulary the ten-class head's too: Keras's take no strings)."""
    if self.kind == MULTICLASS and not self.vocabulary:
      return [tf_keras.metrics.SparseCategoricalAccuracy("accuracy"),
              tf_keras.metrics.SparseCategoricalCrossentropy("average_loss", from_logits=True)]
    return [HeadMetric(self.task, key, self.v1, self.vocabulary)
            for key in self.metric_keys if key != "loss"]

  def _metric(self, key: str) -> Tuple[tf_keras.metrics.Metric,
                                       Callable[[tf.Tensor, tf.Tensor, Optional[tf.Tensor]],
                                                Dict]]:
    """The Keras metric the head updates as `key`, and its update_state arguments from
    (labels, logits, weights): the same values as the head's. Its weights are each
    example's, (B, 1), with a weight_column; without one 1.0, and ones where it
    broadcasts them."""
    metrics = tf_keras.metrics

    def weighted(value: tf.Tensor, weights: Optional[tf.Tensor], broadcast: bool = True):
      if weights is not None:
        return weights
      return tf.ones_like(value) if broadcast else 1.0

    def mean(of: Callable[[tf.Tensor, tf.Tensor], tf.Tensor], broadcast: bool = True):
      def update(labels, logits, weights):
        value = tf.cast(of(labels, logits), tf.float32)
        return {"values": value, "sample_weight": weighted(value, weights, broadcast)}
      return update

    def ids(labels, logits, weights):
      return {"y_true": self._labels(labels), "y_pred": self.predictions(logits)["class_ids"],
              "sample_weight": weighted(logits, weights, broadcast=False)}

    def logistic(labels, logits, weights):
      value = tf.math.sigmoid(logits)
      return {"y_true": self._labels(labels), "y_pred": value,
              "sample_weight": weighted(value, weights)}

    labels = mean(lambda y, _: self._labels(y))

    def auc(curve: str = "ROC"):
      if not self.v1:
        return metrics.AUC(curve=curve), logistic
      # tf.compat.v1.metrics.auc's trapezoids and epsilons, fed the logistic by this head.
      v1_auc = v1_metrics.Metric("auc", curve=curve).keras_metric(curve, self)
      return v1_auc, lambda y, z, w: {"y_true": y, "y_pred": z, "sample_weight": w}

    made = {
        "average_loss": (metrics.Mean(), mean(self._unweighted_loss, broadcast=False)),
        "accuracy": (metrics.Accuracy(), ids),
        "precision": (metrics.Precision(), ids),
        "recall": (metrics.Recall(), ids),
        "prediction/mean": (metrics.Mean(), mean(lambda _, z: self.predictions(z).get(
            "logistic", z))),
        "label/mean": (metrics.Mean(), labels),
        "accuracy_baseline": (_Baseline(), labels),
        "auc": auc(),
        "auc_precision_recall": auc(curve="PR"),
    }
    if self.kind == REGRESSION:  # Its label mean reads the labels as the input gives them.
      made["label/mean"] = (metrics.Mean(), mean(lambda y, _: y, broadcast=False))
    return made[key]

  def estimator_head(self):
    """The tensorflow_estimator head itself (TensorFlow 2.15: tf.estimator)."""
    if self.kind == MULTICLASS:
      return tf.estimator.MultiClassHead(mnist.NUM_CLASSES)
    if self.kind == BINARY:
      return tf.estimator.BinaryClassHead()
    return tf.estimator.RegressionHead()


DIGITS = Head(MULTICLASS)  # The default task's: a canned classifier of the ten digits.


def head(config: Config) -> Head:
  """The head of the run's --task, a v1 one for a `tf.compat.v1.estimator` canned model."""
  v1 = bool(config.canned_settings()) and config.model.endswith("_v1")
  return Head(*parse_task(config.task), v1=v1, vocabulary=config.class_names())
