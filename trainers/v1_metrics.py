"""The `tf.compat.v1.metrics` a model_fn reports in its `eval_metric_ops`, declared once by
their v1 names and arguments and computed the same way by both backends: the Estimator calls
the v1 function itself, Keras a metric that keeps the same sums and turns them into the value
by v1's formula. A spec declares them (`ModelSpec.metrics`), each under the key its
dashboards read:

    from trainers import v1_metrics as v1

    def true_probability(labels, logits):
      return tf.reduce_sum(tf.nn.softmax(logits) * tf.one_hot(labels, 10), axis=-1)

    SPEC = ModelSpec(..., metrics={
        "auc_pr": v1.Metric("auc", curve="PR", summation_method="careful_interpolation"),
        "precision_at_3": v1.Metric("precision_at_k", k=3),
        "mean_true_probability": v1.Metric("mean", of=true_probability),
    })

Evaluation reports them beside the head's metrics, by both backends, in the eval records,
TensorBoard and summary.json; launch.parity holds each to the other backend's.

What each is fed: `of(labels, logits)` returns what the v1 function takes before `weights`
(`values` for `mean` and `percentage_below`, `(labels, predictions)` for the others), from
each example's label (a (B,) tensor when an example has one) and the model's logits. Without
`of`, the run's head (trainers/heads.py) gives it:

- accuracy, mean_per_class_accuracy, mean_iou: label ids and predicted class ids
  (multiclass, binary; num_classes the head's unless given);
- precision, recall, true/false_positives/negatives: label ids and predicted class ids,
  which v1 casts to bool (binary);
- auc, sensitivity_at_specificity, specificity_at_sensitivity: binary: labels and the
  logistic; multiclass: one-hot labels and the softmax (every class's score against its
  column, a micro average);
- mean_absolute_error, mean_squared_error, root_mean_squared_error: as auc; regression:
  labels and predictions;
- precision_at_k, recall_at_k: label ids and the logits (multiclass);
- mean, percentage_below: `of` must say.

Weights: each example's (a --weight_column's), shaped to what the function is fed.
Not here: the functions whose value is not one number (`*_at_thresholds`, `mean_tensor`),
`average_precision_at_k`, `mean_relative_error` (its normalizer is a tensor) and
`mean_cosine_distance`; an unknown name is refused naming those that are.
"""

from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import tensorflow as tf
import tf_keras

from trainers.config import parse_task

# What a function is fed without `of` (the module docstring's table).
CLASSES, BINARY_CLASSES, SCORES, ERRORS, TOP_K, VALUES = (
    "classes", "binary classes", "scores", "errors", "top k", "values")
REQUIRED = object()  # An argument the v1 function has no default for.
_KEPSILON = 1e-7  # v1's endpoints beyond [0, 1] and its divisions' epsilon at thresholds.

# Each function: what it is fed and its arguments but the tensors, with v1's defaults.
FUNCTIONS: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "accuracy": (CLASSES, {}),
    "mean_per_class_accuracy": (CLASSES, {"num_classes": None}),
    "mean_iou": (CLASSES, {"num_classes": None}),
    "precision": (BINARY_CLASSES, {}),
    "recall": (BINARY_CLASSES, {}),
    "true_positives": (BINARY_CLASSES, {}),
    "false_positives": (BINARY_CLASSES, {}),
    "true_negatives": (BINARY_CLASSES, {}),
    "false_negatives": (BINARY_CLASSES, {}),
    "auc": (SCORES, {"num_thresholds": 200, "curve": "ROC",
                     "summation_method": "trapezoidal", "thresholds": None}),
    "sensitivity_at_specificity": (SCORES, {"specificity": REQUIRED, "num_thresholds": 200}),
    "specificity_at_sensitivity": (SCORES, {"sensitivity": REQUIRED, "num_thresholds": 200}),
    "mean_absolute_error": (ERRORS, {}),
    "mean_squared_error": (ERRORS, {}),
    "root_mean_squared_error": (ERRORS, {}),
    "precision_at_k": (TOP_K, {"k": REQUIRED, "class_id": None}),
    "recall_at_k": (TOP_K, {"k": REQUIRED, "class_id": None}),
    "mean": (VALUES, {}),
    "percentage_below": (VALUES, {"threshold": REQUIRED}),
}
_TASKS = {CLASSES: ("multiclass", "binary"), BINARY_CLASSES: ("binary",),
          SCORES: ("multiclass", "binary"), ERRORS: ("multiclass", "binary", "regression"),
          TOP_K: ("multiclass",), VALUES: ("multiclass", "binary", "regression")}
SUMMATIONS = ("trapezoidal", "careful_interpolation", "minoring", "majoring")


class MetricError(ValueError):
  """A declared metric that cannot be computed: the message names it and the fix."""


def _whole(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_arg(arg: str, value: Any) -> Optional[str]:
  """What is wrong with one argument's value, or None."""
  if arg == "num_thresholds" and not (_whole(value) and value >= 2):
    return "a whole number of at least 2"
  if arg == "k" and not (_whole(value) and value >= 1):
    return "a whole number of at least 1"
  if arg == "class_id" and not (value is None or (_whole(value) and value >= 0)):
    return "a class's id, a whole number from 0"
  if arg == "num_classes" and not (value is None or (_whole(value) and value >= 2)):
    return "a whole number of at least 2"
  if arg in ("specificity", "sensitivity") and not (_number(value) and 0 <= value <= 1):
    return "a number in [0, 1]"
  if arg == "threshold" and not _number(value):
    return "a number"
  if arg == "curve" and value not in ("ROC", "PR"):
    return "\"ROC\" or \"PR\""
  if arg == "summation_method" and value not in SUMMATIONS:
    return " or ".join(f"\"{s}\"" for s in SUMMATIONS)
  if arg == "thresholds" and not (value is None or (
      isinstance(value, (list, tuple)) and value
      and all(_number(t) and 0 <= t <= 1 for t in value))):
    return "a list of numbers in [0, 1]"
  return None


class Metric:
  """A `tf.compat.v1.metrics` function (`function`, its name there) with its arguments but
  the tensors, fed what `of(labels, logits)` returns (the module docstring); MetricError,
  naming the fix, for an unknown function or argument or a bad value."""

  def __init__(self, function: str, of: Optional[Callable[..., Any]] = None, **args: Any):
    if function not in FUNCTIONS:
      raise MetricError(f"tf.compat.v1.metrics.{function} is not one this project computes "
                        f"in both backends; it computes {', '.join(sorted(FUNCTIONS))}.")
    self.function, self.of = function, of
    self.view, defaults = FUNCTIONS[function]
    unknown = sorted(set(args) - set(defaults))
    if unknown:
      raise MetricError(f"tf.compat.v1.metrics.{function} takes no argument {unknown[0]!r}; "
                        f"it takes {', '.join(defaults) or 'only the tensors and weights'}"
                        f"{' and of=' if self.view != VALUES else ''}.")
    missing = [a for a, d in defaults.items() if d is REQUIRED and a not in args]
    if missing:
      raise MetricError(f"tf.compat.v1.metrics.{function} needs {missing[0]}=: give it.")
    for arg, value in args.items():
      wrong = _check_arg(arg, value)
      if wrong:
        raise MetricError(f"tf.compat.v1.metrics.{function}({arg}={value!r}): give {wrong}.")
    if of is not None and not callable(of):
      raise MetricError(f"tf.compat.v1.metrics.{function}(of={of!r}): give a function "
                        f"of(labels, logits).")
    if of is None and self.view == VALUES:
      raise MetricError(f"tf.compat.v1.metrics.{function} needs of=: a function of (labels, "
                        f"logits) that returns the values it averages.")
    self.args: Dict[str, Any] = {**defaults, **args}

  def __repr__(self) -> str:
    given = [f"{k}={v!r}" for k, v in self.args.items() if v is not None]
    return f"Metric({self.function!r}{''.join(', ' + g for g in given)})"

  def check(self, head) -> None:
    """MetricError unless the run's head can feed it (without `of`) and its classes fit."""
    if self.of is not None:
      return
    kind = head.kind
    if kind not in _TASKS[self.view]:
      raise MetricError(f"tf.compat.v1.metrics.{self.function} is fed {self.view} "
                        f"({', '.join(_TASKS[self.view])} tasks), and --task={head.task} has "
                        f"none: give it of=, or declare it only for those tasks.")
    classes = max(2, head.logits_dimension)
    for arg in ("k", "class_id"):
      value = self.args.get(arg)
      limit = classes if arg == "k" else classes - 1
      if value is not None and value > limit:
        raise MetricError(f"tf.compat.v1.metrics.{self.function}({arg}={value}): --task="
                          f"{head.task} has {classes} classes; give {arg} up to {limit}.")
    if (self.args.get("num_classes") or classes) < classes:
      raise MetricError(f"tf.compat.v1.metrics.{self.function}(num_classes="
                        f"{self.args['num_classes']}): --task={head.task} has {classes} "
                        f"classes; give at least {classes}, or leave it out.")

  def inputs(self, head, labels: tf.Tensor, logits: tf.Tensor) -> Dict[str, tf.Tensor]:
    """The tensors the v1 function takes (`labels` and `predictions`, or `values`)."""
    labels = one_per_example(labels)
    if self.of is not None:
      made = self.of(labels, logits)
      if self.view == VALUES:
        return {"values": made}
      return dict(zip(("labels", "predictions"), made))
    if self.view in (CLASSES, BINARY_CLASSES):
      return {"labels": tf.reshape(head._labels(labels), [-1]),
              "predictions": tf.reshape(head.predictions(logits)["class_ids"], [-1])}
    if self.view == TOP_K:
      return {"labels": tf.reshape(head._labels(labels), [-1]), "predictions": logits}
    if head.kind == "multiclass":
      return {"labels": tf.one_hot(tf.reshape(head._labels(labels), [-1]), logits.shape[-1]),
              "predictions": tf.nn.softmax(logits)}
    predicted = head.predictions(logits)
    return {"labels": tf.reshape(head._labels(labels), [-1]),
            "predictions": tf.reshape(predicted.get("logistic", logits), [-1])}

  def _arguments(self, head) -> Dict[str, Any]:
    """The function's arguments but the tensors, num_classes the head's unless given."""
    args = dict(self.args)
    if "num_classes" in args and args["num_classes"] is None:
      args["num_classes"] = max(2, head.logits_dimension)
    return args

  def estimator_op(self, head, labels: tf.Tensor, logits: tf.Tensor,
                   weights: Optional[tf.Tensor] = None) -> Tuple[tf.Tensor, tf.Operation]:
    """(value, update_op): the v1 function itself, in the Estimator's graph."""
    tensors = self.inputs(head, labels, logits)
    shaped = example_weights(weights, _weighted(self.function, tensors))
    return getattr(tf.compat.v1.metrics, self.function)(
        **tensors, weights=shaped, **self._arguments(head))

  def keras_metric(self, name: str, head) -> tf_keras.metrics.Metric:
    """The Keras metric `name` that computes it from (labels, logits, sample weights)."""
    return _KerasV1Metric(self, head, name)


def one_per_example(labels: tf.Tensor) -> tf.Tensor:
  """Labels with one value per example as (B,), as an input_fn gives them or Keras passes
  them ((B, 1)); others as they are."""
  if labels.shape.rank == 2 and labels.shape[-1] == 1:
    return tf.squeeze(labels, -1)
  return labels


def _weighted(function: str, tensors: Dict[str, tf.Tensor]) -> tf.Tensor:
  """The tensor a function's weights must fit: each example's count at k, else what it is
  fed."""
  if FUNCTIONS[function][0] == TOP_K:
    return tensors["labels"]
  return tensors.get("predictions", tensors.get("values"))


def example_weights(weights: Optional[tf.Tensor], like: tf.Tensor) -> Optional[tf.Tensor]:
  """Each example's weight shaped to broadcast over `like` (B, ...), float32; None stays."""
  if weights is None:
    return None
  weights = tf.reshape(tf.cast(weights, tf.float32), [-1])
  rank = like.shape.rank
  return tf.reshape(weights, [-1] + [1] * (rank - 1)) if rank and rank > 1 else weights


def _thresholds(metric: Metric) -> list:
  """The thresholds v1 counts at, endpoints included."""
  args, n = metric.args, metric.args.get("num_thresholds", 200)
  if args.get("thresholds") is not None:
    inner = sorted(args["thresholds"])
  else:
    inner = [(i + 1) * 1.0 / (n - 1) for i in range(n - 2)]
  top = 1.0 - _KEPSILON if metric.function == "specificity_at_sensitivity" else 1.0 + _KEPSILON
  return [0.0 - _KEPSILON] + inner + [top]


@tf_keras.utils.register_keras_serializable(package="trainers")
class _KerasV1Metric(tf_keras.metrics.Metric):
  """A `Metric` in Keras: v1's sums as this metric's variables (summed across replicas as
  Keras sums a metric's), updated from what the head or `of` feeds it, and v1's formula."""

  def __init__(self, metric: Metric, head, name: str, dtype=None):
    super().__init__(name=name, dtype=dtype)
    self._declared, self._head = metric, head
    self._args = metric._arguments(head)
    self._family = _family(metric.function)
    self._at = _thresholds(metric) if self._family == "thresholds" else []
    n = self._args.get("num_classes")
    shape, dtype, names = {
        "mean": ((), tf.float32, ("total", "count")),
        "counts": ((), tf.float32, ("tp", "fp", "fn", "tn")),
        "thresholds": ((len(self._at),), tf.float32, ("tp", "fn", "tn", "fp")),
        "at_k": ((), tf.float64, ("tp", "fp", "fn")),
        "mean_per_class_accuracy": ((n,), tf.float32, ("total", "count")),
        "mean_iou": ((n, n), tf.float64, ("cm",)),
    }[self._family]
    self._sums = {k: self.add_weight(name=k, shape=shape, dtype=dtype, initializer="zeros")
                  for k in names}

  def update_state(self, y_true, y_pred, sample_weight=None):
    tensors = self._declared.inputs(self._head, y_true, y_pred)
    weights = example_weights(sample_weight, _weighted(self._declared.function, tensors))
    added = _UPDATES[self._family](self, weights=weights, **tensors)
    return tf.group(*[self._sums[k].assign_add(v) for k, v in added.items()])

  def result(self):
    sums = {k: v.read_value() for k, v in self._sums.items()}
    return _RESULTS[self._family](self, **sums)

  def reset_state(self):
    for variable in self._sums.values():
      variable.assign(tf.zeros_like(variable))

  def get_config(self):
    of = self._declared.of
    return {**super().get_config(), "function": self._declared.function,
            "args": self._declared.args, "task": self._head.task,
            "of": None if of is None else f"{of.__module__}.{of.__qualname__}"}

  @classmethod
  def from_config(cls, config):
    from trainers import heads  # noqa: PLC0415 -- heads builds its v1 AUCs from this module.
    if config.pop("of"):  # A function of the spec's, which a config cannot hold.
      raise MetricError(f"metric {config['name']!r} is fed by a function of its spec: build "
                        f"it from the spec (ModelSpec.metrics), not from a saved config.")
    metric = Metric(config.pop("function"), **config.pop("args"))
    return cls(metric, heads.Head(*parse_task(config.pop("task"))), **config)


def _family(function: str) -> str:
  if function in ("precision_at_k", "recall_at_k"):
    return "at_k"
  if function in ("auc", "sensitivity_at_specificity", "specificity_at_sensitivity"):
    return "thresholds"
  if function in ("mean_per_class_accuracy", "mean_iou"):
    return function
  return "counts" if FUNCTIONS[function][0] == BINARY_CLASSES else "mean"


def _mean_values(metric: _KerasV1Metric, **tensors) -> tf.Tensor:
  """What v1's mean-based functions average, element by element."""
  function = metric._declared.function
  if function == "mean":
    return tf.cast(tensors["values"], tf.float32)
  if function == "percentage_below":
    return tf.cast(tensors["values"] < metric._args["threshold"], tf.float32)
  labels, predictions = _same_shape(tensors["labels"], tensors["predictions"])
  if function == "accuracy":
    return tf.cast(tf.equal(tf.cast(predictions, labels.dtype), labels), tf.float32)
  if function == "mean_absolute_error":
    return tf.abs(predictions - labels)
  return tf.math.squared_difference(labels, predictions)


def _same_shape(labels: tf.Tensor, predictions: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
  """v1's remove_squeezable_dimensions: a last axis of 1 dropped where one is a rank above."""
  if labels.shape.rank == predictions.shape.rank + 1 and labels.shape[-1] == 1:
    labels = tf.squeeze(labels, -1)
  elif predictions.shape.rank == labels.shape.rank + 1 and predictions.shape[-1] == 1:
    predictions = tf.squeeze(predictions, -1)
  return labels, predictions


def _broadcast(weights: Optional[tf.Tensor], values: tf.Tensor) -> tf.Tensor:
  """Weights over every value (v1's broadcast_weights), ones without them."""
  if weights is None:
    return tf.ones_like(values)
  return weights * tf.ones_like(values)


def _update_mean(metric, weights=None, **tensors):
  values = _mean_values(metric, **tensors)
  if weights is None:
    return {"total": tf.reduce_sum(values), "count": tf.cast(tf.size(values), tf.float32)}
  weights = _broadcast(weights, values)
  return {"total": tf.reduce_sum(values * weights), "count": tf.reduce_sum(weights)}


def _result_mean(metric, total, count):
  mean = tf.math.divide_no_nan(total, tf.maximum(count, 0))
  return tf.sqrt(mean) if metric._declared.function == "root_mean_squared_error" else mean


def _update_counts(metric, labels, predictions, weights=None):
  labels, predictions = _same_shape(tf.cast(labels, tf.bool), tf.cast(predictions, tf.bool))
  weights = _broadcast(weights, tf.cast(labels, tf.float32))
  cases = {"tp": labels & predictions, "fp": ~labels & predictions,
           "fn": labels & ~predictions, "tn": ~labels & ~predictions}
  return {k: tf.reduce_sum(tf.cast(c, tf.float32) * weights) for k, c in cases.items()}


def _result_counts(metric, tp, fp, fn, tn):
  function = metric._declared.function
  if function in ("precision", "recall"):
    other = fp if function == "precision" else fn
    return tf.where(tp + other > 0, tf.math.divide(tp, tp + other), 0.0)
  return {"true_positives": tp, "false_positives": fp, "true_negatives": tn,
          "false_negatives": fn}[function]


def _update_thresholds(metric, labels, predictions, weights=None):
  """v1's _confusion_matrix_at_thresholds: each value counted at every threshold it is
  above, each threshold compared, none bucketed."""
  predictions = tf.cast(predictions, tf.float32)
  in_range = [tf.debugging.assert_greater_equal(predictions, 0.0,
                                                message="predictions must be in [0, 1]"),
              tf.debugging.assert_less_equal(predictions, 1.0,
                                             message="predictions must be in [0, 1]")]
  with tf.control_dependencies(in_range):
    labels, predictions = _same_shape(tf.cast(labels, tf.bool), tf.identity(predictions))
  thresholds = tf.constant(metric._at, tf.float32)[:, tf.newaxis]
  positive = tf.reshape(predictions, [1, -1]) > thresholds
  label = tf.reshape(labels, [1, -1])
  weight = (1.0 if weights is None
            else tf.reshape(_broadcast(weights, tf.cast(predictions, tf.float32)), [1, -1]))
  cases = {"tp": label & positive, "fn": label & ~positive, "tn": ~label & ~positive,
           "fp": ~label & positive}
  return {k: tf.reduce_sum(tf.cast(c, tf.float32) * weight, 1) for k, c in cases.items()}


def _result_thresholds(metric, tp, fn, tn, fp):
  function, args = metric._declared.function, metric._args
  if function == "sensitivity_at_specificity":
    specificities = tf.math.divide(tn, tn + fp + _KEPSILON)
    at = tf.cast(tf.argmin(tf.abs(specificities - args["specificity"]), 0), tf.int32)
    return tf.math.divide(tp[at], tp[at] + fn[at] + _KEPSILON)
  if function == "specificity_at_sensitivity":
    gaps = tf.abs(tf.math.divide(tp, tp + fn + _KEPSILON) - args["sensitivity"])
    # The last of the closest: v1's cumsum-and-argmax, as tf.argmax takes the first.
    at = tf.cast(tf.argmax(tf.cumsum(tf.cast(tf.equal(gaps, tf.reduce_min(gaps)), tf.int64)),
                           0), tf.int32)
    return tf.math.divide(tn[at], tn[at] + fp[at] + _KEPSILON)
  return _auc(args["curve"], args["summation_method"], tp, fn, tn, fp)


def _auc(curve: str, summation: str, tp, fn, tn, fp) -> tf.Tensor:
  """v1's compute_auc (metrics_impl.py), its epsilons and its PR interpolation."""
  epsilon = 1.0e-6
  if curve == "PR" and summation == "careful_interpolation":
    dtp = tp[:-1] - tp[1:]
    p = tp + fp
    slope = tf.math.divide_no_nan(dtp, tf.maximum(p[:-1] - p[1:], 0))
    intercept = tp[1:] - slope * p[1:]
    ratio = tf.where(tf.logical_and(p[:-1] > 0, p[1:] > 0),
                     tf.math.divide_no_nan(p[:-1], tf.maximum(p[1:], 0)), tf.ones_like(p[1:]))
    return tf.reduce_sum(tf.math.divide_no_nan(slope * (dtp + intercept * tf.math.log(ratio)),
                                               tf.maximum(tp[1:] + fn[1:], 0)))
  recall = tf.math.divide(tp + epsilon, tp + fn + epsilon)
  if curve == "ROC":
    x, y = tf.math.divide(fp, fp + tn + epsilon), recall
  else:
    x, y = recall, tf.math.divide(tp + epsilon, tp + fp + epsilon)
  if summation == "minoring":
    heights = tf.minimum(y[:-1], y[1:])
  elif summation == "majoring":
    heights = tf.maximum(y[:-1], y[1:])
  else:
    heights = (y[:-1] + y[1:]) / 2.0
  return tf.reduce_sum((x[:-1] - x[1:]) * heights)


def _update_at_k(metric, labels, predictions, weights=None):
  """v1's sparse true and false positives and false negatives at k, for one label an
  example: the label among the top k (ties to the lower class, as tf.nn.top_k breaks them)."""
  k, class_id = metric._args["k"], metric._args["class_id"]
  top = tf.nn.top_k(predictions, k).indices
  labels = tf.reshape(tf.cast(labels, tf.int64), [-1])
  hit = tf.reduce_any(tf.equal(tf.cast(top, tf.int64), labels[:, tf.newaxis]), -1)
  if class_id is None:
    tp = tf.cast(hit, tf.float64)
    fp, fn = k - tp, 1.0 - tp
  else:
    chosen = tf.reduce_any(tf.equal(top, class_id), -1)
    is_class = tf.equal(labels, class_id)
    tp = tf.cast(chosen & is_class, tf.float64)
    fp = tf.cast(chosen & ~is_class, tf.float64)
    fn = tf.cast(is_class & ~chosen, tf.float64)
  if weights is not None:
    weights = tf.cast(tf.reshape(weights, [-1]), tf.float64)
    tp, fp, fn = tp * weights, fp * weights, fn * weights
  return {"tp": tf.reduce_sum(tp), "fp": tf.reduce_sum(fp), "fn": tf.reduce_sum(fn)}


def _result_at_k(metric, tp, fp, fn):
  other = fp if metric._declared.function == "precision_at_k" else fn
  return tf.math.divide(tp, tp + other)


def _class_ids(labels, predictions):
  """Labels and predicted classes as v1's per-class functions flatten them."""
  labels = tf.reshape(tf.cast(labels, tf.int64), [-1])
  return labels, tf.reshape(tf.cast(predictions, tf.int64), [-1])


def _update_mean_per_class_accuracy(metric, labels, predictions, weights=None):
  labels, predictions = _class_ids(labels, predictions)
  correct = tf.cast(tf.equal(predictions, labels), tf.float32)
  ones = tf.ones_like(correct)
  if weights is not None:
    weights = tf.reshape(weights, [-1])
    correct, ones = correct * weights, ones * weights
  n, index = metric._args["num_classes"], labels[:, tf.newaxis]
  return {"total": tf.tensor_scatter_nd_add(tf.zeros([n]), index, ones),
          "count": tf.tensor_scatter_nd_add(tf.zeros([n]), index, correct)}


def _result_mean_per_class_accuracy(metric, total, count):
  return tf.reduce_mean(tf.math.divide_no_nan(count, tf.maximum(total, 0)))


def _update_mean_iou(metric, labels, predictions, weights=None):
  labels, predictions = _class_ids(labels, predictions)
  weights = None if weights is None else tf.reshape(weights, [-1])
  return {"cm": tf.math.confusion_matrix(labels, predictions, metric._args["num_classes"],
                                         weights=weights, dtype=tf.float64)}


def _result_mean_iou(metric, cm):
  rows = tf.cast(tf.reduce_sum(cm, 0), tf.float32)
  columns = tf.cast(tf.reduce_sum(cm, 1), tf.float32)
  diagonal = tf.cast(tf.linalg.diag_part(cm), tf.float32)
  denominator = rows + columns - diagonal
  valid = tf.reduce_sum(tf.cast(tf.not_equal(denominator, 0), tf.float32))
  denominator = tf.where(denominator > 0, denominator, tf.ones_like(denominator))
  iou = tf.math.divide(diagonal, denominator)
  return tf.where(valid > 0, tf.reduce_sum(iou) / valid, 0.0)


_UPDATES: Dict[str, Callable[..., Mapping[str, tf.Tensor]]] = {
    "mean": _update_mean, "counts": _update_counts, "thresholds": _update_thresholds,
    "at_k": _update_at_k, "mean_per_class_accuracy": _update_mean_per_class_accuracy,
    "mean_iou": _update_mean_iou}
_RESULTS: Dict[str, Callable[..., tf.Tensor]] = {
    "mean": _result_mean, "counts": _result_counts, "thresholds": _result_thresholds,
    "at_k": _result_at_k, "mean_per_class_accuracy": _result_mean_per_class_accuracy,
    "mean_iou": _result_mean_iou}
