"""launch.ray.record: the record a Ray run shares, and its rules (no Ray needed)."""

import signal

import pytest

from launch import exit_codes
from launch.ray import record as ray_record


def _record(attempts=1, **counts):
  return {**ray_record.new_record(), "attempts": attempts, **counts}


def test_the_first_failure_of_an_attempt_decides_and_its_peers_follow_it():
  record = _record()
  cause = ray_record.record_failure(record, "worker-1", -9, max_restarts=2)
  assert (cause["code"], cause["retry"], cause["restart"]) == (137, True, 1)
  # The chief loses its peer next: the same attempt, the same cause, no second count.
  assert ray_record.record_failure(record, "worker-0", exit_codes.PEER_LOST, 2) is cause
  assert (record["restarts"], len(record["failures"])) == (1, 1)
  record["attempts"] = 2  # Ray started the workers again.
  again = ray_record.record_failure(record, "worker-0", exit_codes.PEER_LOST, 2)
  assert again is not cause and again["restart"] == 2 and ray_record.run_outcome(record) == 0


def test_a_preemption_is_retried_without_counting_a_restart():
  record = _record()
  failure = ray_record.record_failure(record, "worker-0", exit_codes.PREEMPTED, max_restarts=0)
  assert failure["retry"] and not failure["restart"]
  assert (record["restarts"], record["preemptions"], record["stop"]) == (0, 1, None)


@pytest.mark.parametrize("returncode, max_restarts, why", [
    (exit_codes.DIVERGED, 3, "would diverge again"),
    (-9, 0, "no restarts left (--max_restarts=0)"),
])
def test_a_failure_not_retried_stops_every_task_with_its_code(returncode, max_restarts, why):
  record = _record()
  failure = ray_record.record_failure(record, "worker-1", returncode, max_restarts)
  assert not failure["retry"] and why in failure["why"]
  assert record["stop"]["signal"] == signal.SIGKILL
  assert ray_record.run_outcome(record) == exit_codes.shell_code(returncode)
  # The evaluator, killed by that stop, is not a failure of its own.
  follows = ray_record.record_failure(record, ray_record.EVALUATOR_NAME, -9, max_restarts)
  assert follows["why"] == ray_record.STOPPING and record["evaluator_restarts"] == 0
  assert ray_record.run_outcome(record) == exit_codes.shell_code(returncode)


def test_an_attempt_ended_by_ray_alone_counts_as_a_restart_so_ray_retries_end():
  record = _record(attempts=0)
  ray_record.count_attempt(record, max_restarts=1)  # The first attempt.
  ray_record.count_attempt(record, max_restarts=1)  # Ray lost a worker: nobody recorded it.
  assert (record["attempts"], record["restarts"], record["stop"]) == (2, 1, None)
  assert record["failures"][0]["name"] == ray_record.LOST_WORKER
  ray_record.count_attempt(record, max_restarts=1)  # Again: no restarts left.
  assert record["stop"] and ray_record.run_outcome(record) == exit_codes.PEER_LOST


def test_the_evaluator_is_restarted_alone_and_counted_apart():
  record = _record()
  first = ray_record.record_failure(record, ray_record.EVALUATOR_NAME, -9, max_restarts=1)
  assert first["retry"] and (record["evaluator_restarts"], record["restarts"]) == (1, 0)
  second = ray_record.record_failure(record, ray_record.EVALUATOR_NAME, -9, max_restarts=1)
  assert not second["retry"] and ray_record.run_outcome(record) == 137


def test_the_record_actor_sets_a_stop_only_over_the_one_it_saw():
  actor = ray_record.RunRecord()
  assert actor.attempt_started(max_restarts=0) is None and actor.get()["attempts"] == 1
  actor.task_started("worker-0", 11, "host", "10.0.0.1")
  actor.task_started("worker-0", 12, "host", "10.0.0.1")  # Started again: the new pid stays.
  assert actor.get()["tasks"] == [{"name": "worker-0", "pid": 12, "host": "host",
                                   "address": "10.0.0.1"}]
  failure = actor.failed("worker-1", exit_codes.DIVERGED, 0, "error: NaN")
  assert failure["said"] == "error: NaN" and actor.stop()["code"] == exit_codes.DIVERGED
  # The launcher's timeout, decided on the record before that failure, does not replace it.
  actor.set_stop({"signal": signal.SIGKILL, "code": 124, "why": "timeout"}, None)
  assert actor.stop()["code"] == exit_codes.DIVERGED
  actor.set_stop({**actor.stop(), "signal": signal.SIGTERM}, actor.stop())
  assert actor.stop()["signal"] == signal.SIGTERM
