"""What a model_dir's run is trained with, and what a resume may change of it.

The writer (a lone process, a local cluster's launcher, or a chief) records the
settings that shape the numbers in `model_dir/run.json` when the run first
starts. A later start on a model_dir that holds a checkpoint compares its own
settings with that record:

- `--train_steps` may change: a run goes on longer (or stops earlier). With
  `--decay_steps=0` the schedule follows it, so the learning rates change from
  the step reached on: that is said, not refused.
- The worker count may change while the global batch stays: it is recorded.
- The optimizer may not change: the checkpoint holds its state, which another
  optimizer has no place for.
- Anything else (backend, model and its options, its task, batch, the optimizer's
  hyperparameters, seed, the schedule's length) is refused with exit 2 listing each
  difference, unless `--allow_config_change` is given: then the change is recorded
  in `progress.jsonl` and the record updated.

A model_dir with no checkpoint has nothing to resume: its record is rewritten.
The writer calls `changes` with every other check, before it writes anything,
then `record`. No TensorFlow import here, so a launcher checks before any task
starts.
"""

import json
import os
import re
from typing import Any, Dict, List, Optional

from trainers import config as config_lib
from trainers.config import Config

RECORD_FILE = "run.json"
# The settings compared, with the flag that sets each ("schedule" is the
# learning-rate schedule's length: --decay_steps, or --train_steps when 0).
_FLAGS = {"backend": "the backend", "estimator_program": "--estimator_program",
          "program_params": "--program_params", "model": "--model",
          "model_options": "--model_options", "task": "--task",
          "global_batch_size": "--global_batch_size",
          **{name: f"--{name}" for name in config_lib.HYPERPARAMETERS},
          **{name: f"--{name}" for name in config_lib.CANNED_SETTINGS},
          "seed": "--seed", "schedule": "--decay_steps",
          **{name: f"--{name}" for name in ("learning_rate_schedule", "warmup_steps",
                                            *config_lib.SCHEDULE_SETTINGS,
                                            "clip_global_norm")}}


# What a canned model's record names as its optimizer: its parts' are its own settings.
CANNED_OPTIMIZER = "canned"
# What an Estimator's record names as a team's program's optimizer: its model_fn's own.
PROGRAM_OPTIMIZER = "program"
# The settings naming the optimizers whose state a checkpoint holds: never changed on resume.
_OPTIMIZERS = ("optimizer", "dnn_optimizer", "linear_optimizer")


def optimizer_of(record: Dict[str, Any]) -> str:
  """The optimizer a recorded run trained with; a record older than --optimizer: momentum."""
  return record.get("optimizer", "momentum")


class ConfigChangeError(ValueError):
  """A resume whose settings differ from the run it resumes; the message lists them."""


def settings(backend: str, config: Config, workers: int) -> Dict[str, Any]:
  """The record of a run of `backend` with `config` on `workers` workers."""
  canned = config.canned_settings()
  program = {"estimator_program": config.estimator_program,
             "program_params": config.program_params}
  model = {"model": config.model, "model_options": config.model_options, "task": config.task}
  if backend == "estimator" and config.estimator_program:
    # Their model_fn holds the model, its optimizer and schedule.
    model, optimizer = {}, {"optimizer": PROGRAM_OPTIMIZER}
  elif canned:
    optimizer = {"optimizer": CANNED_OPTIMIZER, **canned}
  else:
    optimizer = {"optimizer": config.optimizer, **config.hyperparameters(),
                 "learning_rate_schedule": config.learning_rate_schedule,
                 "warmup_steps": config.warmup_steps, **config.schedule_settings(),
                 "clip_global_norm": config.clip_global_norm}
  return {"backend": backend, "workers": workers, **program, **model,
          "global_batch_size": config.global_batch_size, **optimizer, "seed": config.seed,
          "schedule": config.schedule_steps(), "train_steps": config.train_steps}


# A run's groups of settings: the first of each names what the others are settings of.
_GROUPS = (("model", "model_options", "task", *config_lib.CANNED_SETTINGS),
           ("optimizer", *config_lib.HYPERPARAMETERS),
           ("learning_rate_schedule", "warmup_steps", *config_lib.SCHEDULE_SETTINGS))
_ALONE = ("estimator_program", "program_params", "global_batch_size", "seed",
          "clip_global_norm", "train_steps")


def holds_a_run(model_dir: str) -> bool:
  """Whether model_dir holds a checkpoint (either backend's) or a Keras backup, found by
  file name alone."""
  try:
    names = os.listdir(model_dir)
  except OSError:
    return False
  # trainers.model_dir.BACKUP_SUBDIR, and checkpoints.find's names (both import TensorFlow).
  return "backup" in names or any(re.match(r"^(model\.)?ckpt-\d+\.index$", n) for n in names)


def resumed_settings(model_dir: Optional[str], given: Dict[str, Any]) -> Dict[str, Any]:
  """The Config fields a start on model_dir takes from its record, for the flags not
  `given` (the Config fields given, with their values): a resume needs no flags. Only
  where model_dir holds a run to resume; a setting of the model, optimizer or schedule
  only when the one given is the recorded one (else `changes` refuses the change, naming
  it). `{}` for a new run."""
  recorded = read(model_dir) if model_dir and holds_a_run(model_dir) else None
  if not recorded:
    return {}
  taken = {}
  for first, *rest in _GROUPS:
    if recorded.get(first) in (None, CANNED_OPTIMIZER, PROGRAM_OPTIMIZER):
      continue
    if first not in given:
      taken[first] = recorded[first]
    elif recorded[first] != given[first]:
      continue
    taken.update({k: recorded[k] for k in rest if k in recorded and k not in given})
  taken.update({k: recorded[k] for k in _ALONE if k in recorded and k not in given})
  schedule = recorded.get("schedule")
  if "decay_steps" not in given and schedule not in (None, recorded.get("train_steps")):
    taken["decay_steps"] = schedule  # Given then: 0 follows --train_steps.
  return taken


def read(model_dir: str) -> Optional[Dict[str, Any]]:
  """model_dir's run record, or None if it has none (or one that does not parse)."""
  try:
    with open(os.path.join(model_dir, RECORD_FILE)) as f:
      record = json.load(f)
  except (OSError, ValueError):
    return None
  return record if isinstance(record, dict) else None


def write(model_dir: str, record: Dict[str, Any]) -> None:
  """Writes the record whole, by a rename."""
  path = os.path.join(model_dir, RECORD_FILE)
  with open(path + ".tmp", "w") as f:
    json.dump(record, f, indent=2)
  os.replace(path + ".tmp", path)


def _refused(recorded: Dict[str, Any], current: Dict[str, Any], config: Config) -> List[str]:
  """The differences that need --allow_config_change, one line each."""
  lines = []
  for key, flag in _FLAGS.items():
    if key not in recorded or recorded[key] == current.get(key):
      continue
    if key == "schedule" and not config.decay_steps:
      continue  # Follows --train_steps, which may change; said by `changes`.
    lines.append(f"{flag}: {recorded[key]} in the run, {current.get(key, 'not read')} now")
  return lines


def changes(model_dir: str, current: Dict[str, Any], config: Config, *,
            has_checkpoint: bool, allow_change: bool) -> List[str]:
  """What a start changes of model_dir's recorded run, if it may; writes nothing.

  Args:
    model_dir: the run's directory.
    current: `settings(...)` of this start.
    config: this start's hyperparameters.
    has_checkpoint: whether model_dir holds a checkpoint this start resumes.
    allow_change: --allow_config_change.

  Returns:
    What changed and is allowed, one line each, for `record` and the log.

  Raises:
    ConfigChangeError: listing the differences and the fixes.
  """
  recorded = read(model_dir) if has_checkpoint else None
  if recorded is None:
    return []
  refused = _refused(recorded, current, config)
  for key in _OPTIMIZERS:
    was = optimizer_of(recorded) if key == "optimizer" else recorded.get(key)
    if was != current.get(key) and (key == "optimizer" or was is not None):
      raise ConfigChangeError(
          f"--model_dir={model_dir} holds a run trained with --{key}={was}, whose state its "
          f"checkpoint holds; this start asks for --{key}={current.get(key)}. Give that "
          f"--{key} to resume it, or choose another --model_dir.")
  if refused and not allow_change:
    raise ConfigChangeError(
        f"--model_dir={model_dir} holds a run trained with other settings "
        f"({RECORD_FILE}):\n  " + "\n  ".join(refused) + "\nGive the run's values to resume "
        "it, or --allow_config_change to go on with the new ones (the change is recorded "
        "in progress.jsonl), or choose another --model_dir.")
  allowed = list(refused)
  if recorded.get("workers") not in (None, current["workers"]):
    allowed.append(f"workers: {recorded['workers']} in the run, {current['workers']} now "
                   f"(the global batch stays {current['global_batch_size']})")
  if ("schedule" in recorded and recorded["schedule"] != current["schedule"]
      and not config.decay_steps):
    allowed.append(f"the learning-rate schedule: {recorded['schedule']} steps in the run, "
                   f"{current['schedule']} now, as --train_steps changed with "
                   f"--decay_steps=0; give --decay_steps={recorded['schedule']} to keep it")
  return allowed


def record(model_dir: str, current: Dict[str, Any], changed: List[str]) -> None:
  """Records this start's settings, and in `progress.jsonl` what `changes` allowed."""
  if changed:
    from trainers import model_dir as layout  # noqa: PLC0415 -- imports TensorFlow.
    layout.record_progress(model_dir, "config_change", changes=changed)
  if read(model_dir) != current:
    write(model_dir, current)
