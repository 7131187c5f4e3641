r"""Runs any TF_CONFIG-aware command as a cluster of local processes.

  python -m launch.local --workers=N [--evaluator] [--timeout=S] [--stall_timeout=S] \
      [--max_restarts=3] -- CMD ARGS...

Each task (chief, workers, optional evaluator) runs CMD with its own
TF_CONFIG. The chief's output is streamed; every task's output goes to
<task_log_dir>/<type>-<index>.log. When a task fails, every task is stopped and
all are started again, up to --max_restarts times. Exits with 0 if every task
succeeds, else with the failed task's code (124 on --timeout or
--stall_timeout), after stopping the rest.
"""

import sys
import tempfile
from typing import Sequence

from absl import app
from absl import flags
from absl import logging

from launch import console
from launch import restarts
from launch import supervisor

_WORKERS = flags.DEFINE_integer("workers", 2, "Training tasks: one chief and N-1 workers.")
_EVALUATOR = flags.DEFINE_bool("evaluator", False, "Also start an 'evaluator' task.")
_TIMEOUT = flags.DEFINE_float("timeout", None, "Seconds before every task is stopped.")
_STALL_TIMEOUT = flags.DEFINE_float("stall_timeout", None, "Seconds without output from any "
                                   "training task (not the evaluator) before the run is "
                                   "stopped as hung.")
_MAX_RESTARTS = flags.DEFINE_integer("max_restarts", restarts.DEFAULT_MAX_RESTARTS,
                                     "Times every task is started again after one fails.")
_LOG_DIR = flags.DEFINE_string("task_log_dir", None, "Where task logs go (default: a new "
                               "temporary directory).")


def main(argv: Sequence[str]) -> None:
  command = list(argv[1:])
  if not command:
    raise app.UsageError("Give the command to run after --, e.g. "
                         "`python -m launch.local --workers=2 -- python train.py`.", exitcode=2)
  if _WORKERS.value < 1:
    raise app.UsageError(f"--workers must be at least 1, got {_WORKERS.value}.", exitcode=2)
  for flag in (_TIMEOUT, _STALL_TIMEOUT):
    if flag.value is not None and flag.value <= 0:
      raise app.UsageError(f"--{flag.name} must be positive, got {flag.value}.", exitcode=2)
  if _MAX_RESTARTS.value < 0:
    raise app.UsageError(f"--max_restarts must be >= 0, got {_MAX_RESTARTS.value}.", exitcode=2)
  log_dir = _LOG_DIR.value or tempfile.mkdtemp(prefix="launch-local-")
  logging.info("Task logs: %s", log_dir)
  sys.exit(supervisor.run_local_cluster(command, _WORKERS.value, log_dir,
                                        evaluator=_EVALUATOR.value, timeout=_TIMEOUT.value,
                                        stall_timeout=_STALL_TIMEOUT.value,
                                        max_restarts=_MAX_RESTARTS.value))


if __name__ == "__main__":
  app.run(main, flags_parser=console.parse_flags)
