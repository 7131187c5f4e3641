"""Save on preemption: SIGTERM to any training task stops every training task at one step,
which is saved, and each task exits with exit_codes.PREEMPTED (143), which orchestrators
retry; the run then resumes from that step, with no step trained twice.

Kubernetes (a pod deleted, a node drained), spot VMs and Ray all stop a task the same way:
SIGTERM, a grace period, then SIGKILL. Per process:

  install(grace_seconds)        once, in the main thread, first thing (distribute.setup_process)
  agreement = Agreement(store, me, peers)   per training loop (trainers.loop)
  with training(agreement):     around the loop, which asks after every step (or
    ...                         execution): `if agreement.pending and agreement.reached(step)`,
                                and on True ends as it ends at its last step, saving there
  agreement.stopped_at          the step it stopped at (None: not stopped)

A signal outside a training loop (start-up, the evaluator task, the chief's evaluation and
export after training) raises `Preempted` at once: nothing unsaved is lost there. Every task
exits within `grace_seconds` of its first signal, saved or not; a second signal exits at
once. SIGINT (Ctrl-C) does the same, ending with exit_codes.INTERRUPTED (130). Handlers set
from Python run even when the process is PID 1 in a container, where the kernel drops a
signal left at its default.

How the cluster agrees, over the coordination service's key-value store (the protocol of
TensorFlow's PreemptionCheckpointHandler, which this project cannot use: MIGRATION.md,
"Preemption"): the signalled task claims the preemption (the first claim wins), publishes
the step it has just finished, S, and waits until every other training task has
acknowledged S before it trains on. Every task stops at its first step after S. In
synchronous training no task can finish the step after S without the claimer, so each has
seen S before it gets there, and all stop after the same step. Between signals the loop
pays one attribute read per step; the tasks exchange nothing.

TensorFlow-free: the store is given (distribute.preemption_agreement makes the agreement
with the coordination service's), so a launcher and tests import this without TensorFlow.
"""

import contextlib
import os
import signal
import sys
import threading
from typing import Iterator, Optional, Protocol, Sequence

from absl import logging

from launch import exit_codes

SIGNALS = (signal.SIGTERM, signal.SIGINT)
DEFAULT_GRACE_SECONDS = 25.0  # Below Kubernetes's default terminationGracePeriodSeconds, 30.
PREFIX = "preemption/"  # The keys of a preemption's agreement; another stop's have another.
CLAIM_KEY = PREFIX + "claimed_by"
STEP_KEY = PREFIX + "stop_after_step"
ACK_KEY = PREFIX + "acknowledged_by/"  # + the task's name.
WATCH_SECONDS = 1.0  # How long each wait of a task's watcher for STEP_KEY lasts.


class Preempted(BaseException):
  """This task was stopped by a signal (or its cluster's preemption), after saving.

  A BaseException, as KeyboardInterrupt: no `except Exception` on the way out catches it.

  Attributes:
    signum: the signal, this task's or (stopped with its cluster) SIGTERM.
    step: the step training stopped at, where it resumes; None outside training.
    by_peer: the signal went to another training task, not to this one.
  """

  def __init__(self, signum: int, step: Optional[int] = None, by_peer: bool = False):
    super().__init__(signal.Signals(signum).name, step)
    self.signum, self.step, self.by_peer = signum, step, by_peer

  @property
  def name(self) -> str:
    return signal.Signals(self.signum).name

  @property
  def exit_code(self) -> int:
    return exit_codes.INTERRUPTED if self.signum == signal.SIGINT else exit_codes.PREEMPTED


class KeyValueStore(Protocol):
  """The cluster's key-value store (distribute.preemption_agreement gives the coordination
  service's): each key is set once."""

  def put(self, key: str, value: str) -> bool:
    """Sets `key`; False if it was set already."""

  def get(self, key: str, timeout_seconds: float) -> Optional[str]:
    """The value of `key`, waiting up to `timeout_seconds` for it to be set; None if not."""


class _State:
  """What this process's handlers share: set by install(), changed only under `lock`."""

  def __init__(self):
    # Reentrant: the main thread's handler may run while that thread holds it.
    self.lock = threading.RLock()
    self.grace_seconds = DEFAULT_GRACE_SECONDS
    self.first: Optional[int] = None  # The first signal received.
    self.count = 0
    self.training: Optional["Agreement"] = None
    self.installed = False
    self.said = threading.Event()  # The watcher has said what the first signal does.


_STATE = _State()


def install(grace_seconds: float = DEFAULT_GRACE_SECONDS) -> None:
  """Handles SIGTERM and SIGINT in this process as the module docstring says.

  Call from the main thread, before anything long (imports aside). A thread woken by
  the signal itself (`signal.set_wakeup_fd`) times the grace period and acts on a
  second signal, even while the main thread waits in TensorFlow for a step or a peer.
  """
  _STATE.grace_seconds = grace_seconds
  if not _STATE.installed:
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    threading.Thread(target=_watch_signals, args=(read_end,), name="signal-watch",
                     daemon=True).start()
    _STATE.installed = True
  reinstall()


def reinstall() -> None:
  """Takes SIGTERM and SIGINT back from whatever set them since install() (the coordination
  service's agent, started with a strategy, sets its own SIGTERM handler, which only logs)."""
  if _STATE.installed:
    for signum in SIGNALS:
      signal.signal(signum, _on_signal)


def _on_signal(signum: int, frame) -> None:
  """The main thread's part: outside training, stop here; in training, tell the loop."""
  del frame
  with _STATE.lock:
    training = _STATE.training
    # Here too: the watcher may read the signal after the loop has stopped for it.
    first = _STATE.first = _STATE.first or signum
  if training is None:
    _wait_until_said()
    raise Preempted(first)
  training.notice()


def _watch_signals(read_end: int) -> None:
  """The grace period and the second signal, acted on as each signal arrives."""
  while True:
    for signum in os.read(read_end, 64):
      if signum not in SIGNALS:
        continue
      with _STATE.lock:
        _STATE.count += 1
        _STATE.first = _STATE.first or signum
        first, count, grace = _STATE.first, _STATE.count, _STATE.grace_seconds
      name = signal.Signals(signum).name
      if count == 1:
        logging.warning("Received %s: stopping at a step every training task agrees on, "
                        "which is saved; exiting within %.0f s (--grace_seconds). A second "
                        "%s stops at once.", name, grace, name)
        threading.Timer(grace, _exit_now, args=(first, f"--grace_seconds={grace:g} ran out "
                                                "before the step was saved")).start()
        _STATE.said.set()
      else:
        _exit_now(first, f"a second {name}")


def _wait_until_said(timeout: float = 1.0) -> None:
  """Before a signal ends the process: the watcher thread (a daemon, killed at exit) has said
  what it does, or the log would lack it when the loop stops first (seen in CI)."""
  if _STATE.first is not None:
    _STATE.said.wait(timeout)


def _exit_now(signum: int, why: str) -> None:
  """Ends the process at once, from any thread: what was saved is what the run resumes from."""
  code = Preempted(signum).exit_code
  print(f"error: {why}: stopping at once with exit code {code}; the run resumes from its last "
        "save.", file=sys.stderr, flush=True)
  os._exit(code)


class Agreement:
  """One training loop's agreement with its peers on the step to stop after.

  Args:
    store: the cluster's key-value store; None for a lone process.
    me: this task's name, e.g. "worker:1".
    peers: the other training tasks' names.
    prefix: its keys' in the store: a preemption's, or another stop's (trainers.early_stopping).
    alone_at_once: a lone process stops at the step it claims (a signal's), not after the
      next (a decided stop's, as the cluster's).
  """

  def __init__(self, store: Optional[KeyValueStore], me: str, peers: Sequence[str],
               prefix: str = PREFIX, alone_at_once: bool = True):
    self._store, self._me, self._peers = store, me, list(peers) if store else []
    self._keys = (prefix + "claimed_by", prefix + "stop_after_step", prefix + "acknowledged_by/")
    self._alone_at_once = alone_at_once
    self._signalled = threading.Event()
    self._claimed = False  # This task tried to claim (and won, or another had).
    self._stop_after: Optional[int] = None
    self._done = threading.Event()
    self.stopped_at: Optional[int] = None
    self.pending = False  # Whether reached() has anything to decide: read every step.
    self._watcher = None
    if self._peers:
      self._watcher = threading.Thread(target=self._watch, name="preemption-watch", daemon=True)
      self._watcher.start()

  def notice(self) -> None:
    """This task received a signal (called by the handler)."""
    self._signalled.set()
    self.pending = True

  def request(self, step: int) -> None:
    """This task decided, not signalled, that training stops: every training task stops at
    its first step after `step` (the step that just ended here)."""
    if self._stop_after is None and not self._claimed:
      self._claim(step)
    self.pending = True

  def reached(self, step: int) -> bool:
    """Called after each step (or execution) with the global step: True once training must
    stop here, at the step the cluster agreed on."""
    if self._stop_after is None and self._signalled.is_set() and not self._claimed:
      self._claim(step)
    at_once = not self._peers and self._alone_at_once
    if self._stop_after is not None and (step > self._stop_after or at_once):
      self.stopped_at = step
      return True
    return False

  def _claim(self, step: int) -> None:
    self._claimed = True
    if not self._peers:
      self._stop_after = step
      return
    claim_key, step_key, ack_key = self._keys
    if not self._store.put(claim_key, self._me):
      return  # Another task claimed first: its step comes to the watcher.
    self._store.put(step_key, str(step))
    self._stop_after = step
    # Bounded by the grace period's timer for a signal; by the lost-peer watch otherwise.
    for peer in self._peers:
      while self._store.get(ack_key + peer, WATCH_SECONDS) is None:
        pass
    logging.info("Every training task stops at its first step after step %d.", step)

  def _watch(self) -> None:
    """Waits for the claimer's step, takes it and acknowledges it."""
    while not self._done.is_set():
      try:
        value = self._store.get(self._keys[1], WATCH_SECONDS)
      except Exception as e:  # A lost coordination service: the loop fails on its own.
        logging.info("Stopped watching for a preemption: %s", e)
        return
      if value is not None:
        self._stop_after = int(value)
        self.pending = True
        self._store.put(self._keys[2] + self._me, "1")
        return

  def close(self) -> None:
    self._done.set()
    if self._watcher is not None:
      self._watcher.join()


@contextlib.contextmanager
def training(agreement: Agreement) -> Iterator[Agreement]:
  """While in the block, a signal tells `agreement` (the loop stops at the agreed step)
  instead of raising Preempted; after it, a signal received raises Preempted."""
  with _STATE.lock:
    _STATE.training = agreement
  try:
    yield agreement
  finally:
    with _STATE.lock:
      _STATE.training = None
    agreement.close()


def stopped(agreement: Agreement, step: int) -> None:
  """After a training loop: raises Preempted at `step` if the loop stopped for a preemption,
  or this task received a signal meanwhile (its loop had ended before the agreed step)."""
  if agreement.stopped_at is not None or _STATE.first is not None:
    _wait_until_said()
    raise Preempted(_STATE.first or signal.SIGTERM, step, by_peer=_STATE.first is None)
