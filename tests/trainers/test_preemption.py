"""trainers.preemption: every training task stops after the same step; signals as documented."""

import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import tensorflow as tf

from launch import exit_codes
from launch.proofs import runs
from trainers import checkpoints
from trainers import preemption
from trainers.config import Config
from tests.conftest import REPO


class MemoryStore:
  """The coordination service's key-value store, in memory: each key set once."""

  def __init__(self):
    self.values = {}
    self._changed = threading.Condition()

  def put(self, key, value):
    with self._changed:
      if key in self.values:
        return False
      self.values[key] = value
      self._changed.notify_all()
      return True

  def get(self, key, timeout_seconds):
    with self._changed:
      self._changed.wait_for(lambda: key in self.values, timeout_seconds)
      return self.values.get(key)


def _train_in_lockstep(signalled_at, tasks=3, steps=60, seed=0):
  """Tasks as threads in synchronous training: none finishes step n until every task has
  begun it (a barrier stands for the step's all-reduce). `signalled_at` maps a task to the
  step after which it receives SIGTERM. Returns the step each task stopped at."""
  store, names = MemoryStore(), [f"worker:{i}" for i in range(tasks)]
  agreements = [preemption.Agreement(store, me, [n for n in names if n != me]) for me in names]
  all_reduce = threading.Barrier(tasks, timeout=10)
  stopped, rng = {}, random.Random(seed)

  def train(i):
    agreement = agreements[i]
    for step in range(1, steps + 1):
      time.sleep(rng.random() / 500)  # The tasks drift apart within a step.
      all_reduce.wait()  # A task stopped early would leave the others here: BrokenBarrierError.
      if signalled_at.get(i) == step:
        agreement.notice()
      if agreement.pending and agreement.reached(step):
        stopped[i] = step
        break
    agreement.close()

  threads = [threading.Thread(target=train, args=(i,)) for i in range(tasks)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  return stopped, store


@pytest.mark.parametrize("seed", range(5))
def test_every_task_stops_after_the_step_the_signalled_task_had_finished(seed):
  stopped, store = _train_in_lockstep({1: 20}, seed=seed)
  assert stopped == {0: 21, 1: 21, 2: 21}
  assert store.values[preemption.CLAIM_KEY] == "worker:1"
  assert store.values[preemption.STEP_KEY] == "20"


@pytest.mark.parametrize("seed", range(5))
def test_tasks_signalled_together_agree_on_one_step(seed):
  stopped, store = _train_in_lockstep({0: 30, 1: 30, 2: 31}, seed=seed)
  assert len(set(stopped.values())) == 1 and len(stopped) == 3
  assert stopped[0] == int(store.values[preemption.STEP_KEY]) + 1


@pytest.mark.parametrize("seed", range(3))
def test_a_stop_the_chief_decides_stops_every_task_after_the_next_step(seed):
  """An early stop (request, not a signal), under its own keys: all stop after step c + 1."""
  store, names = MemoryStore(), [f"worker:{i}" for i in range(3)]
  agreements = [preemption.Agreement(store, me, [n for n in names if n != me],
                                     prefix="early_stop/", alone_at_once=False)
                for me in names]
  all_reduce, stopped, rng = threading.Barrier(3, timeout=10), {}, random.Random(seed)

  def train(i):
    for step in range(1, 40):
      time.sleep(rng.random() / 500)
      all_reduce.wait()
      if i == 0 and step == 12:
        agreements[0].request(step)
      if agreements[i].pending and agreements[i].reached(step):
        stopped[i] = step
        break
    agreements[i].close()

  threads = [threading.Thread(target=train, args=(i,)) for i in range(3)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert stopped == {0: 13, 1: 13, 2: 13}
  assert store.values["early_stop/stop_after_step"] == "12"
  assert preemption.STEP_KEY not in store.values


def test_a_lone_process_stops_after_the_next_step_unless_at_once():
  decided = preemption.Agreement(None, "local", [], alone_at_once=False)
  decided.request(7)
  assert (decided.reached(7), decided.reached(8)) == (False, True)
  signalled = preemption.Agreement(None, "local", [])
  signalled.request(7)
  assert signalled.reached(7)


def test_no_task_stops_without_a_signal():
  stopped, store = _train_in_lockstep({}, steps=10)
  assert stopped == {} and store.values == {}


def test_a_task_stopped_by_its_clusters_preemption_acknowledges_it_and_says_so():
  store = MemoryStore()
  store.put(preemption.STEP_KEY, "4")
  agreement = preemption.Agreement(store, "worker:1", ["chief:0"])
  deadline = time.monotonic() + 10
  while not agreement.pending:
    assert time.monotonic() < deadline
    time.sleep(0.01)
  assert not agreement.reached(4) and agreement.reached(5)
  agreement.close()
  assert store.values[preemption.ACK_KEY + "worker:1"] == "1"
  with pytest.raises(preemption.Preempted) as stopped:
    preemption.stopped(agreement, 5)
  assert (stopped.value.step, stopped.value.by_peer, stopped.value.exit_code) == (5, True, 143)


def test_a_lone_process_stops_at_the_step_it_is_at():
  agreement = preemption.Agreement(None, "local", [])
  assert not agreement.pending and not agreement.reached(5)
  agreement.notice()
  assert agreement.pending and agreement.reached(6) and agreement.stopped_at == 6


def test_preempted_says_its_signal_and_exit_code():
  assert preemption.Preempted(signal.SIGTERM, 7).exit_code == exit_codes.PREEMPTED == 143
  assert preemption.Preempted(signal.SIGINT).exit_code == exit_codes.INTERRUPTED == 130
  assert exit_codes.retried(exit_codes.PREEMPTED)
  assert preemption.Preempted(signal.SIGTERM).name == "SIGTERM"


# A process that installs the handlers, then waits as `mode` says: outside training,
# training (a lone loop asking after every step), or stuck in training where Python
# cannot act (a lock acquired forever).
PROGRAM = textwrap.dedent("""
    import sys, threading, time
    from trainers import preemption
    preemption.install(grace_seconds=float(sys.argv[1]))
    mode = sys.argv[2]
    try:
      if mode == "outside":
        print("ready", flush=True)
        time.sleep(60)
      agreement = preemption.Agreement(None, "local", [])
      with preemption.training(agreement):
        print("ready", flush=True)
        step = 0
        while True:
          step += 1
          if mode == "stuck":
            lock = threading.Lock()
            lock.acquire()
            lock.acquire()
          time.sleep(0.01)
          if agreement.pending and agreement.reached(step):
            break
      print(f"stopped at step {step}", flush=True)
      preemption.stopped(agreement, step)
    except preemption.Preempted as e:
      print(f"preempted by {e.name} at {e.step}", flush=True)
      sys.exit(e.exit_code)
""")


def _start(tmp_path, mode, grace=30.0, wrap=()):
  script = tmp_path / "program.py"
  script.write_text(PROGRAM)
  proc = subprocess.Popen([*wrap, sys.executable, str(script), str(grace), mode], cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == "ready"
  return proc


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_outside_training_stops_at_once(tmp_path, signum, code):
  proc = _start(tmp_path, "outside")
  start = time.monotonic()
  proc.send_signal(signum)
  out, err = proc.communicate(timeout=10)
  assert proc.returncode == code and time.monotonic() - start < 5
  assert f"preempted by {signal.Signals(signum).name} at None" in out
  assert "Traceback" not in err


def test_a_signal_in_training_stops_the_loop_at_its_next_step(tmp_path):
  proc = _start(tmp_path, "training")
  time.sleep(0.5)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=10)
  assert proc.returncode == 143, err
  stopped = int(out.split("stopped at step ")[1].split()[0])
  assert f"preempted by SIGTERM at {stopped}" in out
  assert "Received SIGTERM" in err and "Traceback" not in err


def test_the_grace_period_ends_a_task_that_cannot_save(tmp_path):
  proc = _start(tmp_path, "stuck", grace=2.0)
  start = time.monotonic()
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=20)
  assert proc.returncode == 143 and 1.5 < time.monotonic() - start < 10
  assert "--grace_seconds=2 ran out before the step was saved" in err


def test_a_second_signal_stops_at_once(tmp_path):
  proc = _start(tmp_path, "stuck", grace=60.0)
  proc.send_signal(signal.SIGTERM)
  time.sleep(0.5)
  start = time.monotonic()
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=20)
  assert proc.returncode == 143 and time.monotonic() - start < 5
  assert "a second SIGTERM: stopping at once" in err


def _pid_namespace_child(unshare_pid):
  """The pid, seen from here, of the process `unshare --fork` started (PID 1 inside)."""
  deadline = time.monotonic() + 10
  while time.monotonic() < deadline:
    try:
      with open(f"/proc/{unshare_pid}/task/{unshare_pid}/children") as f:
        children = f.read().split()
      if children:
        return int(children[0])
    except OSError:
      pass
    time.sleep(0.05)
  raise AssertionError("unshare started no process")


@pytest.mark.skipif(os.geteuid() != 0, reason="a PID namespace needs root")
def test_the_handler_works_as_pid_1(tmp_path):
  """PID 1 (a container without an init) ignores a signal left at its default."""
  proc = _start(tmp_path, "training", wrap=("unshare", "--pid", "--fork"))
  pid_1 = _pid_namespace_child(proc.pid)
  with open(f"/proc/{pid_1}/status") as f:
    assert next(line for line in f if line.startswith("NSpid:")).split()[-1] == "1"
  os.kill(pid_1, signal.SIGTERM)
  out, err = proc.communicate(timeout=10)
  assert proc.returncode == 143, err
  assert "preempted by SIGTERM at" in out


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="a PID namespace needs root")
def test_a_trainer_as_pid_1_saves_on_sigterm_and_resumes_from_that_step(tiny_data_dir,
                                                                          tmp_path):
  """As in a container without an init: SIGTERM reaches it, it saves the step it is at and
  exits 143; run again, it goes on from that step."""
  model_dir = str(tmp_path / "model")
  config = Config(train_steps=300, global_batch_size=32, eval_batch_size=50, log_every_steps=2,
                  checkpoint_every_steps=1000, backup_every_steps=1000, data_dir=tiny_data_dir)
  command = runs.trainer_command("keras", config, workers=1, model_dir=model_dir)
  with open(tmp_path / "run.log", "w") as log:
    proc = subprocess.Popen(["unshare", "--pid", "--fork", *command], stdout=log,
                            stderr=subprocess.STDOUT, env=runs.clean_env(), cwd=REPO)
    pid_1 = _pid_namespace_child(proc.pid)
    deadline = time.monotonic() + 120
    while not [r for r in runs.read_progress(model_dir) if r["event"] == "step"]:
      assert proc.poll() is None and time.monotonic() < deadline, "training never began"
      time.sleep(0.05)
    os.kill(pid_1, signal.SIGTERM)
    assert proc.wait(timeout=60) == exit_codes.PREEMPTED, (tmp_path / "run.log").read_text()
  (saved,) = [r["step"] for r in runs.read_progress(model_dir) if r["event"] == "preempted"]
  assert 0 < saved < config.train_steps
  assert checkpoints.checkpoint_step(tf.train.latest_checkpoint(model_dir)) == ("keras", saved)
  assert "Stopped by SIGTERM after step" in (tmp_path / "run.log").read_text()
  summary = runs.run_trainer("keras", config, workers=1, model_dir=model_dir,
                             log_path=str(tmp_path / "again.log"))
  starts = [r["from_step"] for r in runs.read_progress(model_dir) if r["event"] == "start"]
  assert starts == [0, saved] and summary["global_step"] == config.train_steps


@pytest.mark.slow
@pytest.mark.parametrize("ps", [0, 1])
def test_ctrl_c_to_a_local_cluster_saves_and_the_same_command_goes_on(ps, tiny_data_dir,
                                                                      tmp_path):
  """The launcher as the drain: each task stops at the agreed step, which is saved; the
  launcher exits 130 with one line; the same command goes on from that step. On parameter
  servers Keras's coordinating chief stops at the end of its epoch and saves it, its
  servers stopped after it."""
  model_dir, log_path = str(tmp_path / "model"), tmp_path / "run.log"
  # On parameter servers an epoch of fit (each ended by a join) is --log_every_steps steps.
  config = Config(train_steps=400, global_batch_size=32, eval_batch_size=50,
                  log_every_steps=20 if ps else 2, checkpoint_every_steps=1000,
                  backup_every_steps=1000, data_dir=tiny_data_dir)
  flags = [f"--ps={ps}"] if ps else []
  command = runs.trainer_command("keras", config, workers=2, model_dir=model_dir,
                                 extra_flags=flags)
  with open(log_path, "w") as log:
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=runs.clean_env(),
                            cwd=REPO)
    deadline = time.monotonic() + 120
    while not [r for r in runs.read_progress(model_dir) if r["event"] == "step"]:
      assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
      time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=90) == exit_codes.INTERRUPTED, log_path.read_text()
  text = log_path.read_text()
  assert "Received SIGINT: every task stops at a step" in text and "Traceback" not in text
  # One story: the chief was sent the launcher's SIGINT, and says 130 as the launcher does.
  assert re.search(r"\[chief:0\].*Stopped by SIGINT .*: exiting 130\. Run the same", text)
  assert "exiting 143" not in text
  (saved,) = [r["step"] for r in runs.read_progress(model_dir) if r["event"] == "preempted"]
  assert checkpoints.checkpoint_step(tf.train.latest_checkpoint(model_dir)) == ("keras", saved)
  summary = runs.run_trainer("keras", config, workers=2, model_dir=model_dir,
                             log_path=str(tmp_path / "again.log"), extra_flags=flags)
  starts = [r["from_step"] for r in runs.read_progress(model_dir) if r["event"] == "start"]
  assert starts == [0, saved] and summary["global_step"] == config.train_steps
