"""A spec that reports what a ten-class model_fn's eval_metric_ops reported: the default CNN
with a dozen `tf.compat.v1.metrics`, declared by their v1 names and arguments
(trainers/v1_metrics.py). Both backends report each under its key; launch.parity holds each
to the other backend's:

    PYTHONPATH=docs/examples python -m launch.parity --workers=2 --model=metrics_model:SPEC

The model_fn these came from computed them as:

    eval_metric_ops = {
        "auc": tf.compat.v1.metrics.auc(tf.one_hot(labels, 10), probabilities),
        "auc_pr": tf.compat.v1.metrics.auc(tf.one_hot(labels, 10), probabilities,
                                           curve="PR", summation_method="careful_interpolation"),
        "precision_at_3": tf.compat.v1.metrics.precision_at_k(labels, logits, k=3),
        ...
    }
"""

import tensorflow as tf

from trainers import v1_metrics as v1
from trainers.model import ModelSpec
from trainers.models import cnn


def true_probability(labels, logits):
  """Each example's probability of its own digit."""
  return tf.reduce_sum(tf.nn.softmax(logits) * tf.one_hot(labels, 10), axis=-1)


def is_seven(labels, logits):
  """One digit against the rest: (the label is 7, the predicted class is 7)."""
  return tf.equal(labels, 7), tf.equal(tf.argmax(logits, -1), 7)


METRICS = {
    "auc": v1.Metric("auc"),
    "auc_pr": v1.Metric("auc", curve="PR", summation_method="careful_interpolation"),
    "auc_pr_trapezoidal": v1.Metric("auc", curve="PR"),
    "precision_at_3": v1.Metric("precision_at_k", k=3),
    "recall_at_2": v1.Metric("recall_at_k", k=2),
    "recall_at_1_of_7": v1.Metric("recall_at_k", k=1, class_id=7),
    "mean_per_class_accuracy": v1.Metric("mean_per_class_accuracy"),
    "mean_iou": v1.Metric("mean_iou"),
    "brier": v1.Metric("mean_squared_error"),
    "rmse": v1.Metric("root_mean_squared_error"),
    "sensitivity_at_specificity_99": v1.Metric("sensitivity_at_specificity", specificity=0.99),
    "mean_true_probability": v1.Metric("mean", of=true_probability),
    "unsure": v1.Metric("percentage_below", of=true_probability, threshold=0.5),
    "precision_of_7": v1.Metric("precision", of=is_seven),
}

SPEC = ModelSpec(name="metrics_model", build=cnn.build, metrics=METRICS)
