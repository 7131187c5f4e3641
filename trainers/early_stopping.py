"""Early stopping (`--early_stopping_metric`), as `tf.estimator.experimental.
stop_if_no_decrease_hook` (`--early_stopping_mode=min`) and `stop_if_no_increase_hook` (max)
stop a run under MultiWorkerMirroredStrategy, written once for both backends.

    python -m trainers.keras_main --workers=2 --early_stopping_metric=loss \\
        --early_stopping_steps=1000 --early_stopping_check_every_steps=100

The chief checks the evaluator's results in model_dir/eval (either backend's records,
read by trainers/evaluation.py) at the first step its process trains and every
`--early_stopping_check_every_steps` steps after, as the hooks' step timer does. When the
metric has not improved for `--early_stopping_steps` training steps (`no_improvement`, the
hooks' rule, evaluations before `--early_stopping_min_steps` left out), it decides: every
training task stops after the next step, as the hook's vote takes effect one step later
(over the cluster's key-value store: preemption.Agreement). That step is saved, as a
preemption's is, and is the run's last: the chief records it (`early_stop.json`) before training it,
so both evaluators end once they have evaluated it (`final_step`) and the same command again
trains nothing more.
"""

import dataclasses
import json
import os
from typing import Dict, Mapping, Optional

import tensorflow as tf
from absl import logging

from trainers import evaluation
from trainers import model_dir as layout
from trainers import preemption
from trainers.config import Config

PREFIX = "early_stop/"  # Its agreement's keys in the cluster's key-value store.


@dataclasses.dataclass(frozen=True)
class Rule:
  """What stops a run: `metric` not improved (lower for "min") over `steps` training steps,
  counting evaluations from `min_steps`, checked every `every` steps."""

  metric: str
  mode: str
  steps: int
  min_steps: int
  every: int

  @classmethod
  def of(cls, config: Config) -> Optional["Rule"]:
    """The run's rule, or None without --early_stopping_metric."""
    if not config.early_stopping_metric:
      return None
    return cls(config.early_stopping_metric, config.early_stopping_mode,
               config.early_stopping_steps, config.early_stopping_min_steps,
               config.early_stopping_every())

  def better(self, value: float, than: float) -> bool:
    return value > than if self.mode == "max" else value < than


@dataclasses.dataclass(frozen=True)
class Decision:
  """Why a check stopped the run: at evaluation `at`, `metric` had not improved since
  `best_step`'s `best`."""

  at: int
  best_step: int
  best: float


def no_improvement(rule: Rule, results: Mapping[int, Mapping[str, float]]
                   ) -> Optional[Decision]:
  """The hooks' stop_if_no_metric_improvement_fn over `results` (step -> metrics): the first
  evaluation `rule.steps` or more steps after the best one before it, or None."""
  best: Optional[float] = None
  best_step = 0
  for step in sorted(results):
    if step < rule.min_steps:
      continue
    value = evaluation.metric_value(results[step], rule.metric, "--early_stopping_metric", step)
    if best is None or rule.better(value, best):
      best, best_step = value, step
    if step - best_step >= rule.steps:
      return Decision(step, best_step, best)
  return None


class Checks:
  """The chief's checks in one training process: `after_step` after each step."""

  def __init__(self, rule: Rule, model_dir: str, agreement: preemption.Agreement):
    self._rule, self._model_dir, self._agreement = rule, model_dir, agreement
    self._last: Optional[int] = None

  def after_step(self, step: int) -> None:
    """Checks at the first step and every `rule.every` after the last check (the hooks'
    SecondOrStepTimer); on a stop, records the next step as the last and asks every task to
    stop after it."""
    if self._last is not None and step < self._last + self._rule.every:
      return
    self._last = step
    results = evaluation.read_results(os.path.join(self._model_dir, layout.EVAL_SUBDIR))
    decision = no_improvement(self._rule, results)
    if decision is None:
      return
    rule = self._rule
    logging.info("No %s in %s for %d steps (best %.6g at step %d, evaluated to step %d): "
                 "stopping after step %d (--early_stopping_steps=%d).",
                 "increase" if rule.mode == "max" else "decrease", rule.metric,
                 decision.at - decision.best_step, decision.best, decision.best_step,
                 decision.at, step + 1, rule.steps)
    _write_record(self._model_dir, {
        "step": step + 1, "checked_at": step, "metric": rule.metric, "mode": rule.mode,
        "best_step": decision.best_step, "best": decision.best, "decided_at": decision.at,
        "evaluated_steps": sorted(results)})
    self._agreement.request(step)


def _write_record(model_dir: str, record: Dict) -> None:
  path = os.path.join(model_dir, layout.EARLY_STOP_FILE)
  with tf.io.gfile.GFile(path + ".tmp", "w") as f:
    json.dump(record, f, indent=2)
  tf.io.gfile.rename(path + ".tmp", path, overwrite=True)


def read_record(model_dir: str) -> Optional[Dict]:
  """The record of the early stop that ended the run in model_dir, or None."""
  try:
    with tf.io.gfile.GFile(os.path.join(model_dir, layout.EARLY_STOP_FILE)) as f:
      return json.load(f)
  except (tf.errors.NotFoundError, ValueError):
    return None


def final_step(config: Config, model_dir: str) -> int:
  """The run's last step: where an early stop ended it, else --train_steps."""
  record = read_record(model_dir) if config.early_stopping_metric else None
  return min(record["step"], config.train_steps) if record else config.train_steps


def for_run(config: Config, model_dir: str) -> Config:
  """The run's config with train_steps at its last step (`final_step`), the schedule's
  length kept: what the backends train to after an early stop."""
  step = final_step(config, model_dir)
  if step == config.train_steps:
    return config
  return dataclasses.replace(config, train_steps=step,
                             decay_steps=config.decay_steps or config.train_steps)


class EvaluationDone(Exception):
  """Raised by an evaluator's per-evaluation callback once the run's last step (`final_step`:
  an early stop's) is evaluated and written: it ends the evaluator's loop, which would
  otherwise wait for --train_steps."""


def end_if_final(config: Config, model_dir: str, step: int) -> None:
  """After an evaluator wrote its evaluation of `step`: EvaluationDone if that was the
  early-stopped run's last step (at --train_steps the evaluator ends on its own)."""
  final = final_step(config, model_dir)
  if final < config.train_steps and step >= final:
    logging.info("Evaluated step %d, where early stopping ended the run: the evaluator ends.",
                 step)
    raise EvaluationDone(step)
