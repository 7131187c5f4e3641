"""Runs a local cluster: one process per task, each with its own TF_CONFIG.

It runs any TF_CONFIG-aware command. The chief's output is streamed live and,
like every task's, appended to `<log_dir>/<type>-<index>.log`; a task whose
log cannot be written (a full disk) has its lines shown instead. Synchronous
training fails as a whole when one task dies, so when a training task fails
every training task is stopped and, up to `max_restarts` times, all are
started again with the same TF_CONFIGs (launch.restarts decides): the
trainers resume from their last backup. A preempted task (exit_codes.PREEMPTED:
its cluster saved the step it stopped at) is restarted the same way, without
counting against `max_restarts`.
The evaluator is outside the collective: it keeps running meanwhile,
and when it fails it is restarted alone. SIGTERM or SIGINT to the launcher
drains the cluster: every task gets SIGTERM and the time to save (`grace`),
and the launcher exits 128 + the signal's number; a second signal is passed on
to the tasks, which then stop at once. A run that passes
its timeout, or in which no task writes output for `stall_timeout` seconds,
is stopped after each task is asked for a stack dump (SIGUSR1). No process
outlives the launcher: on every way out it stops the tasks, and on Linux each
task also gets SIGKILL if the launcher itself is killed (PR_SET_PDEATHSIG).
The tasks share a network namespace with only loopback (launch.netns): no
other host can reach their unauthenticated TensorFlow servers. Given the modules
every task imports (`preload`), the tasks are forked from one process that
imported them (launch.zygote) instead of each importing them again.
"""

import ctypes
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Callable, List, Mapping, Optional, Sequence, Tuple, Union

from absl import logging

from launch import cluster
from launch import console
from launch import exit_codes
from launch import netns
from launch import restarts
from launch import zygote as zygote_lib

GRACE_SECONDS = 10.0
# What a trainer's launcher gives its tasks beyond their --grace_seconds, before SIGKILL.
GRACE_MARGIN_SECONDS = 5.0
DUMP_WAIT_SECONDS = 3.0
# After a task fails, how long to let its peers fail too, so the failure that
# decides (a task's own, not a peer's lost collective) is the one reported.
SETTLE_SECONDS = 1.0
EVALUATOR_NICENESS = 10  # os.nice increment of a local evaluator task, and its session's.
PR_SET_PDEATHSIG = 1  # From <sys/prctl.h>.
LOG_SUBDIR = "logs"  # A trainer's local cluster keeps its task logs in model_dir/logs.


class _TaskLog:
  """A task's log file, written by the pumps of its stdout and stderr.

  The log is best effort: once a write fails (its filesystem is full, as
  model_dir's can be) it is given up and the task's lines go to the terminal
  instead, so that its last words, the error line naming the fault, reach
  the user. The pumps also time the task's output, for the stall check.
  """

  def __init__(self, path: str, header: bytes):
    self.path = path
    self.received = 0  # Bytes of output, logged or not.
    self.last_output = time.monotonic()
    self.failed: Optional[OSError] = None
    self.last_error: Optional[str] = None  # The last "error: ..." line the task wrote.
    self._lock = threading.Lock()
    self._file = open(path, "ab")  # noqa: SIM115 -- open for the task's life; close() closes it.
    self.write(header)

  def write(self, line: bytes) -> bool:
    """Appends `line`; False once the log cannot be written (said once, on stderr)."""
    with self._lock:
      self.received += len(line)
      self.last_output = time.monotonic()
      if line.startswith(b"error: "):
        self.last_error = line.decode(errors="replace").rstrip()
      if self.failed is None:
        try:
          self._file.write(line)
          self._file.flush()
        except OSError as e:
          self.failed = e
          sys.stderr.buffer.write(f"warning: cannot write {self.path} ({e}); its lines go to "
                                  "this terminal only.\n".encode())
          sys.stderr.buffer.flush()
      return self.failed is None

  def close(self) -> None:
    try:
      self._file.close()
    except OSError:
      pass  # A full disk: write() has said so.


_Process = Union[subprocess.Popen, zygote_lib.Task]  # A task: a process of its own, or forked.


@dataclasses.dataclass
class _Proc:
  name: str
  popen: _Process
  log: _TaskLog
  pumps: List[threading.Thread]
  # It only serves the others (a ps task; on parameter servers, a worker that a
  # coordinating chief steps): it is stopped once they have ended.
  serves: bool = False

  @property
  def log_path(self) -> str:
    return self.log.path

  def poll_output(self) -> float:
    """Seconds since this task last wrote output."""
    return time.monotonic() - self.log.last_output


def _pump(src: IO[bytes], log: _TaskLog, terminal: IO[bytes], show: Callable[[bytes], bool],
          streamed: bool, prefix: bytes) -> None:
  """Copies every line to the log, and those `show` lets through to the terminal:
  all along if the task is `streamed` (the chief), else once its log fails."""
  for line in iter(src.readline, b""):
    if not log.write(line) or streamed:
      try:
        shown = show(line)
      except Exception:
        shown = True  # A filter's bug must not stop the pipe (the task would block on it).
      if shown:
        terminal.write(line if streamed else prefix + line)
        terminal.flush()
  src.close()


def _close_when_done(threads: Sequence[threading.Thread], log: _TaskLog) -> None:
  for t in threads:
    t.join()
  log.close()


def _task_preexec(niceness: int, network: Optional[netns.PrivateNetwork] = None
                  ) -> Callable[[], None]:
  """A preexec_fn: the task joins `network`, gets SIGKILL when the launcher dies
  (Linux), and runs at `niceness` (its session too).

  Whatever ends the launcher (SIGKILL from an out-of-memory killer, a closed
  terminal), its tasks must not train on unsupervised, holding ports and
  cores: prctl(PR_SET_PDEATHSIG). It fires when the thread that started the
  task exits; run_local_cluster starts and waits for its tasks in one thread.
  """
  libc = (ctypes.CDLL(None, use_errno=True)  # Loaded here, not in the forked child.
          if sys.platform.startswith("linux") else None)
  launcher = os.getpid()

  def preexec() -> None:
    if network is not None:
      network.join()
    if niceness:
      zygote_lib.set_niceness(niceness)
    if libc is not None:
      libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
      if os.getppid() != launcher:  # The launcher died before prctl took effect.
        os._exit(128 + signal.SIGKILL)

  return preexec


def _popen(cmd: Sequence[str], env: Mapping[str, str], niceness: int,
           network: Optional[netns.PrivateNetwork]) -> subprocess.Popen:
  # A session of its own, so stopping the task stops whatever it started; and
  # the task dies with the launcher.
  return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          stdin=subprocess.DEVNULL, start_new_session=True,
                          preexec_fn=_task_preexec(niceness, network))


def _start(name: str, popen: _Process, log_path: str, stream: bool, header: bytes,
           verbose: bool) -> _Proc:
  """Supervises the task `popen` started: its output to its log and the terminal."""
  log = _TaskLog(log_path, header)
  # The terminal gets the run's own lines; the log keeps everything.
  prefix = f"[{name}] ".encode()
  pumps = [
      threading.Thread(target=_pump, args=(popen.stdout, log, sys.stdout.buffer, lambda _: True,
                                           stream, prefix), daemon=True),
      threading.Thread(target=_pump, args=(popen.stderr, log, sys.stderr.buffer,
                                           console.LineFilter(verbose), stream, prefix),
                       daemon=True),
  ]
  for t in pumps:
    t.start()
  # Both pumps write to the log: it is closed once both have reached EOF.
  closer = threading.Thread(target=_close_when_done, args=(pumps, log), daemon=True)
  closer.start()
  return _Proc(name, popen, log, [*pumps, closer])


def _signal_all(procs: Sequence[_Proc], signum: int) -> None:
  """`signum` to every live task's process group."""
  for p in procs:
    if p.popen.poll() is None:
      try:
        os.killpg(p.popen.pid, signum)
        os.killpg(p.popen.pid, signal.SIGCONT)  # A stopped task acts on a signal only once resumed.
      except ProcessLookupError:
        pass


def _stop_all(procs: Sequence[_Proc], grace: float,
              signum: Optional[int] = signal.SIGTERM) -> None:
  """`signum` to every live task's process group (None: they are stopping on their own),
  then SIGKILL to those still running after `grace` s.

  SIGTERM asks a trainer to save the step its cluster agrees on (a drain); after a
  failure there is nothing its peers could agree on, and SIGKILL stops them at once.
  """
  live = [p for p in procs if p.popen.poll() is None]
  if signum is not None:
    _signal_all(live, signum)
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
  for p in procs:
    for t in p.pumps:
      t.join()


def _stop_in_order(procs: Sequence[_Proc], grace: float,
                   signum: Optional[int] = signal.SIGTERM) -> None:
  """_stop_all, the servers after the others: a chief's last save reads the variables the
  parameter servers hold."""
  for servers in (False, True):
    _stop_all([p for p in procs if p.serves == servers], grace, signum)


def _dump_stacks(procs: Sequence[_Proc]) -> List[str]:
  """Asks every live task for a stack dump; returns the names of those that gave none.

  The trainers print every thread's Python stack to their log on SIGUSR1
  (faulthandler); a task that is stopped, or stuck outside Python's reach,
  writes nothing.
  """
  live = [p for p in procs if p.popen.poll() is None]
  sizes = {}
  for p in live:
    sizes[p.name] = p.log.received
    try:
      os.kill(p.popen.pid, signal.SIGUSR1)
    except ProcessLookupError:
      pass
  time.sleep(DUMP_WAIT_SECONDS)
  return [p.name for p in live if p.log.received == sizes[p.name]]


def _hang_report(procs: Sequence[_Proc], log_dir: str) -> str:
  """Names the hung task: one that gave no stack dump, else the one silent longest."""
  silence = {p.name: p.poll_output() for p in procs if p.popen.poll() is None}
  if not silence:
    return "no task is still running."
  mute = _dump_stacks(procs)
  hung = mute or [max(silence, key=silence.get)]
  details = ", ".join(
      f"{name} (silent {silence[name]:.0f} s"
      f"{', no stack dump: stopped or stuck outside Python' if name in mute else ''})"
      for name in hung)
  others = sorted(set(silence) - set(hung))
  also = f"; also still running: {', '.join(others)}" if others else ""
  return f"hung: {details}{also}. Stack dumps are in the task logs in {log_dir}."


def _cause_rank(returncode: int) -> int:
  """Which of the tasks that failed together ended the run: the lowest rank. A failure
  that would recur (a usage error, a divergence, a full disk) decides; then a task
  killed by a signal, the usual first cause, over its peers' errors that followed;
  then any other error; then a preemption, which its peers share; a task's loss of a
  peer (PEER_LOST) last."""
  if returncode in exit_codes.NOT_RETRIED:
    return 0
  if returncode < 0:
    return 1
  return {exit_codes.PREEMPTED: 3, exit_codes.PEER_LOST: 4}.get(returncode, 2)


def _is(p: _Proc, task_type: str) -> bool:
  return p.name.startswith(task_type + "-")


def _ended(p: _Proc) -> bool:
  """Whether `p` failed: it exited other than 0, or, a server, exited at all (it serves
  until the launcher stops it)."""
  code = p.popen.poll()
  return code is not None and (code != 0 or p.serves)


def _watch(procs: Sequence[_Proc], deadline: Optional[float],
           stall_timeout: Optional[float]) -> Tuple[str, Optional[_Proc]]:
  """Waits until every task but the servers succeeds ("ok"), one fails ("failed"), or time
  runs out."""
  while True:
    failed = [p for p in procs if _ended(p)]
    if failed:
      time.sleep(SETTLE_SECONDS)
      failed = [p for p in procs if _ended(p)]
      return "failed", min(failed, key=lambda p: _cause_rank(p.popen.returncode))
    if all(p.popen.poll() == 0 for p in procs if not p.serves):
      return "ok", None
    if deadline is not None and time.monotonic() > deadline:
      return "timeout", None
    # The evaluator's output does not count: it logs while it waits for checkpoints; nor
    # do the servers', which serve in silence.
    training = [p for p in procs if not (_is(p, cluster.EVALUATOR) or p.serves)]
    if stall_timeout is not None and min(p.poll_output() for p in training) > stall_timeout:
      return "stalled", None
    time.sleep(0.2)


def run_local_cluster(
    cmd: Sequence[str],
    num_workers: int,
    log_dir: str,
    *,
    evaluator: bool = False,
    timeout: Optional[float] = None,
    stall_timeout: Optional[float] = None,
    max_restarts: int,
    env: Optional[Mapping[str, str]] = None,
    grace: float = GRACE_SECONDS,
    verbose: bool = True,
    ps: int = 0,
    workers_serve: bool = False,
    preload: Sequence[str] = (),
) -> int:
  """Runs `cmd` once per task of a localhost cluster and supervises the tasks.

  Args:
    cmd: the command every task runs; each gets its own TF_CONFIG.
    num_workers: `chief:0` and `worker:0` to `worker:<N-2>` (the training tasks, or with
      `workers_serve` a coordinating chief and its workers).
    log_dir: where `<type>-<index>.log` files and `tasks.json` go; created if missing.
    evaluator: also start an "evaluator" task, outside the training collective.
    timeout: seconds before the whole run, restarts included, is stopped;
      None waits forever.
    stall_timeout: seconds without output from any training task before the
      run is stopped as hung; None never.
    max_restarts: how many times the training tasks are started again after
      one fails, and, counted apart, the evaluator alone after it fails (a
      failure is retried only if its exit code is 128 or above, as
      launch.exit_codes says).
    env: base environment; defaults to os.environ.
    grace: seconds between SIGTERM and SIGKILL when stopping tasks.
    verbose: stream all of the chief's output; False streams only the run's
      own lines, warnings and errors (launch.console). Logs keep everything.
    ps: also start this many parameter servers (`ps:0`...), which serve until the others
      end: then they are stopped. A parameter server that ends is a lost peer (retried);
      it restarts with every training task. With parameter servers a worker trains
      alone, so a failed `worker` task is restarted alone, and a drain or a preemption
      stops every task with SIGTERM (nothing agrees on a step), the servers last.
    workers_serve: with parameter servers, the `worker` tasks serve too, stepped by the
      chief, which coordinates them (Keras's ParameterServerStrategy): they are stopped
      with the parameter servers, and a lost one is restarted alone.
    preload: modules every task imports: imported once, in a process (launch.zygote) each
      task is forked from, when `cmd` is `<this python> -m <module> ...`; each task is
      then spared their imports. Empty: each task is a process of its own.

  Returns:
    0 when every task but the servers exits 0. Otherwise the exit code of the task whose
    failure ended the run (128 + signal number if it was killed), or 124
    on timeout or stall.
  """
  # One screen of supervision, read whole: start, watch, and on each outcome end, or stop
  # and restart. Split, its state (the tasks, two restart counts, the network) would be
  # passed back and forth between the pieces.
  if num_workers < 1:
    raise ValueError(f"num_workers must be >= 1, got {num_workers}.")
  if max_restarts < 0:
    raise ValueError(f"max_restarts must be >= 0, got {max_restarts}.")
  os.makedirs(log_dir, exist_ok=True)
  base_env = dict(os.environ if env is None else env)
  # The same ports on every restart: each task keeps its TF_CONFIG.
  tf_configs = cluster.make_tf_configs(
      cluster.pick_free_ports(num_workers + ps + evaluator), evaluator, ps=ps)
  procs: List[_Proc] = []
  deadline = None if timeout is None else time.monotonic() + timeout
  previous_handlers = {}
  if threading.current_thread() is threading.main_thread():
    # A signal becomes an exception: the launcher drains the cluster, then exits.
    previous_handlers = {signum: signal.signal(signum, _raise_signalled)
                         for signum in (signal.SIGTERM, signal.SIGINT)}

  def start(index: int, header: bytes) -> _Proc:
    task = tf_configs[index]["task"]
    name = f"{task['type']}-{task['index']}"
    task_env = dict(base_env, TF_CONFIG=json.dumps(tf_configs[index]))
    # The evaluator shares the machine's cores with the training tasks, which
    # wait on each other every step: it gets what they leave.
    niceness = EVALUATOR_NICENESS if task["type"] == cluster.EVALUATOR else 0
    nonlocal zygote
    if preload and zygote_lib.forks(cmd):
      if zygote is None or not zygote.alive():  # Killed: its tasks died with it.
        if zygote is not None:
          zygote.close()
        zygote = zygote_lib.Zygote(preload, base_env, _task_preexec(0, network))
      popen = zygote.spawn(cmd, task_env, niceness)
      header += zygote.imported  # Its log keeps everything, its imports' lines too.
    else:
      popen = _popen(cmd, task_env, niceness, network)
    proc = _start(name, popen, os.path.join(log_dir, name + ".log"), stream=index == 0,
                  header=header, verbose=verbose)
    proc.serves = task["type"] == cluster.PS or (workers_serve and task["type"] == cluster.WORKER)
    return proc

  counts = restarts.new_counts()
  network = zygote = None
  try:
    # TensorFlow's servers listen on every interface, unauthenticated: the
    # tasks talk over loopback only, in a namespace no other host can reach.
    network, why_not = netns.private_network(_task_preexec(0))
    if network is None:
      logging.warning("The tasks' TensorFlow servers listen on every network interface, "
                      "unauthenticated: no private network namespace could be made (%s). Run "
                      "only on a trusted network (docs/operations.md: Security).", why_not)
    procs = [start(i, b"") for i in range(len(tf_configs))]
    logging.info("Started %s; logs in %s", ", ".join(p.name for p in procs), log_dir)
    while True:
      restarts.write_record(log_dir, {**counts, "tasks": [
          {"name": p.name, "pid": p.popen.pid, "tf_config": tf_configs[i]}
          for i, p in enumerate(procs)], **({"zygote": zygote.pid} if zygote else {})})
      outcome, failed = _watch(procs, deadline, stall_timeout)
      if outcome == "ok":
        if counts["restarts"] or counts["evaluator_restarts"]:
          logging.info("All tasks succeeded after %d restart(s) of the training tasks and %d "
                       "of the evaluator.", counts["restarts"], counts["evaluator_restarts"])
        return 0
      if outcome == "timeout":
        logging.error("Timed out after %.0f s (--timeout); %s Stopping every task.", timeout,
                      _hang_report(procs, log_dir))
        return exit_codes.TIMEOUT
      if outcome == "stalled":
        logging.error("No task wrote any output for %.0f s (--stall_timeout); %s Stopping every "
                      "task.", stall_timeout, _hang_report(procs, log_dir))
        return exit_codes.TIMEOUT
      returncode = failed.popen.returncode
      if failed.serves and returncode == 0:
        returncode = exit_codes.PEER_LOST  # The others lost what it served.
      cause = f"{failed.name} {restarts.describe_exit(failed.popen.returncode)}"
      if failed is not procs[0]:  # The chief's own lines were streamed already.
        for t in failed.pumps:  # Its last lines, read to the end.
          t.join(timeout=grace)
        said = failed.log.last_error
        cause += f" ({said})" if said else ""
      # The evaluator is outside the training collective: it is restarted
      # alone, and goes on running while the training tasks are restarted.
      is_evaluator = _is(failed, cluster.EVALUATOR)
      decision = restarts.decide(counts, returncode, is_evaluator, max_restarts)
      # On parameter servers a worker steps alone: it is restarted alone.
      worker_alone = bool(ps) and _is(failed, cluster.WORKER)
      restarts.say(decision, cause, failed.log_path, is_evaluator, max_restarts,
                   again=("restarting it alone while the others train on" if worker_alone
                          else "restarting the training tasks"), resumes=not worker_alone)
      if not decision.retry:
        return decision.code
      alone = is_evaluator or worker_alone
      restart = ([procs.index(failed)] if alone else
                 [i for i, p in enumerate(procs) if not _is(p, cluster.EVALUATOR)])
      # A preempted task's peers stop at the same step on their own: they are left the
      # time to save. With parameter servers nothing agrees on a step: SIGTERM saves what
      # the chief can, the servers stopped last.
      stop = None if decision.preempted and not ps else (
          signal.SIGTERM if decision.preempted else signal.SIGKILL)
      _stop_in_order([procs[i] for i in restart], grace, stop)
      what = (f"preemption {counts['preemptions']}" if decision.preempted else
              f"{'evaluator ' if is_evaluator else ''}restart {decision.restart} of "
              f"{max_restarts}")
      for i in restart:
        procs[i] = start(i, f"\n=== {what}: {cause} ===\n".encode())
  except _Signalled as e:
    code = 128 + e.signum
    logging.warning("Received %s: every task stops at a step the training tasks agree on and "
                    "saves it (up to %.0f s), then this exits %d; a second %s stops them at "
                    "once.", e.name, grace, code, e.name)
    for signum in previous_handlers:  # Passed on: a second signal stops a task at once.
      signal.signal(signum, lambda signum, _: _signal_all(procs, signum))
    # The same signal, so each task says what the launcher says: Ctrl-C's exit 130, not 143.
    _stop_in_order(procs, grace, e.signum)
    return code
  except zygote_lib.ZygoteDied as e:  # Killed (out of memory?) or its imports crashed.
    logging.error("%s. Run again, or give --nofork_tasks to start each task as a process of "
                  "its own.", e)
    return 1
  finally:
    # What ended the run (a failure, a timeout, a stall) leaves its tasks nothing to save;
    # a drain has stopped them already; the parameter servers of a finished run have
    # nothing left to serve.
    _stop_all(procs, grace, signal.SIGKILL)
    if zygote is not None:
      zygote.close()
    if network is not None:
      network.close()
    for signum, handler in previous_handlers.items():
      signal.signal(signum, handler)


class _Signalled(Exception):
  """The launcher received SIGTERM or SIGINT."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum, self.name = signum, signal.Signals(signum).name


def _raise_signalled(signum, frame):
  del frame
  raise _Signalled(signum)
