"""Kubeflow TFJob manifests (Training Operator v1, `kubeflow.org/v1`) for the trainers.

One Chief and N-1 Worker replicas train, as `--workers=N` does locally, plus
an Evaluator replica (the Estimator needs it at N > 1; Keras runs
SidecarEvaluator there). With `ps` PS replicas both train on parameter
servers, as `--ps` does locally: Keras's Chief then coordinates N Workers.
The operator writes each pod's TF_CONFIG in the shape `launch.cluster` reads
(lower-cased job names, every replica in every cluster, `"environment":
"cloud"`, none for a one-replica job).

Restarts follow our exit codes (README, "Exit codes"): `restartPolicy:
ExitCode` retries 128-255 (a lost peer, `exit_codes.PEER_LOST`, or a
pod killed by a signal) and never retries 1-127 (a usage error, a diverged
run, a full disk, a bug); a preempted pod saves the step its cluster stops at and
exits 143 within its `terminationGracePeriodSeconds`, set from `--grace_seconds`.
A NetworkPolicy lets only the job's own pods reach
its unauthenticated gRPC servers. No TensorFlow import here.
"""

import copy
import dataclasses
import math
import re
from typing import Any, Dict, List, Sequence, Tuple

import yaml
from absl import flags

from launch import supervisor
from trainers import flags as trainer_flags
from trainers import runner
from trainers.config import Config

API_VERSION = "kubeflow.org/v1"
CONTAINER = "tensorflow"  # The webhook requires it: the operator puts TF_CONFIG in it.
PORT, PORT_NAME = 2222, "tfjob-port"  # The operator's defaults; the address in TF_CONFIG.
JOB_NAME_LABEL = "training.kubeflow.org/job-name"  # Set by the operator on every pod.
RESTART_POLICY = "ExitCode"
CLEAN_POD_POLICY = "Running"  # A finished job's pods stay, for `kubectl logs`, but none runs.
# Flags the manifest sets itself, or that mean nothing in a pod (the operator
# starts, supervises and restarts the tasks).
OWN_FLAGS = ("workers", "ps", "model_dir", "evaluator", "max_restarts", "stall_timeout",
             "timeout", "task_log_dir")
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
                       r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")


@dataclasses.dataclass(frozen=True)
class JobSpec:
  """What a TFJob runs.

  Attributes:
    backend: "keras" or "estimator".
    workers: training replicas (Chief and Worker).
    image: the container image (see the Dockerfile).
    model_dir: where every pod reads and writes the run: a path under
      `mount_path`, on the PersistentVolumeClaim `pvc`.
    pvc: a ReadWriteMany PersistentVolumeClaim every pod mounts.
    evaluator: with workers > 1 or parameter servers, an Evaluator replica.
    ps: PS replicas (parameter servers): the Estimator's Chief and Workers each step
      alone; Keras's Chief coordinates `workers` Worker replicas.
    name, namespace: the TFJob's.
    mount_path: where the claim is mounted in each pod.
    cpu, memory: each pod's requests (memory is its limit too).
    backoff_limit: pod restarts before the job fails (a lost peer restarts every
      pod: with 2 workers, each loss uses up to 2).
    trainer_args: more trainer flags, e.g. ("--train_steps=3000",).
  """

  backend: str
  workers: int
  image: str
  model_dir: str
  pvc: str
  evaluator: bool = True
  ps: int = 0
  name: str = "mnist"
  namespace: str = "default"
  mount_path: str = "/train"
  cpu: str = "2"
  memory: str = "4Gi"
  backoff_limit: int = 3
  trainer_args: Tuple[str, ...] = ()

  @property
  def replicas(self) -> Dict[str, int]:
    """Replica type -> count, as the TFJob's `tfReplicaSpecs` has them."""
    counts = {"Chief": 1}
    # Keras's chief coordinates on parameter servers: --workers Workers compute.
    workers = self.workers - 1 + runner.coordinated(self.backend, self.ps)
    if workers:
      counts["Worker"] = workers
    if self.evaluator and (self.workers > 1 or self.ps):
      counts["Evaluator"] = 1
    if self.ps:
      counts["PS"] = self.ps
    return counts


def validate(spec: JobSpec) -> Config:
  """Checks `spec` as a user's input; returns the Config its trainer flags give.

  Raises:
    ValueError: naming what is wrong and how to fix it.
  """
  if spec.backend not in runner.BACKENDS:
    raise ValueError(f"--backend must be keras or estimator, got {spec.backend!r}.")
  if spec.workers < 1:
    raise ValueError(f"--workers must be at least 1, got {spec.workers}.")
  if spec.ps < 0:
    raise ValueError(f"--ps must be at least 0, got {spec.ps}.")
  if spec.backoff_limit < 0:
    raise ValueError(f"--backoff_limit must be at least 0, got {spec.backoff_limit}.")
  if spec.backend == "estimator" and spec.workers > 1 and not spec.evaluator:
    raise ValueError("--noevaluator is for Keras: a multi-worker Estimator evaluates only in "
                     "its Evaluator replica.")
  # Every pod's name (<name>-<type>-<i>) is a DNS label too: this one is at least as
  # long as any (evaluator is the longest type; the highest index is below workers or ps).
  longest = f"{spec.name}-evaluator-{max(spec.workers - 1, spec.ps - 1, 0)}"
  if not _DNS_1035.match(spec.name) or len(longest) > 63:
    raise ValueError(f"--name {spec.name!r} must be a DNS-1035 label (lower-case letters, digits "
                     f"and '-', starting with a letter) short enough that {longest!r} has at "
                     "most 63 characters.")
  if not _DNS_1035.match(spec.namespace) or len(spec.namespace) > 63:
    raise ValueError(f"--namespace {spec.namespace!r} must be a DNS label.")
  if not spec.image or any(c.isspace() for c in spec.image):
    raise ValueError(f"--image must name an image, e.g. registry.example.com/mnist:1, got "
                     f"{spec.image!r}.")
  if not _DNS_1123_SUBDOMAIN.match(spec.pvc) or len(spec.pvc) > 253:
    raise ValueError(f"--pvc must name a PersistentVolumeClaim, got {spec.pvc!r}.")
  mount = spec.mount_path.rstrip("/")
  if not mount.startswith("/") or not spec.model_dir.startswith(mount + "/"):
    raise ValueError(
        f"--model_dir {spec.model_dir!r} is not under --mount_path {spec.mount_path!r}: every "
        "pod must read and write the same model_dir, on the shared claim (--pvc). Cloud "
        "storage URLs (gs://) are not supported: the chief's records and checkpoint set-aside "
        "use POSIX file operations.")
  for name, value in (("cpu", spec.cpu), ("memory", spec.memory)):
    if not _QUANTITY.match(value):
      raise ValueError(f"--{name} must be a Kubernetes quantity (e.g. 2, 500m, 4Gi), got "
                       f"{value!r}.")
  flag_values, extra = _trainer_flags(spec)
  if extra:
    raise ValueError(f"Unexpected arguments: {' '.join(extra)} (trainer flags look like "
                     "--train_steps=3000).")
  own = sorted(name for name in OWN_FLAGS if flag_values[name].present)
  if own:
    raise ValueError(f"--{', --'.join(own)}: set by this tool's own flags or meaningless in "
                     "a pod (the operator starts and restarts the tasks); leave them out.")
  config = trainer_flags.config_from_flags(flag_values)
  runner.check_parameter_servers(spec.backend, config, spec.ps, spec.evaluator, spec.workers)
  config.validate(num_replicas=spec.workers, find_model=False)  # It is in the image.
  return config


def _trainer_flags(spec: JobSpec) -> Tuple[flags.FlagValues, List[str]]:
  """The trainer's flags as `spec.trainer_args` set them, and any other arguments.

  Raises:
    ValueError: a bad trainer flag.
  """
  flag_values = flags.FlagValues()
  trainer_flags.define_flags(flag_values)
  try:
    extra = flag_values(["trainer", *spec.trainer_args])[1:]
  except flags.Error as e:
    raise ValueError(f"Trainer flags after --: {e}") from e
  return flag_values, extra


def termination_grace_seconds(spec: JobSpec) -> int:
  """The pods' `terminationGracePeriodSeconds`: the trainer's --grace_seconds to save on
  SIGTERM, and the launcher's margin, before Kubernetes sends SIGKILL."""
  grace = _trainer_flags(spec)[0]["grace_seconds"].value
  return math.ceil(grace + supervisor.GRACE_MARGIN_SECONDS)


def trainer_command(spec: JobSpec) -> List[str]:
  """The command every replica runs: the same binary; TF_CONFIG tells each its task."""
  return ["python", "-m", f"trainers.{spec.backend}_main", f"--workers={spec.workers}",
          *([f"--ps={spec.ps}"] if spec.ps else []), f"--model_dir={spec.model_dir}",
          *spec.trainer_args]


def tfjob(spec: JobSpec) -> Dict[str, Any]:
  """The TFJob manifest for `spec` (validate it first)."""
  container = {
      "name": CONTAINER,
      "image": spec.image,
      "command": trainer_command(spec),
      "ports": [{"name": PORT_NAME, "containerPort": PORT}],
      "resources": {"requests": {"cpu": spec.cpu, "memory": spec.memory},
                    "limits": {"memory": spec.memory}},
      "volumeMounts": [{"name": "model-dir", "mountPath": spec.mount_path}],
  }
  # The image's user (see the Dockerfile); fsGroup makes the claim writable to it.
  template = {"spec": {"securityContext": {"runAsUser": 1000, "runAsGroup": 1000,
                                           "fsGroup": 1000},
                       # The pod's pause process is then PID 1, not the trainer, which as
                       # PID 1 would ignore the start-up watchdog's SIGALRM (no handler
                       # of its can run while TensorFlow holds the interpreter).
                       "shareProcessNamespace": True,
                       "terminationGracePeriodSeconds": termination_grace_seconds(spec),
                       "containers": [container],
                       "volumes": [{"name": "model-dir",
                                    "persistentVolumeClaim": {"claimName": spec.pvc}}]}}
  return {
      "apiVersion": API_VERSION,
      "kind": "TFJob",
      "metadata": {"name": spec.name, "namespace": spec.namespace},
      "spec": {
          "runPolicy": {"cleanPodPolicy": CLEAN_POD_POLICY,
                        "backoffLimit": spec.backoff_limit},
          "tfReplicaSpecs": {
              rtype: {"replicas": n, "restartPolicy": RESTART_POLICY,
                      "template": copy.deepcopy(template)}
              for rtype, n in spec.replicas.items()},
      },
  }


def network_policy(spec: JobSpec) -> Dict[str, Any]:
  """Lets only the job's own pods connect to its pods (their gRPC servers are unauthenticated)."""
  pods = {"matchLabels": {JOB_NAME_LABEL: spec.name}}
  return {
      "apiVersion": "networking.k8s.io/v1",
      "kind": "NetworkPolicy",
      "metadata": {"name": f"{spec.name}-tasks-only", "namespace": spec.namespace},
      "spec": {"podSelector": pods, "policyTypes": ["Ingress"],
               "ingress": [{"from": [{"podSelector": pods}]}]},
  }


def manifests(spec: JobSpec, with_network_policy: bool = True) -> List[Dict[str, Any]]:
  """The objects to `kubectl apply`: the TFJob, then (by default) its NetworkPolicy."""
  validate(spec)
  return [tfjob(spec)] + ([network_policy(spec)] if with_network_policy else [])


class _Dumper(yaml.SafeDumper):
  """Writes repeated parts (each replica's pod template) in full: no YAML anchors."""

  def ignore_aliases(self, data: Any) -> bool:
    return True


def to_yaml(objects: Sequence[Dict[str, Any]]) -> str:
  """One YAML stream, a document per object, keys in the order written."""
  return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, default_flow_style=False)

