"""launch.chaos: a worker killed at a random step costs at most one backup, and nothing hangs."""

import os

import pytest

from launch.tools import chaos
from trainers.config import Config
from tests.conftest import run_module

# CI runs a few trials per backend; `python -m launch.chaos --trials=10` runs more.
TRIALS = int(os.environ.get("CHAOS_TRIALS", "2"))
CONFIG = Config(train_steps=40, global_batch_size=32, eval_batch_size=50, log_every_steps=2,
                checkpoint_every_steps=10, backup_every_steps=10)


@pytest.mark.chaos
@pytest.mark.parametrize("backend", ("keras", "estimator"))
def test_killed_workers_resume_to_the_exact_final_step(backend, tiny_data_dir, tmp_path):
  config = Config(**{**CONFIG.__dict__, "data_dir": tiny_data_dir})
  results = chaos.run_chaos(backend, config, 2, TRIALS, str(tmp_path), seed=7, timeout=300)
  print(chaos.format_table(results))
  assert {t.signal for t in results} <= {"SIGKILL", "SIGTERM"}
  for t in results:
    assert t.passed, chaos.format_table(results)
    assert t.restarts >= 1 and t.final_step == config.train_steps and t.checkpoint_valid
    # A kill costs at most the steps since the last backup (plus the steps
    # logged between the kill and the log line that triggered it).
    assert 0 <= t.steps_redone <= config.backup_every_steps + 2


@pytest.mark.chaos
def test_a_killed_evaluator_is_restarted_alone_and_evaluates_the_final_step(tiny_data_dir,
                                                                            tmp_path):
  config = Config(**{**CONFIG.__dict__, "data_dir": tiny_data_dir})
  (t,) = chaos.run_chaos("keras", config, 2, 1, str(tmp_path), seed=3, timeout=300,
                         kill="evaluator")
  print(chaos.format_table([t]))
  # Passing means: final step exact, final checkpoint valid and evaluated, the
  # evaluator restarted, the training tasks never restarted, nothing left over.
  assert t.passed, chaos.format_table([t])
  assert t.victim == "evaluator-0" and t.restarts == 0 and t.final_step == config.train_steps


def test_trial_failures_are_reported_not_hidden(tiny_data_dir, tmp_path):
  # Too short a timeout: the run cannot finish, and the trial must say so.
  config = Config(**{**CONFIG.__dict__, "data_dir": tiny_data_dir})
  (result,) = chaos.run_chaos("keras", config, 2, 1, str(tmp_path), timeout=3)
  assert not result.passed and result.problems
  assert "FAIL" in chaos.format_table([result])


def test_cli_rejects_a_lone_worker():
  result = run_module("launch.chaos", ["--backend=keras", "--workers=1"])
  assert result.returncode == 2 and "at least 2" in result.stderr
