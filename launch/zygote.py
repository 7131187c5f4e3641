"""Starts a local cluster's tasks, or a tool's runs, from one process that imported them.

Every task of a trainer imports TensorFlow, tf-keras, TFDS and the Estimator: 4 to 5 CPU-s
each, most of a short run's work on a 2-core machine. A `Zygote` imports them once, in a
process of its own started before any task, and forks each task from it (`spawn`): the
task then runs `python -m <module> <args>` as it would have, in the zygote's copy of the
interpreter.

    zygote = Zygote(["tensorflow", "tf_keras"], env, preexec)
    task = zygote.spawn([sys.executable, "-m", "trainers.keras_main", ...], task_env)
    task.poll(); task.wait(timeout); task.pid; task.stdout; task.stderr
    task.cpu_seconds  # Once it ended: its CPU time and its waited-for children's.
    zygote.close()

A task gets what a new process would: its own session, its environment, its argv, its
stdout and stderr pipes (or one file for both), stdin from /dev/null, default signal
handlers, no other file descriptor, its `niceness`; what the zygote wrote as it imported is
`imported`, for the task's log. With `session=False` (a tool's runs, which stop with the
tool), the zygote and its tasks stay in the caller's process group instead: a terminal's
Ctrl-C or a signal to the group reaches the tasks as it reaches the caller, and the zygote
only notes it, to outlive their saving.

What a task cannot get anew is what its modules did as they were imported: so every
task's environment must equal the zygote's but for TF_CONFIG
(`forks`), which TensorFlow reads only once a strategy is made; a task whose environment
differs is refused (ValueError), never started with another's. `ps` shows a task's
command line as the zygote's.

The zygote is the tasks' parent: it reaps them and reports each exit code, as Popen's
`returncode` gives it (negative: the signal). It dies with the launcher (PR_SET_PDEATHSIG,
set by the `preexec` the launcher gives it), and its tasks with it. If its caller ends
(or closes it) while tasks run, it gives them SIGTERM (unless a signal to the group reached
them already: a second would stop them unsaved) and STOP_SECONDS to save, as a preemption
does, then SIGKILL. TensorFlow's runtime is never started in the zygote (importing it
starts none of its thread pools), so a fork copies no running TensorFlow thread. One lock
orders what threads of the caller ask of a zygote.
"""

import array
import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set

# Read by TensorFlow only when a strategy is made, after the fork: the one variable in
# which a task's environment may differ from the zygote's.
PER_TASK = ("TF_CONFIG",)
# Between SIGTERM and SIGKILL to tasks left running by their caller: a trainer's default
# --grace_seconds (25) and a margin. Not imported: the zygote imports only what it preloads.
STOP_SECONDS = 30.0
AUTOGROUP = "/proc/self/autogroup"  # This session's scheduling group, where the kernel has them.
_READY = "ready"
_SESSION, _GROUP = "session", "group"  # Where the zygote and its tasks run.
_MAX_REQUEST = 1 << 20


def forks(cmd: Sequence[str]) -> bool:
  """Whether `cmd` can be forked from a zygote: `<this python> -m <module> [args]`."""
  return len(cmd) >= 3 and cmd[0] == sys.executable and cmd[1] == "-m"


def set_niceness(niceness: int) -> None:
  """This process's and its session's nice increment (call after setsid)."""
  os.nice(niceness)
  # Under autogroup scheduling (Linux, on by default here) CPU is shared between sessions
  # first, by each session's group nice: a task has a session of its own, so its nice
  # alone would not yield the cores to the other tasks.
  try:
    with open(AUTOGROUP, "w") as f:
      f.write(str(niceness))
  except OSError:
    pass  # No autogroups in this kernel (or not ours to set): the nice above stands.


def _env_key(env: Mapping[str, str]) -> Dict[str, str]:
  return {k: v for k, v in env.items() if k not in PER_TASK}


class Task:
  """A forked task, as much of `subprocess.Popen` as a launcher uses."""

  def __init__(self, zygote: "Zygote", pid: int, stdout, stderr):
    self._zygote, self.pid, self.stdout, self.stderr = zygote, pid, stdout, stderr

  @property
  def returncode(self) -> Optional[int]:
    return self._zygote.exits.get(self.pid)

  @property
  def cpu_seconds(self) -> Optional[float]:
    """User and system CPU time of the ended task and its waited-for children."""
    return self._zygote.cpu.get(self.pid)

  def poll(self) -> Optional[int]:
    self._zygote.read(0.0)
    return self.returncode

  def wait(self, timeout: Optional[float] = None) -> int:
    deadline = None if timeout is None else time.monotonic() + timeout
    while self.poll() is None:
      left = None if deadline is None else deadline - time.monotonic()
      if left is not None and left <= 0:
        raise subprocess.TimeoutExpired(f"task {self.pid}", timeout)
      self._zygote.read(0.1 if left is None else min(left, 0.1))
    return self.returncode


class Zygote:
  """A process that imported `preload` and forks tasks (module docstring)."""

  def __init__(self, preload: Sequence[str], env: Mapping[str, str],
               preexec: Optional[Callable[[], None]] = None, cwd: Optional[str] = None,
               session: bool = True):
    """`cwd`: the tasks' working directory (default: this process's); `session`: whether
    the zygote and each task have a session of their own (module docstring)."""
    self._env, self._session = _env_key(env), session
    self._lock = threading.RLock()
    self.exits: Dict[int, int] = {}
    self.cpu: Dict[int, float] = {}
    self._started: List[int] = []
    self._ready = self._dead = False
    ours, theirs = socket.socketpair()
    # A launcher's (session): a session of its own, as each task has, so a terminal's
    # Ctrl-C reaches the launcher, which drains the tasks, and not the zygote, whose death
    # would kill them unsaved.
    self._process = subprocess.Popen(
        [sys.executable, "-m", "launch.zygote", str(theirs.fileno()),
         _SESSION if session else _GROUP, *preload],
        env=dict(env), pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=session,
        preexec_fn=preexec, cwd=cwd)
    theirs.close()
    self._socket, self._buffer, self._said = ours, b"", b""
    self._start()
    self.imported = self._said + self._said_so_far()

  def spawn(self, cmd: Sequence[str], env: Mapping[str, str], niceness: int = 0,
            output: Optional[int] = None) -> Task:
    """Forks a task running `cmd` (`forks(cmd)`) in `env` (the zygote's, but PER_TASK), its
    stdout and stderr two pipes (the Task's), or both this file descriptor (`output`)."""
    if not forks(cmd):
      raise ValueError(f"a zygote forks `{sys.executable} -m <module>` only, not {cmd}")
    if _env_key(env) != self._env:
      raise ValueError("a task's environment differs from its zygote's beyond "
                       f"{', '.join(PER_TASK)}: start it as a process of its own")
    if niceness and not self._session:  # Its session's autogroup is its caller's too.
      raise ValueError("a task in its caller's process group keeps its caller's niceness")
    with self._lock:
      return self._spawn(cmd, env, niceness, output)

  def _spawn(self, cmd: Sequence[str], env: Mapping[str, str], niceness: int,
             output: Optional[int]) -> Task:
    if output is None:
      out_read, out_write = os.pipe()
      err_read, err_write = os.pipe()
    else:
      out_read = err_read = None
      out_write, err_write = os.dup(output), os.dup(output)
    request = json.dumps({"module": cmd[2], "argv": list(cmd[3:]), "env": dict(env),
                          "niceness": niceness}).encode()
    count = len(self._started)
    try:
      self._socket.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                        array.array("i", [out_write, err_write]))])
    except OSError:  # It died: _wait_for says how.
      self._dead = True
    finally:
      os.close(out_write)
      os.close(err_write)
    try:
      self._wait_for(lambda: len(self._started) > count, "fork a task")
    except ZygoteDied:
      for fd in (out_read, err_read):
        if fd is not None:
          os.close(fd)
      raise
    return Task(self, self._started[count], *(None if fd is None else os.fdopen(fd, "rb")
                                              for fd in (out_read, err_read)))

  def read(self, timeout: float) -> None:
    """Takes in what the zygote said within `timeout` s: tasks started, exit codes."""
    with self._lock:
      self._read(timeout)

  def _read(self, timeout: float) -> None:
    if self._dead or not select.select([self._socket], [], [], timeout)[0]:
      return
    data = self._socket.recv(1 << 16)
    if not data:  # The zygote died, and its tasks with it (PR_SET_PDEATHSIG).
      self._dead = True
      for pid in self._started:
        self.exits.setdefault(pid, -signal.SIGKILL)
      return
    self._buffer += data
    *lines, self._buffer = self._buffer.split(b"\n")
    for line in lines:
      what, *values = line.decode().split()
      if what == _READY:
        self._ready = True
      elif what == "started":
        self._started.append(int(values[0]))
      elif what == "exited":
        self.exits[int(values[0])] = int(values[1])
        self.cpu[int(values[0])] = float(values[2])

  def _start(self) -> None:
    """Waits for the zygote's imports, reading what they write meanwhile: a pipe left full
    (PYTHONPROFILEIMPORTTIME=1 writes a line per module) would stop them."""
    pipes = [self._process.stdout, self._process.stderr]
    while not self._ready and not self._dead:
      readable = select.select([self._socket, *pipes], [], [], 1.0)[0]
      for pipe in [p for p in pipes if p in readable]:
        chunk = os.read(pipe.fileno(), 1 << 16)
        if chunk:
          self._said += chunk
        else:
          pipes.remove(pipe)
      if self._socket in readable:
        self._read(0.0)
    self._wait_for(lambda: self._ready, "start")  # Dead: says why.

  def _wait_for(self, done: Callable[[], bool], doing: str) -> None:
    while not done():
      if self._dead:
        raise ZygoteDied(f"the zygote could not {doing}: {self._error()}")
      self.read(1.0)

  def _error(self) -> str:
    self._process.wait()
    said = (self._said + self._process.stderr.read()).decode(errors="replace").strip().splitlines()
    return said[-1] if said else f"it exited {self._process.returncode}"

  def _said_so_far(self) -> bytes:
    """What the zygote wrote while importing (TensorFlow's start-up lines), which each
    task's log begins with, as a task that imported them itself would have written."""
    said = b""
    for pipe in (self._process.stdout, self._process.stderr):
      os.set_blocking(pipe.fileno(), False)
      try:
        said += pipe.read() or b""
      finally:
        os.set_blocking(pipe.fileno(), True)
    return said

  @property
  def pid(self) -> int:
    return self._process.pid

  def running(self) -> List[int]:
    """The tasks not yet known to have ended."""
    with self._lock:
      self._read(0.0)
      return [pid for pid in self._started if pid not in self.exits]

  def alive(self) -> bool:
    return not self._dead and self._process.poll() is None

  def close(self) -> None:
    """Ends the zygote, once tasks still running have stopped (module docstring)."""
    self._socket.close()
    try:
      self._process.wait(STOP_SECONDS + 10)
    except subprocess.TimeoutExpired:
      self._process.kill()
      self._process.wait()
    self._process.stdout.close()
    self._process.stderr.close()


class ZygoteDied(RuntimeError):
  """The zygote exited: a module of `preload` failed to import, or it was killed."""


def _serve(channel: socket.socket, own_sessions: bool) -> None:
  """The zygote's loop: forks a task for each request; reports each task started and
  each task's exit code and CPU seconds, in that order; returns when the launcher closes
  the socket."""
  children = set()
  while True:
    for pid in list(children):
      done, status, usage = os.wait4(pid, os.WNOHANG)
      if done:
        children.discard(pid)
        channel.sendall(f"exited {pid} {os.waitstatus_to_exitcode(status)} "
                        f"{usage.ru_utime + usage.ru_stime:.3f}\n".encode())
    if not select.select([channel], [], [], 0.05)[0]:
      continue
    fds = array.array("i")
    message, ancillary, _, _ = channel.recvmsg(
        _MAX_REQUEST, socket.CMSG_SPACE(2 * fds.itemsize))
    if not message:
      _stop(children, own_sessions)
      return
    for _, _, data in ancillary:
      fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    request = json.loads(message)
    pid = os.fork()
    if pid == 0:
      channel.close()
      _run_task(request, list(fds), own_sessions)  # Never returns.
    for fd in fds:
      os.close(fd)
    children.add(pid)
    channel.sendall(f"started {pid}\n".encode())


_SIGNALLED: List[int] = []  # What reached the zygote's process group (session=False).


def _stop(children: Set[int], own_sessions: bool) -> None:
  """SIGTERM to the tasks still running (to each one's session, if it has its own) unless
  the group's signal reached them; SIGKILL to those still running STOP_SECONDS later."""

  def send(signum: int) -> None:
    for pid in children:
      try:
        os.kill(-pid if own_sessions else pid, signum)
      except ProcessLookupError:
        pass

  def reap() -> None:
    deadline = time.monotonic() + STOP_SECONDS
    while children and time.monotonic() < deadline:
      children.difference_update([pid for pid in children if os.waitpid(pid, os.WNOHANG)[0]])
      time.sleep(0.05)

  if not _SIGNALLED:
    send(signal.SIGTERM)
  reap()
  send(signal.SIGKILL)
  reap()


def _run_task(request: dict, fds: Sequence[int], own_session: bool) -> None:
  """In the forked child: becomes the task a new process would be, runs its module as
  `python -m` runs it, and exits with its code."""
  code = 1
  try:
    if own_session:
      os.setsid()
    for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGUSR1):
      signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: it dies with the zygote.
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX") if os.sysconf("SC_OPEN_MAX") > 0 else 4096)
    os.environ.clear()
    os.environ.update(request["env"])
    if request["niceness"]:
      set_niceness(request["niceness"])
    import runpy  # noqa: PLC0415 -- only a task needs it
    sys.argv = [request["module"], *request["argv"]]
    try:
      runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
      code = 0
    except SystemExit as e:
      if e.code is None or isinstance(e.code, int):
        code = e.code or 0
      else:  # As the interpreter exits on sys.exit("message").
        print(e.code, file=sys.stderr)
  except KeyboardInterrupt:  # As the interpreter ends on one: killed by SIGINT.
    import traceback  # noqa: PLC0415
    traceback.print_exc()
    sys.stderr.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
  except BaseException:  # pylint: disable=broad-except
    import traceback  # noqa: PLC0415
    traceback.print_exc()
  finally:
    try:
      sys.stdout.flush()
      sys.stderr.flush()
    finally:
      os._exit(code)  # Not the zygote's atexit handlers, nor its buffers.


def main(argv: Sequence[str]) -> None:
  channel, own_sessions = socket.socket(fileno=int(argv[1])), argv[2] == _SESSION
  if not own_sessions:  # In its caller's process group: its tasks' signals are not for it.
    for signum in (signal.SIGINT, signal.SIGTERM):
      signal.signal(signum, lambda signum, _: _SIGNALLED.append(signum))
  import importlib  # noqa: PLC0415
  for name in argv[3:]:
    try:
      importlib.import_module(name)
    except ImportError:
      pass  # Not installed here (tensorflow_estimator after TF 2.15): the task needs none.
  channel.sendall(f"{_READY}\n".encode())
  _serve(channel, own_sessions)


if __name__ == "__main__":
  main(sys.argv)
