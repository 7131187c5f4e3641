"""The trainers on a Ray cluster, through Ray Train's own `TensorflowTrainer`.

`run_ray_cluster` takes the place of `launch.supervisor.run_local_cluster` in
`trainers.runner.run` (`python -m launch.ray`): the runner checks flags, data and
model_dir and holds the run lock as for a local cluster; then Ray Train starts one
worker per training task with a `TF_CONFIG` of its own making (worker-only: worker 0
is the chief), and each worker runs the trainer binary as a child process with it.
A child process, not the trainer in Ray's thread: Ray Train's controller runs the
training function in a thread that is not the main one, where signal handlers
(trainers.preemption) cannot be set and an exit code is lost.

What the local launcher guarantees holds here, through one record every task and this
process share, a `ray_record.RunRecord` held by a Ray actor, which this process writes
to `<log_dir>/tasks.json`:

- Restarts: the first task of an attempt to fail decides for all of them, by the local
  launcher's rule (launch.restarts): a retried code (128 and above) within
  `max_restarts`, or a preemption (143, not counted), raises `TaskExit` and Ray Train
  starts the worker group again, which resumes from the last backup, checkpoint or
  saved preemption step; any other failure stops every task and ends the run with that
  code. Ray's own `FailureConfig` retries without limit: the record decides, and an
  attempt that ended with no task's failure recorded (Ray lost a worker) counts as a
  restart (ray_record.count_attempt).
- Evaluation: an evaluator runs beside the workers as a Ray task asking for no CPU (so
  N workers on N cores keep them all), over the shared model_dir, restarted alone by
  the same rule; each worker's TF_CONFIG lists it, so the chief waits for its result.
  Without it (`evaluator=False`) the chief evaluates.
- Stops: SIGTERM or SIGINT to this process, `timeout` and `stall_timeout` set `stop`;
  every task, wherever it runs, passes the signal to its trainer (SIGTERM: a drain,
  each training task stops at one step its cluster agrees on and saves it; SIGKILL
  after `grace`, a second signal, a timeout or a stall).
- Each task's output goes to `<log_dir>/<type>-<index>.log`, as the local launcher's; the
  chief's is followed to this terminal as the local launcher streams it.

Ray is imported only here, and only when a run starts: `pip install -e ".[tf215,ray]"`.
"""

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from absl import logging

from launch import cluster
from launch import console
from launch import exit_codes
from launch import restarts
from launch import supervisor
from launch.ray import record as ray_record
from trainers import run_lock

RAY_EXTRA = "ray"
# The evaluator's place in the workers' TF_CONFIG: listed, so the chief waits for its
# result, and never bound (it serves nothing).
EVALUATOR_ADDRESS = "ray-evaluator.invalid:1"
CONNECT_SECONDS = 60  # How long an --address may take to answer.
# The longest temporary directory a local Ray cluster's sockets fit under: 107 bytes
# less "/ray/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store" (68 at most).
MAX_TEMP_DIR_CHARS = 39
POLL_SECONDS = 0.5  # How often a task and this process read the record.
LOG_TAIL_BYTES = 1 << 16  # How much of a failed task's log is searched for its error.
PR_SET_PDEATHSIG = 1


class RayUnavailable(ValueError):
  """Ray is not installed, or its cluster cannot be reached; the message names the fix."""


class TaskExit(RuntimeError):
  """A task's trainer failed and the run goes on: Ray starts the workers again."""

  def __init__(self, name: str, code: int):
    super().__init__(f"{name} exited with code {code}")
    self.name, self.code = name, code

  def __reduce__(self):
    return (TaskExit, (self.name, self.code))


def check_installed() -> None:
  """Raises RayUnavailable, naming the extra, if Ray Train cannot be imported."""
  try:
    import ray.train.tensorflow  # noqa: F401, PLC0415 -- only to see that it is there.
  except ImportError as e:
    raise RayUnavailable(
        f"Ray Train is not installed ({e}). Install it with the project's extra, in Python "
        f"3.10 or 3.11: pip install -e \".[tf215,{RAY_EXTRA}]\".") from e


def check_reachable(address: str) -> None:
  """Raises RayUnavailable unless a "host:port" address answers within CONNECT_SECONDS
  ("auto" and "ray://" addresses are left to Ray)."""
  if address == "auto" or "://" in address:
    return
  host, _, port = address.rpartition(":")
  try:
    socket.create_connection((host, int(port)), timeout=CONNECT_SECONDS).close()
  except (OSError, ValueError) as e:
    raise RayUnavailable(
        f"--address={address}: no Ray cluster answers there ({e}). Give the head node's "
        "GCS address (host:6379, as `ray start --head` prints it), or leave --address out "
        "to start a Ray cluster on this machine.") from e


def check_temp_dir() -> None:
  """Raises RayUnavailable, naming the fix, if a Ray cluster started here would put its
  sockets at paths longer than AF_UNIX allows (Ray's temporary directory, as Ray picks
  it: $RAY_TMPDIR, else $TMPDIR, else /tmp)."""
  root = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
  if len(os.path.abspath(root)) > MAX_TEMP_DIR_CHARS:
    raise RayUnavailable(
        f"Ray would put its sockets under {root}/ray, too long a path for them (AF_UNIX "
        f"paths hold 107 bytes; Ray's temporary directory can have {MAX_TEMP_DIR_CHARS} "
        "characters). Set RAY_TMPDIR to a short directory, e.g. RAY_TMPDIR=/tmp.")


def _run_task(name: str, cmd: Sequence[str], tf_config: Dict[str, Any],
              env: Mapping[str, str], log_dir: str, cwd: str,
              record: Any) -> Tuple[int, Optional[str]]:
  """Runs the trainer as task `name` with `tf_config`, its output appended to its log, in
  `cwd` (the command's directory, so its relative paths mean what they meant there) where
  this node has it; passes on the run's stop signal (`record`: the ray_record.RunRecord actor);
  returns its exit code as Popen gives it and the last "error: " line it wrote. Dies with
  the Ray worker that started it (PR_SET_PDEATHSIG), as the local launcher's tasks do."""
  import ctypes  # noqa: PLC0415 -- in the Ray worker only.
  import ray  # noqa: PLC0415 -- in the Ray worker only.
  libc = ctypes.CDLL(None, use_errno=True)

  def preexec() -> None:
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

  log_path = os.path.join(log_dir, f"{name}.log")
  with open(log_path, "ab") as log:
    start = log.tell()
    proc = subprocess.Popen(list(cmd),
                            env={**os.environ, **env, "TF_CONFIG": json.dumps(tf_config)},
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            cwd=cwd if os.path.isdir(cwd) else None, preexec_fn=preexec)
  ray.get(record.task_started.remote(name, proc.pid, socket.gethostname(),
                                     ray.util.get_node_ip_address()))
  sent = None
  try:
    while True:
      try:
        return proc.wait(timeout=POLL_SECONDS), _last_error(log_path, start)
      except subprocess.TimeoutExpired:
        stop = ray.get(record.stop.remote())
        if stop and stop["signal"] != sent:
          sent = stop["signal"]
          proc.send_signal(sent)
  finally:
    if proc.poll() is None:  # This Ray worker is being stopped: so is its task.
      proc.kill()
      proc.wait()


def _last_error(log_path: str, start: int) -> Optional[str]:
  """The last "error: " line of the log from byte `start` on (the local launcher says it
  beside the task's exit code, as here)."""
  with open(log_path, "rb") as f:
    f.seek(max(start, os.path.getsize(log_path) - LOG_TAIL_BYTES))
    lines = [line for line in f.read().splitlines() if line.startswith(b"error: ")]
  return lines[-1].decode(errors="replace") if lines else None


def _train_worker(loop_config: Dict[str, Any]) -> None:
  """Ray Train's training function, on each worker: the trainer binary with Ray's TF_CONFIG
  (and the evaluator listed in it); raises TaskExit when the run goes on without it.

  Anything else raised here would be retried by Ray without end: it is recorded as this
  task's failure (exit code 1, not retried), its traceback in the task's log.
  """
  import ray  # noqa: PLC0415 -- in the Ray worker.
  tf_config = json.loads(os.environ["TF_CONFIG"])
  index = tf_config["task"]["index"]
  name, log_dir, record = f"{cluster.WORKER}-{index}", loop_config["log_dir"], loop_config["record"]
  max_restarts = loop_config["max_restarts"]
  try:
    if loop_config["evaluator"]:
      tf_config["cluster"][cluster.EVALUATOR] = [EVALUATOR_ADDRESS]
    # One worker 0 per attempt: it counts them.
    stopped = ray.get(record.attempt_started.remote(max_restarts) if index == 0 else
                      record.stop.remote())
    returncode, said = (0, None) if stopped else _run_task(
        name, loop_config["cmd"], tf_config, loop_config["env"], log_dir, loop_config["cwd"],
        record)
  except Exception:  # noqa: BLE001 -- recorded and said; see the docstring.
    try:
      with open(os.path.join(log_dir, f"{name}.log"), "a") as log:
        log.write(f"Ray Train worker {index} failed:\n{traceback.format_exc()}")
    except OSError:
      pass  # A full disk: the exit code still says it.
    returncode, said = 1, "error: the Ray Train worker failed; its traceback is in the log"
  if returncode:
    cause = ray.get(record.failed.remote(name, returncode, max_restarts, said))
    if cause["retry"]:
      raise TaskExit(cause["name"], cause["code"])


def _evaluate(cmd: Sequence[str], num_workers: int, env: Mapping[str, str], log_dir: str,
              cwd: str, max_restarts: int, record: Any) -> int:
  """The evaluator task: run, and restarted alone while ray_record.record_failure says so;
  returns its last exit code."""
  import ray  # noqa: PLC0415 -- in the Ray worker.
  tf_config = {"cluster": {cluster.WORKER: [f"ray-worker-{i}.invalid:1"
                                            for i in range(num_workers)],
                           cluster.EVALUATOR: [EVALUATOR_ADDRESS]},
               "task": {"type": cluster.EVALUATOR, "index": 0}}
  name = ray_record.EVALUATOR_NAME
  while True:
    returncode, said = _run_task(name, cmd, tf_config, env, log_dir, cwd, record)
    if not returncode:
      return 0
    failure = ray.get(record.failed.remote(name, returncode, max_restarts, said))
    if not failure["retry"]:
      return failure["code"]


class _ChiefOutput:
  """The chief's log, followed to the terminal as the local launcher streams the chief:
  its summary JSON to stdout, the rest through console.LineFilter to stderr."""

  def __init__(self, path: str, verbose: bool):
    self.path, self.show = path, console.LineFilter(verbose)
    self.offset = os.path.getsize(path) if os.path.exists(path) else 0  # This run's only.

  def pump(self) -> None:
    """Writes the complete lines added since the last call."""
    try:
      with open(self.path, "rb") as f:
        f.seek(self.offset)
        data = f.read()
    except OSError:
      return  # Not started yet.
    end = data.rfind(b"\n") + 1
    self.offset += end
    for line in data[:end].splitlines(keepends=True):
      if line.startswith(b"{"):
        sys.stdout.buffer.write(line)
        sys.stdout.flush()
      elif self.show(line):
        sys.stderr.buffer.write(line)
        sys.stderr.flush()


class _Watch:
  """This process's side of the record (`actor`, the ray_record.RunRecord): writes it to tasks.json,
  streams the chief's output, says each restart as it is decided, and sets `stop` on a
  signal, at `timeout` or when the training tasks' logs fall silent for `stall_timeout`,
  and SIGKILL `grace` seconds after a SIGTERM."""

  def __init__(self, log_dir: str, max_restarts: int, timeout: Optional[float],
               stall_timeout: Optional[float], grace: float, verbose: bool,
               actor: Any = None):
    self.log_dir, self.max_restarts, self.grace = log_dir, max_restarts, grace
    self.actor, self.written, self.write_failed = actor, None, False
    self.chief = _ChiefOutput(os.path.join(log_dir, f"{cluster.WORKER}-0.log"), verbose)
    self.started = time.time()  # Beside the logs' modification times.
    self.deadline = None if timeout is None else time.monotonic() + timeout
    self.timeout, self.stall_timeout = timeout, stall_timeout
    self.signals: list = []
    self.said = 0
    self.stopped_at: Optional[float] = None
    self.done = threading.Event()
    self.thread = threading.Thread(target=self._loop, daemon=True)

  def __enter__(self) -> "_Watch":
    self.thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self.done.set()
    self.thread.join()
    self.chief.pump()
    self._say(self.read())

  def read(self) -> Dict[str, Any]:
    """The record as it is now, written to tasks.json if it changed (a full disk is said
    once: the record itself lives in the actor)."""
    import ray  # noqa: PLC0415 -- only where run_ray_cluster has imported it.
    record = ray.get(self.actor.get.remote())
    if record != self.written:
      if restarts.write_record(self.log_dir, record, warn=not self.write_failed):
        self.written = record
      else:
        self.write_failed = True
    return record

  def _loop(self) -> None:
    while not self.done.wait(POLL_SECONDS):
      self.chief.pump()
      record = self.read()
      self._say(record)
      stop = self._stop_wanted(record)
      if stop:
        self.actor.set_stop.remote(stop, record["stop"])

  def _say(self, record: Dict[str, Any]) -> None:
    for failure in record["failures"][self.said:]:
      name = failure["name"]
      if name == ray_record.LOST_WORKER:
        cause, log = f"{name} was lost", "Ray's logs"
      else:
        cause = f"{name} {restarts.describe_exit(failure['returncode'])}"
        cause += f" ({failure['said']})" if failure["said"] else ""
        log = os.path.join(self.log_dir, name + ".log")
      if failure["why"] == ray_record.STOPPING:  # What the stop did, not why it came.
        logging.info("%s (%s).", cause, ray_record.STOPPING)
        continue
      decision = restarts.Decision(
          **{f.name: failure[f.name] for f in dataclasses.fields(restarts.Decision)})
      restarts.say(decision, cause, log, name == ray_record.EVALUATOR_NAME, self.max_restarts,
                   again="Ray Train starts the workers again")
    self.said = len(record["failures"])

  def _stop_wanted(self, record: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The stop to set now, or None."""
    stop, now = record["stop"], time.monotonic()
    if stop and stop["signal"] == signal.SIGTERM and (
        len(self.signals) > 1 or now > self.stopped_at + self.grace):
      return {**stop, "signal": signal.SIGKILL}
    if stop:
      return None
    if self.signals:
      name = signal.Signals(self.signals[0]).name
      logging.warning("Received %s: every task stops at a step the training tasks agree on "
                      "and saves it (up to %.0f s), then this exits %d; a second %s stops "
                      "them at once.", name, self.grace, 128 + self.signals[0], name)
      self.stopped_at = now
      return {"signal": signal.SIGTERM, "code": 128 + self.signals[0], "why": name}
    if self.deadline is not None and now > self.deadline:
      logging.error("Timed out after %.0f s (--timeout); stopping every task.", self.timeout)
      return {"signal": signal.SIGKILL, "code": exit_codes.TIMEOUT, "why": "timeout"}
    silent = self._silence()
    if self.stall_timeout is not None and silent > self.stall_timeout:
      logging.error("No training task wrote any output for %.0f s (--stall_timeout); "
                    "stopping every task. Their logs are in %s.", silent, self.log_dir)
      return {"signal": signal.SIGKILL, "code": exit_codes.TIMEOUT, "why": "stall"}
    return None

  def _silence(self) -> float:
    """Seconds since a training task's log last grew (since the start, before any did)."""
    logs = [os.path.join(self.log_dir, n) for n in os.listdir(self.log_dir)
            if n.startswith(cluster.WORKER) and n.endswith(".log")]
    newest = max((os.path.getmtime(p) for p in logs), default=self.started)
    return time.time() - max(newest, self.started)

  def signalled(self, signum: int, frame: Any) -> None:
    """A SIGTERM or SIGINT handler: the loop sets the stop (no lock in a handler)."""
    del frame
    self.signals.append(signum)


def run_ray_cluster(cmd: Sequence[str], num_workers: int, log_dir: str, *,
                    evaluator: bool = True, timeout: Optional[float] = None,
                    stall_timeout: Optional[float] = None, max_restarts: int,
                    env: Optional[Mapping[str, str]] = None, verbose: bool = True,
                    grace: float = supervisor.GRACE_SECONDS,
                    address: Optional[str] = None, preload: Sequence[str] = ()) -> int:
  """Runs `cmd` as every training task of a Ray Train worker group (see the module doc).

  Args, as launch.supervisor.run_local_cluster's (but `preload`: Ray starts each task
  as a process of its own, in its worker's actor), and:
    address: a Ray cluster to join ("host:port" of its head, or "auto"); None starts one
      on this machine.

  Returns:
    0 when every task exited 0; else the exit code of the task whose failure ended the
    run (128 + N if signal N killed it), 124 at timeout or stall, 128 + N after signal N.

  Raises:
    RayUnavailable: Ray is not installed, `address` does not answer, or (with none) the
      temporary directory is too long for a Ray cluster's sockets.
  """
  del preload
  check_installed()
  if address:
    check_reachable(address)
  else:
    check_temp_dir()
  import ray  # noqa: PLC0415 -- imported only when a run starts (seconds).
  from ray.train import FailureConfig, RunConfig, ScalingConfig  # noqa: PLC0415
  from ray.train.tensorflow import TensorflowTrainer  # noqa: PLC0415
  from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: PLC0415
  log_dir = os.path.abspath(log_dir)
  os.makedirs(log_dir, exist_ok=True)
  # Only what the tasks need of this process's environment: the rest is their node's.
  task_env = {k: v for k, v in (env or {}).items()
              if k in (run_lock.HELD_FOR_ENV, "TFDS_DATA_DIR", "MNIST_IDX_DIR", "PYTHONPATH")}
  ray.init(address=address, include_dashboard=False, logging_level="WARNING",
           log_to_driver=False)
  # The record and the evaluator stay on this process's node: a node lost elsewhere must
  # not take them with it (the run goes on), and this node's loss ends the run anyway.
  here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
  actor = ray.remote(num_cpus=0, scheduling_strategy=here)(ray_record.RunRecord).remote()
  watch = _Watch(log_dir, max_restarts, timeout, stall_timeout, grace, verbose, actor)
  handlers = {s: signal.signal(s, watch.signalled) for s in (signal.SIGTERM, signal.SIGINT)}
  evaluator_task = None
  try:
    with watch:
      if evaluator:
        evaluate = ray.remote(num_cpus=0, max_retries=0, scheduling_strategy=here)(_evaluate)
        evaluator_task = evaluate.remote(cmd, num_workers, task_env, log_dir, os.getcwd(),
                                         max_restarts, actor)
      logging.info("Ray: %d workers%s; logs in %s", num_workers,
                   " and an evaluator" if evaluator else "", log_dir)
      trainer = TensorflowTrainer(
          _train_worker,
          train_loop_config={"cmd": list(cmd), "evaluator": evaluator, "env": task_env,
                             "log_dir": log_dir, "cwd": os.getcwd(),
                             "max_restarts": max_restarts, "record": actor},
          scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=False,
                                       resources_per_worker={"CPU": 1}),
          # Restarts are decided by the tasks (ray_record.record_failure); Ray's own count
          # would take preemptions for failures.
          run_config=RunConfig(name="mnist", storage_path=os.path.join(log_dir, "ray"),
                               failure_config=FailureConfig(max_failures=-1)))
      try:
        trainer.fit()
      except Exception as e:  # Ray's TrainingFailedError: Ray itself failed.
        logging.error("Ray Train stopped the run: %s (the tasks' logs are in %s)",
                      str(e).strip().splitlines()[-1], log_dir)
        return 1
      if evaluator_task is not None:
        try:  # Bounded: the stop at a timeout reaches the evaluator too.
          ray.get(evaluator_task)
        except Exception as e:  # Ray lost the evaluator's worker.
          logging.error("Ray lost the evaluator: %s", str(e).strip().splitlines()[-1])
          return 1
      return ray_record.run_outcome(watch.read())
  finally:
    for s, handler in handlers.items():
      signal.signal(s, handler)
    if evaluator_task is not None:
      ray.cancel(evaluator_task, force=True)  # Done, or waiting for a step never saved.
    ray.shutdown()
