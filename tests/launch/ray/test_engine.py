"""launch.ray and launch.ray.engine: the trainers on Ray Train, as on local workers."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from launch import exit_codes
from launch.ray import engine as ray_engine
from launch.ray import record as ray_record
from launch.proofs import runs
from trainers import evaluation
from trainers import flags as trainer_flags
from trainers.config import Config
from tests.conftest import REPO
from tests.conftest import needs_ray
from tests.conftest import run_module

CONFIG = Config(train_steps=30, global_batch_size=32, eval_batch_size=50, log_every_steps=5,
                checkpoint_every_steps=10, backup_every_steps=10)


def test_without_ray_the_error_names_the_extra(monkeypatch):
  monkeypatch.setitem(sys.modules, "ray", None)  # As if not installed: import fails.
  monkeypatch.delitem(sys.modules, "ray.train", raising=False)
  monkeypatch.delitem(sys.modules, "ray.train.tensorflow", raising=False)
  with pytest.raises(ray_engine.RayUnavailable, match=r'pip install -e "\.\[tf215,ray\]"'):
    ray_engine.check_installed()


@pytest.mark.parametrize("args, message", [
    (["--workers=2"], "--backend=keras or --backend=estimator"),
    (["--backend=keras", "--workers=1"], "--workers must be at least 2 on Ray"),
    (["--backend=keras", "--workers=2", "--bogus"], "bogus"),
    (["--backend=estimator", "--workers=2", "--ps=1"],
     "--ps=1: Ray Train runs no parameter servers (ray-project/ray#38972)"),
])
def test_bad_usage_exits_2(args, message):
  result = run_module("launch.ray", args, timeout=120)
  assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
  assert "Traceback" not in result.stderr


@needs_ray
def test_an_unreachable_address_fails_at_once_naming_it(tmp_path):
  start = time.monotonic()
  result = run_module("launch.ray", ["--backend=keras", "--workers=2", "--address=127.0.0.1:1",
                                     f"--model_dir={tmp_path / 'model'}"], timeout=120)
  assert result.returncode == 2, result.stderr[-2000:]
  assert "--address=127.0.0.1:1: no Ray cluster answers there" in result.stderr
  assert time.monotonic() - start < 60 and not (tmp_path / "model").exists()


def _watch(tmp_path, **kwargs):
  options = {"max_restarts": 0, "timeout": None, "stall_timeout": None, "grace": 5.0,
             "verbose": False, **kwargs}
  return ray_engine._Watch(str(tmp_path), **options)


def test_a_timeout_or_a_stall_stops_every_task_with_124(tmp_path):
  record = ray_record.new_record()
  assert _watch(tmp_path, timeout=60.0)._stop_wanted(record) is None
  stop = _watch(tmp_path, timeout=0.0)._stop_wanted(record)
  assert (stop["signal"], stop["code"], stop["why"]) == (signal.SIGKILL, 124, "timeout")
  log = tmp_path / "worker-1.log"
  log.write_text("step 5\n")
  stalled = _watch(tmp_path, stall_timeout=30.0)
  assert stalled._stop_wanted(record) is None
  stalled.started -= 100  # A run 100 s old whose training logs last grew 100 s ago:
  os.utime(log, (stalled.started, stalled.started))
  assert stalled._stop_wanted(record)["why"] == "stall"
  (tmp_path / "evaluator-0.log").write_text("evaluating\n")  # Not a training task's.
  assert stalled._stop_wanted(record)["why"] == "stall"


def test_sigterm_drains_and_a_second_signal_or_the_grace_period_kills(tmp_path):
  record = ray_record.new_record()
  watch = _watch(tmp_path, grace=60.0)
  watch.signalled(signal.SIGTERM, None)
  record["stop"] = watch._stop_wanted(record)
  assert (record["stop"]["signal"], record["stop"]["code"]) == (signal.SIGTERM, 143)
  assert watch._stop_wanted(record) is None  # Draining, within the grace period.
  watch.signalled(signal.SIGTERM, None)
  assert watch._stop_wanted(record) == {**record["stop"], "signal": signal.SIGKILL}
  late, record = _watch(tmp_path, grace=0.0), ray_record.new_record()
  late.signalled(signal.SIGINT, None)
  record["stop"] = late._stop_wanted(record)
  assert record["stop"]["code"] == 130
  assert late._stop_wanted(record)["signal"] == signal.SIGKILL


def _check_trained_and_evaluated(model_dir, stdout: str, config: Config) -> None:
  """The run ended as a local cluster's: summary, evaluation, the summary printed last, a
  log per task, the chief waiting for the evaluator."""
  summary = json.loads((model_dir / "summary.json").read_text())
  assert (summary["workers"], summary["global_step"]) == (2, config.train_steps)
  assert evaluation.read_result(str(model_dir / "eval"), config.train_steps) == pytest.approx(
      summary["test_metrics"], abs=1e-6)
  assert json.loads(stdout.strip().splitlines()[-1])["global_step"] == config.train_steps
  logs = model_dir / "logs"
  assert sorted(p.name for p in logs.glob("*.log")) == ["evaluator-0.log", "worker-0.log",
                                                        "worker-1.log"]
  # Worker 0 of Ray's worker-only cluster is the chief: it waited for the evaluator.
  assert "Waiting for the evaluator's result" in (logs / "worker-0.log").read_text()


@pytest.mark.slow
@needs_ray
@pytest.mark.estimator
def test_estimator_on_ray_trains_and_evaluates_as_a_local_cluster(tiny_data_dir, tmp_path):
  model_dir = tmp_path / "model"
  config = Config(**{**CONFIG.__dict__, "data_dir": tiny_data_dir})
  result = run_module("launch.ray", ["--backend=estimator", "--workers=2",
                                     f"--model_dir={model_dir}",
                                     *trainer_flags.config_to_flags(config)], timeout=600)
  assert result.returncode == 0, result.stderr[-3000:] + "".join(
      p.read_text()[-2000:] for p in (model_dir / "logs").glob("*.log"))
  _check_trained_and_evaluated(model_dir, result.stdout, config)


@pytest.mark.slow
@needs_ray
def test_sigterm_to_launch_ray_drains_every_task_and_the_same_command_goes_on(tiny_data_dir,
                                                                             tmp_path):
  model_dir, log_path = tmp_path / "model", tmp_path / "run.log"
  config = Config(**{**CONFIG.__dict__, "data_dir": tiny_data_dir, "train_steps": 400,
                     "log_every_steps": 2, "checkpoint_every_steps": 1000,
                     "backup_every_steps": 1000})
  command = runs.trainer_command("keras", config, workers=2, model_dir=str(model_dir),
                                 engine="ray")
  with open(log_path, "w") as log:
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=runs.clean_env(),
                            cwd=REPO)
    deadline = time.monotonic() + 300
    while not [r for r in runs.read_progress(str(model_dir)) if r["event"] == "step"]:
      assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
      time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == exit_codes.PREEMPTED, log_path.read_text()[-3000:]
  text = log_path.read_text()
  assert "Received SIGTERM: every task stops at a step" in text and "Traceback" not in text
  (saved,) = [r["step"] for r in runs.read_progress(str(model_dir)) if r["event"] == "preempted"]
  assert 0 < saved < config.train_steps
  assert json.loads((model_dir / "logs" / "tasks.json").read_text())["stop"]["code"] == 143
  again = run_module("launch.ray", ["--backend=keras", "--workers=2", f"--model_dir={model_dir}",
                                    *trainer_flags.config_to_flags(config)], timeout=600)
  assert again.returncode == 0, again.stderr[-3000:]
  starts = [r["from_step"] for r in runs.read_progress(str(model_dir)) if r["event"] == "start"]
  assert starts == [0, saved]
  _check_trained_and_evaluated(model_dir, again.stdout, config)


def test_launch_ray_imports_no_tensorflow_before_the_runner_quiets_it():
  result = subprocess.run([sys.executable, "-c", "import sys, launch.ray; "
                           "assert 'tensorflow' not in sys.modules"], cwd=REPO,
                          capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
