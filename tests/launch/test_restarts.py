"""launch.restarts: the one rule both launchers restart by, and what it says."""

import json
import logging

import pytest

from launch import exit_codes
from launch import restarts


def test_a_retried_code_restarts_until_max_restarts_then_ends_the_run():
  counts = restarts.new_counts()
  first = restarts.decide(counts, -9, evaluator=False, max_restarts=2)
  second = restarts.decide(counts, exit_codes.PEER_LOST, evaluator=False, max_restarts=2)
  assert (first.retry, first.restart, first.code) == (True, 1, 137)
  assert (second.retry, second.restart) == (True, 2)
  third = restarts.decide(counts, -9, evaluator=False, max_restarts=2)
  assert not third.retry and third.code == 137
  assert third.why == "no restarts left (--max_restarts=2)"
  assert counts == {"restarts": 2, "evaluator_restarts": 0, "preemptions": 0}


@pytest.mark.parametrize("returncode, why", [
    (exit_codes.USAGE, "usage error"), (exit_codes.DIVERGED, "would diverge again"),
    (exit_codes.DISK_FULL, "free space"), (1, "the task's log says what failed")])
def test_a_code_below_128_ends_the_run_at_once_saying_why(returncode, why):
  counts = restarts.new_counts()
  decision = restarts.decide(counts, returncode, evaluator=False, max_restarts=3)
  assert (decision.retry, decision.code) == (False, returncode) and why in decision.why
  assert counts == restarts.new_counts()


def test_a_preemption_restarts_without_counting_even_with_no_restarts_allowed():
  counts = restarts.new_counts()
  decision = restarts.decide(counts, exit_codes.PREEMPTED, evaluator=False, max_restarts=0)
  assert decision.retry and decision.preempted and decision.restart == 0
  assert counts == {"restarts": 0, "evaluator_restarts": 0, "preemptions": 1}


def test_the_evaluator_is_counted_apart_from_the_training_tasks():
  counts = {**restarts.new_counts(), "attempts": 4}  # Other keys are left alone.
  assert restarts.decide(counts, -9, evaluator=True, max_restarts=1).restart == 1
  assert restarts.decide(counts, -9, evaluator=False, max_restarts=1).restart == 1
  assert not restarts.decide(counts, -9, evaluator=True, max_restarts=1).retry
  assert counts == {"restarts": 1, "evaluator_restarts": 1, "preemptions": 0, "attempts": 4}


@pytest.mark.parametrize("decision, evaluator, said", [
    (restarts.Decision(137, True, restart=1), False,
     "Restart 1 of 3: worker-1 was killed by SIGKILL (its log: w.log); Ray restarts them, "
     "from the last backup or checkpoint."),
    (restarts.Decision(137, True, restart=2), True,
     "Restart 2 of 3 of the evaluator alone: worker-1 was killed by SIGKILL"),
    (restarts.Decision(143, True), False,
     "Preempted: worker-1 was killed by SIGKILL; Ray restarts them from the step saved"),
    (restarts.Decision(143, True), True, "Preempted: worker-1 was killed by SIGKILL; "
     "restarting the evaluator from the step saved"),
    (restarts.Decision(3, False, why="it would diverge"), False,
     "worker-1 was killed by SIGKILL (it would diverge); stopping every task. Its log: w.log"),
])
def test_what_is_said_names_the_task_its_log_and_what_follows(decision, evaluator, said,
                                                              caplog):
  caplog.set_level(logging.INFO)
  restarts.say(decision, f"worker-1 {restarts.describe_exit(-9)}", "w.log", evaluator, 3,
               again="Ray restarts them")
  assert said in caplog.text


def test_describe_exit_names_the_signal_or_the_code():
  assert restarts.describe_exit(-15) == "was killed by SIGTERM"
  assert restarts.describe_exit(3) == "exited with code 3"


def test_the_record_is_written_whole_or_not_at_all(tmp_path, caplog):
  record = {**restarts.new_counts(), "tasks": [{"name": "chief-0", "pid": 7}]}
  assert restarts.write_record(str(tmp_path), record)
  assert json.loads((tmp_path / restarts.TASKS_FILE).read_text()) == record
  assert not list(tmp_path.glob("*.tmp"))
  missing = tmp_path / "gone"  # Stands for a directory that cannot be written.
  assert not restarts.write_record(str(missing), record, warn=False)
  assert "Cannot write" not in caplog.text
  assert not restarts.write_record(str(missing), record)
  assert f"Cannot write {missing / restarts.TASKS_FILE}" in caplog.text
