"""launch.zygote: a forked task is the process `python -m` would have started."""

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from launch import zygote
from tests.conftest import FORKED_RUNS, REPO, run_module

TASK = r'''
import json, os, signal, sys
if sys.argv[1:2] == ["report"]:
  print(json.dumps({
      "argv": sys.argv[1:], "tf_config": os.environ.get("TF_CONFIG"),
      "own_session": os.getsid(0) == os.getpid(), "stdin": sys.stdin.read(),
      "sigint_raises": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
      "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
      "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2)[:-1],
      "niceness": os.nice(0), "name": __name__, "preloaded": "csv" in sys.modules}))
  print("to stderr", file=sys.stderr)
elif sys.argv[1] == "exit":
  sys.exit(int(sys.argv[2]))
elif sys.argv[1] == "say":
  sys.exit("error: said so")
elif sys.argv[1] == "raise":
  raise RuntimeError("boom")
elif sys.argv[1] == "interrupt":
  raise KeyboardInterrupt
elif sys.argv[1] == "sleep":
  print("asleep", flush=True)
  import time
  time.sleep(60)
'''


@pytest.fixture
def forked(tmp_path):
  (tmp_path / "zygote_task.py").write_text(TASK)
  (tmp_path / "noisy.py").write_text("import sys\nprint('said at import', file=sys.stderr)\n")
  env = dict(os.environ, PYTHONPATH=str(tmp_path))
  made = zygote.Zygote(["csv", "no_such_module_here", "noisy"], env)
  yield made, env
  made.close()


def _spawn(made, env, *argv, niceness=0):
  return made.spawn([sys.executable, "-m", "zygote_task", *argv],
                    dict(env, TF_CONFIG='{"task": 1}'), niceness)


@pytest.mark.quick
def test_a_forked_task_is_the_process_python_dash_m_would_start(forked):
  made, env = forked
  task = _spawn(made, env, "report", "--flag=1", niceness=3)
  report = json.loads(task.stdout.read())
  assert task.stderr.read() == b"to stderr\n"
  assert task.wait(30) == 0
  # Its argv, its own TF_CONFIG, a session of its own, /dev/null for stdin, Python's
  # handlers, no descriptor of the zygote's, its niceness; its module run as __main__, in
  # an interpreter that imported the preloaded modules (one not installed was left out).
  base = os.nice(0)
  assert report == {"argv": ["report", "--flag=1"], "tf_config": '{"task": 1}',
                    "own_session": True, "stdin": "", "sigint_raises": True,
                    "sigterm_default": True, "fds": [], "niceness": base + 3,
                    "name": "__main__", "preloaded": True}
  assert task.pid != os.getpid() and task.poll() == 0
  # What the imports wrote, once, for each task's log.
  assert made.imported == b"said at import\n"


@pytest.mark.parametrize("argv, code, said", [
    (("exit", "3"), 3, b""), (("exit", "0"), 0, b""),
    (("say",), 1, b"error: said so\n"), (("raise",), 1, b"RuntimeError: boom\n"),
    (("interrupt",), -signal.SIGINT, b"KeyboardInterrupt\n")])
def test_each_ending_gives_the_exit_code_a_process_of_its_own_would(forked, argv, code, said):
  made, env = forked
  task = _spawn(made, env, *argv)
  assert task.wait(30) == code
  assert task.stderr.read().endswith(said)


def test_a_signalled_task_reports_the_signal_and_a_running_one_can_be_waited_on(forked):
  made, env = forked
  task = _spawn(made, env, "sleep")
  assert task.stdout.readline() == b"asleep\n"
  with pytest.raises(subprocess.TimeoutExpired):
    task.wait(0.2)
  os.killpg(task.pid, signal.SIGTERM)
  assert task.wait(30) == -signal.SIGTERM


def test_only_a_python_dash_m_command_in_the_zygotes_environment_is_forked(forked):
  made, env = forked
  with pytest.raises(ValueError, match="forks `.* -m <module>` only"):
    made.spawn([sys.executable, "zygote_task.py"], env)
  with pytest.raises(ValueError, match="differs from its zygote's beyond TF_CONFIG"):
    made.spawn([sys.executable, "-m", "zygote_task"], dict(env, OTHER="1"))


def test_the_tasks_die_with_the_zygote_and_say_so(forked):
  made, env = forked
  task = _spawn(made, env, "sleep")
  assert task.stdout.readline() == b"asleep\n"
  made._process.kill()  # pylint: disable=protected-access
  assert task.wait(30) == -signal.SIGKILL and not made.alive()
  deadline = time.monotonic() + 10
  while os.path.exists(f"/proc/{task.pid}") and time.monotonic() < deadline:
    time.sleep(0.05)  # PR_SET_PDEATHSIG: the kernel kills it as its parent dies.
  assert not os.path.exists(f"/proc/{task.pid}")
  with pytest.raises(zygote.ZygoteDied, match="could not fork a task"):
    _spawn(made, env, "exit", "0")


def test_a_task_reports_its_cpu_time_and_threads_can_share_a_zygote(forked):
  made, env = forked
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    tasks = list(pool.map(lambda code: _spawn(made, env, "exit", str(code)), range(4)))
    codes = list(pool.map(lambda task: task.wait(30), tasks))
  assert codes == [0, 1, 2, 3] and made.running() == []
  assert all(0 < task.cpu_seconds < 10 for task in tasks)


@pytest.mark.parametrize("argv", [("report",), ("exit", "3"), ("say",), ("raise",)])
def test_run_module_forked_gives_what_a_process_of_its_own_gives(tmp_path, argv):
  (tmp_path / "zygote_task.py").write_text(TASK)
  forked_before = len(FORKED_RUNS)
  runs = [run_module("zygote_task", list(argv), env={"PYTHONPATH": str(tmp_path)}, timeout=60,
                     fresh=fresh) for fresh in (True, False, False)]
  assert len(FORKED_RUNS) == forked_before + 1  # Forked from the environment's second run.
  fresh, forked = ([r.returncode, r.stdout, r.stderr.splitlines()[-1:]] for r in runs[::2])
  if argv == ("report",):  # What a forked task shares with a process of its own (which
    # inherits an ignored SIGINT, as under nohup, where a forked one gets Python's handler).
    for said in (fresh, forked):
      report = json.loads(said[1])
      said[1] = [report[k] for k in ("argv", "tf_config", "stdin", "sigterm_default", "fds",
                                     "name")]
  assert forked == fresh


def test_run_module_forked_stops_at_its_timeout(tmp_path):
  (tmp_path / "zygote_task.py").write_text(TASK)
  run_module("zygote_task", ["exit", "0"], env={"PYTHONPATH": str(tmp_path)})  # Then forked.
  forked_before = len(FORKED_RUNS)
  with pytest.raises(subprocess.TimeoutExpired) as e:
    run_module("zygote_task", ["sleep"], env={"PYTHONPATH": str(tmp_path)}, timeout=3)
  assert e.value.output == "asleep\n" and len(FORKED_RUNS) == forked_before + 1
  assert not os.path.exists(f"/proc/{FORKED_RUNS[-1]}")


SAVER = r'''
import signal, sys, time
got = []
signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
print("ready", flush=True)
while not got:
  time.sleep(0.05)
time.sleep(1.0)  # Saving, as a preempted trainer does: a second signal would come now.
with open(sys.argv[1], "w") as f:
  f.write(f"{len(got)} signal(s)")
sys.exit(143)
'''
TOOL = r'''
import os, sys
from launch import zygote
made = zygote.Zygote([], dict(os.environ), session=False)
with open({log!r}, "w") as log:
  task = made.spawn([sys.executable, "-m", "saver", {saved!r}], dict(os.environ),
                    output=log.fileno())
print(task.pid, made.pid, flush=True)
task.wait()
'''


@pytest.mark.parametrize("stop", ["the tool's group", "the tool alone"])
def test_a_tools_runs_stop_with_it_and_have_the_time_to_save(tmp_path, stop):
  # A tool's zygote (session=False) and its runs share the tool's process group: a signal to
  # the group reaches each run once; the tool killed alone, the zygote gives them SIGTERM.
  (tmp_path / "saver.py").write_text(SAVER)
  log, saved = tmp_path / "run.log", tmp_path / "saved"
  (tmp_path / "tool.py").write_text(TOOL.format(log=str(log), saved=str(saved)))
  tool = subprocess.Popen([sys.executable, str(tmp_path / "tool.py")], stdout=subprocess.PIPE,
                          text=True, start_new_session=True,
                          env=dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{tmp_path}"))
  pids = [int(pid) for pid in tool.stdout.readline().split()]
  assert all(os.getpgid(pid) == tool.pid for pid in pids)  # The run's and the zygote's.
  deadline = time.monotonic() + 30
  while "ready" not in log.read_text() and time.monotonic() < deadline:
    time.sleep(0.05)
  if stop == "the tool alone":
    os.kill(tool.pid, signal.SIGKILL)
  else:
    os.killpg(tool.pid, signal.SIGTERM)
  tool.wait(30)
  while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)
  assert saved.read_text() == "1 signal(s)"


def test_a_task_in_its_callers_group_keeps_its_callers_niceness(tmp_path):
  made = zygote.Zygote([], dict(os.environ), session=False)
  try:
    with pytest.raises(ValueError, match="keeps its caller's niceness"):
      made.spawn([sys.executable, "-m", "saver"], dict(os.environ), niceness=3)
  finally:
    made.close()


def test_imports_that_write_more_than_a_pipe_holds_do_not_stop_the_zygote(tmp_path):
  (tmp_path / "loud.py").write_text("import sys\nsys.stderr.write('x' * 300_000 + '\\n')\n")
  made = zygote.Zygote(["loud"], dict(os.environ, PYTHONPATH=str(tmp_path)))
  try:
    assert made.imported == b"x" * 300_000 + b"\n"
  finally:
    made.close()
