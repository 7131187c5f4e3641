"""TF_CONFIG: the one place that writes, reads and validates it.

A local cluster of N training workers has one "chief" task and N-1 "worker"
tasks, plus, optionally, one "evaluator" task that is not part of the
training collective. Every task's cluster lists all of them, evaluator
included, as Kubeflow's TFJob operator writes it; a cluster without the
evaluator job (the Estimator's documented layout) is accepted too, and so is
one without a chief job (then `worker:0` is the chief).
"""

import dataclasses
import json
import os
import socket
from typing import Any, Dict, List, Mapping, Optional

CHIEF = "chief"
WORKER = "worker"
EVALUATOR = "evaluator"
TASK_TYPES = (CHIEF, WORKER, EVALUATOR)


class TFConfigError(ValueError):
  """TF_CONFIG is malformed or describes a task this project does not run."""


@dataclasses.dataclass(frozen=True)
class Task:
  """The task this process runs, from TF_CONFIG.

  Attributes:
    type: "chief", "worker" or "evaluator".
    index: index within its type.
    num_workers: number of training tasks (chief and workers) in the cluster.
    has_chief_job: whether the cluster names a "chief" job.
    address: this task's "host:port" in the cluster; None for the evaluator,
      which serves nothing (its address, if listed, is never bound).
    cluster: the cluster spec, job name -> addresses.
  """

  type: str
  index: int
  num_workers: int
  has_chief_job: bool = True
  address: Optional[str] = None
  cluster: Optional[Dict[str, List[str]]] = dataclasses.field(default=None, compare=False)

  @property
  def has_evaluator(self) -> bool:
    """Whether the cluster lists an evaluator task (then the chief does not evaluate)."""
    return self.type == EVALUATOR or EVALUATOR in (self.cluster or {})

  @property
  def training_cluster(self) -> Dict[str, List[str]]:
    """The chief and worker jobs: the tasks that train together."""
    return {job: list(a) for job, a in (self.cluster or {}).items() if job != EVALUATOR}

  @property
  def is_chief(self) -> bool:
    if self.has_chief_job:
      return self.type == CHIEF
    return self.type == WORKER and self.index == 0

  @property
  def name(self) -> str:
    return f"{self.type}:{self.index}"


def pick_free_ports(count: int, host: str = "localhost") -> List[int]:
  """Returns `count` distinct ports that are free now.

  All sockets stay open until every port is chosen, so the ports differ; a
  port can still be taken by another program before a task binds it, which
  then fails at start-up with TF's "address already in use".
  """
  sockets = []
  try:
    for _ in range(count):
      s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      s.bind((host, 0))
      sockets.append(s)
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def make_tf_configs(
    ports: List[int], evaluator: bool = False, host: str = "localhost"
) -> List[Dict[str, Any]]:
  """Builds one TF_CONFIG per task (chief, workers in order, then the evaluator),
  in the shape Kubeflow's TFJob operator writes: every task's cluster lists every task.

  Args:
    ports: one port per task; the first is the chief's, the last the
      evaluator's if there is one (listed, never bound: it serves nothing).
    evaluator: the last port is an "evaluator" task's.
    host: the address every task listens on.

  Returns:
    The TF_CONFIG dicts, the chief's first.
  """
  addresses = [f"{host}:{port}" for port in ports]
  if evaluator:
    addresses, evaluator_address = addresses[:-1], addresses[-1]
  cluster = {CHIEF: addresses[:1]}
  if addresses[1:]:
    cluster[WORKER] = addresses[1:]
  tasks = [(CHIEF, 0)] + [(WORKER, i) for i in range(len(addresses) - 1)]
  if evaluator:
    cluster[EVALUATOR] = [evaluator_address]
    tasks.append((EVALUATOR, 0))
  return [{"cluster": cluster, "task": {"type": t, "index": i}, "environment": "cloud"}
          for t, i in tasks]


def parse_tf_config(environ: Optional[Mapping[str, str]] = None) -> Optional[Task]:
  """Reads this process's task from TF_CONFIG.

  Args:
    environ: the environment; defaults to os.environ.

  Returns:
    The task, or None when TF_CONFIG is unset or has no cluster (one local
    process).

  Raises:
    TFConfigError: naming what is wrong, if TF_CONFIG cannot be run.
  """
  environ = os.environ if environ is None else environ
  raw = environ.get("TF_CONFIG", "").strip()
  if not raw:
    return None
  try:
    tf_config = json.loads(raw)
  except json.JSONDecodeError as e:
    raise TFConfigError(
        f"TF_CONFIG is not valid JSON ({e}). Unset it to run one local process, "
        'or set it like {"cluster": {"worker": ["host:port", ...]}, '
        '"task": {"type": "worker", "index": 0}}.'
    ) from e
  if not isinstance(tf_config, dict):
    raise TFConfigError("TF_CONFIG must be a JSON object with 'cluster' and 'task'.")
  cluster = tf_config.get("cluster") or {}
  if not cluster:
    return None
  if not isinstance(cluster, dict):
    raise TFConfigError("TF_CONFIG cluster must map job names to lists of 'host:port'.")
  extra_jobs = sorted(set(cluster) - set(TASK_TYPES))
  if extra_jobs:
    raise TFConfigError(
        f"TF_CONFIG cluster has job(s) {extra_jobs}; this project runs 'chief' and "
        "'worker' jobs (MultiWorkerMirroredStrategy) plus an optional 'evaluator' task."
    )
  for job, addresses in cluster.items():
    if not isinstance(addresses, list) or not addresses:
      raise TFConfigError(f"TF_CONFIG cluster.{job} must be a non-empty list of 'host:port'.")
  for job in (CHIEF, EVALUATOR):
    if len(cluster.get(job, [])) > 1:
      raise TFConfigError(f"TF_CONFIG cluster.{job} must list exactly one task.")
  if not set(cluster) - {EVALUATOR}:
    raise TFConfigError("TF_CONFIG cluster has no 'chief' or 'worker' job: nothing trains.")
  task = tf_config.get("task") or {}
  task_type, index = task.get("type"), task.get("index", 0)
  if task_type not in TASK_TYPES:
    raise TFConfigError(
        f"TF_CONFIG task type {task_type!r} is not run here; use one of {list(TASK_TYPES)}."
    )
  if not isinstance(index, int) or index < 0:
    raise TFConfigError(f"TF_CONFIG task index must be a non-negative integer, got {index!r}.")
  if task_type == EVALUATOR:
    if index != 0:
      raise TFConfigError(f"There is one evaluator, index 0; got index {index}.")
  elif task_type not in cluster:
    raise TFConfigError(f"TF_CONFIG task type {task_type!r} has no job in the cluster.")
  elif index >= len(cluster[task_type]):
    count = len(cluster[task_type])
    raise TFConfigError(
        f"TF_CONFIG task index {index} is out of range: the cluster has {count} "
        f"{task_type} task(s), indices 0 to {count - 1}."
    )
  return Task(type=task_type, index=index,
              num_workers=len(cluster.get(CHIEF, [])) + len(cluster.get(WORKER, [])),
              has_chief_job=CHIEF in cluster,
              address=None if task_type == EVALUATOR else cluster[task_type][index],
              cluster=cluster)


def evaluator_tf_config_with_chief(task: Task) -> Dict[str, Any]:
  """The evaluator's TF_CONFIG with `worker:0` listed as the "chief" job, if there is none.

  The same cluster (worker 0 is its chief either way), in the layout the
  Estimator's RunConfig demands of an evaluator task: it rejects a cluster with
  no "chief" job, the shape a TFJob with no Chief replica gets. Only for the
  evaluator, which joins no collective: the training tasks' indices stay.
  """
  if task.type != EVALUATOR:
    raise ValueError(f"only the evaluator's TF_CONFIG may be rewritten, not {task.name}'s")
  spec = {job: list(addresses) for job, addresses in (task.cluster or {}).items()}
  if CHIEF not in spec and spec.get(WORKER):
    spec[CHIEF] = spec[WORKER][:1]
    spec[WORKER] = spec[WORKER][1:]
    if not spec[WORKER]:
      del spec[WORKER]
  return {"cluster": spec, "task": {"type": task.type, "index": task.index}}


def check_port_free(task: Task) -> None:
  """Raises TFConfigError, naming the fix, if this task's port is taken.

  TensorFlow's gRPC server binds with SO_REUSEPORT, so a second server on a
  busy port may start without an error and talk to the wrong peers: look first.
  """
  if task.address is None:
    return
  port = task.address.rpartition(":")[2]
  if not port.isdigit():
    raise TFConfigError(f"TF_CONFIG address {task.address!r} of {task.name} is not 'host:port'.")
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    # Like gRPC: a port whose old connections linger in TIME_WAIT is free.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      s.bind(("", int(port)))  # TF's server listens on every interface.
    except OSError as e:
      raise TFConfigError(
          f"Port {port} of {task.name} ({task.address} in TF_CONFIG) cannot be bound: {e.strerror}. "
          "Stop the program using it, or give this task a free port in every task's TF_CONFIG "
          "(python -m launch.local picks free ports)."
      ) from e
