"""Flags of the trainer binaries; defined only when a binary calls define_flags.

Each flag is declared once, with its type, default and help: how to run in `RunOptions`'s
fields (trainers/run_options.py), what to train in `Config`'s. `help_table()` renders the
same texts for docs/training.md.
"""

import dataclasses
import os
import sys
import typing
from typing import Any, Dict, List, Sequence, Tuple

from absl import app
from absl import flags
from absl import logging

from trainers import config as config_lib
from trainers import model_registry
from trainers import run_lock
from trainers import run_options
from trainers import run_record
from trainers.config import Config
from trainers.run_options import RunOptions

FLAGS = flags.FLAGS
ConfigFlags = Dict[str, flags.FlagHolder]
# The Config fields that name the model (with its head and a canned model's settings), and
# the optimizer with its hyperparameters.
MODEL_FIELDS = ("model", "model_options", "task", *config_lib.CANNED_SETTINGS)
OPTIMIZER_FIELDS = ("optimizer", *config_lib.HYPERPARAMETERS)
# How the optimizer steps: the schedule (its length, --decay_steps, is a tool's own where it
# sets one apart) and clipping.
STEP_FIELDS = ("learning_rate_schedule", "warmup_steps", *config_lib.SCHEDULE_SETTINGS,
               "clip_global_norm")
TRAINING_FIELDS = MODEL_FIELDS + OPTIMIZER_FIELDS + STEP_FIELDS
# A team's own program (--estimator_program), for the tools that take one.
PROGRAM_FIELDS = ("estimator_program", "program_params")
# Where a run's model starts (trainers/warm_start.py).
WARM_START_FIELDS = ("warm_start_from", "warm_start_vars", "warm_start_map")
_DEFINE = {int: flags.DEFINE_integer, float: flags.DEFINE_float, bool: flags.DEFINE_bool,
           str: flags.DEFINE_string}


def _all_flags() -> List[Tuple[str, type, object, str]]:
  """(name, type, default, help) of every trainer flag, run flags first."""
  rows = []
  for field in (*run_options.FLAG_FIELDS, *dataclasses.fields(Config)):
    kind = next(t for t in (int, float, bool, str)  # Optional[float] is a float flag.
                if field.type is t or t in typing.get_args(field.type))
    rows.append((field.name, kind, field.default, field.metadata["help"]))
  return rows


def help_text(name: str) -> str:
  """The help of one launcher flag, for binaries that define it too."""
  return next(f.metadata["help"] for f in run_options.FLAG_FIELDS if f.name == name)


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
  """Defines the launcher flags and one flag per Config field."""
  for name, kind, default, text in _all_flags():
    _DEFINE[kind](name, default, text, flag_values=flag_values)


def help_table() -> str:
  """docs/training.md's flag table, from the same help texts as --help."""
  rows = ["| flag | default | meaning |", "| --- | --- | --- |"]
  for name, _, default, text in _all_flags():
    shown = "none" if default is None else str(default).lower() if isinstance(default, bool) \
        else str(default)
    rows.append(f"| `--{name}` | {shown} | {text} |")
  return "\n".join(rows)


def config_from_flags(flag_values: flags.FlagValues = FLAGS) -> Config:
  """The Config the parsed flags describe. On a --model_dir that holds a run, the flags left
  out take the values its `run.json` records (trainers.run_record.resumed_settings), said in
  one line: a resume needs no flags."""
  values = {f.name: flag_values[f.name].value for f in dataclasses.fields(Config)}
  model_dir = flag_values["model_dir"].value if "model_dir" in flag_values else None
  taken = run_record.resumed_settings(
      model_dir, {name: value for name, value in values.items() if flag_values[name].present})
  taken = {name: value for name, value in taken.items() if value != values[name]}
  if taken and not run_lock.held_by_launcher(model_dir):  # Said by the launcher alone.
    logging.info("Resuming with the settings %s records: %s", os.path.join(
        model_dir, run_record.RECORD_FILE), " ".join(config_to_flags(Config(**taken), taken)))
  return Config(**{**values, **taken})


def config_to_flags(config: Config, names: Sequence[str] = ()) -> List[str]:
  """The command-line flags that make a trainer binary use `config` (of the fields `names`
  alone, if given)."""
  args = []
  for field in dataclasses.fields(config):
    if names and field.name not in names:
      continue
    value = getattr(config, field.name)
    if isinstance(value, bool):
      args.append(f"--{'' if value else 'no'}{field.name}")
    elif value is not None:
      args.append(f"--{field.name}={value}")
  return args


def run_options_from_flags(module: str, flag_values: flags.FlagValues = FLAGS) -> RunOptions:
  """How to run, from the flags; `module` is the binary, re-run for each task."""
  return RunOptions(**{f.name: flag_values[f.name].value for f in run_options.FLAG_FIELDS},
                    relaunch=[sys.executable, "-m", module, *sys.argv[1:]],
                    verbosity=flag_values["verbosity"].value)


def define_config_flags(names: Sequence[str], flag_values: flags.FlagValues = flags.FLAGS
                        ) -> ConfigFlags:
  """The trainer binaries' flags of these Config fields alone, for the tools
  (`MODEL_FIELDS`, `OPTIMIZER_FIELDS`)."""
  rows = {name: (kind, default, text) for name, kind, default, text in _all_flags()}
  return {name: _DEFINE[rows[name][0]](name, rows[name][1], rows[name][2],
                                       flag_values=flag_values)
          for name in names}


def config_settings(holders: ConfigFlags, **values: Any) -> Dict[str, Any]:
  """The flags (with `values` in place of some) as Config fields; a usage error (exit 2)
  naming the fix when they name no model (checked without importing it), or an
  optimizer setting that does not fit."""
  settings = {name: holder.value for name, holder in holders.items()}
  settings.update(values)
  config = Config(**settings)
  try:
    if "model" in settings:
      model_registry.check(config.model, config.model_options)
      config.validate_canned()
    if "task" in settings:
      config.validate_task()
    if "optimizer" in settings:
      config.validate_optimizer()
    if "learning_rate_schedule" in settings:
      config.validate_schedule()
  except ValueError as e:  # SpecError too.
    raise app.UsageError(str(e), exitcode=2) from None
  return settings
