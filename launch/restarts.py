"""What a failed task does to a run: the rule both launchers keep, what they say of it,
and the record of it they write for the tools.

Both launchers (launch.supervisor's local cluster, launch.ray.engine's Ray Train
workers) decide with `decide`: a training task's failure with a retried code
(launch.exit_codes: 128 and above) restarts every training task, up to `max_restarts`
times; a preemption (exit_codes.PREEMPTED: its cluster saved the step it stopped at)
restarts them without counting; any other code ends the run with it. The evaluator is
outside the training collective: it is restarted alone, counted apart.

The counts, with each task's pid, go to `<log_dir>/tasks.json` (`write_record`), which
tools that watch or signal the tasks read (launch.chaos, the benchmarks).
"""

import dataclasses
import json
import os
import signal
from typing import Any, Dict

from absl import logging

from launch import exit_codes

TASKS_FILE = "tasks.json"
# The launchers' --max_restarts when none is given: a preemption or a lost peer is retried
# without one.
DEFAULT_MAX_RESTARTS = 3


def new_counts() -> Dict[str, int]:
  """The counts `decide` keeps: training restarts, evaluator restarts, preemptions."""
  return {"restarts": 0, "evaluator_restarts": 0, "preemptions": 0}


@dataclasses.dataclass(frozen=True)
class Decision:
  """What a failure with `code` (as a shell reads it) does: `retry`, as restart number
  `restart` (0: a preemption, not counted), or end the run with `code`, for `why`."""

  code: int
  retry: bool
  restart: int = 0
  why: str = ""

  @property
  def preempted(self) -> bool:
    return self.retry and not self.restart


def decide(counts: Dict[str, int], returncode: int, evaluator: bool,
           max_restarts: int) -> Decision:
  """Decides what a task's failure (`returncode` as Popen gives it) does, and counts it
  in `counts` (new_counts' keys; other keys are left alone)."""
  code = exit_codes.shell_code(returncode)
  count = "evaluator_restarts" if evaluator else "restarts"
  if code == exit_codes.PREEMPTED:
    counts["preemptions"] += 1
    return Decision(code, retry=True)
  if exit_codes.retried(code) and counts[count] < max_restarts:
    counts[count] += 1
    return Decision(code, retry=True, restart=counts[count])
  return Decision(code, retry=False, why=(
      exit_codes.why_not_retried(code) if not exit_codes.retried(code) else
      f"no restarts left (--max_restarts={max_restarts})"))


def describe_exit(returncode: int) -> str:
  """How a task ended, from its Popen return code: "was killed by SIGKILL", "exited with code 3"."""
  if returncode < 0:
    return f"was killed by {signal.Signals(-returncode).name}"
  return f"exited with code {returncode}"


def say(decision: Decision, cause: str, log_path: str, evaluator: bool, max_restarts: int,
        again: str, resumes: bool = True) -> None:
  """Logs `decision` on the failure `cause` ("worker-1 was killed by SIGKILL"), whose log
  is `log_path`; `again` says how this launcher restarts the training tasks, which resume
  from the last backup or checkpoint unless not `resumes` (a worker on parameter servers,
  restarted alone, holds no state)."""
  if not decision.retry:
    logging.error("%s (%s); stopping every task. Its log: %s", cause, decision.why, log_path)
  elif decision.preempted:
    logging.warning("Preempted: %s; %s%s (preemptions do not count against --max_restarts).",
                    cause, "restarting the evaluator" if evaluator else again,
                    " from the step saved" if resumes else "")
  elif evaluator:
    logging.warning("Restart %d of %d of the evaluator alone: %s (its log: %s); training goes "
                    "on.", decision.restart, max_restarts, cause, log_path)
  else:
    logging.warning("Restart %d of %d: %s (its log: %s); %s%s.", decision.restart, max_restarts,
                    cause, log_path, again,
                    ", from the last backup or checkpoint" if resumes else "")


def write_record(log_dir: str, record: Dict[str, Any], warn: bool = True) -> bool:
  """Writes `record` (the counts, "tasks": [{"name", "pid", ...}], what else the launcher
  keeps) to `<log_dir>/tasks.json` at once; False if it cannot (a full disk, said unless
  not `warn`): the supervision of running tasks goes on without it."""
  path = os.path.join(log_dir, TASKS_FILE)
  try:
    with open(path + ".tmp", "w") as f:
      json.dump(record, f)
    os.replace(path + ".tmp", path)
    return True
  except OSError as e:
    if warn:
      logging.warning("Cannot write %s: %s", path, e)
    return False
