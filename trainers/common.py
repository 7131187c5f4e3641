"""What both trainers share beyond the model: inputs, seeds, initial weights, records, summary."""

import json
import os
import time
from typing import Any, Callable, Dict, List, Optional

import tensorflow as tf
from absl import logging

from data import mnist
from trainers import model as model_lib
from trainers.config import Config

InputFn = Callable[[str, Optional[tf.distribute.InputContext]], tf.data.Dataset]
SUMMARY_FILE = "summary.json"
LOSSES_FILE = "losses.json"
EXPORT_SUBDIR = "export"
EVAL_SUBDIR = "eval"  # Estimator's own name for its evaluation events.


def default_input_fn(config: Config) -> InputFn:
  """The shared MNIST input_fn, bound to the config's batch sizes, data and seed."""

  def input_fn(mode: str, input_context: Optional[tf.distribute.InputContext] = None):
    batch = config.global_batch_size if mode == mnist.TRAIN else config.eval_batch_size
    return mnist.input_fn(mode, input_context, global_batch_size=batch,
                          data_dir=config.data_dir, seed=config.seed,
                          record_dir=config.record_dir)

  return input_fn


def setup_determinism(config: Config) -> None:
  """Op determinism if asked; the global seed that, with the op seed, fixes the shuffle."""
  if config.deterministic:
    tf.config.experimental.enable_op_determinism()
  tf.random.set_seed(config.seed)


def initial_weights(config: Config) -> Optional[model_lib.Weights]:
  """The weights file's contents, or None to initialize from the seed."""
  return model_lib.load_weights_npz(config.init_weights) if config.init_weights else None


def record_losses(config: Config, backend: str, losses: List[float]) -> None:
  """Writes the per-step training losses for launch.parity (chief only)."""
  tf.io.gfile.makedirs(config.record_dir)
  with tf.io.gfile.GFile(os.path.join(config.record_dir, LOSSES_FILE), "w") as f:
    json.dump({"backend": backend, "losses": [float(x) for x in losses]}, f)


def export_path(model_dir: str) -> str:
  """A fresh timestamped SavedModel directory, as Estimator's exports use."""
  parent = os.path.join(model_dir, EXPORT_SUBDIR)
  tf.io.gfile.makedirs(parent)
  return os.path.join(parent, str(int(time.time())))


def finish(
    backend: str,
    config: Config,
    model_dir: str,
    *,
    workers: int,
    global_step: int,
    metrics: Dict[str, float],
    train_seconds: float,
    export_dir: str,
) -> Dict[str, Any]:
  """Writes summary.json to model_dir and prints it as the last stdout line.

  Args:
    backend: "keras" or "estimator".
    config: the run's hyperparameters.
    model_dir: the chief's model directory.
    workers: number of training workers.
    global_step: the final optimizer step, all trained within train_seconds.
    metrics: test-split "accuracy" and "loss".
    train_seconds: wall time of the training loop.
    export_dir: the SavedModel written.

  Returns:
    The summary.
  """
  summary = {
      "backend": backend,
      "workers": workers,
      "global_step": int(global_step),
      "test_accuracy": round(float(metrics["accuracy"]), 6),
      "test_loss": round(float(metrics["loss"]), 6),
      "train_seconds": round(train_seconds, 3),
      "examples_per_second": round(
          global_step * config.global_batch_size / max(train_seconds, 1e-9), 1),
      "model_dir": model_dir,
      "export_dir": export_dir,
  }
  path = os.path.join(model_dir, SUMMARY_FILE)
  with tf.io.gfile.GFile(path + ".tmp", "w") as f:
    json.dump(summary, f, indent=2)
  tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
  logging.info("Wrote %s", path)
  print(json.dumps(summary), flush=True)
  return summary
