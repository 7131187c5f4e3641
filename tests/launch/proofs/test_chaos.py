"""launch.chaos: every fault ends as the fault table in docs/operations.md says; nothing hangs."""

import json
import os

import pytest

from launch.proofs import chaos
from trainers import model_dir as layout
from trainers.config import Config
from tests.conftest import needs_ray
from tests.conftest import run_module

# One trial of each fault on each backend, as docs/operations.md's table promises;
# `python -m launch.chaos --fault=all --trials=N` runs more.
TRIALS = int(os.environ.get("CHAOS_TRIALS", "1"))
BACKENDS = ("keras", "estimator")
CASES = [(backend, fault) for fault in chaos.FAULTS if fault not in chaos.PS_ONLY
         for backend in BACKENDS]
# On a parameter server, in CI: a ps lost (Keras) and a task preempted (the Estimator: the
# trial's draw picks which); a ps lost in the Estimator and a chief or worker killed in
# Keras in the extended run. `launch.chaos --ps=1 --fault=all` runs every fault
# (docs/operations.md, its measured trials).
PS_CASES = [("keras", "kill_ps"), ("estimator", "preempt"),
            pytest.param("estimator", "kill_ps", marks=pytest.mark.extended),
            pytest.param("keras", "kill_worker", marks=pytest.mark.extended)]
# A guard against a hang, not a speed claim: on a loaded 2-core CI runner, a Ray trial that
# takes 95 to 150 s took over 330 s while the other xdist worker trained too.
TRIAL_TIMEOUT = 600
CONFIG = Config(train_steps=40, global_batch_size=32, eval_batch_size=50, log_every_steps=2,
                checkpoint_every_steps=10, backup_every_steps=10)
# A kill costs at most the steps since the last backup, plus the steps logged
# between the kill and the progress record that triggered it.
MAX_REDONE = CONFIG.backup_every_steps + 2
# The fault's step is the last progress record the tool saw before it struck, so it can
# trail the step the fault landed at, which a backup may already hold: by a record or two
# (the tool polls), and the count of steps redone is then that much below 0.
MIN_REDONE = -2 * CONFIG.log_every_steps
RESTARTED = {"kill_worker", "stop_chief"}  # The launcher restarts the training tasks.
PREEMPTED = {"preempt", "drain"}  # It restarts them too, counting no restart.
# On Ray Train (launch.ray), in CI: a preempted worker saves; Ray restarts a killed one in
# the extended run (in CI, tests/test_multihost.py has Ray replace a lost node, Keras on it).
RAY_CASES = [pytest.param("keras", "kill_worker", marks=pytest.mark.extended),
             ("estimator", "preempt")]


@pytest.mark.chaos
@pytest.mark.parametrize("backend, fault", CASES)
def test_each_fault_ends_as_documented(backend, fault, tiny_data_dir, tmp_path):
  config = Config(**{**CONFIG.__dict__, "data_dir": tiny_data_dir})
  results = chaos.run_chaos(backend, config, 2, TRIALS, str(tmp_path), seed=7,
                            timeout=TRIAL_TIMEOUT, faults=(fault,))
  table = chaos.format_table(results)
  print(table)
  with open(tmp_path / chaos.TRIALS_FILE) as f:  # Written as each trial ends.
    records = [json.loads(line) for line in f]
  assert [(r["fault"], r["passed"]) for r in records] == [(fault, t.passed) for t in results]
  for t in results:
    if t.skipped:
      pytest.skip(f"{fault}: {t.skipped}")
    # Passing means, besides what is asserted here: no process left, nothing
    # left in model_dir or the tasks' temporary directory, the output names the
    # fault, and the newest checkpoint loads.
    assert t.passed, table
    assert t.checkpoint_valid
    if fault == "nan_loss":
      assert t.exit_code == 3 and t.restarts == 0 and t.final_step is None
    elif fault == "disk_full":
      assert t.exit_code == 4 and t.restarts == 0 and t.final_step == config.train_steps
    elif fault.startswith("early_stop_"):  # It stopped early, there and only there.
      record = json.loads((tmp_path / f"{backend}-{fault}-{t.trial}" / "model" /
                           "early_stop.json").read_text())
      assert t.final_step == record["step"] < chaos.early_stopping_config(config).train_steps
      assert t.restarts == 0 and t.exit_code == 0, table
    else:
      assert t.final_step == config.train_steps
      assert (t.restarts >= 1) == (fault in RESTARTED)
    if fault in RESTARTED or fault == "kill_launcher":
      assert MIN_REDONE <= t.steps_redone <= MAX_REDONE, table
    if fault in PREEMPTED:
      assert t.steps_redone == 0 and t.exit_code == 0, table


@pytest.mark.chaos
@pytest.mark.parametrize("backend, fault", PS_CASES)
def test_on_a_parameter_server_each_lost_task_ends_as_documented(backend, fault, tiny_data_dir,
                                                                 tmp_path):
  config = Config(**{**CONFIG.__dict__, "data_dir": tiny_data_dir})
  (t,) = chaos.run_chaos(backend, config, 2, 1, str(tmp_path), seed=7,
                            timeout=TRIAL_TIMEOUT,
                         faults=(fault,), ps=1)
  table = chaos.format_table([t])
  print(table)
  # Passing means, as above, and: the run ended at train_steps or up to a progress interval
  # past it (chaos._ps_slack), its final step saved and evaluated.
  assert t.passed and t.exit_code == 0, table
  assert config.train_steps <= t.final_step <= config.train_steps + config.log_every_steps
  victim = t.how.split()[-1]
  if victim.startswith("worker"):  # Restarted alone: nothing resumed, nothing redone.
    killed = fault == "kill_worker"
    assert t.steps_redone == (None if killed else 0) and t.restarts == killed, table
  elif fault == "preempt" and victim.startswith("chief"):
    assert t.steps_redone == 0 and t.restarts == 0, table
  else:  # The chief or a ps lost: every training task from the last checkpoint.
    assert MIN_REDONE <= t.steps_redone <= CONFIG.checkpoint_every_steps + 2, table


@pytest.mark.chaos
@needs_ray
@pytest.mark.parametrize("backend, fault", RAY_CASES)
def test_on_ray_a_fault_ends_as_on_local_workers(backend, fault, tiny_data_dir, tmp_path):
  config = Config(**{**CONFIG.__dict__, "data_dir": tiny_data_dir})
  (t,) = chaos.run_chaos(backend, config, 2, 1, str(tmp_path), seed=7,
                            timeout=TRIAL_TIMEOUT,
                         faults=(fault,), engine="ray")
  table = chaos.format_table([t])
  # Passing means, as above, and: no process of the run's Ray cluster is left.
  assert t.passed and t.final_step == config.train_steps, table
  if fault in PREEMPTED:
    assert t.steps_redone == 0 and t.restarts == 0, table
  else:
    assert t.restarts == 1 and MIN_REDONE <= t.steps_redone <= MAX_REDONE, table


def test_trial_failures_are_reported_not_hidden(tiny_data_dir, tmp_path):
  # Too short a timeout: the run cannot finish, and the trial must say so.
  config = Config(**{**CONFIG.__dict__, "data_dir": tiny_data_dir})
  (result,) = chaos.run_chaos("keras", config, 2, 1, str(tmp_path), timeout=3)
  assert not result.passed and result.problems
  assert "FAIL" in chaos.format_table([result]) and not chaos.overall_passed([result])


@pytest.mark.parametrize("events, expected", [
    # Saved at 23, resumed there.
    ([("start", 0), ("step", 22), ("preempted", 23), ("start", 23), ("step", 40)], (23, 23)),
    # Signalled during the evaluation after training ended at 41 (a ps run's slack): no
    # save, no resume; it stopped and resumed at its last step.
    ([("start", 0), ("step", 40), ("step", 41)], (41, 41)),
    # Resumed without a save recorded: the tool cannot say where it stopped.
    ([("start", 0), ("step", 22), ("start", 20), ("step", 40)], (None, 20)),
])
def test_a_preemption_is_read_from_the_progress_records(events, expected, tmp_path):
  for event, step in events:
    layout.record_progress(str(tmp_path), event,
                           **({"from_step": step} if event == "start" else {"step": step}))
  assert chaos._stop_and_resume(str(tmp_path)) == expected


def test_a_skipped_trial_says_why_and_never_passes_alone():
  skipped = chaos.Trial(1, "keras", "disk_full", skipped="needs root")
  passed = chaos.Trial(2, "keras", "kill_worker")
  assert not skipped.passed and not chaos.overall_passed([skipped])
  assert chaos.overall_passed([skipped, passed])
  assert "SKIPPED: needs root" in chaos.format_table([skipped, passed])


@pytest.mark.parametrize("args, message", [
    (["--backend=keras", "--workers=1"], "at least 2"),
    (["--backend=keras", "--fault=kill_worker,unplug"], "unknown unplug"),
    (["--backend=keras", "--fault=kill_ps"], "--fault=kill_ps needs parameter servers: give "
     "--ps=1"),
    (["--backend=estimator", "--ps=1", "--fault=stop_chief,preempt"],
     "--fault=stop_chief does not run on parameter servers: drop it"),
    (["--backend=keras", "--ps=1", "--engine=ray"], "Ray Train runs no parameter servers"),
])
def test_cli_rejects_bad_flags(args, message):
  result = run_module("launch.chaos", args)
  assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
