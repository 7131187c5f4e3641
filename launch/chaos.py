r"""Kills a random worker (or the evaluator) at a random step, trial after trial, and checks
each run recovers.

  python -m launch.chaos --backend={keras,estimator} [--workers=2] [--trials=N] \
      [--kill={worker,evaluator}] [--train_steps=300] [--data_dir=DIR] [--out=DIR] [--seed=0]

Each trial trains the backend on local workers with its evaluator task, sends
SIGKILL or SIGTERM (at random) to a random training task (or, with
--kill=evaluator, to the evaluator) once the chief reaches a random step, and
lets the launcher restart the training tasks from the last backup (Keras
BackupAndRestore) or checkpoint (Estimator), or the evaluator alone. Prints a
table: trial, backend, signal, victim, step killed, restarts, final step, steps
redone, checkpoint valid, wall time. Exits 0 only if every trial ends at exactly
--train_steps with a valid, evaluated checkpoint, only the killed side restarted, no
process left running, and nothing left behind.
"""

import sys
import tempfile
from typing import Sequence

from absl import app
from absl import flags

from launch import console
from launch.tools import chaos
from launch.tools import runs
from trainers.config import Config

_BACKEND = flags.DEFINE_enum("backend", None, ["keras", "estimator"], "Backend to train.",
                             required=True)
_WORKERS = flags.DEFINE_integer("workers", 2, "Local training workers (at least 2).")
_TRIALS = flags.DEFINE_integer("trials", 10, "Number of trials.")
_KILL = flags.DEFINE_enum("kill", "worker", chaos.KILLS, "What each trial kills: a random "
                          "training task (chief included), or the evaluator task.")
_TRAIN_STEPS = flags.DEFINE_integer("train_steps", 300, "Steps of each trial's run.")
_BACKUP_EVERY = flags.DEFINE_integer("backup_every_steps", 50, "Keras backups and Estimator "
                                     "checkpoints, in steps: the most a kill can cost.")
_DATA_DIR, _MNIST_IDX_DIR = runs.define_data_flags()
_OUT = flags.DEFINE_string("out", None, "Where each trial's model_dir goes (default: a new "
                           "temporary directory).")
_SEED = flags.DEFINE_integer("seed", 0, "Seeds the choice of step, signal and victim.")
_TIMEOUT = flags.DEFINE_float("timeout", 600, "Seconds allowed for each trial's run.")


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}", exitcode=2)
  console.quiet_records(flags.FLAGS.verbosity)  # Their runs' logs keep everything.
  if _WORKERS.value < 2:
    raise app.UsageError("--workers must be at least 2: a lone process has no launcher to "
                         "restart it.", exitcode=2)
  if _TRIALS.value < 1 or _TRAIN_STEPS.value < 2 or _TIMEOUT.value <= 0:
    raise app.UsageError("--trials must be >= 1, --train_steps >= 2 and --timeout > 0.",
                         exitcode=2)
  every = _BACKUP_EVERY.value
  config = Config(train_steps=_TRAIN_STEPS.value, data_dir=_DATA_DIR.value,
                  backup_every_steps=every, checkpoint_every_steps=every,
                  log_every_steps=max(1, min(5, every)))
  runs.check_or_exit(config, _WORKERS.value, _MNIST_IDX_DIR.value, [_BACKEND.value])
  out = _OUT.value or tempfile.mkdtemp(prefix="chaos-")
  results = chaos.run_chaos(_BACKEND.value, config, _WORKERS.value, _TRIALS.value, out,
                            seed=_SEED.value, timeout=_TIMEOUT.value, kill=_KILL.value)
  print(chaos.format_table(results))
  print(f"Runs: {out}")
  sys.exit(0 if all(t.passed for t in results) else 1)


if __name__ == "__main__":
  app.run(main, flags_parser=console.parse_flags)
