"""The record a Ray run's tasks and its launcher share, and the rules it keeps.

One `RunRecord`, held by a Ray actor (launch.ray.engine starts it), holds the
local launcher's keys of `tasks.json` (the restart counts, each task's pid) and
`attempts`, `failures` and `stop`. Every task reaches it wherever it runs, and it
depends on no disk (a full one is a fault it must outlive). The rules, which import no
Ray (so they are tested without it):

- `record_failure`: the first training task of an attempt to fail decides for all, by
  the local launcher's rule (launch.restarts); the rest fail because it did (a lost
  peer) and neither count again nor end the run otherwise. The evaluator's failures
  decide for it alone. A failure not retried sets `stop`, which ends every task.
- `count_attempt`: an attempt that ended with no task's failure recorded (Ray lost a
  worker) counts as a restart, so Ray's retries, unbounded, end when `max_restarts` does.
- `run_outcome`: the run's exit code.
"""

import dataclasses
import signal
from typing import Any, Dict, Optional

from launch import cluster
from launch import exit_codes
from launch import restarts

EVALUATOR_NAME = f"{cluster.EVALUATOR}-0"
STOPPING = "the run is stopping"  # A failure's "why" once the run's stop is set.
LOST_WORKER = "a Ray worker"  # The failure of an attempt that no task recorded.


def new_record() -> Dict[str, Any]:
  """A run's record before its first attempt."""
  return {**restarts.new_counts(), "tasks": [], "attempts": 0, "failures": [], "stop": None}


class RunRecord:
  """The run's record, as a Ray actor that asks for no CPU holds it: its methods run one
  at a time, so each is atomic. The launcher writes it to `<log_dir>/tasks.json`."""

  def __init__(self):
    self.record = new_record()

  def get(self) -> Dict[str, Any]:
    return self.record

  def stop(self) -> Optional[Dict[str, Any]]:
    return self.record["stop"]

  def set_stop(self, stop: Dict[str, Any], seen: Optional[Dict[str, Any]]) -> None:
    """Sets `stop` unless the stop changed since it was `seen` (a task's failure won)."""
    if self.record["stop"] == seen:
      self.record["stop"] = stop

  def task_started(self, name: str, pid: int, host: str, address: str) -> None:
    """Task `name` runs as `pid` on the node `host` whose Ray address is `address`."""
    self.record["tasks"] = [t for t in self.record["tasks"] if t["name"] != name]
    self.record["tasks"].append({"name": name, "pid": pid, "host": host, "address": address})

  def attempt_started(self, max_restarts: int) -> Optional[Dict[str, Any]]:
    """Worker 0's start: counts the attempt (count_attempt); returns the stop, if set."""
    count_attempt(self.record, max_restarts)
    return self.record["stop"]

  def failed(self, name: str, returncode: int, max_restarts: int,
             said: Optional[str]) -> Dict[str, Any]:
    return record_failure(self.record, name, returncode, max_restarts, said)


def record_failure(record: Dict[str, Any], name: str, returncode: int, max_restarts: int,
                   said: Optional[str] = None) -> Dict[str, Any]:
  """Records a task's failure (`said`: its last "error: " line) in `record` and returns
  the failure that decides what follows: retried ("retry"), or the run stopped ("stop"
  set, every task killed).

  The evaluator's own failures decide for it alone. Of the training tasks, the first
  of an attempt to fail is the cause, and decides for all: the others fail because it
  did (a lost peer), and must neither count again nor end the run otherwise.
  """
  evaluator = name == EVALUATOR_NAME
  attempt = None if evaluator else record["attempts"]
  if not evaluator:
    for failure in record["failures"]:
      if failure["attempt"] == attempt:
        return failure
  if record["stop"]:
    decision = restarts.Decision(exit_codes.shell_code(returncode), retry=False, why=STOPPING)
  else:
    decision = restarts.decide(record, returncode, evaluator, max_restarts)
    if not decision.retry:
      record["stop"] = {"signal": signal.SIGKILL, "code": decision.code,
                        "why": f"{name} failed"}
  failure = {"name": name, "returncode": returncode, "attempt": attempt, "said": said,
             **dataclasses.asdict(decision)}
  record["failures"].append(failure)
  return failure


def count_attempt(record: Dict[str, Any], max_restarts: int) -> None:
  """A new attempt; if the one before ended with no task's failure recorded, Ray lost a
  worker (its node, its process): that counts as a restart too, so that Ray's retries,
  unbounded, end when max_restarts does."""
  previous = record["attempts"]
  if previous and not any(f["attempt"] == previous for f in record["failures"]):
    record_failure(record, LOST_WORKER, exit_codes.PEER_LOST, max_restarts)
  record["attempts"] += 1


def run_outcome(record: Dict[str, Any]) -> int:
  """The run's exit code: its stop's (a failure not retried, a signal, a timeout), or 0."""
  return record["stop"]["code"] if record["stop"] else 0
