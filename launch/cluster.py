"""TF_CONFIG: the one place that writes, reads and validates it.

A local cluster of N training workers has one "chief" task and N-1 "worker"
tasks, plus, optionally, one "evaluator" task that is not part of the
training collective. Every task's cluster lists all of them, evaluator
included, as Kubeflow's TFJob operator writes it. Read too: a cluster without
the evaluator job (the Estimator's documented layout, and Vertex AI's, whose
evaluator is outside `cluster`), one without a chief job (Ray Train's: then
`worker:0` is the chief), and Vertex AI's "master" for the chief, read as
"chief" (MultiWorkerMirroredStrategy rejects "master"; `tf_config_of` writes
the task's TF_CONFIG back as TensorFlow takes it). Keys other than
`cluster.<job>`, `task.type` and `task.index` (Vertex AI's `job`, `trial`,
`cloud`) are ignored.
"""

import dataclasses
import json
import os
import socket
from typing import Any, Dict, List, Mapping, Optional, Tuple

CHIEF = "chief"
WORKER = "worker"
EVALUATOR = "evaluator"
PS = "ps"  # A parameter server: holds variables, computes nothing.
TASK_TYPES = (CHIEF, WORKER, PS, EVALUATOR)
MASTER = "master"  # Vertex AI's (and AI Platform's) name for the chief, read as CHIEF.


class TFConfigError(ValueError):
  """TF_CONFIG is malformed or describes a task this project does not run."""


@dataclasses.dataclass(frozen=True)
class Task:
  """The task this process runs, from TF_CONFIG.

  Attributes:
    type: "chief", "worker", "ps" or "evaluator".
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
  def num_ps(self) -> int:
    """The parameter servers in the cluster: 0 for a MultiWorkerMirroredStrategy run."""
    return len((self.cluster or {}).get(PS, []))

  @property
  def training_cluster(self) -> Dict[str, List[str]]:
    """The chief and worker jobs: the tasks that compute gradients."""
    return {job: list(a) for job, a in (self.cluster or {}).items() if job in (CHIEF, WORKER)}

  @property
  def servers(self) -> Dict[str, List[str]]:
    """Every job but the evaluator's: the tasks that serve each other (with parameter
    servers, the ps tasks too)."""
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
    ports: List[int], evaluator: bool = False, host: str = "localhost", ps: int = 0
) -> List[Dict[str, Any]]:
  """Builds one TF_CONFIG per task (chief, workers in order, the ps tasks, then the
  evaluator), in the shape Kubeflow's TFJob operator writes: every task's cluster lists
  every task.

  Args:
    ports: one port per task; the first is the chief's, then the workers', the last `ps`
      before the evaluator's the parameter servers', and the last the evaluator's if there
      is one (listed, never bound: it serves nothing).
    evaluator: the last port is an "evaluator" task's.
    host: the address every task listens on.
    ps: how many of the ports are parameter servers'.

  Returns:
    The TF_CONFIG dicts, the chief's first.
  """
  addresses = [f"{host}:{port}" for port in ports]
  if evaluator:
    addresses, evaluator_address = addresses[:-1], addresses[-1]
  if ps:
    addresses, ps_addresses = addresses[:-ps], addresses[-ps:]
  cluster = {CHIEF: addresses[:1]}
  if addresses[1:]:
    cluster[WORKER] = addresses[1:]
  tasks = [(CHIEF, 0)] + [(WORKER, i) for i in range(len(addresses) - 1)]
  if ps:
    cluster[PS] = ps_addresses
    tasks += [(PS, i) for i in range(ps)]
  if evaluator:
    cluster[EVALUATOR] = [evaluator_address]
    tasks.append((EVALUATOR, 0))
  return [{"cluster": cluster, "task": {"type": t, "index": i}, "environment": "cloud"}
          for t, i in tasks]


_EXAMPLE = ('{"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222"]}, '
            '"task": {"type": "worker", "index": 0}}')


def parse_tf_config(environ: Optional[Mapping[str, str]] = None) -> Optional[Task]:
  """Reads this process's task from TF_CONFIG.

  TF_CONFIG is a JSON object: "cluster" maps each job ("chief", "worker",
  "evaluator") to a list of "host:port" strings, every address different, and
  "task" names this process's job and its index in that job's list, e.g.
  {"cluster": {"chief": ["h0:2222"], "worker": ["h1:2222"]},
   "task": {"type": "worker", "index": 0}}. Anything else in it is ignored.

  Args:
    environ: the environment; defaults to os.environ.

  Returns:
    The task, or None when TF_CONFIG is unset or has no cluster (one local
    process).

  Raises:
    TFConfigError: naming the field that is wrong and the fix, if TF_CONFIG
      cannot be run; never a KeyError or TypeError for a malformed shape.
  """
  environ = os.environ if environ is None else environ
  raw = environ.get("TF_CONFIG", "").strip()
  if not raw:
    return None
  tf_config = _load_json(raw)
  if not isinstance(tf_config, dict):
    raise TFConfigError(
        f"TF_CONFIG must be a JSON object, got {_json_type(tf_config)}; set it like {_EXAMPLE}."
    )
  cluster = tf_config.get("cluster")
  if cluster is None or cluster == {}:
    return None
  cluster, task = _as_chief(cluster, tf_config.get("task"))
  _check_cluster(cluster)
  task_type, index = _check_task(task, cluster)
  return Task(type=task_type, index=index,
              num_workers=len(cluster.get(CHIEF, [])) + len(cluster.get(WORKER, [])),
              has_chief_job=CHIEF in cluster,
              address=None if task_type == EVALUATOR else cluster[task_type][index],
              cluster=cluster)


def _json_type(value: Any) -> str:
  """`value`'s JSON type, for messages: 'a string ("worker")', 'a number (2222)'..."""
  if value is None:
    return "null"
  kinds = ((bool, "a boolean"), (str, "a string"), ((int, float), "a number"),
           (list, "a list"), (dict, "an object"))
  kind = next(name for types, name in kinds if isinstance(value, types))
  return f"{kind} ({json.dumps(value)[:60]})"


def _load_json(raw: str) -> Any:
  """TF_CONFIG's JSON; a key given twice in one object is an error, not the last one silently."""

  def no_duplicate_keys(pairs):
    keys = [key for key, _ in pairs]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
      raise TFConfigError(
          f"TF_CONFIG has key(s) {repeated} twice in one object, and JSON keeps only the "
          "last one: list every address of a job in one list, and give each key once."
      )
    return dict(pairs)

  try:
    return json.loads(raw, object_pairs_hook=no_duplicate_keys)
  except json.JSONDecodeError as e:
    raise TFConfigError(
        f"TF_CONFIG is not valid JSON ({e}). Unset it to run one local process, "
        f"or set it like {_EXAMPLE}."
    ) from e


def _as_chief(cluster: Any, task: Any) -> Tuple[Any, Any]:
  """`cluster` and `task` with a "master" job and task type read as "chief"."""
  if isinstance(cluster, dict) and MASTER in cluster:
    if CHIEF in cluster:
      raise TFConfigError(
          "TF_CONFIG cluster has both a 'chief' and a 'master' job; they name the same task "
          "(Vertex AI writes one of them): keep one.")
    cluster = {(CHIEF if job == MASTER else job): a for job, a in cluster.items()}
  if isinstance(task, dict) and task.get("type") == MASTER:
    task = dict(task, type=CHIEF)
  return cluster, task


def write_master_as_chief(environ: Optional[Dict[str, str]] = None) -> None:
  """Rewrites TF_CONFIG with a "master" job and task type as "chief", other keys kept, so
  TensorFlow (MultiWorkerMirroredStrategy, the Estimator's RunConfig) reads the task
  parse_tf_config reads. Call it after parse_tf_config accepted TF_CONFIG."""
  environ = os.environ if environ is None else environ
  raw = environ.get("TF_CONFIG", "").strip()
  tf_config = json.loads(raw) if raw else {}
  if not isinstance(tf_config, dict):
    return
  cluster, task = _as_chief(tf_config.get("cluster"), tf_config.get("task"))
  if (cluster, task) != (tf_config.get("cluster"), tf_config.get("task")):
    environ["TF_CONFIG"] = json.dumps(dict(tf_config, cluster=cluster, task=task))


def _check_cluster(cluster: Any) -> None:
  """Raises TFConfigError unless `cluster` maps known jobs to lists of distinct 'host:port'."""
  if not isinstance(cluster, dict):
    raise TFConfigError(
        f"TF_CONFIG cluster must be an object mapping job names to lists of 'host:port', "
        f"got {_json_type(cluster)}; e.g. \"cluster\": {{\"worker\": [\"host0:2222\", "
        "\"host1:2222\"]}. Leave it out to run one local process."
    )
  extra_jobs = sorted(set(cluster) - set(TASK_TYPES))
  if extra_jobs:
    raise TFConfigError(
        f"TF_CONFIG cluster has job(s) {extra_jobs}; this project runs 'chief' (or "
        "'master'), 'worker' and 'ps' jobs plus an optional 'evaluator' task."
    )
  seen: Dict[str, str] = {}
  for job, addresses in cluster.items():
    if not isinstance(addresses, list) or not addresses:
      raise TFConfigError(
          f"TF_CONFIG cluster.{job} must be a non-empty list of 'host:port', got "
          f"{_json_type(addresses)}; e.g. \"{job}\": [\"host0:2222\"]."
      )
    for i, address in enumerate(addresses):
      field = f"cluster.{job}[{i}]"
      _check_address(field, address)
      if address.lower() in seen:
        raise TFConfigError(
            f"TF_CONFIG {field} and {seen[address.lower()]} are both {address!r}: "
            "every task needs its own 'host:port'; give one of them another port."
        )
      seen[address.lower()] = field
  for job in (CHIEF, EVALUATOR):
    if len(cluster.get(job, [])) > 1:
      raise TFConfigError(
          f"TF_CONFIG cluster.{job} must list exactly one task, got {len(cluster[job])}; "
          + ("list the others under 'worker'." if job == CHIEF else "remove the others.")
      )
  if not set(cluster) & {CHIEF, WORKER}:
    raise TFConfigError("TF_CONFIG cluster has no 'chief' or 'worker' job: nothing trains.")
  if PS in cluster and CHIEF not in cluster:
    raise TFConfigError(
        "TF_CONFIG cluster has 'ps' tasks but no 'chief' job: a cluster with parameter "
        "servers needs one (the Estimator's chief trains and saves there, Keras's "
        "coordinator runs there); name one task 'chief' in every task's cluster.")


def _check_address(field: str, address: Any) -> None:
  """Raises TFConfigError unless `address` is a 'host:port' string with a port in 1..65535."""
  if not isinstance(address, str):
    raise TFConfigError(
        f"TF_CONFIG {field} must be a 'host:port' string, got {_json_type(address)}; "
        "write each address as one string, e.g. \"localhost:2222\", not \"localhost\", 2222."
    )
  host, colon, port = address.rpartition(":")
  if (not colon or not host or any(c.isspace() for c in address)
      or not (port.isascii() and port.isdigit())):
    raise TFConfigError(
        f"TF_CONFIG {field} is {address!r}, not 'host:port'; write it like \"localhost:2222\"."
    )
  if not 1 <= int(port) <= 65535:
    raise TFConfigError(
        f"TF_CONFIG {field} {address!r} has port {int(port)}; a port is 1 to 65535."
    )


def _check_task(task: Any, cluster: Dict[str, List[str]]) -> Tuple[str, int]:
  """This task's (type, index), or TFConfigError naming the field and the fix."""
  example = '"task": {"type": "worker", "index": 0}'
  if task is None:
    raise TFConfigError(
        f"TF_CONFIG has a cluster but no task; name this process's, e.g. {example}."
    )
  if not isinstance(task, dict):
    raise TFConfigError(
        f"TF_CONFIG task must be an object with 'type' and 'index', got {_json_type(task)}; "
        f"e.g. {example}."
    )
  task_type = task.get("type")
  if task_type is None:
    raise TFConfigError(
        f"TF_CONFIG task has no 'type'; use one of {list(TASK_TYPES)}, e.g. {example}."
    )
  if not isinstance(task_type, str) or task_type not in TASK_TYPES:
    got = repr(task_type) if isinstance(task_type, str) else _json_type(task_type)
    raise TFConfigError(
        f"TF_CONFIG task.type {got} is not run here; use one of {list(TASK_TYPES)}."
    )
  if task_type != EVALUATOR and task_type not in cluster:
    raise TFConfigError(
        f"TF_CONFIG task.type {task_type!r} has no job in the cluster, which has "
        f"{sorted(cluster)}; use one of those, or add the job to every task's cluster."
    )
  if "index" not in task:
    raise TFConfigError(
        f"TF_CONFIG task has no 'index'; give this task's position in cluster.{task_type}, "
        f'e.g. "task": {{"type": "{task_type}", "index": 0}}.'
    )
  index = task["index"]
  if isinstance(index, bool) or not isinstance(index, int) or index < 0:
    raise TFConfigError(
        f"TF_CONFIG task.index must be a non-negative integer, got {_json_type(index)}; "
        "write it as a number: 0, 1, ..."
    )
  count = 1 if task_type == EVALUATOR else len(cluster[task_type])
  if index >= count:
    if task_type == EVALUATOR:
      raise TFConfigError(f"There is one evaluator, index 0; got task.index {index}.")
    raise TFConfigError(
        f"TF_CONFIG task.index {index} is out of range: the cluster has {count} "
        f"{task_type} task(s), indices 0 to {count - 1}."
    )
  return task_type, index


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
          f"Port {port} of {task.name} ({task.address} in TF_CONFIG) cannot be bound: "
          f"{e.strerror}. "
          "Stop the program using it, or give this task a free port in every task's TF_CONFIG "
          "(python -m launch.local picks free ports)."
      ) from e
