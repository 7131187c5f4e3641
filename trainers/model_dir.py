"""What a run keeps in its model_dir, by name, and the run records the chief writes there.

The layout (both backends; only the chief writes, the evaluator task adds `eval/` and the
exports of --export=latest|best):

  checkpoint, ckpt-<step>.* (Keras) or model.ckpt-<step>.* (the Estimator)
  backup/        Keras BackupAndRestore's state while training runs
  eval/          the evaluator's metrics (the head's: trainers/heads.py), by step
  export/<time>/ SavedModels, as the Estimator names them (export/<name>_exporter/<time>/
                 with --export=latest or best: trainers.export)
  progress.jsonl one JSON record a line: start, step (trainers.progress)
  summary.json   the finished run's figures (write_summary)
  corrupt/, diverged/  checkpoints set aside, never deleted (trainers.checkpoints)
  logs/          a local cluster's task logs (launch.supervisor.LOG_SUBDIR)
"""

import hashlib
import json
import os
import shutil
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

import tensorflow as tf
from absl import logging

from launch import cluster
from trainers import program
from trainers.config import Config

SUMMARY_FILE = "summary.json"
PROGRESS_FILE = "progress.jsonl"
LOSSES_FILE = "losses.json"  # In --record_dir: the per-step training losses, for the tools.
EARLY_STOP_FILE = "early_stop.json"  # The step an early stop ended the run at (early_stopping).
EXPORT_SUBDIR = "export"
EVAL_SUBDIR = "eval"  # The Estimator's own name for its evaluation events.
BACKUP_SUBDIR = "backup"
DIVERGED_SUBDIR = "diverged"
CORRUPT_SUBDIR = "corrupt"


def worker_scratch_dir(model_dir: str, task: cluster.Task) -> str:
  """A non-chief training task's own directory for what it must save but not keep, emptied.

  Named by model_dir and task, in the system's temporary directory: only the
  chief writes to model_dir, and a restarted or re-run task clears what a
  killed one left. The caller removes it when done.
  """
  digest = hashlib.sha256(os.path.abspath(model_dir).encode()).hexdigest()[:12]
  path = os.path.join(tempfile.gettempdir(), f"mnist-{task.type}-{task.index}-{digest}")
  shutil.rmtree(path, ignore_errors=True)
  os.makedirs(path, mode=0o700)
  return path


def record_progress(model_dir: str, event: str, **fields: Any) -> None:
  """Appends one record to `model_dir/progress.jsonl` (chief only).

  The tools (chaos, bench, handoff) read these instead of parsing log lines.
  """
  append_record(os.path.join(model_dir, PROGRESS_FILE),
                {"event": event, "time": round(time.time(), 3), **fields})


def append_record(path: str, record: Dict[str, Any]) -> None:
  """Appends `record` to the JSON-lines file at `path`, whole, in one write, so a reader
  sees whole lines. A line torn by a crash or a full disk mid-write is ended first, so it
  cannot swallow this record."""
  line = json.dumps(record) + "\n"
  prefix = "\n" if _torn(path) else ""
  with tf.io.gfile.GFile(path, "a") as f:
    f.write(prefix + line)


def read_records(path: str) -> List[Dict[str, Any]]:
  """The records of the JSON-lines file at `path` (`append_record`), oldest first; none if
  it is not there. A line being written (no newline yet) is left for the next read, and one
  torn by a crash is skipped: the records after it still count."""
  try:
    with tf.io.gfile.GFile(path) as f:
      text = f.read()
  except tf.errors.NotFoundError:
    return []
  records = []
  for line in text.split("\n")[:-1]:
    try:
      records.append(json.loads(line))
    except ValueError:
      pass
  return records


def _torn(path: str) -> bool:
  """Whether the file at `path` ends inside a line (a write cut short)."""
  try:
    size = tf.io.gfile.stat(path).length
  except tf.errors.NotFoundError:
    return False
  if not size:
    return False
  with tf.io.gfile.GFile(path, "rb") as f:
    f.seek(size - 1)
    return f.read(1) != b"\n"


def record_losses(record_dir: str, backend: str, losses: Sequence[float],
                  learning_rates: Sequence[float] = ()) -> None:
  """Writes the per-step training losses, and the learning rates each step trained with
  (none for a canned model's constant rates), to `record_dir/losses.json` (chief only)."""
  tf.io.gfile.makedirs(record_dir)
  with tf.io.gfile.GFile(os.path.join(record_dir, LOSSES_FILE), "w") as f:
    json.dump({"backend": backend, "losses": [float(x) for x in losses],
               "learning_rates": [float(x) for x in learning_rates]}, f)


def read_summary(model_dir: str) -> Optional[Dict[str, Any]]:
  """The summary.json of model_dir's last finished run, or None."""
  try:
    with tf.io.gfile.GFile(os.path.join(model_dir, SUMMARY_FILE)) as f:
      return json.load(f)
  except (tf.errors.NotFoundError, ValueError):
    return None


def finished_summary(model_dir: str, step: int) -> Optional[Dict[str, Any]]:
  """The summary of the run that finished at `step` in model_dir, if its export (if it has
  one) is still there; else None."""
  summary = read_summary(model_dir)
  if not summary or summary.get("global_step") != step:
    return None
  export = summary.get("export_dir")
  return summary if not export or tf.io.gfile.isdir(export) else None


def _absolute(path: str) -> str:
  """A local path as an absolute one, so the summary names it wherever it is read; a URL
  (gs://...) as it is."""
  return path if "://" in path else os.path.abspath(path)


def write_summary(
    backend: str,
    config: Config,
    model_dir: str,
    *,
    workers: int,
    global_step: int,
    metrics: Dict[str, float],
    train_seconds: float,
    trained_steps: int,
    export_dir: Optional[str],
    first_step_time: Optional[float] = None,
    kept: Optional[Dict[str, Any]] = None,
    early_stop: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
  """Writes summary.json to model_dir (whole, by a rename) and prints it as the last stdout line.

  Args:
    backend: "keras" or "estimator".
    config: the run's hyperparameters.
    model_dir: the chief's model directory.
    workers: number of training workers.
    global_step: the final optimizer step.
    metrics: the test split's "loss" and, but for a program that reports none,
      "accuracy"; a program's every eval_metric_ops value too.
    train_seconds: wall time of this process's training loop.
    trained_steps: the steps it ran (fewer than global_step after a resume).
    export_dir: the SavedModel written (None: a program without a receiver).
    first_step_time: unix time when this run's first training step finished
      (launch.bench measures launch-to-first-step with it).
    kept: a re-run that trained nothing keeps the training figures of this
      earlier summary (train_seconds, examples_per_second, first_step_time).
    early_stop: the record of the early stop that ended the run (trainers.early_stopping),
      if one did.

  Returns:
    The summary.
  """
  own_batches = bool(config.estimator_program
                     and program.load(config.estimator_program).input_fn)
  summary = {
      "backend": backend,
      "workers": workers,
      "global_step": int(global_step),
      # None where a team's program reports no `accuracy`: test_metrics has what it does.
      "test_accuracy": round(float(metrics["accuracy"]), 6) if "accuracy" in metrics else None,
      "test_loss": round(float(metrics["loss"]), 6),
      "test_metrics": {k: round(float(v), 6) for k, v in sorted(metrics.items())
                       if k != "global_step"},
      "train_seconds": round(train_seconds, 3),
      # None where a team's program batches its own input: the batch is not a flag's.
      "examples_per_second": None if own_batches else round(
          trained_steps * config.global_batch_size / train_seconds if train_seconds > 0 else 0,
          1),
      "model_dir": _absolute(model_dir),
      "export_dir": export_dir and _absolute(export_dir),
  }
  if first_step_time:
    summary["first_step_time"] = round(first_step_time, 3)
  if early_stop:
    summary["early_stop"] = early_stop
  for name in ("train_seconds", "examples_per_second", "first_step_time"):
    if kept and name in kept:
      summary[name] = kept[name]
  path = os.path.join(model_dir, SUMMARY_FILE)
  with tf.io.gfile.GFile(path + ".tmp", "w") as f:
    json.dump(summary, f, indent=2)
  tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
  logging.info("Wrote %s%s", path, f"; SavedModel in {export_dir}" if export_dir else "")
  print(json.dumps(summary), flush=True)
  return summary
