"""Flags shared by the trainer binaries; defined only when a binary calls define_flags."""

import dataclasses
import sys
from typing import List

from absl import flags

from trainers import runner
from trainers.config import Config

FLAGS = flags.FLAGS
_HELP = {
    "train_steps": "Optimizer steps; each consumes one global batch.",
    "global_batch_size": "Examples per step, summed over all workers.",
    "learning_rate": "Initial SGD learning rate, cosine-decayed to 0 over --train_steps.",
    "momentum": "SGD momentum.",
    "seed": "Seeds the initial weights and the shuffle order.",
    "data_dir": "TFDS data directory holding mnist/ (default: $TFDS_DATA_DIR or "
                "~/tensorflow_datasets). Fill it with `python -m data.prepare`.",
    "eval_batch_size": "Evaluation batch size; a divisor of 10,000 keeps both backends' "
                       "test loss identical.",
    "log_every_steps": "Steps between progress logs and loss summaries.",
    "checkpoint_every_steps": "Steps between checkpoints (and Estimator evaluations); the "
                              "Estimator resumes from them after a failure.",
    "backup_every_steps": "Steps between Keras BackupAndRestore backups; Keras resumes from "
                          "them after a failure.",
    "init_weights": "A .npz of initial weights by variable name (launch.parity writes one); "
                    "default: initialize from --seed.",
    "deterministic": "Turn on TensorFlow op determinism.",
    "record_dir": "Record per-step losses (chief) and each shard's example fingerprints "
                  "here, for launch.parity.",
    "steps_per_execution": "Keras only: training steps per call of the compiled train "
                           "function (fewer Python round trips); --train_steps and the log, "
                           "checkpoint and backup intervals must be multiples of it. 0: the "
                           "largest that fits, up to 10.",
}


def define_flags() -> None:
  """Defines --workers, --model_dir, the launcher flags and one flag per Config field."""
  flags.DEFINE_integer("workers", 1, "Training workers. Above 1, this process starts a "
                       "local cluster with one process per worker (plus an evaluator for the "
                       "Estimator). A process with TF_CONFIG set runs as that task.")
  flags.DEFINE_string("model_dir", None, "Output directory: events, checkpoints, export, "
                      "summary.json. Default: a new directory under the system temp dir.")
  flags.DEFINE_string("task_log_dir", None, "With --workers > 1: where each task's log file goes. "
                      "Default: <model_dir>/logs.")
  flags.DEFINE_float("timeout", None, "With --workers > 1: seconds before the whole run is "
                     "stopped and the launcher exits non-zero.")
  flags.DEFINE_float("stall_timeout", 300, "With --workers > 1: seconds without output from "
                     "any task before the run is stopped as hung.")
  flags.DEFINE_integer("max_restarts", 3, "With --workers > 1: times every task is started "
                       "again (resuming from the last backup) after one fails.")
  for field in dataclasses.fields(Config):
    define = {int: flags.DEFINE_integer, float: flags.DEFINE_float,
              bool: flags.DEFINE_bool}.get(field.type, flags.DEFINE_string)
    define(field.name, field.default, _HELP[field.name])


def config_from_flags() -> Config:
  """The Config the parsed flags describe."""
  return Config(**{f.name: FLAGS[f.name].value for f in dataclasses.fields(Config)})


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
  )
