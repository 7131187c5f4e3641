"""The trainers on a Ray cluster, through Ray Train's own `TensorflowTrainer`.

`run_ray_cluster` takes the place of `launch.supervisor.run_local_cluster` in
`trainers.runner.run` (`python -m launch.ray`): the runner checks flags, data and
model_dir and holds the run lock as for a local cluster; then Ray Train starts one
worker per training task with a `TF_CONFIG` of its own making (worker-only: worker 0
is the chief), and each worker runs the trainer binary as a child process with it.
A child process, not the trainer in Ray's thread: Ray Train's controller runs the
training function in a thread that is not the main one, where signal handlers
(trainers.preemption) cannot be set and an exit code is lost.

- Evaluation: an evaluator task runs beside the workers in a Ray actor asking for no
  CPU (so N workers on N cores keep them all), over the shared model_dir; each
  worker's TF_CONFIG lists it, so the chief waits for its result, as in a local
  cluster. Without it (`evaluator=False`) the chief evaluates.
- Failures: a worker whose trainer exits with a retried code (launch.exit_codes:
  128 and above) raises, and Ray's `FailureConfig(max_failures=max_restarts)` starts
  the worker group again, which resumes from the last backup or checkpoint; a code
  below 128 (a usage error, a divergence, a full disk) ends the run with that code.
- Each task's output goes to `<log_dir>/<type>-<index>.log`, as the local launcher's.

Ray is imported only here, and only when a run starts: `pip install -e ".[tf215,ray]"`.
"""

import json
import os
import signal
import socket
import subprocess
import time
from typing import Any, Dict, Mapping, Optional, Sequence

from absl import logging

from launch import cluster
from launch import exit_codes
from trainers import run_lock

RAY_EXTRA = "ray"
# The evaluator's place in the workers' TF_CONFIG: listed, so the chief waits for its
# result, and never bound (it serves nothing).
EVALUATOR_ADDRESS = "ray-evaluator.invalid:1"
CONNECT_SECONDS = 60  # How long an --address may take to answer.
PR_SET_PDEATHSIG = 1


class RayUnavailable(ValueError):
  """Ray is not installed, or its cluster cannot be reached; the message names the fix."""


class TaskExit(RuntimeError):
  """A task's trainer exited with a code that is retried: Ray starts the workers again."""

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


def _task_name(index: int) -> str:
  return f"{cluster.WORKER}-{index}"


def _run_task(cmd: Sequence[str], tf_config: Dict[str, Any], env: Mapping[str, str],
              log_path: str) -> int:
  """Runs the trainer with `tf_config`, its output appended to `log_path`; dies with the
  Ray worker that started it (PR_SET_PDEATHSIG), as the local launcher's tasks do."""
  import ctypes  # noqa: PLC0415 -- in the Ray worker only.
  libc = ctypes.CDLL(None, use_errno=True)

  def preexec() -> None:
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

  with open(log_path, "ab") as log:
    proc = subprocess.Popen(list(cmd),
                            env={**os.environ, **env, "TF_CONFIG": json.dumps(tf_config)},
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            preexec_fn=preexec)
    try:
      return proc.wait()
    finally:
      if proc.poll() is None:  # The Ray worker is being stopped: so is its task.
        proc.send_signal(signal.SIGTERM)
        proc.wait()


def _train_worker(loop_config: Dict[str, Any]) -> None:
  """Ray Train's training function, on each worker: the trainer binary with Ray's TF_CONFIG
  (and the evaluator listed in it)."""
  import ray.train  # noqa: PLC0415 -- in the Ray worker.
  tf_config = json.loads(os.environ["TF_CONFIG"])
  if loop_config["evaluator"]:
    tf_config["cluster"][cluster.EVALUATOR] = [EVALUATOR_ADDRESS]
  index = tf_config["task"]["index"]
  name = _task_name(index)
  code = _run_task(loop_config["cmd"], tf_config, loop_config["env"],
                   os.path.join(loop_config["log_dir"], f"{name}.log"))
  if exit_codes.retried(code):
    raise TaskExit(name, code)
  ray.train.report({"exit_code": code, "task": name})


def _evaluator_tf_config(num_workers: int) -> Dict[str, Any]:
  """The evaluator's TF_CONFIG: the workers' addresses are Ray's, unknown here and never
  used by the evaluator, which connects to no task."""
  return {"cluster": {cluster.WORKER: [f"ray-worker-{i}.invalid:1" for i in range(num_workers)],
                      cluster.EVALUATOR: [EVALUATOR_ADDRESS]},
          "task": {"type": cluster.EVALUATOR, "index": 0}}


def _failure_code(error: BaseException) -> int:
  """The exit code of the task whose failure ended the run, or 1."""
  failures = getattr(error, "worker_failures", {}) or {}
  codes = [f.code for f in failures.values() if isinstance(f, TaskExit)]
  return min(codes, key=lambda c: c == exit_codes.PEER_LOST) if codes else 1


def _print_summary(chief_log: str) -> None:
  """Prints the chief's summary JSON, the last line a run prints (the local launcher
  streams the chief's output; Ray's workers write theirs to their logs)."""
  with open(chief_log, errors="replace") as f:
    lines = [line for line in f if line.startswith("{")]
  if lines:
    print(lines[-1].rstrip(), flush=True)


def run_ray_cluster(cmd: Sequence[str], num_workers: int, log_dir: str, *,
                    evaluator: bool = True, timeout: Optional[float] = None,
                    stall_timeout: Optional[float] = None, max_restarts: int = 0,
                    env: Optional[Mapping[str, str]] = None, verbose: bool = True,
                    grace: float = 0.0, address: Optional[str] = None) -> int:
  """Runs `cmd` as every training task of a Ray Train worker group (see the module doc).

  Args, as launch.supervisor.run_local_cluster's (stall_timeout and grace are Ray's to
  judge there: it stops its own workers), and:
    address: a Ray cluster to join ("host:port" of its head, or "auto"); None starts one
      on this machine.

  Returns:
    0 when every task exited 0; else the exit code of the task that ended the run.

  Raises:
    RayUnavailable: Ray is not installed, or `address` does not answer.
  """
  del stall_timeout, verbose, grace
  check_installed()
  if address:
    check_reachable(address)
  import ray  # noqa: PLC0415 -- imported only when a run starts (seconds).
  from ray.train import FailureConfig, RunConfig, ScalingConfig  # noqa: PLC0415
  from ray.train.tensorflow import TensorflowTrainer  # noqa: PLC0415
  os.makedirs(log_dir, exist_ok=True)
  # Only what the tasks need of this process's environment: the rest is their node's.
  task_env = {k: v for k, v in (env or {}).items()
              if k in (run_lock.HELD_FOR_ENV, "TFDS_DATA_DIR", "MNIST_IDX_DIR", "PYTHONPATH")}
  ray.init(address=address, include_dashboard=False, logging_level="WARNING",
           log_to_driver=False)
  started = time.monotonic()
  evaluator_task = None
  try:
    if evaluator:
      runner = ray.remote(num_cpus=0)(_run_task)
      evaluator_task = runner.remote(cmd, _evaluator_tf_config(num_workers), task_env,
                                     os.path.join(log_dir, "evaluator-0.log"))
    logging.info("Ray: %d workers%s; logs in %s", num_workers,
                 " and an evaluator" if evaluator else "", log_dir)
    trainer = TensorflowTrainer(
        _train_worker,
        train_loop_config={"cmd": list(cmd), "evaluator": evaluator, "env": task_env,
                           "log_dir": os.path.abspath(log_dir)},
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=False,
                                     resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name="mnist", storage_path=os.path.abspath(
            os.path.join(log_dir, "ray")), failure_config=FailureConfig(
                max_failures=max_restarts)))
    try:
      result = trainer.fit()
    except Exception as e:  # Ray's TrainingFailedError, after its retries.
      code = _failure_code(e)
      logging.error("Ray Train stopped the run: %s (exit code %d; the tasks' logs are in %s)",
                    str(e).strip().splitlines()[-1], code, log_dir)
      return code
    code = int((result.metrics or {}).get("exit_code", 0))
    if code:
      logging.error("%s exited with code %d (%s); see its log in %s",
                    result.metrics.get("task"), code, exit_codes.why_not_retried(code), log_dir)
      return code
    _print_summary(os.path.join(log_dir, f"{_task_name(0)}.log"))
    if evaluator_task is not None:
      remaining = None if timeout is None else max(1.0, timeout - (time.monotonic() - started))
      ready, _ = ray.wait([evaluator_task], timeout=remaining)
      evaluator_code = ray.get(ready[0]) if ready else exit_codes.TIMEOUT
      if evaluator_code:
        logging.error("The evaluator exited with code %d; its log: %s", evaluator_code,
                      os.path.join(log_dir, "evaluator-0.log"))
        return evaluator_code
    return 0
  finally:
    if evaluator_task is not None:
      ray.cancel(evaluator_task, force=True)  # Done, or waiting for a step never saved.
    ray.shutdown()
