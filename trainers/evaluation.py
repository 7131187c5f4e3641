"""Evaluation results in `model_dir/eval`: written as the Estimator's evaluator writes them
(the head's metrics at the checkpoint's step, trainers/heads.py; a team's program writes its
every eval_metric_ops value), read back by step, and waited for."""

import glob
import os
import time
from typing import Dict, Mapping, Optional

import tensorflow as tf
from absl import logging

from trainers import model_dir as layout

RESULT_WAIT_SECONDS = 600.0  # How long a chief waits for the evaluator's final result.
POLL_SECONDS = 0.25  # How often it looks: the run ends that much sooner after the result.
_MEAN_LOSS = "average_loss"


def log_result(step: int, metrics: Mapping[str, float]) -> None:
  """The line every evaluation shows: "Test metrics at step N: {accuracy, loss, ...}"."""
  logging.info("Test metrics at step %d: %s", step,
               {k: float(v) for k, v in metrics.items() if k != "global_step"})


def write_result(model_dir: str, step: int, metrics: Mapping[str, float]) -> None:
  """Writes one evaluation's metrics (the head's: trainers/heads.py) to `model_dir/eval` at
  `step`, `loss` last (`read_results` counts a step once its loss is there) and, where the
  head reports `average_loss`, equal to it (`mean_loss`).

  A writer per result, closed at once: a chief may be waiting for it, and a
  writer kept open did not flush it before the process exited.
  """
  metrics = mean_loss(dict(metrics))
  writer = tf.summary.create_file_writer(os.path.join(model_dir, layout.EVAL_SUBDIR))
  with writer.as_default(step=step):
    for name in sorted(metrics, key=lambda name: name == "loss"):
      tf.summary.scalar(name, float(metrics[name]))
  writer.close()


def _scalar(value) -> float:
  """A scalar summary's value: TF1 summaries (the Estimator's) or TF2 tensors (Keras's)."""
  if value.HasField("tensor"):
    return float(tf.make_ndarray(value.tensor))
  return float(value.simple_value)


def _numeric_scalar(tensor) -> bool:
  """Whether a summary's tensor is a number (not the Estimator's `checkpoint_path`)."""
  return (bool(tensor.ByteSize()) and not tensor.tensor_shape.dim
          and tf.as_dtype(tensor.dtype) != tf.string)


def read_scalars(directory: str) -> Dict[int, Dict[str, float]]:
  """Every numeric scalar summary in `directory`'s event files, by step and tag: TF1
  summaries (the Estimator's) and TF2 tensors (Keras's) alike."""
  values: Dict[int, Dict[str, float]] = {}
  for path in sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*"))):
    try:
      for event in tf.compat.v1.train.summary_iterator(path):
        for v in event.summary.value:
          if v.HasField("simple_value") or _numeric_scalar(v.tensor):
            values.setdefault(int(event.step), {})[v.tag] = _scalar(v)
    except tf.errors.DataLossError:
      pass  # Its writer is still writing this file.
  return dict(sorted(values.items()))


def read_results(eval_dir: str) -> Dict[int, Dict[str, float]]:
  """Every step the evaluator evaluated, with every metric it wrote, from its event files.

  The Estimator writes them in one event; Keras's tf.summary writes one event per value,
  `loss` last: a step is there once its loss is.
  """
  return {step: mean_loss(metrics) for step, metrics in read_scalars(eval_dir).items()
          if "loss" in metrics}


def mean_loss(metrics: Dict[str, float]) -> Dict[str, float]:
  """An evaluation with `loss` the per-example mean, as both backends report it: the head's
  `average_loss` (an Estimator's `loss` is a mean of batch means, a v1 head's the sum over
  its batch; Keras's compiled loss may round otherwise)."""
  if _MEAN_LOSS not in metrics:
    return metrics
  return {**metrics, "loss": metrics[_MEAN_LOSS]}


class MissingMetricError(ValueError):
  """An evaluation without the metric a flag names (--early_stopping_metric, --export_metric):
  a team's program's eval_metric_ops, say, that the run could not check before training."""


def metric_value(metrics: Mapping[str, float], name: str, flag: str,
                 step: Optional[int] = None) -> float:
  """The metric `name` of one evaluation (the loss the per-example mean: `mean_loss`);
  MissingMetricError naming `flag` if it has none."""
  metrics = mean_loss(dict(metrics))
  if name not in metrics:
    at = "" if step is None else f" of step {step}"
    raise MissingMetricError(
        f"{flag}={name}: the evaluation{at} has no such metric; it has "
        f"{', '.join(sorted(k for k in metrics if k != 'global_step'))}.")
  return float(metrics[name])


def read_result(eval_dir: str, step: int) -> Optional[Dict[str, float]]:
  """The evaluator's metrics at `step`, or None if it has not evaluated it."""
  return read_results(eval_dir).get(step)


def wait_for_result(model_dir: str, step: int, timeout: float = RESULT_WAIT_SECONDS
                    ) -> Dict[str, float]:
  """Waits for the evaluator task's result at `step` (the chief's final step)."""
  eval_dir = os.path.join(model_dir, layout.EVAL_SUBDIR)
  deadline = time.monotonic() + timeout
  logging.info("Waiting for the evaluator's result at step %d in %s", step, eval_dir)
  while time.monotonic() < deadline:
    result = read_result(eval_dir, step)
    if result:
      return result
    time.sleep(POLL_SECONDS)
  raise TimeoutError(
      f"No evaluation of step {step} appeared in {eval_dir} within {timeout:.0f} s: "
      "is the evaluator task running? (launch.local --evaluator starts one)."
  )
