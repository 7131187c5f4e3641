"""Flags of the trainer binaries; defined only when a binary calls define_flags.

Each flag's help is written once: the launcher flags here, the hyperparameters
in `Config`'s field metadata. `help_table()` renders the same texts for docs/training.md.
"""

import dataclasses
import sys
import typing
from typing import Any, Dict, List, Sequence, Tuple

from absl import app
from absl import flags

from trainers import config as config_lib
from trainers import model_registry
from trainers import preemption
from trainers import runner
from trainers.config import Config

FLAGS = flags.FLAGS
# (name, default, help) of the flags that say how to run, not what to train.
RUN_FLAGS = (
    ("workers", 1, "Training workers. Above 1, this process starts a local cluster with one "
     "process per worker, plus an evaluator (see --evaluator). A process with TF_CONFIG set "
     "runs as that task."),
    ("evaluator", True, "With --workers > 1: also run an 'evaluator' task that evaluates each "
     "checkpoint off the training path (Keras: SidecarEvaluator). Keras only: --noevaluator "
     "evaluates on the chief instead, while the workers wait."),
    ("model_dir", None, "Output directory: events, checkpoints, export, summary.json, "
     "progress.jsonl. Default: a new directory under the system temp dir."),
    ("max_restarts", 3, "With --workers > 1: times every task is started again (resuming from "
     "the last backup or checkpoint) after one fails."),
    ("stall_timeout", 300.0, "With --workers > 1: seconds without output from any training task "
     "(the evaluator's does not count) before the run is stopped as hung."),
    ("timeout", None, "With --workers > 1: seconds before the whole run is stopped and the "
     "launcher exits non-zero."),
    ("startup_timeout", 600.0, "Seconds a training task waits for every other training task "
     "of its TF_CONFIG cluster to start, saying whom it waits for; then it exits 142, which "
     "the launcher and orchestrators retry."),
    ("grace_seconds", preemption.DEFAULT_GRACE_SECONDS, "Seconds a task may take, after "
     "SIGTERM, to stop at a step every training task agrees on, save it and exit 143, which "
     "orchestrators retry; a second SIGTERM stops at once. Keep it below the orchestrator's "
     "grace period (Kubernetes: 30 s). A local cluster's launcher gives its tasks this "
     "long, plus 5 s, before SIGKILL."),
    ("task_log_dir", None, "With --workers > 1: where each task's log and tasks.json go. "
     "Default: <model_dir>/logs."),
    ("allow_config_change", False, "Resume a model_dir whose run had other settings (model "
     "options, batch, the optimizer's hyperparameters, seed, schedule; see its run.json): the "
     "change is recorded in progress.jsonl. Without it such a resume exits 2, listing the "
     "differences. The optimizer itself cannot change."),
    ("mnist_idx_dir", None, "If MNIST is not prepared in --data_dir: prepare it from the four "
     "MNIST IDX files in this directory (default: $MNIST_IDX_DIR), with no network. Without "
     "either, TFDS downloads it."),
)
_TYPES = {"workers": int, "model_dir": str, "max_restarts": int, "stall_timeout": float,
          "timeout": float, "task_log_dir": str, "mnist_idx_dir": str,
          "evaluator": bool, "allow_config_change": bool,
          "startup_timeout": float, "grace_seconds": float}
ConfigFlags = Dict[str, flags.FlagHolder]
# The Config fields that name the model (with a canned model's settings), and the
# optimizer with its hyperparameters.
MODEL_FIELDS = ("model", "model_options", *config_lib.CANNED_SETTINGS)
OPTIMIZER_FIELDS = ("optimizer", *config_lib.HYPERPARAMETERS)
TRAINING_FIELDS = MODEL_FIELDS + OPTIMIZER_FIELDS
_DEFINE = {int: flags.DEFINE_integer, float: flags.DEFINE_float, bool: flags.DEFINE_bool,
           str: flags.DEFINE_string}


def _all_flags() -> List[Tuple[str, type, object, str]]:
  """(name, type, default, help) of every trainer flag, run flags first."""
  rows = [(name, _TYPES[name], default, text) for name, default, text in RUN_FLAGS]
  for field in dataclasses.fields(Config):
    kind = next(t for t in (int, float, bool, str)  # Optional[float] is a float flag.
                if field.type is t or t in typing.get_args(field.type))
    rows.append((field.name, kind, field.default, field.metadata["help"]))
  return rows


def help_text(name: str) -> str:
  """The help of one launcher flag, for binaries that define it too."""
  return next(text for flag, _, text in RUN_FLAGS if flag == name)


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
  """The Config the parsed flags describe."""
  return Config(**{f.name: flag_values[f.name].value for f in dataclasses.fields(Config)})


def config_to_flags(config: Config) -> List[str]:
  """The command-line flags that make a trainer binary use `config`."""
  args = []
  for field in dataclasses.fields(config):
    value = getattr(config, field.name)
    if isinstance(value, bool):
      args.append(f"--{'' if value else 'no'}{field.name}")
    elif value is not None:
      args.append(f"--{field.name}={value}")
  return args


def run_options_from_flags(module: str) -> runner.RunOptions:
  """How to run, from the flags; `module` is the binary, re-run for each task."""
  return runner.RunOptions(
      workers=FLAGS.workers if FLAGS["workers"].present else None,
      model_dir=FLAGS.model_dir,
      relaunch=[sys.executable, "-m", module, *sys.argv[1:]],
      log_dir=FLAGS.task_log_dir,
      timeout=FLAGS.timeout,
      stall_timeout=FLAGS.stall_timeout,
      max_restarts=FLAGS.max_restarts,
      verbosity=FLAGS.verbosity,
      mnist_idx_dir=FLAGS.mnist_idx_dir,
      evaluator=FLAGS.evaluator,
      allow_config_change=FLAGS.allow_config_change,
      startup_timeout=FLAGS.startup_timeout,
      grace_seconds=FLAGS.grace_seconds,
  )


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
    if "optimizer" in settings:
      config.validate_optimizer()
  except ValueError as e:  # SpecError too.
    raise app.UsageError(str(e), exitcode=2) from None
  return settings
