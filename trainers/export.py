"""Where SavedModels go, and which ones a run keeps (`--export`).

    --export=final   (default) the chief exports the trained model once, to
                     model_dir/export/<unix time>, as `estimator.export_saved_model` names it.
    --export=latest  the task that evaluates (the evaluator task, or the chief where it
                     evaluates) exports every checkpoint it evaluated, as
                     `tf.estimator.LatestExporter` in the EvalSpec does.
    --export=best    it exports each checkpoint whose evaluation is the best so far by
                     --export_metric (lower for --export_mode=min), as
                     `tf.estimator.BestExporter` does, the first evaluation of each evaluating
                     process always (BestExporter's `_has_exported`).

Latest and best keep the --exports_to_keep exports with the largest timestamps (the
exporters' garbage collection), in model_dir/export/<exporter name>/<unix time>, the
layout the Estimator's exporters write: TF Serving can watch that directory. The Estimator
backend runs the exporters themselves; Keras runs `Exports`, their rule written once more;
`tests/trainers/test_export.py` replays one evaluation history into both. Each decision,
export or not, is a line of that directory's `exports.jsonl` (`read_record`): the step, its
metric, the export; the chief waits there for the final step's (`wait_for`).
"""

import dataclasses
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

import tensorflow as tf
from absl import logging

from trainers import evaluation
from trainers import model_dir as layout
from trainers.config import Config

FINAL, LATEST, BEST = "final", "latest", "best"
DEFAULT_EXPORTS_TO_KEEP = 5  # LatestExporter's and BestExporter's.
RECORD_FILE = "exports.jsonl"
_TIMESTAMP_ATTEMPTS = 10  # As export_utils.get_timestamped_export_dir, a second apart.


@dataclasses.dataclass(frozen=True)
class Policy:
  """--export=latest or best: which evaluated checkpoints are exported, and how many kept
  (`keep`; None keeps all)."""

  kind: str
  keep: Optional[int]
  metric: Optional[str] = None
  mode: str = "min"

  @classmethod
  def of(cls, config: Config) -> Optional["Policy"]:
    """The run's policy; None for --export=final, which the chief does once."""
    if config.export == FINAL:
      return None
    keep = (DEFAULT_EXPORTS_TO_KEEP if config.exports_to_keep is None
            else config.exports_to_keep or None)
    return cls(config.export, keep, config.export_metric, config.export_mode)

  @property
  def name(self) -> str:
    """The exporter's name, its directory under model_dir/export: BestExporter's default."""
    return f"{self.kind}_exporter"

  def directory(self, model_dir: str) -> str:
    return os.path.join(model_dir, layout.EXPORT_SUBDIR, self.name)

  def value(self, metrics: Mapping[str, Any], step: Optional[int] = None) -> float:
    """The evaluation's --export_metric (evaluation.metric_value: MissingMetricError)."""
    return evaluation.metric_value(metrics, self.metric, "--export_metric", step)

  def better(self, current: Mapping[str, Any], best: Mapping[str, Any]) -> bool:
    """BestExporter's compare_fn: whether the evaluation `current` beats `best` (the loss the
    per-example mean in both)."""
    now, then = self.value(current), self.value(best)
    return now > then if self.mode == "max" else now < then


def new_export_dir(parent: str) -> str:
  """A fresh `parent/<unix time>` (not created); a second later if that one is taken, as the
  Estimator's get_timestamped_export_dir waits."""
  tf.io.gfile.makedirs(parent)
  for _ in range(_TIMESTAMP_ATTEMPTS):
    path = os.path.join(parent, str(int(time.time())))
    if not tf.io.gfile.exists(path):
      return path
    time.sleep(1.0)
  raise RuntimeError(f"No free timestamped export directory in {parent} after "
                     f"{_TIMESTAMP_ATTEMPTS} s: is another process exporting there?")


def write_staged(parent: str, save: Callable[[str], None]) -> str:
  """Calls `save(directory)` on a staging directory beside the export's final name under
  `parent`, then renames it into place; a failed save leaves nothing under that name.

  Returns:
    The export directory.
  """
  export_dir = new_export_dir(parent)
  staging = tempfile.mkdtemp(prefix=".tmp-export-", dir=parent)
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(staging, 0o777 & ~umask)  # As the Estimator's exports: mkdtemp's 0700 is for scratch.
  try:
    save(staging)
    os.rename(staging, export_dir)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
  return export_dir


def final_export_parent(model_dir: str) -> str:
  """Where --export=final writes: model_dir/export."""
  return os.path.join(model_dir, layout.EXPORT_SUBDIR)


def collect_garbage(parent: str, keep: Optional[int]) -> None:
  """Deletes all but the `keep` largest exports under `parent` (names of 10 digits), as the
  exporters' _garbage_collect_exports; None keeps all."""
  if keep is None or not tf.io.gfile.isdir(parent):
    return
  versions = sorted(int(name) for name in tf.io.gfile.listdir(parent)
                    if len(name.rstrip("/")) == 10 and name.rstrip("/").isdigit())
  for version in versions[:-keep]:
    try:
      tf.io.gfile.rmtree(os.path.join(parent, str(version)))
    except tf.errors.NotFoundError as e:
      logging.warning("Can not delete %s: %s", version, e)


def record(parent: str, step: int, metrics: Mapping[str, Any],
           export_dir: Optional[str]) -> None:
  """Records one evaluation's decision in `parent/exports.jsonl`: exported to `export_dir`, or
  not (None)."""
  tf.io.gfile.makedirs(parent)
  layout.append_record(os.path.join(parent, RECORD_FILE), {
      "step": step, "export_dir": export_dir, "time": round(time.time(), 3),
      "metrics": {k: float(v) for k, v in evaluation.mean_loss(dict(metrics)).items()
                  if k != "global_step"}})


def read_record(model_dir: str, policy: Policy) -> List[Dict[str, Any]]:
  """Every decision recorded under the policy's directory, oldest first."""
  return layout.read_records(os.path.join(policy.directory(model_dir), RECORD_FILE))


def current(model_dir: str, policy: Policy) -> Optional[str]:
  """The newest export the record names that is still there: the latest, or the best."""
  for entry in reversed(read_record(model_dir, policy)):
    if entry["export_dir"] and tf.io.gfile.isdir(entry["export_dir"]):
      return entry["export_dir"]
  return None


def wait_for(model_dir: str, policy: Policy, step: int,
             timeout: float = evaluation.RESULT_WAIT_SECONDS) -> Optional[str]:
  """Waits until the evaluating task has decided on `step`'s export (the chief's final step);
  returns the current export (`current`)."""
  deadline = time.monotonic() + timeout
  while not any(entry["step"] >= step for entry in read_record(model_dir, policy)):
    if time.monotonic() > deadline:
      raise TimeoutError(
          f"The evaluator recorded no export decision for step {step} in "
          f"{policy.directory(model_dir)} within {timeout:.0f} s: is it running?")
    time.sleep(evaluation.POLL_SECONDS)
  return current(model_dir, policy)


class Exports:
  """One evaluating process's exports under a `Policy`, as the Estimator's LatestExporter and
  BestExporter decide them (Keras; the Estimator backend runs those exporters).

  `after_evaluation(step, metrics, save)` after each evaluation is written: `save(directory)`
  writes the evaluated model as a SavedModel when the policy exports it.
  """

  def __init__(self, policy: Policy, model_dir: str):
    self._policy, self._parent = policy, policy.directory(model_dir)
    self._best: Optional[Mapping[str, Any]] = None

  def after_evaluation(self, step: int, metrics: Mapping[str, Any],
                       save: Callable[[str], None]) -> Optional[str]:
    """Exports if the policy says so, keeps `keep`, records the decision; returns the
    export, or None."""
    policy = self._policy
    export_dir = None
    if policy.kind == BEST:
      policy.value(metrics, step)  # Every evaluation has the metric, the first too.
    if policy.kind == LATEST or self._best is None or policy.better(metrics, self._best):
      self._best = dict(metrics)
      export_dir = write_staged(self._parent, save)
      logging.info("Exported step %d to %s (--export=%s).", step, export_dir, policy.kind)
      collect_garbage(self._parent, policy.keep)
    record(self._parent, step, metrics, export_dir)
    return export_dir
