"""One run per model_dir: the lock a run holds on its model_dir while it writes there.

The process that writes model_dir (a lone process, the local launcher for its
whole cluster, or a chief started by an orchestrator) takes the lock before it
reads or changes anything there, and holds it until it exits. It is an OS lock
(`flock`) on the model_dir directory itself: nothing is written to take it,
and the kernel releases it when the process dies, however it dies, so a
crashed run leaves no stale lock. A second run names the first from
`/proc/locks` (its pid and command, when it runs on this host).

Where the file system cannot lock a directory (some network file systems), the
lock is a file, `model_dir/.run.lock`, created exclusively and naming host, pid
and start time. Its rule for staleness: a lock file of this host whose process
is gone is taken over; one of another host stands until that run ends (the run
removes it) or someone who knows it is gone removes it.

The evaluator task only reads checkpoints and writes `eval/`: it takes no
lock. TensorFlow-free: the launcher takes it before it imports TensorFlow.
"""

import errno
import fcntl
import json
import os
import socket
import sys
import time
from typing import Dict, Mapping, Optional

LOCK_FILE = ".run.lock"  # Only where a directory cannot be locked.
# Set by a launcher holding the lock for the tasks it starts: their chief writes
# model_dir under the launcher's lock and must not try to take it again.
HELD_FOR_ENV = "MNIST_RUN_LOCK_HELD_FOR"
_NO_DIRECTORY_LOCKS = (errno.EBADF, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL)


class ModelDirBusy(ValueError):
  """Another live run holds the model_dir's lock."""


class RunLock:
  """A held lock; released by `release()` or when this process exits."""

  def __init__(self, model_dir: str, fd: Optional[int] = None, file: Optional[str] = None):
    self.model_dir, self._fd, self._file = model_dir, fd, file

  def release(self) -> None:
    if self._fd is not None:
      os.close(self._fd)  # Closing the only descriptor releases the flock.
      self._fd = None
    if self._file is not None:
      os.remove(self._file)
      self._file = None


def _busy(model_dir: str, holder: str) -> ModelDirBusy:
  return ModelDirBusy(
      f"--model_dir={model_dir} is in use by {holder}: one run writes a model_dir at a time. "
      "Wait for that run to end (or stop it), or choose another --model_dir. Nothing was "
      "changed.")


def _process(pid: int) -> str:
  """'pid P (command)', as far as /proc tells."""
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      command = " ".join(f.read().replace(b"\0", b" ").decode(errors="replace").split())
  except OSError:
    command = ""
  return f"the run of pid {pid}" + (f" ({command[:300]})" if command else "")


def _flock_holder(path: str) -> str:
  """Who holds the flock on `path`, from /proc/locks; 'another run' if it does not say."""
  st = os.stat(path)
  key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
  try:
    with open("/proc/locks") as f:
      for line in f:
        fields = line.split()
        if "FLOCK" in fields and key in fields:
          return _process(int(fields[fields.index(key) - 1]))
  except (OSError, ValueError):
    pass
  return "another run"


def acquire(model_dir: str) -> RunLock:
  """Takes model_dir's run lock (model_dir must exist), or raises ModelDirBusy naming the run
  that holds it. Writes nothing, but for the lock file where a directory cannot be locked."""
  # Not inherited by the tasks a launcher starts (os.open's default): the lock
  # must end with the process that took it.
  fd = os.open(model_dir, os.O_RDONLY)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return RunLock(model_dir, fd=fd)
  except BlockingIOError:
    os.close(fd)
    raise _busy(model_dir, _flock_holder(model_dir)) from None
  except OSError as e:
    os.close(fd)
    if e.errno not in _NO_DIRECTORY_LOCKS:
      raise
  return _acquire_file(model_dir)


def _acquire_file(model_dir: str) -> RunLock:
  """The lock file, for file systems that cannot lock a directory (see the module doc)."""
  path = os.path.join(model_dir, LOCK_FILE)
  me = {"host": socket.gethostname(), "pid": os.getpid(), "start": round(time.time(), 3),
        "command": " ".join(sys.argv)[:300]}
  for _ in range(2):
    try:
      fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
      holder = _read(path)
      if holder.get("host") == me["host"] and not _alive(holder.get("pid")):
        os.remove(path)  # Its run is gone: stale.
        continue
      started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("start", 0)))
      raise _busy(model_dir, f"the run of pid {holder.get('pid')} on {holder.get('host')}, "
                             f"started {started} (its lock file {path}; remove it only if "
                             "that run is gone)") from None
    with os.fdopen(fd, "w") as f:
      json.dump(me, f)
    return RunLock(model_dir, file=path)
  raise _busy(model_dir, "another run, which took the lock just now")


def _read(path: str) -> Dict:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


def _alive(pid) -> bool:
  try:
    os.kill(int(pid), 0)
  except (TypeError, ValueError, ProcessLookupError):
    return False
  except PermissionError:
    return True
  return True


def held_by_launcher(model_dir: str, environ: Optional[Mapping[str, str]] = None) -> bool:
  """Whether this process is a task of a launcher that holds model_dir's lock for it."""
  environ = os.environ if environ is None else environ
  return environ.get(HELD_FOR_ENV) == os.path.abspath(model_dir)
