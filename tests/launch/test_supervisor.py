"""launch.supervisor: runs any TF_CONFIG-aware command and stops every task on failure."""

import dataclasses
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from typing import Dict, List, Tuple

import pytest

from launch import exit_codes
from launch import zygote
from launch import restarts
from launch import supervisor
from tests.conftest import REPO, run_module

# A stand-in task: records its TF_CONFIG and pid (one file per start), then
# behaves as $BEHAVIOUR_<type>_<index> says.
TASK = textwrap.dedent("""
    import faulthandler, json, os, signal, socket, sys, time
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # As the trainers do.
    tf_config = json.loads(os.environ["TF_CONFIG"])
    task = tf_config["task"]
    name = f"{task['type']}-{task['index']}"
    out = os.environ["OUT_DIR"]
    starts = len([n for n in os.listdir(out) if n.startswith(name + ".")])
    with open("/proc/net/dev") as f:
        interfaces = sorted(line.split(":")[0].strip() for line in f.readlines()[2:])
    listener = socket.create_server(("", 0))  # Every interface, as TensorFlow's servers.
    autogroup = (open("/proc/self/autogroup").read().split()[-1]
                 if os.path.exists("/proc/self/autogroup") else None)
    with open(os.path.join(out, f"{name}.{starts}.json"), "w") as f:
        json.dump({"tf_config": tf_config, "pid": os.getpid(), "niceness": os.nice(0),
                   "autogroup_nice": autogroup,
                   "netns": os.readlink("/proc/self/ns/net"), "interfaces": interfaces,
                   "port": listener.getsockname()[1]}, f)
    behaviour = os.environ.get("BEHAVIOUR_" + name.replace("-", "_"), "ok")
    print(f"hello from {name}", flush=True)
    if behaviour == "fail" or (behaviour in ("fail_once", "fail_once_then_serve")
                               and not starts):
        time.sleep(0.5)  # Killed, as by the out-of-memory killer: retried.
        os.kill(os.getpid(), signal.SIGKILL)
    if behaviour == "error" or (behaviour == "error_once_later" and not starts):
        time.sleep(1.0 if behaviour == "error_once_later" else 0)
        sys.exit(1)  # An error no exit code names: not retried.
    if behaviour == "usage":
        sys.exit(2)
    if behaviour == "diverge":  # As a trainer whose loss became NaN: exit 3.
        time.sleep(0.3)
        sys.exit(3)
    if behaviour == "disk_full":  # As a trainer whose write found no space left: exit 4.
        print("error: a write failed: No space left on device (/x/ckpt-4)", file=sys.stderr)
        sys.exit(4)
    if behaviour == "lose_peer":  # A peer's failed collective: fails first, exit 200.
        sys.exit(200)
    if behaviour == "fail_late":  # The cause, seen after its peer's loss of it.
        time.sleep(0.3)
        sys.exit(5)
    if behaviour in ("hang", "fail_once_then_serve") or (behaviour == "serve_once_briefly"
                                                         and starts):
        time.sleep(600)
    if behaviour == "serve_once_briefly":  # A parameter server that ends: lost.
        time.sleep(0.5)
        sys.exit(0)
    if behaviour == "linger":  # Outlives a restart of the others, then ends well.
        time.sleep(4)
    if behaviour == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    if behaviour == "preempt_once" and not starts:  # Stopped by SIGTERM, its step saved.
        time.sleep(0.3)
        sys.exit(143)
    if behaviour == "save_on_signal":  # As a trainer: saves, then exits 128 + N; a second
        def on_signal(signum, frame):  # signal stops it at once.
            marker = os.path.join(out, f"{name}.{signal.Signals(signum).name}")
            if os.path.exists(marker):
                open(marker + ".again", "w").close()
                os._exit(128 + signum)
            open(marker, "w").close()
            time.sleep(float(os.environ.get("SAVE_SECONDS", "0.3")))
            open(os.path.join(out, name + ".saved"), "w").close()
            os._exit(128 + signum)
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        time.sleep(600)
    print("last line of " + name, flush=True)
""")


@dataclasses.dataclass
class Tasks:
  """The stand-in task, as a process of its own or forked from a zygote (launch.zygote)."""
  path: pathlib.Path
  out: pathlib.Path
  forked: bool

  @property
  def cmd(self) -> List[str]:
    return [sys.executable, "-m", "task"] if self.forked else [sys.executable, str(self.path)]

  @property
  def preload(self) -> Tuple[str, ...]:
    return ("json",) if self.forked else ()

  def env(self, **more) -> Dict[str, str]:
    return dict(os.environ, OUT_DIR=str(self.out), PYTHONPATH=f"{REPO}:{self.path.parent}",
                **more)


@pytest.fixture(params=[False, True], ids=["process", "forked"])
def task_script(tmp_path, request):
  path = tmp_path / "task.py"
  path.write_text(TASK)
  out = tmp_path / "out"
  out.mkdir()
  return Tasks(path, out, request.param)


def _run(task_script, tmp_path, workers=2, evaluator=False, timeout=60, stall_timeout=None,
         max_restarts=0, ps=0, workers_serve=False, **behaviour):
  env = task_script.env(**{f"BEHAVIOUR_{k}": v for k, v in behaviour.items()})
  rc = supervisor.run_local_cluster(task_script.cmd, workers, str(tmp_path / "logs"),
                                    evaluator=evaluator, timeout=timeout,
                                    stall_timeout=stall_timeout, max_restarts=max_restarts,
                                    env=env, grace=2, ps=ps, workers_serve=workers_serve,
                                    preload=task_script.preload)
  # One record per start: "chief-0.0", "chief-0.1" after a restart, ...
  records = {p.stem: json.loads(p.read_text()) for p in task_script.out.glob("*.json")}
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
  assert sorted(records) == ["chief-0.0", "evaluator-0.0", "worker-0.0", "worker-1.0"]
  cluster_specs = {json.dumps(r["tf_config"]["cluster"]) for r in records.values()}
  assert len(cluster_specs) == 1  # Every task's lists every task, as Kubeflow writes it.
  assert sorted(json.loads(cluster_specs.pop())) == ["chief", "evaluator", "worker"]
  for name in ("chief-0", "evaluator-0", "worker-0", "worker-1"):
    assert f"last line of {name}" in (tmp_path / "logs" / f"{name}.log").read_text()
  streamed = capfd.readouterr().out
  assert "last line of chief-0" in streamed and "worker-0" not in streamed
  # The evaluator yields the cores to the training tasks, which wait on each other.
  base = os.nice(0)
  assert {n: r["niceness"] - base for n, r in records.items()} == {
      "chief-0.0": 0, "worker-0.0": 0, "worker-1.0": 0,
      "evaluator-0.0": supervisor.EVALUATOR_NICENESS}
  # Each task has a session of its own: under autogroup scheduling, its session's
  # group nice is what yields the cores to the other sessions.
  if os.path.exists(zygote.AUTOGROUP):
    assert {n: r["autogroup_nice"] for n, r in records.items()} == {
        "chief-0.0": "0", "worker-0.0": "0", "worker-1.0": "0",
        "evaluator-0.0": str(supervisor.EVALUATOR_NICENESS)}


def test_a_failed_worker_stops_the_others(task_script, tmp_path):
  start = time.monotonic()
  rc, records = _run(task_script, tmp_path, workers=3, worker_1="fail", chief_0="hang",
                     worker_0="hang")
  assert rc == 128 + 9
  assert time.monotonic() - start < 30
  assert not any(_alive(r["pid"]) for r in records.values())


def _tasks_file(tmp_path):
  return json.loads((tmp_path / "logs" / restarts.TASKS_FILE).read_text())


def test_a_failed_task_restarts_every_task_with_the_same_tf_config(task_script, tmp_path, caplog):
  rc, records = _run(task_script, tmp_path, workers=2, max_restarts=3, worker_0="fail_once")
  assert rc == 0
  assert sorted(records) == ["chief-0.0", "chief-0.1", "worker-0.0", "worker-0.1"]
  for name in ("chief-0", "worker-0"):
    assert records[f"{name}.0"]["tf_config"] == records[f"{name}.1"]["tf_config"]
  assert not any(_alive(r["pid"]) for r in records.values())
  tasks = _tasks_file(tmp_path)
  assert tasks["restarts"] == 1
  assert {t["pid"] for t in tasks["tasks"]} == {records["chief-0.1"]["pid"],
                                                records["worker-0.1"]["pid"]}
  assert "Restart 1 of 3: worker-0 was killed by SIGKILL" in caplog.text
  log = (tmp_path / "logs" / "chief-0.log").read_text()
  assert log.count("hello from chief-0") == 2
  assert "=== restart 1 of 3: worker-0 was killed by SIGKILL ===" in log


def test_a_killed_zygote_takes_its_tasks_and_the_restart_forks_from_a_new_one(tmp_path, caplog):
  tasks = Tasks(tmp_path / "task.py", tmp_path / "out", forked=True)
  tasks.path.write_text(TASK)
  tasks.out.mkdir()
  killed = []

  def kill_the_zygote():  # Once both tasks run, as an out-of-memory killer would.
    while len(list(tasks.out.glob("*.json"))) < 2:
      time.sleep(0.05)
    killed.append(_tasks_file(tmp_path)["zygote"])
    os.kill(killed[0], signal.SIGKILL)

  threading.Thread(target=kill_the_zygote, daemon=True).start()
  rc = supervisor.run_local_cluster(
      tasks.cmd, 2, str(tmp_path / "logs"), max_restarts=1, grace=2, timeout=60,
      env=tasks.env(BEHAVIOUR_chief_0="linger", BEHAVIOUR_worker_0="linger"),
      preload=tasks.preload)
  assert rc == 0, caplog.text
  assert "Restart 1 of 1: chief-0 was killed by SIGKILL" in caplog.text or (
      "Restart 1 of 1: worker-0 was killed by SIGKILL" in caplog.text), caplog.text
  assert sorted(p.stem for p in tasks.out.glob("*.json")) == [
      "chief-0.0", "chief-0.1", "worker-0.0", "worker-0.1"]
  assert _tasks_file(tmp_path)["zygote"] != killed[0]


def test_a_zygote_that_cannot_import_ends_the_run_naming_the_fix(tmp_path, caplog):
  (tmp_path / "crash.py").write_text("import os\nos._exit(7)\n")  # As a crashing import.
  tasks = Tasks(tmp_path / "task.py", tmp_path / "out", forked=True)
  tasks.path.write_text(TASK)
  rc = supervisor.run_local_cluster(tasks.cmd, 2, str(tmp_path / "logs"), max_restarts=3,
                                    env=tasks.env(), preload=("crash",))
  assert rc == 1
  assert ("the zygote could not start: it exited 7. Run again, or give --nofork_tasks"
          in caplog.text), caplog.text
  assert not list(tmp_path.glob("out*"))


def test_parameter_servers_serve_until_the_others_end_then_are_stopped(task_script, tmp_path):
  rc, records = _run(task_script, tmp_path, workers=2, evaluator=True, ps=2, ps_0="hang",
                     ps_1="hang", chief_0="linger")
  assert rc == 0
  assert sorted(records) == ["chief-0.0", "evaluator-0.0", "ps-0.0", "ps-1.0", "worker-0.0"]
  assert sorted(records["ps-1.0"]["tf_config"]["cluster"]) == ["chief", "evaluator", "ps",
                                                                "worker"]
  assert records["ps-1.0"]["tf_config"]["task"] == {"type": "ps", "index": 1}
  assert not any(_alive(r["pid"]) for r in records.values())
  assert [t["name"] for t in _tasks_file(tmp_path)["tasks"]] == [
      "chief-0", "worker-0", "ps-0", "ps-1", "evaluator-0"]


def test_a_parameter_server_that_ends_is_a_lost_peer_and_restarts_with_the_others(
    task_script, tmp_path, caplog):
  rc, records = _run(task_script, tmp_path, workers=2, ps=1, max_restarts=1,
                     ps_0="serve_once_briefly", chief_0="linger", worker_0="linger")
  assert rc == 0
  assert sorted(records) == ["chief-0.0", "chief-0.1", "ps-0.0", "ps-0.1", "worker-0.0",
                             "worker-0.1"]
  assert "Restart 1 of 1: ps-0 exited with code 0" in caplog.text
  assert not any(_alive(r["pid"]) for r in records.values())


def test_with_parameter_servers_a_failed_worker_restarts_alone(task_script, tmp_path, caplog):
  rc, records = _run(task_script, tmp_path, workers=3, ps=1, max_restarts=1, ps_0="hang",
                     chief_0="linger", worker_1="fail_once")
  assert rc == 0
  # Its peers trained on: each worker steps alone against the parameter servers.
  assert sorted(records) == ["chief-0.0", "ps-0.0", "worker-0.0", "worker-1.0", "worker-1.1"]
  assert "Restart 1 of 1: worker-1 was killed by SIGKILL" in caplog.text


def test_workers_that_serve_a_coordinating_chief_are_stopped_with_the_parameter_servers(
    task_script, tmp_path, caplog):
  # Keras on parameter servers: the chief coordinates, the workers serve it; a lost worker
  # restarts alone (the coordinator goes on with the others), and the run ends with the chief.
  rc, records = _run(task_script, tmp_path, workers=3, ps=1, max_restarts=1,
                     workers_serve=True, ps_0="hang", worker_0="hang",
                     worker_1="fail_once_then_serve",
                     chief_0="linger")
  assert rc == 0
  assert sorted(records) == ["chief-0.0", "ps-0.0", "worker-0.0", "worker-1.0", "worker-1.1"]
  assert "Restart 1 of 1: worker-1 was killed by SIGKILL" in caplog.text
  assert "restarting it alone while the others train on." in caplog.text
  assert not any(_alive(r["pid"]) for r in records.values())


def test_the_evaluator_is_restarted_alone_and_outlives_a_training_restart(task_script,
                                                                          tmp_path, caplog):
  rc, records = _run(task_script, tmp_path, workers=2, evaluator=True, max_restarts=1,
                     evaluator_0="fail_once", worker_0="fail_once", chief_0="linger")
  assert rc == 0
  # The evaluator's failure restarted it alone; the worker's restarted chief and
  # worker, and the evaluator's second process ran on through it.
  assert sorted(records) == ["chief-0.0", "chief-0.1", "evaluator-0.0", "evaluator-0.1",
                             "worker-0.0", "worker-0.1"]
  assert "Restart 1 of 1 of the evaluator alone: evaluator-0 was killed by SIGKILL" in caplog.text
  assert "Restart 1 of 1: worker-0 was killed by SIGKILL" in caplog.text
  tasks = _tasks_file(tmp_path)
  assert (tasks["restarts"], tasks["evaluator_restarts"]) == (1, 1)
  log = (tmp_path / "logs" / "evaluator-0.log").read_text()
  assert log.count("hello from evaluator-0") == 2 and "last line of evaluator-0" in log
  assert "=== evaluator restart 1 of 1: evaluator-0 was killed by SIGKILL ===" in log
  assert "evaluator" not in (tmp_path / "logs" / "chief-0.log").read_text()


def test_a_preempted_task_restarts_the_cluster_without_counting_a_restart(task_script,
                                                                          tmp_path, caplog):
  rc, records = _run(task_script, tmp_path, workers=2, evaluator=True, max_restarts=0,
                     worker_0="preempt_once", evaluator_0="preempt_once")
  assert rc == 0
  assert sorted(records) == ["chief-0.0", "chief-0.1", "evaluator-0.0", "evaluator-0.1",
                             "worker-0.0", "worker-0.1"]
  tasks = _tasks_file(tmp_path)
  assert (tasks["restarts"], tasks["evaluator_restarts"], tasks["preemptions"]) == (0, 0, 2)
  assert "Preempted: worker-0 exited with code 143; restarting the training tasks" in caplog.text
  assert "Preempted: evaluator-0 exited with code 143; restarting the evaluator" in caplog.text
  log = (tmp_path / "logs" / "worker-0.log").read_text()
  assert "=== preemption 1: worker-0 exited with code 143 ===" in log


def _launcher(task_script, tmp_path, **env):
  """The launcher in a process of its own, its tasks saving on a signal; started once every
  task has started."""
  out = task_script.out
  launcher = subprocess.Popen(
      [sys.executable, "-c", textwrap.dedent(f"""
          import sys
          from absl import logging
          from launch import supervisor
          logging.use_absl_handler()
          sys.exit(supervisor.run_local_cluster({task_script.cmd!r}, 2,
                                                {str(tmp_path / 'logs')!r}, evaluator=True,
                                                max_restarts=0, grace=20,
                                                preload={task_script.preload!r}))""")],
      cwd=REPO, stderr=subprocess.PIPE, text=True,
      env=task_script.env(**env, **{f"BEHAVIOUR_{n}": "save_on_signal"
                                    for n in ("chief_0", "worker_0", "evaluator_0")}))
  deadline = time.monotonic() + 30
  while len(list(out.glob("*.json"))) < 3:
    assert time.monotonic() < deadline, "the tasks did not start"
    time.sleep(0.1)
  time.sleep(0.5)  # Their handlers set.
  return launcher, out


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_drains_every_task(task_script, tmp_path, signum):
  launcher, out = _launcher(task_script, tmp_path)
  launcher.send_signal(signum)
  _, err = launcher.communicate(timeout=30)
  assert launcher.returncode == 128 + signum
  # Each task was asked with the launcher's own signal, saved, and exited on its own.
  name = signal.Signals(signum).name
  assert sorted(p.name for p in out.glob("*.saved")) == ["chief-0.saved", "evaluator-0.saved",
                                                         "worker-0.saved"]
  assert sorted(p.name for p in out.glob(f"*.{name}")) == [
      f"chief-0.{name}", f"evaluator-0.{name}", f"worker-0.{name}"]
  assert not list(out.glob("*.again"))
  assert f"Received {name}: every task stops at a step" in err and "Traceback" not in err


def test_a_second_signal_to_the_launcher_stops_every_task_at_once(task_script, tmp_path):
  launcher, out = _launcher(task_script, tmp_path, SAVE_SECONDS="60")
  launcher.send_signal(signal.SIGTERM)
  deadline = time.monotonic() + 10
  while len(list(out.glob("*.SIGTERM"))) < 3:
    assert time.monotonic() < deadline, "the tasks were not asked to stop"
    time.sleep(0.1)
  start = time.monotonic()
  launcher.send_signal(signal.SIGTERM)
  _, err = launcher.communicate(timeout=30)
  assert launcher.returncode == 143 and time.monotonic() - start < 10
  assert len(list(out.glob("*.again"))) == 3 and not list(out.glob("*.saved"))
  assert "Traceback" not in err


def test_restarts_stop_at_max_restarts(task_script, tmp_path, caplog):
  rc, records = _run(task_script, tmp_path, workers=2, max_restarts=2, chief_0="fail")
  assert rc == 128 + 9
  assert len([r for r in records if r.startswith("chief-0")]) == 3
  assert _tasks_file(tmp_path)["restarts"] == 2
  assert "no restarts left (--max_restarts=2)" in caplog.text


def test_a_usage_error_is_not_retried(task_script, tmp_path, caplog):
  rc, records = _run(task_script, tmp_path, workers=2, max_restarts=3, worker_0="usage")
  assert rc == 2
  assert _tasks_file(tmp_path)["restarts"] == 0
  assert "a usage error is not retried" in caplog.text
  assert not any(_alive(r["pid"]) for r in records.values())


def test_an_error_no_code_names_is_not_retried_as_an_orchestrator_would_not(
    task_script, tmp_path, caplog):
  rc, records = _run(task_script, tmp_path, workers=2, max_restarts=3, worker_0="error")
  assert rc == 1 and _tasks_file(tmp_path)["restarts"] == 0
  assert "exit codes 1 to 127 are not retried" in caplog.text
  assert not any(_alive(r["pid"]) for r in records.values())


def test_a_killed_task_is_the_cause_not_a_peers_error_after_it(task_script, tmp_path,
                                                               caplog):
  # The worker is killed; the chief's error follows within the settling time.
  rc, records = _run(task_script, tmp_path, workers=2, max_restarts=1, worker_0="fail_once",
                     chief_0="error_once_later")
  assert rc == 0, caplog.text
  assert "Restart 1 of 1: worker-0 was killed by SIGKILL" in caplog.text
  assert sorted(records) == ["chief-0.0", "chief-0.1", "worker-0.0", "worker-0.1"]


def test_a_diverged_run_is_not_retried_even_when_a_peer_failed_first(task_script, tmp_path,
                                                                    caplog):
  rc, records = _run(task_script, tmp_path, workers=2, max_restarts=3, chief_0="diverge",
                     worker_0="lose_peer")
  assert rc == exit_codes.DIVERGED == 3
  assert _tasks_file(tmp_path)["restarts"] == 0
  assert "a diverged run is not retried" in caplog.text
  assert "chief-0 exited with code 3" in caplog.text
  assert not any(_alive(r["pid"]) for r in records.values())


def test_a_full_disk_is_not_retried_and_a_workers_error_is_quoted(task_script, tmp_path,
                                                                  caplog):
  rc, records = _run(task_script, tmp_path, workers=2, max_restarts=3, worker_0="disk_full")
  assert rc == exit_codes.DISK_FULL == 4
  assert _tasks_file(tmp_path)["restarts"] == 0
  assert "a full disk is not retried" in caplog.text
  # The worker's output is not streamed: the launcher quotes its error.
  assert ("worker-0 exited with code 4 (error: a write failed: No space left on device"
          in caplog.text)
  assert not any(_alive(r["pid"]) for r in records.values())


def test_a_task_whose_log_cannot_be_written_says_its_error_on_the_terminal(task_script, tmp_path,
                                                                          capfd, caplog):
  # The logs live in model_dir, on the filesystem that filled: a write there
  # fails with ENOSPC, as every write to /dev/full does.
  (tmp_path / "logs").mkdir()
  (tmp_path / "logs" / "worker-0.log").symlink_to("/dev/full")
  rc, _ = _run(task_script, tmp_path, workers=3, worker_0="disk_full")
  assert rc == exit_codes.DISK_FULL
  out, err = capfd.readouterr()
  assert "cannot write" in err and "worker-0.log" in err and "No space left on device" in err
  assert "[worker-0] error: a write failed: No space left on device (/x/ckpt-4)" in err
  # The chief's lines are streamed; another worker's stay in its log.
  assert "hello from chief-0" in out and "[worker-0] hello from worker-0" in out
  assert "worker-1" not in out and "hello from worker-1" in (tmp_path / "logs" /
                                                              "worker-1.log").read_text()
  assert "worker-0 exited with code 4 (error: a write failed" in caplog.text


def test_a_tasks_own_failure_is_reported_not_its_peers_loss_of_it(task_script, tmp_path,
                                                                  caplog):
  rc, _ = _run(task_script, tmp_path, workers=2, chief_0="lose_peer", worker_0="fail_late")
  assert rc == 5 and "worker-0 exited with code 5" in caplog.text


def test_a_lost_peer_is_retried(task_script, tmp_path, caplog):
  rc, _ = _run(task_script, tmp_path, workers=2, max_restarts=1, worker_0="lose_peer")
  assert rc == exit_codes.PEER_LOST == 200  # Retried once, lost again.
  assert _tasks_file(tmp_path)["restarts"] == 1 and "Restart 1 of 1" in caplog.text


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="network namespaces: Linux")
def test_no_other_host_can_reach_the_tasks(task_script, tmp_path):
  """The tasks share one network namespace with only loopback: a server they start on
  every interface is out of reach from this machine's own namespace, and so from others."""
  path, out = task_script.path, task_script.out
  env = dict(os.environ, OUT_DIR=str(out), BEHAVIOUR_chief_0="hang")
  with subprocess.Popen([sys.executable, "-m", "launch.local", "--workers=2", "--evaluator",
                         f"--task_log_dir={tmp_path / 'logs'}", "--", sys.executable, str(path)],
                        cwd=REPO, env=env, stderr=subprocess.PIPE, text=True) as launcher:
    try:
      deadline = time.monotonic() + 60
      while len(list(out.glob("*.json"))) < 3:
        assert time.monotonic() < deadline and launcher.poll() is None
        time.sleep(0.2)
      time.sleep(0.5)  # Each record is written whole, but a moment after it is created.
      records = [json.loads(p.read_text()) for p in out.glob("*.json")]
      assert len({r["netns"] for r in records}) == 1
      assert records[0]["netns"] != os.readlink("/proc/self/ns/net")
      assert {tuple(r["interfaces"]) for r in records} == {("lo",)}
      chief = next(r for r in records if r["tf_config"]["task"]["type"] == "chief")
      with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", chief["port"]), timeout=5).close()
    finally:
      launcher.kill()
      stderr = launcher.communicate()[1]
  assert "no private network namespace" not in stderr


def test_timeout_stops_a_hung_cluster(task_script, tmp_path, caplog):
  rc, records = _run(task_script, tmp_path, workers=2, timeout=3, worker_0="hang")
  assert rc == exit_codes.TIMEOUT
  assert not any(_alive(r["pid"]) for r in records.values())
  assert "Timed out after 3 s" in caplog.text and "worker-0" in caplog.text
  # Asked for its stacks before it was killed.
  assert "in <module>" in (tmp_path / "logs" / "worker-0.log").read_text()


def test_stall_watchdog_names_the_task_that_gives_no_stack_dump(task_script, tmp_path, caplog):
  start = time.monotonic()
  rc, records = _run(task_script, tmp_path, workers=3, timeout=60, stall_timeout=2,
                     chief_0="hang", worker_0="hang", worker_1="stop")
  assert rc == exit_codes.TIMEOUT
  assert time.monotonic() - start < 30
  assert "No task wrote any output for 2 s (--stall_timeout)" in caplog.text
  assert "hung: worker-1 (silent" in caplog.text and "no stack dump" in caplog.text
  assert "also still running: chief-0, worker-0" in caplog.text
  assert "in <module>" in (tmp_path / "logs" / "worker-0.log").read_text()
  assert not any(_alive(r["pid"]) for r in records.values())


def test_cli_runs_a_command_on_local_workers(task_script, tmp_path):
  path, out = task_script.path, task_script.out
  result = run_module("launch.local", ["--workers=2", f"--task_log_dir={tmp_path / 'cli_logs'}",
                                       "--max_restarts=0", "--", sys.executable, str(path)],
                      env={"OUT_DIR": str(out), "BEHAVIOUR_worker_0": "fail"})
  assert result.returncode == 128 + 9, result.stderr
  assert "worker-0 was killed by SIGKILL" in result.stderr
  assert "hello from chief-0" in result.stdout


def test_cli_rejects_bad_usage():
  result = run_module("launch.local", ["--workers=0", "--", "true"])
  assert result.returncode == 2 and "workers" in result.stderr
  result = run_module("launch.local", ["--max_restarts=-1", "--", "true"])
  assert result.returncode == 2 and "--max_restarts must be >= 0" in result.stderr
  result = run_module("launch.local", ["--workers=2"])
  assert result.returncode == 2 and "command" in result.stderr


def test_tasks_die_with_a_killed_launcher(task_script, tmp_path):
  """SIGKILL to the launcher (an OOM killer, a closed terminal): no task trains on."""
  out = task_script.out
  launcher = subprocess.Popen(
      [sys.executable, "-c", textwrap.dedent(f"""
          import sys
          from launch import supervisor
          supervisor.run_local_cluster({task_script.cmd!r}, 2,
                                       {str(tmp_path / 'logs')!r}, evaluator=True,
                                       max_restarts=0, preload={task_script.preload!r})""")],
      cwd=REPO, env=task_script.env(BEHAVIOUR_chief_0="hang", BEHAVIOUR_worker_0="hang",
                                    BEHAVIOUR_evaluator_0="hang"))
  deadline = time.monotonic() + 30
  while len(list(out.glob("*.json"))) < 3:
    assert time.monotonic() < deadline, "the tasks did not start"
    time.sleep(0.1)
  pids = [json.loads(p.read_text())["pid"] for p in out.glob("*.json")]
  assert all(_alive(pid) for pid in pids)
  launcher.kill()
  launcher.wait()
  deadline = time.monotonic() + 10
  while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
    time.sleep(0.1)
  assert not any(_alive(pid) for pid in pids), "tasks outlived the launcher"
