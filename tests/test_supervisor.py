"""launch.supervisor: runs any TF_CONFIG-aware command and stops every task on failure."""

import json
import os
import sys
import textwrap
import time

import pytest

from launch import supervisor
from tests.conftest import run_module

# A stand-in task: records its TF_CONFIG and pid, then behaves as $BEHAVIOUR_<type>_<index> says.
TASK = textwrap.dedent("""
    import json, os, sys, time
    tf_config = json.loads(os.environ["TF_CONFIG"])
    task = tf_config["task"]
    name = f"{task['type']}-{task['index']}"
    out = os.environ["OUT_DIR"]
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump({"tf_config": tf_config, "pid": os.getpid()}, f)
    behaviour = os.environ.get("BEHAVIOUR_" + name.replace("-", "_"), "ok")
    print(f"hello from {name}", flush=True)
    if behaviour == "fail":
        time.sleep(0.5)
        sys.exit(3)
    if behaviour == "hang":
        time.sleep(600)
    print("last line of " + name, flush=True)
""")


@pytest.fixture
def task_script(tmp_path):
  path = tmp_path / "task.py"
  path.write_text(TASK)
  out = tmp_path / "out"
  out.mkdir()
  return path, out


def _run(task_script, tmp_path, workers=2, evaluator=False, timeout=60, **behaviour):
  path, out = task_script
  env = dict(os.environ, OUT_DIR=str(out), **{f"BEHAVIOUR_{k}": v for k, v in behaviour.items()})
  rc = supervisor.run_local_cluster([sys.executable, str(path)], workers, str(tmp_path / "logs"),
                                    evaluator=evaluator, timeout=timeout, env=env, grace=2)
  records = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
  return rc, records


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return True


def test_every_task_gets_its_tf_config_and_a_log(task_script, tmp_path, capfd):
  rc, records = _run(task_script, tmp_path, workers=3, evaluator=True)
  assert rc == 0
  assert sorted(records) == ["chief-0", "evaluator-0", "worker-0", "worker-1"]
  cluster_specs = {json.dumps(r["tf_config"]["cluster"]) for r in records.values()}
  assert len(cluster_specs) == 1
  for name in records:
    assert f"last line of {name}" in (tmp_path / "logs" / f"{name}.log").read_text()
  streamed = capfd.readouterr().out
  assert "last line of chief-0" in streamed and "worker-0" not in streamed


def test_a_failed_worker_stops_the_others(task_script, tmp_path):
  start = time.monotonic()
  rc, records = _run(task_script, tmp_path, workers=3, worker_1="fail", chief_0="hang",
                     worker_0="hang")
  assert rc == 3
  assert time.monotonic() - start < 30
  assert not any(_alive(r["pid"]) for r in records.values())


def test_timeout_stops_a_hung_cluster(task_script, tmp_path):
  rc, records = _run(task_script, tmp_path, workers=2, timeout=3, worker_0="hang")
  assert rc == supervisor.EXIT_TIMEOUT
  assert not any(_alive(r["pid"]) for r in records.values())


def test_cli_runs_a_command_on_local_workers(task_script, tmp_path):
  path, out = task_script
  result = run_module("launch.local", ["--workers=2", f"--task_log_dir={tmp_path / 'cli_logs'}",
                                       "--", sys.executable, str(path)],
                      env={"OUT_DIR": str(out), "BEHAVIOUR_worker_0": "fail"})
  assert result.returncode == 3, result.stderr
  assert "worker-0 exited with code 3" in result.stderr
  assert "hello from chief-0" in result.stdout


def test_cli_rejects_bad_usage():
  result = run_module("launch.local", ["--workers=0", "--", "true"])
  assert result.returncode == 2 and "workers" in result.stderr
  result = run_module("launch.local", ["--workers=2"])
  assert result.returncode == 2 and "command" in result.stderr
