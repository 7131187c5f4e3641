"""Runs one backend as a single process, as one TF_CONFIG task, or as a local cluster."""

import dataclasses
import importlib
import os
import sys
import tempfile
from typing import Optional, Sequence

from absl import logging

from data import mnist
from launch import cluster
from launch import supervisor
from trainers import distribute
from trainers.config import Config

BACKENDS = {"keras": "trainers.keras_trainer", "estimator": "trainers.estimator_trainer"}
EXIT_USAGE = 2


@dataclasses.dataclass(frozen=True)
class RunOptions:
  """How to run, as opposed to what to train (that is the Config).

  Attributes:
    workers: training workers; None when not given (then TF_CONFIG decides, or 1).
    model_dir: output directory; None makes a new temporary one.
    relaunch: the command line that runs this binary again, for each task.
    log_dir: task logs of a local cluster; None means <model_dir>/logs.
    timeout: seconds before a local cluster is stopped; None waits.
  """

  workers: Optional[int]
  model_dir: Optional[str]
  relaunch: Sequence[str]
  log_dir: Optional[str] = None
  timeout: Optional[float] = None


def _error(message: str, code: int) -> int:
  print(f"error: {message}", file=sys.stderr)
  return code


def run(backend: str, config: Config, options: RunOptions) -> int:
  """Trains `backend` and returns the process exit code.

  With TF_CONFIG set, this process runs as that task. Otherwise, with more
  than one worker it starts a localhost cluster whose tasks each run
  `options.relaunch` (this same command) with their own TF_CONFIG, and
  streams the chief's output; with one worker it trains here.

  Args:
    backend: "keras" or "estimator".
    config: hyperparameters.
    options: workers, directories, timeout.

  Returns:
    0 on success; 2 for bad flags or TF_CONFIG; 1 for missing data; a failed
    task's exit code for a cluster.
  """
  workers, model_dir = options.workers, options.model_dir
  try:
    if workers is not None and workers < 1:
      raise ValueError(f"--workers must be at least 1, got {workers}.")
    task = cluster.parse_tf_config()
    if task and workers is not None and workers != task.num_workers:
      raise ValueError(
          f"--workers={workers} but TF_CONFIG describes {task.num_workers} training tasks: "
          "start every task with the same --workers, or leave it out."
      )
    num_workers = task.num_workers if task else (workers or 1)
    config.validate(num_replicas=num_workers)  # One CPU replica per worker.
  except ValueError as e:  # TFConfigError is a ValueError too.
    return _error(str(e), EXIT_USAGE)
  try:
    mnist.check_prepared(config.data_dir)
  except mnist.MissingDataError as e:
    return _error(str(e), 1)

  if task is None and num_workers > 1:
    model_dir = model_dir or tempfile.mkdtemp(prefix=f"mnist_{backend}_")
    log_dir = options.log_dir or os.path.join(model_dir, "logs")
    logging.info("Starting %d %s workers; model_dir=%s, logs in %s", num_workers, backend,
                 model_dir, log_dir)
    return supervisor.run_local_cluster(
        [*options.relaunch, f"--model_dir={model_dir}"], num_workers, log_dir,
        evaluator=backend == "estimator", timeout=options.timeout)

  if model_dir is None:
    if task is not None:
      return _error("--model_dir is required when TF_CONFIG is set: every task must "
                    "share it.", EXIT_USAGE)
    model_dir = tempfile.mkdtemp(prefix=f"mnist_{backend}_")
  distribute.setup_process(task)
  # Imported by name, so the Keras path never loads tf.estimator (gone in TF 2.16).
  try:
    trainer = importlib.import_module(BACKENDS[backend])
  except ImportError as e:  # tf.estimator on TensorFlow >= 2.16: the message says what to do.
    return _error(str(e), 1)
  trainer.train_and_evaluate(config, model_dir)
  return 0
