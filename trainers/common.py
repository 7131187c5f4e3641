"""What both trainers share beyond the model: inputs, seeds, initial weights, records, summary."""

import errno
import glob
import hashlib
import json
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from absl import logging

from data import mnist
from launch import cluster
from trainers import model as model_lib
from trainers.config import Config

InputFn = Callable[[str, Optional[tf.distribute.InputContext]], tf.data.Dataset]
SUMMARY_FILE = "summary.json"
LOSSES_FILE = "losses.json"
EXPORT_SUBDIR = "export"
EVAL_SUBDIR = "eval"  # Estimator's own name for its evaluation events.
BACKUP_SUBDIR = "backup"  # Keras BackupAndRestore's state while training runs.
KERAS_CHECKPOINT_PREFIX = "ckpt"  # Keras: ckpt-<step>; the Estimator: model.ckpt-<step>.
PROGRESS_FILE = "progress.jsonl"  # The chief's run records, one JSON object a line.
KEEP_CHECKPOINTS = 3  # Both backends keep this many checkpoints in model_dir.
RESULT_WAIT_SECONDS = 600.0  # How long a chief waits for the evaluator's final result.
_STARTUP: Dict[str, float] = {}  # Unix times this process passed start-up milestones.


def mark_startup(milestone: str) -> None:
  """Notes when this process passed a start-up milestone ("imported", "strategy")."""
  _STARTUP[milestone] = time.time()


def worker_scratch_dir(model_dir: str, task: cluster.Task) -> str:
  """A non-chief training task's own directory for what it must save but not keep, emptied.

  Named by model_dir and task, in the system's
  temporary directory: only the chief writes to model_dir, and a restarted or
  re-run task clears what a killed one left. The caller removes it when done.
  """
  digest = hashlib.sha256(os.path.abspath(model_dir).encode()).hexdigest()[:12]
  path = os.path.join(tempfile.gettempdir(), f"mnist-{task.type}-{task.index}-{digest}")
  shutil.rmtree(path, ignore_errors=True)
  os.makedirs(path, mode=0o700)
  return path


def record_progress(model_dir: str, event: str, **fields: Any) -> None:
  """Appends one record to `model_dir/progress.jsonl` (chief only).

  The tools (chaos, bench, handoff) read these instead of parsing log lines.
  Each record is written whole, in one write, so a reader sees whole lines.
  """
  line = json.dumps({"event": event, "time": round(time.time(), 3), **fields}) + "\n"
  with tf.io.gfile.GFile(os.path.join(model_dir, PROGRESS_FILE), "a") as f:
    f.write(line)


DIVERGED_SUBDIR = "diverged"  # Checkpoints and backups set aside after a divergence.


class DivergedError(RuntimeError):
  """The training loss or the weights became NaN or Inf; the last checkpoint saved before
  it is kept."""


def diverged(step: int) -> DivergedError:
  """The error both backends raise when the loss or the weights stop being finite at (or
  by) `step`."""
  return DivergedError(
      f"the training loss or the weights became NaN or Inf by step {step}: training stopped "
      "there. Lower --learning_rate, or check the input data; a restart with the same "
      "settings would diverge again.")


def weights_finite(variables: Sequence[tf.Variable]) -> tf.Tensor:
  """Whether every element of `variables` is finite (this worker's copy: no collective).

  The loss alone does not show a divergence on every CPU: where a fused
  Conv2D+ReLU or a max-pool turns NaN into 0 or -FLT_MAX (oneDNN on AMD EPYC,
  seen 2026-11), a NaN batch gives a finite loss and NaN gradients, and the
  loss stays finite while the kernel it updated is NaN.
  """
  return tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in variables])


def in_chain(error: Optional[BaseException],
             matches: Callable[[BaseException], bool]) -> Optional[BaseException]:
  """The first error in `error`'s chain (its causes and contexts) that `matches`, or None."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if matches(error):
      return error
    error = error.__cause__ or error.__context__
  return None


def no_space_left(error: BaseException) -> Optional[BaseException]:
  """The error in `error`'s chain that is a write finding no space left (ENOSPC), or None.

  Python raises OSError(ENOSPC); TensorFlow's file system maps ENOSPC to an
  OpError (RESOURCE_EXHAUSTED) whose message keeps strerror's text.
  """
  return in_chain(error, lambda e: (
      (isinstance(e, OSError) and e.errno == errno.ENOSPC) or
      (isinstance(e, tf.errors.OpError) and os.strerror(errno.ENOSPC) in e.message)))


def disk_full_message(model_dir: str, error: BaseException) -> str:
  """What a run that found no space left says: the write, what is kept, and the fix."""
  newest = tf.train.latest_checkpoint(model_dir)
  kept = (f"The newest complete checkpoint, {newest}, is kept; nothing was deleted." if newest
          else "No checkpoint was saved yet.")
  first_line = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
  return (f"a write failed: {os.strerror(errno.ENOSPC)} ({first_line}). {kept} Free space on "
          f"the filesystem of --model_dir={model_dir} (or of the temporary directory, if the "
          "write was there), then run the same command again: it resumes from the newest "
          "checkpoint. A restart before that would fail the same way.")


CORRUPT_SUBDIR = "corrupt"  # Checkpoints that do not load, set aside before a resume.


def _non_finite(path: str) -> Optional[str]:
  """Why the checkpoint at `path` is no good to resume from after a divergence, or None."""
  reader = tf.train.load_checkpoint(path)
  bad = [name for name, dtype in reader.get_variable_to_dtype_map().items()
         if dtype.is_floating and not np.isfinite(reader.get_tensor(name)).all()]
  return f"holds NaN or Inf in {bad[0]}" if bad else None


def _damage(path: str) -> Optional[str]:
  """Why the checkpoint at `path` does not load (a truncated or missing file), or None."""
  try:
    reader = tf.train.load_checkpoint(path)
    for name in reader.get_variable_to_shape_map():
      reader.get_tensor(name)
  except Exception as e:  # pylint: disable=broad-except
    # A truncated file raises IndexError, OutOfRangeError or DataLossError, by where it ends.
    return f"{type(e).__name__}: {str(e).splitlines()[0]}"
  return None


def _set_aside(model_dir: str, subdir: str, why: Callable[[str], Optional[str]],
               keep_one: bool = False) -> Tuple[List[str], Optional[str]]:
  """Moves into `model_dir/subdir/` (never deletes) a Keras backup that `why` faults, and
  the newest checkpoints it faults, newest first until one passes; the `checkpoint`
  file then names that one.

  Args:
    keep_one: if checkpoints exist and none passes, raise instead, moving nothing.

  Returns:
    "file: why" for each set aside, and the newest checkpoint that passes, or None.

  Raises:
    ValueError: with `keep_one`, when no checkpoint passes.
  """
  backup = os.path.join(model_dir, BACKUP_SUBDIR)
  newest_backup = tf.train.latest_checkpoint(os.path.join(backup, "chief"))
  backup_reason = newest_backup and why(newest_backup)
  state = tf.train.get_checkpoint_state(model_dir)
  paths = list(state.all_model_checkpoint_paths) if state else []
  faulted = []
  while paths:
    reason = why(paths[-1])
    if not reason:
      break
    faulted.append((paths.pop(), reason))
  moved = ([f"{BACKUP_SUBDIR}/: {backup_reason}"] if backup_reason else []) + [
      f"{os.path.basename(path)}: {reason}" for path, reason in faulted]
  if keep_one and faulted and not paths:
    raise ValueError(
        f"no checkpoint in --model_dir={model_dir} loads ({'; '.join(moved)}). Nothing was "
        "moved or deleted. Restore the files from a copy, move them away to start afresh "
        "in this directory, or choose a new --model_dir.")
  aside = os.path.join(model_dir, subdir)
  if moved:
    tf.io.gfile.makedirs(aside)
  if backup_reason:
    tf.io.gfile.rename(backup, os.path.join(aside, BACKUP_SUBDIR), overwrite=True)
  for path, _ in faulted:
    for name in tf.io.gfile.glob(path + ".*"):
      tf.io.gfile.rename(name, os.path.join(aside, os.path.basename(name)), overwrite=True)
  if faulted:
    if paths:
      tf.compat.v1.train.update_checkpoint_state(model_dir, paths[-1],
                                                 all_model_checkpoint_paths=paths)
    else:
      tf.io.gfile.remove(os.path.join(model_dir, "checkpoint"))
  return moved, (paths[-1] if paths else None)


def set_aside_diverged(model_dir: str, error: DivergedError) -> DivergedError:
  """Chief only, after a divergence: moves what holds NaN or Inf into `model_dir/diverged/`.

  The weights go non-finite one step before the loss shows it, so the newest
  checkpoints (and a Keras backup) may already hold NaN: each is moved aside,
  never deleted, newest first until one is finite, and the `checkpoint` file
  then names that one, which a run with better settings resumes from.

  Returns:
    `error`, its message extended with what was moved and what is kept.
  """
  moved, kept = _set_aside(model_dir, DIVERGED_SUBDIR, _non_finite)
  where = (f"Moved to {os.path.join(model_dir, DIVERGED_SUBDIR)}: {'; '.join(moved)}. "
           if moved else "Nothing saved holds NaN or Inf. ")
  kept = (f"The newest finite checkpoint, {kept}, is kept." if kept else
          "No finite checkpoint is left.")
  return DivergedError(f"{error} {where}{kept}")


def set_aside_damaged(model_dir: str) -> List[str]:
  """Writer only, before a resume: moves checkpoints that do not load into `model_dir/corrupt/`.

  A crash or a full disk mid-save can truncate the newest checkpoint (or Keras
  backup); the run then resumes from the newest one that loads. A save cut
  short leaves its staging directory (`<checkpoint>_temp`, which a complete
  save merges and removes): it is moved there too.

  Returns:
    "file: why" for each one moved.

  Raises:
    ValueError: if checkpoints exist and none loads; nothing is moved then.
  """
  moved, kept = _set_aside(model_dir, CORRUPT_SUBDIR, _damage, keep_one=True)
  aside = os.path.join(model_dir, CORRUPT_SUBDIR)
  for staging in sorted(tf.io.gfile.glob(os.path.join(model_dir, "*ckpt-*_temp"))):
    tf.io.gfile.makedirs(aside)
    name = os.path.basename(staging)
    tf.io.gfile.rename(staging, os.path.join(aside, name), overwrite=True)
    moved.append(f"{name}/: a save cut short")
  if moved:
    logging.warning("Set aside in %s what does not load: %s. Resuming from %s.",
                    os.path.join(model_dir, CORRUPT_SUBDIR), "; ".join(moved),
                    kept or "the start")
  return moved


class Progress:
  """What both trainers report while training: log lines and, on the chief, records.

  `start` logs "Training from step S to T." and records a `start` record
  with the start-up milestones; `log` logs "step N/T: loss L, X steps/s, ETA
  Y s" and records a `step` record. `loss` is the mean global-batch training
  loss over the steps since the previous log, in both backends.
  """

  def __init__(self, total: int, model_dir: Optional[str]):
    """model_dir: where the chief records progress; None on other workers."""
    self._total, self._model_dir = total, model_dir
    self.first_step = self.last_step = 0
    self.start_time = self.end_time = self.first_step_time = self._last_time = 0.0

  def start(self, step: int) -> None:
    self.first_step = self.last_step = step
    self.start_time = self._last_time = time.time()
    logging.info("Training from step %d to %d.", step, self._total)
    if self._model_dir:
      record_progress(self._model_dir, "start", from_step=int(step), to_step=self._total,
                      startup={k: round(v, 3) for k, v in _STARTUP.items()})

  def first_step_done(self) -> None:
    if not self.first_step_time:
      self.first_step_time = time.time()

  def log(self, step: int, loss: float) -> float:
    """Reports the window ending at `step`; returns its steps/s."""
    now = time.time()
    steps_per_sec = (step - self.last_step) / max(now - self._last_time, 1e-9)
    eta = (self._total - step) / max(steps_per_sec, 1e-9)
    logging.info("step %d/%d: loss %.4f, %.1f steps/s, ETA %.0f s", step, self._total, loss,
                 steps_per_sec, eta)
    if self._model_dir:
      record_progress(self._model_dir, "step", step=int(step), loss=float(loss),
                      steps_per_sec=round(steps_per_sec, 3))
    self.last_step, self._last_time = step, now
    return steps_per_sec

  def end(self) -> None:
    self.end_time = time.time()


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


KERAS_STEP_KEY = "model/optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"


def _checkpoint_owner(shapes: Mapping[str, Sequence[int]]) -> str:
  """"keras" for object-based checkpoints (tf.train.Checkpoint), "estimator" for name-based."""
  return "keras" if "_CHECKPOINTABLE_OBJECT_GRAPH" in shapes else "estimator"


def _model_mismatch(owner: str, shapes: Mapping[str, Sequence[int]]) -> Optional[str]:
  """How a checkpoint's weights differ from build_model's, or None if they match."""
  # In a graph of its own: an eager op here would start TensorFlow's runtime
  # before the strategy can configure it.
  with tf.Graph().as_default():
    layers = [layer for layer in model_lib.build_model(seed=0).layers if layer.weights]
    expected = {}
    for i, layer in enumerate(layers):
      for weight in layer.weights:
        name = model_lib.weight_name(weight)
        key = (name if owner == "estimator" else
               f"model/layer_with_weights-{i}/{name.split('/')[-1]}/.ATTRIBUTES/VARIABLE_VALUE")
        expected[key] = weight.shape.as_list()
  for key, shape in expected.items():
    if key not in shapes:
      return f"it has no variable {key}"
    if list(shapes[key]) != shape:
      return f"{key} has shape {list(shapes[key])}, this model's has {shape}"
  return None


def checkpoint_step(path: str) -> Tuple[str, int]:
  """The backend that wrote a checkpoint and its global step; raises if it cannot be read."""
  reader = tf.train.load_checkpoint(path)
  owner = _checkpoint_owner(reader.get_variable_to_shape_map())
  return owner, int(reader.get_tensor(KERAS_STEP_KEY if owner == "keras" else "global_step"))


def checkpoint_problem(backend: str, model_dir: str) -> Optional[str]:
  """Why `backend` cannot resume from model_dir's checkpoint, or None if it can (or has none).

  The Estimator resumes from `model_dir`'s checkpoint, Keras from its final
  checkpoint or its backup. A checkpoint of the other backend, or of another
  model, is reported (naming it, whose it is, and the fix) and left untouched.
  """
  for directory in (model_dir, os.path.join(model_dir, BACKUP_SUBDIR, "chief")):
    path = tf.train.latest_checkpoint(directory)
    if path is None:
      continue
    shapes = dict(tf.train.list_variables(path))
    owner = _checkpoint_owner(shapes)
    if owner != backend:
      return (f"--model_dir={model_dir} holds a checkpoint of the {owner} backend ({path}); "
              f"the {backend} backend cannot resume from it and will not overwrite it. Choose a "
              f"new --model_dir, resume it with python -m trainers.{owner}_main, or carry it "
              f"across with python -m launch.convert --from_{owner}={model_dir} "
              f"--to_{backend}=NEW_MODEL_DIR.")
    mismatch = _model_mismatch(owner, shapes)
    if mismatch:
      return (f"--model_dir={model_dir} holds a checkpoint of a different model ({path}: "
              f"{mismatch}); it will not be overwritten. Choose a new --model_dir.")
  return None


def read_eval_results(eval_dir: str) -> Dict[int, Dict[str, float]]:
  """Every step the evaluator evaluated, with its accuracy and loss, from its event files.

  The Estimator writes both in one event; Keras's tf.summary writes one event
  per value: both are read.
  """
  values: Dict[int, Dict[str, float]] = {}
  for path in sorted(glob.glob(os.path.join(eval_dir, "events.out.tfevents.*"))):
    try:
      for event in tf.compat.v1.train.summary_iterator(path):
        for v in event.summary.value:
          if v.tag in ("accuracy", "loss"):
            values.setdefault(int(event.step), {})[v.tag] = _scalar(v)
    except tf.errors.DataLossError:
      pass  # The evaluator is still writing this file.
  return {step: metrics for step, metrics in sorted(values.items()) if len(metrics) == 2}


def read_eval_result(eval_dir: str, step: int) -> Optional[Dict[str, float]]:
  """The evaluator's accuracy and loss at `step`, or None if it has not evaluated it."""
  return read_eval_results(eval_dir).get(step)


def _scalar(value) -> float:
  """A scalar summary's value: TF1 summaries (the Estimator's) or TF2 tensors (Keras's)."""
  if value.HasField("tensor"):
    return float(tf.make_ndarray(value.tensor))
  return float(value.simple_value)


def wait_for_eval(model_dir: str, step: int, timeout: float = RESULT_WAIT_SECONDS
                  ) -> Dict[str, float]:
  """Waits for the evaluator task's result at `step` (the chief's final step)."""
  eval_dir = os.path.join(model_dir, EVAL_SUBDIR)
  deadline = time.monotonic() + timeout
  logging.info("Waiting for the evaluator's result at step %d in %s", step, eval_dir)
  while time.monotonic() < deadline:
    result = read_eval_result(eval_dir, step)
    if result:
      return result
    time.sleep(1.0)
  raise TimeoutError(
      f"No evaluation of step {step} appeared in {eval_dir} within {timeout:.0f} s: "
      "is the evaluator task running? (launch.local --evaluator starts one)."
  )


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
    trained_steps: int,
    export_dir: str,
    first_step_time: Optional[float] = None,
) -> Dict[str, Any]:
  """Writes summary.json to model_dir and prints it as the last stdout line.

  Args:
    backend: "keras" or "estimator".
    config: the run's hyperparameters.
    model_dir: the chief's model directory.
    workers: number of training workers.
    global_step: the final optimizer step.
    metrics: test-split "accuracy" and "loss".
    train_seconds: wall time of this process's training loop.
    trained_steps: the steps it ran (fewer than global_step after a resume).
    export_dir: the SavedModel written.
    first_step_time: unix time when this run's first training step finished
      (launch.bench measures launch-to-first-step with it).

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
          trained_steps * config.global_batch_size / train_seconds if train_seconds > 0 else 0,
          1),
      "model_dir": model_dir,
      "export_dir": export_dir,
  }
  if first_step_time:
    summary["first_step_time"] = round(first_step_time, 3)
  path = os.path.join(model_dir, SUMMARY_FILE)
  with tf.io.gfile.GFile(path + ".tmp", "w") as f:
    json.dump(summary, f, indent=2)
  tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
  logging.info("Wrote %s%s", path, f"; SavedModel in {export_dir}" if export_dir else "")
  print(json.dumps(summary), flush=True)
  return summary
