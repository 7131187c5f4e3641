"""Runs a local cluster: one process per task, each with its own TF_CONFIG.

It runs any TF_CONFIG-aware command. The chief's output is streamed live and,
like every task's, written to `<log_dir>/<type>-<index>.log`. When a task
fails, or the run exceeds its timeout, every other task is stopped, so no
process outlives the launcher.
"""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, List, Mapping, Optional, Sequence

from absl import logging

from launch import cluster

GRACE_SECONDS = 10.0
EXIT_TIMEOUT = 124  # As coreutils' timeout(1).


class LaunchError(RuntimeError):
  """The cluster could not be run to completion; the message says why."""


@dataclasses.dataclass
class _Proc:
  name: str
  popen: subprocess.Popen
  log_path: str
  pumps: List[threading.Thread]


def _pump(src: IO[bytes], sinks: Sequence[IO[bytes]]) -> None:
  for line in iter(src.readline, b""):
    for sink in sinks:
      sink.write(line)
      sink.flush()
  src.close()


def _close_when_done(threads: Sequence[threading.Thread], log: IO[bytes]) -> None:
  for t in threads:
    t.join()
  log.close()


def _start(name: str, cmd: Sequence[str], env: Mapping[str, str], log_path: str,
           stream: bool) -> _Proc:
  log = open(log_path, "wb")  # pylint: disable=consider-using-with
  # A session of its own, so stopping the task stops whatever it started.
  if not stream:
    popen = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    return _Proc(name, popen, log_path, [])
  popen = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           stdin=subprocess.DEVNULL, start_new_session=True)
  pumps = [
      threading.Thread(target=_pump, args=(popen.stdout, [sys.stdout.buffer, log]), daemon=True),
      threading.Thread(target=_pump, args=(popen.stderr, [sys.stderr.buffer, log]), daemon=True),
  ]
  for t in pumps:
    t.start()
  # Both pumps write to the log: it is closed once both have reached EOF.
  closer = threading.Thread(target=_close_when_done, args=(pumps, log), daemon=True)
  closer.start()
  return _Proc(name, popen, log_path, [*pumps, closer])


def _describe(returncode: int) -> str:
  if returncode < 0:
    return f"was killed by {signal.Signals(-returncode).name}"
  return f"exited with code {returncode}"


def _stop_all(procs: Sequence[_Proc], grace: float) -> None:
  """SIGTERM to every live task's process group, then SIGKILL after `grace` s."""
  live = [p for p in procs if p.popen.poll() is None]
  for p in live:
    try:
      os.killpg(p.popen.pid, signal.SIGTERM)
    except ProcessLookupError:
      pass
  deadline = time.monotonic() + grace
  for p in live:
    try:
      p.popen.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      logging.warning("%s did not stop within %.0f s of SIGTERM; sending SIGKILL.", p.name, grace)
  for p in procs:
    try:
      os.killpg(p.popen.pid, signal.SIGKILL)  # Also reaps children of exited tasks.
    except (ProcessLookupError, PermissionError):
      pass
    p.popen.wait()


def run_local_cluster(
    cmd: Sequence[str],
    num_workers: int,
    log_dir: str,
    *,
    evaluator: bool = False,
    timeout: Optional[float] = None,
    env: Optional[Mapping[str, str]] = None,
    grace: float = GRACE_SECONDS,
) -> int:
  """Runs `cmd` once per task of a localhost cluster and supervises the tasks.

  Args:
    cmd: the command every task runs; each gets its own TF_CONFIG.
    num_workers: training workers; worker 0 is the chief.
    log_dir: where `<type>-<index>.log` files go; created if missing.
    evaluator: also start an "evaluator" task (Estimator's sidecar).
    timeout: seconds before the whole run is stopped; None waits forever.
    env: base environment; defaults to os.environ.
    grace: seconds between SIGTERM and SIGKILL when stopping tasks.

  Returns:
    0 when every task exits 0. Otherwise the exit code of the first task that
    failed (128 + signal number if it was killed), or 124 on timeout.
  """
  if num_workers < 1:
    raise ValueError(f"num_workers must be >= 1, got {num_workers}.")
  os.makedirs(log_dir, exist_ok=True)
  base_env = dict(os.environ if env is None else env)
  tf_configs = cluster.make_tf_configs(cluster.pick_free_ports(num_workers), evaluator)
  procs: List[_Proc] = []
  deadline = None if timeout is None else time.monotonic() + timeout
  previous_handler = None
  if threading.current_thread() is threading.main_thread():
    # Turn SIGTERM into an exception so the finally clause stops the tasks.
    previous_handler = signal.signal(signal.SIGTERM, _raise_interrupt)
  try:
    for tf_config in tf_configs:
      task = tf_config["task"]
      name = f"{task['type']}-{task['index']}"
      task_env = dict(base_env, TF_CONFIG=json.dumps(tf_config))
      procs.append(_start(name, cmd, task_env, os.path.join(log_dir, name + ".log"),
                          stream=not procs))
    logging.info("Started %s; logs in %s", ", ".join(p.name for p in procs), log_dir)
    while True:
      failed = [p for p in procs if p.popen.poll() not in (None, 0)]
      if failed:
        p = failed[0]
        logging.error("%s %s; stopping the other tasks. Its log: %s", p.name,
                      _describe(p.popen.returncode), p.log_path)
        rc = p.popen.returncode
        return 128 - rc if rc < 0 else rc
      if all(p.popen.poll() == 0 for p in procs):
        return 0
      if deadline is not None and time.monotonic() > deadline:
        running = [p.name for p in procs if p.popen.poll() is None]
        logging.error("Timed out after %.0f s; still running: %s. Stopping them.", timeout,
                      ", ".join(running))
        return EXIT_TIMEOUT
      time.sleep(0.2)
  finally:
    _stop_all(procs, grace)
    for p in procs:
      for t in p.pumps:
        t.join()
    if previous_handler is not None:
      signal.signal(signal.SIGTERM, previous_handler)


def _raise_interrupt(signum, frame):
  del frame
  raise KeyboardInterrupt(f"received {signal.Signals(signum).name}")
