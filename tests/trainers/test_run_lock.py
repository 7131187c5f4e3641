"""trainers.run_lock: one run per model_dir, released when its process dies."""

import errno
import fcntl
import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO
from trainers import run_lock


def test_a_second_run_is_refused_naming_the_first_and_nothing_is_written(tmp_path):
  holder = subprocess.Popen(
      [sys.executable, "-c", textwrap.dedent(f"""
          import sys, time
          from trainers import run_lock
          run_lock.acquire({str(tmp_path)!r})
          print("held", flush=True)
          time.sleep(600)""")],
      cwd=REPO, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(run_lock.ModelDirBusy,
                       match=f"the run of pid {holder.pid} .*time.sleep.*Nothing was changed"):
      run_lock.acquire(str(tmp_path))
  finally:
    holder.kill()  # Its lock ends with it: no stale lock.
    holder.wait()
  run_lock.acquire(str(tmp_path)).release()
  assert os.listdir(tmp_path) == []


def test_where_a_directory_cannot_be_locked_a_lock_file_names_the_run(tmp_path, monkeypatch):
  def no_directory_locks(fd, operation):
    raise OSError(errno.ENOLCK, "No locks available")

  monkeypatch.setattr(fcntl, "flock", no_directory_locks)
  lock = run_lock.acquire(str(tmp_path))
  with pytest.raises(run_lock.ModelDirBusy, match=f"pid {os.getpid()} on "):
    run_lock.acquire(str(tmp_path))
  lock.release()
  assert os.listdir(tmp_path) == []
  # A lock file left by a process of this host that is gone is stale: taken over.
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  (tmp_path / run_lock.LOCK_FILE).write_text(json.dumps(
      {"host": socket.gethostname(), "pid": int(dead.stdout), "start": 0}))
  run_lock.acquire(str(tmp_path)).release()
  # Another host's stands, with the rule to remove it.
  (tmp_path / run_lock.LOCK_FILE).write_text(json.dumps({"host": "elsewhere", "pid": 1}))
  with pytest.raises(run_lock.ModelDirBusy, match="on elsewhere.*remove it only if"):
    run_lock.acquire(str(tmp_path))


def test_a_launchers_tasks_know_it_holds_the_lock(tmp_path):
  environ = {run_lock.HELD_FOR_ENV: os.path.abspath(tmp_path)}
  assert run_lock.held_by_launcher(str(tmp_path), environ)
  assert not run_lock.held_by_launcher(str(tmp_path / "other"), environ)
  assert not run_lock.held_by_launcher(str(tmp_path), {})
