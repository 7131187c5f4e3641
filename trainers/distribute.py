"""Per-process set-up: the one place a tf.distribute strategy is created."""

import os
from typing import Optional

import tensorflow as tf
from absl import logging
from tensorflow.python.eager import context  # wait_at_barrier has no public API in TF 2.15.

from launch import cluster


class _TaskFormatter(logging.PythonFormatter):
  """Prefixes every absl log line with the task, e.g. `[worker:1]`."""

  def __init__(self, task_name: str):
    super().__init__()
    self._prefix = f"[{task_name}] "

  def format(self, record):
    return self._prefix + super().format(record)


def setup_process(task: Optional[cluster.Task]) -> None:
  """Tags logs with the task and splits the cores among the local tasks.

  Must run before TensorFlow's runtime starts (before any op or strategy).

  Args:
    task: this process's task from TF_CONFIG, or None for one local process.
  """
  # TF's logger has its own stderr handler besides absl's: keep one copy of each line.
  for handler in list(tf.get_logger().handlers):
    tf.get_logger().removeHandler(handler)
  if task is None:
    return
  logging.get_absl_handler().setFormatter(_TaskFormatter(task.name))
  # launch.local puts every worker on this machine: without a cap each would
  # start a thread per core, and N workers would fight over the same cores.
  threads = max(1, (os.cpu_count() or 1) // task.num_workers)
  tf.config.threading.set_intra_op_parallelism_threads(threads)
  logging.info("Task %s of %d workers; %d intra-op threads.", task.name, task.num_workers, threads)


def create_strategy() -> tf.distribute.MultiWorkerMirroredStrategy:
  """MultiWorkerMirroredStrategy for this process's TF_CONFIG (local if unset).

  Both backends use it: Keras builds its model in its scope; the Estimator
  gets it as `RunConfig(train_distribute=...)`.
  """
  return tf.distribute.MultiWorkerMirroredStrategy()


def num_workers(strategy: tf.distribute.Strategy) -> int:
  """Number of training worker processes behind the strategy."""
  resolver = getattr(strategy, "cluster_resolver", None)
  jobs = resolver.cluster_spec().as_dict() if resolver else {}
  return max(1, len(jobs.get("worker", [])) + len(jobs.get("chief", [])))


def is_chief(strategy: tf.distribute.Strategy) -> bool:
  """True for the one process that writes to model_dir: worker 0, or a local run."""
  resolver = getattr(strategy, "cluster_resolver", None)
  jobs = resolver.cluster_spec().as_dict() if resolver else {}
  if not jobs:
    return True
  # The rule itself lives with the rest of TF_CONFIG handling, in launch.cluster.
  return cluster.Task(resolver.task_type, resolver.task_id, num_workers(strategy),
                      has_chief_job=cluster.CHIEF in jobs).is_chief


def barrier(strategy: tf.distribute.Strategy, name: str, timeout_seconds: float = 300) -> None:
  """Waits until every worker of a multi-worker strategy reaches `name`; no-op otherwise."""
  if num_workers(strategy) > 1:
    context.context().wait_at_barrier(name, int(timeout_seconds * 1000))
