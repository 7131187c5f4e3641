"""Start-up: a training task waits for its peers before TensorFlow's own start-up does.

Pods of one job start minutes apart (scheduling, image pulls, data
preparation). TensorFlow 2.15 waits for its peers inside its start-up, holding
the GIL, so nothing in the process can stop it cleanly or say whom it waits for.
So each training task first waits here, in Python: it listens on its own port,
answering each connection with its TF_CONFIG cluster, and asks every other
training task, every half second, for theirs. A peer that answers with another
cluster is a usage error, named at once. A peer that has gone on answers from
TensorFlow's own server, which took its port over: it counts as started, so
none waits for one that already left. No TensorFlow import here.
"""

import json
import socket
import threading
import time
from typing import List, Optional, Sequence, Tuple

from absl import logging

from launch import cluster

POLL_SECONDS = 0.5
SAY_EVERY_SECONDS = 30.0
# A task that finds another cluster keeps answering this long before it exits,
# so the peer, asking every POLL_SECONDS, learns of the mismatch too.
LINGER_SECONDS = 4 * POLL_SECONDS
_HELLO = b"mnist-rendezvous "


class StartupTimeout(Exception):
  """Some peers never listened within --startup_timeout; the message names them."""


class ClusterMismatchError(ValueError):
  """The tasks of one cluster were started with different TF_CONFIG clusters."""


def mismatch(peer: str, theirs: str, task: cluster.Task) -> ClusterMismatchError:
  """The error for a peer started with cluster `theirs` (JSON), naming both clusters."""
  return ClusterMismatchError(
      f"Task {peer} was started with TF_CONFIG cluster {theirs}, but this task ({task.name}) "
      f"with {cluster_json(task)}: start every task with the same cluster (and the same "
      "--workers).")


def cluster_json(task: cluster.Task) -> str:
  """The task's cluster, as every task of one cluster writes it alike."""
  return json.dumps(task.cluster, sort_keys=True)


def _peers(task: cluster.Task) -> List[Tuple[str, str]]:
  """(name, "host:port") of every other task that serves: the training tasks, and the
  parameter servers if there are any. On parameter servers a worker that is not the chief
  waits for them alone: its session speaks to them and itself only (the Estimator's device
  filters), and the chief may be gone already, when a worker restarted late finds the run
  finished."""
  jobs = task.servers
  if task.num_ps and not task.is_chief:
    jobs = {cluster.PS: jobs[cluster.PS]}
  return [(f"{job}:{index}", address)
          for job, addresses in jobs.items()
          for index, address in enumerate(addresses)
          if (job, index) != (task.type, task.index)]


def _ask(address: str) -> Optional[str]:
  """The cluster a peer waiting here answers with; "" for a listener that is not
  one (TensorFlow's server: the peer went on); None if nothing listens."""
  host, _, port = address.rpartition(":")
  try:
    s = socket.create_connection((host, int(port)), timeout=POLL_SECONDS)
  except OSError:  # Refused, unreachable, or no answer in time: not started.
    return None
  answer = b""
  with s:
    s.settimeout(2 * POLL_SECONDS)
    try:
      while not answer.endswith(b"\n") and len(answer) < 1 << 16:
        chunk = s.recv(4096)
        if not chunk:
          break
        answer += chunk
    except OSError:
      pass  # Listening, but saying no cluster: not a task waiting here.
  return answer[len(_HELLO):].decode().strip() if answer.startswith(_HELLO) else ""


def _answer(listener: socket.socket, hello: bytes, stop: threading.Event) -> None:
  """Tells every peer that connects this task's cluster, until `stop`."""
  listener.settimeout(POLL_SECONDS / 5)
  while not stop.is_set():
    try:
      conn, _ = listener.accept()
    except socket.timeout:
      continue
    except OSError:
      return
    with conn:
      try:
        conn.sendall(hello)
      except OSError:
        pass  # The peer gave up first; it asks again.


def _names(peers: Sequence[Tuple[str, str]]) -> str:
  return ", ".join(f"{name} ({address})" for name, address in peers)


def wait_for_peers(task: cluster.Task, timeout: float) -> None:
  """Returns once every other training task of `task`'s cluster has started.

  Listens on this task's own port meanwhile (every interface, as TensorFlow's
  server will), and logs whom it still waits for every SAY_EVERY_SECONDS.

  Args:
    task: this training task (not the evaluator, which joins no collective).
    timeout: seconds to wait: --startup_timeout.

  Raises:
    ClusterMismatchError: a peer was started with another cluster.
    StartupTimeout: naming the peers that never listened, and the fix.
  """
  waiting = _peers(task)
  if not waiting or task.address is None:
    return
  mine = cluster_json(task)
  stop = threading.Event()
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
    # Like gRPC: a port whose old connections linger in TIME_WAIT is free.
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("", int(task.address.rpartition(":")[2])))
    listener.listen(64)
    answering = threading.Thread(target=_answer, args=(listener, _HELLO + mine.encode() + b"\n",
                                                       stop), daemon=True)
    answering.start()
    try:
      _wait(task, waiting, mine, timeout)
    except ClusterMismatchError:
      time.sleep(LINGER_SECONDS)
      raise
    finally:
      stop.set()
      answering.join()


def _wait(task: cluster.Task, waiting: List[Tuple[str, str]], mine: str,
          timeout: float) -> None:
  """Asks the peers in `waiting` until all have answered (wait_for_peers)."""
  start = said = time.monotonic()
  while True:
    still = []
    for name, address in waiting:
      theirs = _ask(address)
      if theirs is None:
        still.append((name, address))
      elif theirs and theirs != mine:
        raise mismatch(name, theirs, task)
    waiting = still
    if not waiting:
      return
    waited = time.monotonic() - start
    if time.monotonic() - said >= SAY_EVERY_SECONDS:  # Said even if time is up now.
      logging.info("Waiting for %s to start: %.0f s of --startup_timeout=%.0f.",
                   _names(waiting), waited, timeout)
      said = time.monotonic()
    if waited >= timeout:
      raise StartupTimeout(
          f"the cluster did not come up within {timeout:.0f} s (--startup_timeout): no task "
          f"listens at {_names(waiting)}. Start every task with the same TF_CONFIG cluster "
          "(python -m launch.local does), or give a longer --startup_timeout.")
    time.sleep(POLL_SECONDS)
