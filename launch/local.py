r"""Runs any TF_CONFIG-aware command as a cluster of local processes.

  python -m launch.local --workers=N [--evaluator] [--timeout=S] -- CMD ARGS...

Each task (chief, workers, optional evaluator) runs CMD with its own
TF_CONFIG. The chief's output is streamed; every task's output goes to
<task_log_dir>/<type>-<index>.log. Exits with 0 if every task succeeds, else
with the first failed task's code (124 on --timeout), after stopping the rest.
"""

import sys
import tempfile
from typing import Sequence

from absl import app
from absl import flags
from absl import logging

from launch import supervisor

_WORKERS = flags.DEFINE_integer("workers", 2, "Training tasks: one chief and N-1 workers.")
_EVALUATOR = flags.DEFINE_bool("evaluator", False, "Also start an 'evaluator' task.")
_TIMEOUT = flags.DEFINE_float("timeout", None, "Seconds before every task is stopped.")
_LOG_DIR = flags.DEFINE_string("task_log_dir", None, "Where task logs go (default: a new "
                               "temporary directory).")


def main(argv: Sequence[str]) -> None:
  command = list(argv[1:])
  if not command:
    raise app.UsageError("Give the command to run after --, e.g. "
                         "`python -m launch.local --workers=2 -- python train.py`.", exitcode=2)
  if _WORKERS.value < 1:
    raise app.UsageError(f"--workers must be at least 1, got {_WORKERS.value}.", exitcode=2)
  if _TIMEOUT.value is not None and _TIMEOUT.value <= 0:
    raise app.UsageError(f"--timeout must be positive, got {_TIMEOUT.value}.", exitcode=2)
  log_dir = _LOG_DIR.value or tempfile.mkdtemp(prefix="launch-local-")
  logging.info("Task logs: %s", log_dir)
  sys.exit(supervisor.run_local_cluster(command, _WORKERS.value, log_dir,
                                        evaluator=_EVALUATOR.value, timeout=_TIMEOUT.value))


if __name__ == "__main__":
  app.run(main)
