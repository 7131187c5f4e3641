"""launch.ray and launch.tools.ray_engine: the trainers on Ray Train, as on local workers."""

import importlib.util
import json
import os
import sys
import time

import pytest

from launch.tools import ray_engine
from trainers import evaluation
from trainers import flags as trainer_flags
from trainers.config import Config
from tests.conftest import run_module

HAS_RAY = importlib.util.find_spec("ray") is not None
# CI installs the ray extra and must run these; elsewhere they skip, saying why.
needs_ray = pytest.mark.skipif(not HAS_RAY and not os.environ.get("REQUIRE_RAY"),
                               reason='Ray is not installed: pip install -e ".[tf215,ray]"')
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


def test_a_task_failure_keeps_its_exit_code_through_ray():
  error = type("WorkerGroupError", (Exception,), {})()
  error.worker_failures = {0: ray_engine.TaskExit("worker-0", 200),
                           1: ray_engine.TaskExit("worker-1", 137)}
  assert ray_engine._failure_code(error) == 137  # The cause, not its peer's loss of it.
  assert ray_engine._failure_code(RuntimeError("controller")) == 1


@needs_ray
@pytest.mark.parametrize("backend", ["keras", pytest.param("estimator",
                                                           marks=pytest.mark.estimator)])
def test_two_workers_on_ray_train_and_evaluate_as_a_local_cluster(backend, tiny_data_dir,
                                                                  tmp_path):
  model_dir = tmp_path / "model"
  config = Config(**{**CONFIG.__dict__, "data_dir": tiny_data_dir})
  result = run_module("launch.ray", [f"--backend={backend}", "--workers=2",
                                     f"--model_dir={model_dir}",
                                     *trainer_flags.config_to_flags(config)], timeout=600)
  logs = model_dir / "logs"
  assert result.returncode == 0, result.stderr[-3000:] + "".join(
      p.read_text()[-2000:] for p in logs.glob("*.log"))
  summary = json.loads((model_dir / "summary.json").read_text())
  assert (summary["workers"], summary["global_step"]) == (2, config.train_steps)
  assert evaluation.read_result(str(model_dir / "eval"), config.train_steps) == pytest.approx(
      {"accuracy": summary["test_accuracy"], "loss": summary["test_loss"]}, abs=1e-6)
  assert json.loads(result.stdout.strip().splitlines()[-1])["global_step"] == config.train_steps
  assert sorted(p.name for p in logs.glob("*.log")) == ["evaluator-0.log", "worker-0.log",
                                                        "worker-1.log"]
  # Worker 0 of Ray's worker-only cluster is the chief: it waited for the evaluator.
  assert "Waiting for the evaluator's result" in (logs / "worker-0.log").read_text()
