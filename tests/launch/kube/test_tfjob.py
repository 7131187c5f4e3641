"""launch.tfjob: every manifest it writes passes Kubeflow's schema and webhook rules, offline.

The CRD's schema (../shared/schemas/kubeflow-tfjob/kubeflow.org_tfjobs.yaml)
checks types only. `_Validator` adds what the API server and the operator
add: unknown fields are rejected, the allowed values from the Go types
(common_types.go, tensorflow_types.go), and the webhook's rules
(tfjob_webhook.go). Left out: util.ValidateRunPolicy (not among the shared
sources) and the CEL rule on schedulingPolicy.queue (updates only).
"""

import copy
import os
import pathlib
import re
from typing import Any, Dict, List

import pytest
import yaml

from launch import cluster
from launch import exit_codes
from launch.proofs import runs
from launch.kube import tfjob
from tests.conftest import REPO, kubeflow_tf_configs, run_module

SCHEMA_DIR = pathlib.Path(os.environ.get("KUBEFLOW_SCHEMA_DIR",
                                         REPO.parent / "shared/schemas/kubeflow-tfjob"))
# From the Go types: the values each string field may take.
ALLOWED = {
    "spec.tfReplicaSpecs": {"PS", "Worker", "Chief", "Master", "Evaluator"},  # Map keys.
    "spec.tfReplicaSpecs.*.restartPolicy": {"Always", "OnFailure", "Never", "ExitCode"},
    "spec.runPolicy.cleanPodPolicy": {"All", "Running", "None"},
    "spec.successPolicy": {"", "AllWorkers"},
    "spec.runPolicy.managedBy": {"kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue"},
}
METADATA_FIELDS = {"name", "namespace", "labels", "annotations"}
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int,
          "number": (int, float)}


class _Validator:
  """The CRD's openAPIV3Schema, made strict; `errors(manifest)` lists what is wrong."""

  def __init__(self, crd: Dict[str, Any]):
    version = crd["spec"]["versions"][0]
    self.api_version = f"{crd['spec']['group']}/{version['name']}"
    self.kind = crd["spec"]["names"]["kind"]
    self.schema = version["schema"]["openAPIV3Schema"]

  def errors(self, manifest: Dict[str, Any]) -> List[str]:
    found: List[str] = []
    if manifest.get("apiVersion") != self.api_version or manifest.get("kind") != self.kind:
      found.append(f"apiVersion/kind: want {self.api_version} {self.kind}")
    metadata = manifest.get("metadata") or {}
    found += [f"metadata.{k}: unknown field" for k in set(metadata) - METADATA_FIELDS]
    name = metadata.get("name", "")
    if not _DNS_1035.match(name) or len(name) > 63:
      found.append(f"metadata.name: {name!r} is not a DNS-1035 label")
    self._check(manifest, self.schema, "", found)
    found += self._webhook(manifest.get("spec") or {})
    return found

  def _check(self, value: Any, schema: Dict[str, Any], path: str, found: List[str]) -> None:
    if "anyOf" in schema:
      options = [[] for _ in schema["anyOf"]]
      for option, errs in zip(schema["anyOf"], options):
        self._check(value, {**option, **{k: v for k, v in schema.items() if k != "anyOf"}},
                    path, errs)
      if all(options):
        found.append(f"{path}: {value!r} matches none of {schema['anyOf']}: {options}")
      return
    kind = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
      ok = isinstance(value, (int, str)) and not isinstance(value, bool)
    else:
      ok = kind is None or (isinstance(value, _TYPES[kind]) and
                            not (kind in ("integer", "number") and isinstance(value, bool)))
    if not ok:
      found.append(f"{path}: {value!r} is not {kind}")
      return
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"],
                                                                         value):
      found.append(f"{path}: {value!r} does not match {schema['pattern']}")
    allowed = ALLOWED.get(re.sub(r"\.(Chief|Worker|Evaluator|PS|Master)\b", ".*", path[1:]))
    if allowed is not None and isinstance(value, str) and value not in allowed:
      found.append(f"{path}: {value!r} is not one of {sorted(allowed)}")
    if isinstance(value, dict):
      for key in schema.get("required", []):
        if key not in value:
          found.append(f"{path}.{key}: required")
      properties = schema.get("properties", {})
      extra = schema.get("additionalProperties")
      keys_allowed = ALLOWED.get(path[1:]) if isinstance(extra, dict) else None
      for key, item in value.items():
        if key in properties:
          self._check(item, properties[key], f"{path}.{key}", found)
        elif isinstance(extra, dict):
          if keys_allowed is not None and key not in keys_allowed:
            found.append(f"{path}.{key}: not one of {sorted(keys_allowed)}")
          self._check(item, extra, f"{path}.{key}", found)
        elif properties and not schema.get("x-kubernetes-preserve-unknown-fields"):
          found.append(f"{path}.{key}: unknown field")
    if isinstance(value, list) and "items" in schema:
      for i, item in enumerate(value):
        self._check(item, schema["items"], f"{path}[{i}]", found)

  @staticmethod
  def _webhook(spec: Dict[str, Any]) -> List[str]:
    """tfjob_webhook.go's validateTFReplicaSpecs."""
    replicas = spec.get("tfReplicaSpecs")
    if not replicas:
      return ["spec.tfReplicaSpecs: must be required"]
    found = []
    for rtype, rspec in replicas.items():
      containers = ((rspec or {}).get("template") or {}).get("spec", {}).get("containers") or []
      if not containers:
        found.append(f"spec.tfReplicaSpecs.{rtype}: containers must be specified")
      found += [f"spec.tfReplicaSpecs.{rtype}: container {i} has no image"
                for i, c in enumerate(containers) if not c.get("image")]
      if not any(c.get("name") == tfjob.CONTAINER for c in containers):
        found.append(f"spec.tfReplicaSpecs.{rtype}: no container named {tfjob.CONTAINER}")
    if sum(rtype in ("Chief", "Master") for rtype in replicas) > 1:
      found.append("spec.tfReplicaSpecs: must not have more than 1 Chief or Master role")
    return found


@pytest.fixture(scope="module")
def validator() -> _Validator:
  crd_path = SCHEMA_DIR / "kubeflow.org_tfjobs.yaml"
  if not crd_path.exists():
    pytest.skip(f"Kubeflow's TFJob CRD not found at {crd_path} (set KUBEFLOW_SCHEMA_DIR)")
  return _Validator(yaml.safe_load(crd_path.read_text()))


def _spec(**changes) -> tfjob.JobSpec:
  base = dict(backend="keras", workers=2, image="registry.example.com/mnist:1",
              model_dir="/train/mnist", pvc="mnist-runs")
  return tfjob.JobSpec(**{**base, **changes})


EVERY_SHAPE = [dict(backend=b, workers=n, evaluator=e, ps=p)
               for b in runs.BACKENDS for n in (1, 2, 4) for e in (True, False) for p in (0, 2)
               if not (b == "estimator" and n > 1 and not e) and not (b == "keras" and p
                                                                     and not e)]


@pytest.mark.parametrize("shape", EVERY_SHAPE, ids=lambda s: "-".join(map(str, s.values())))
def test_every_manifest_it_writes_is_valid_and_gets_the_tf_config_the_trainers_read(
    validator, shape):
  spec = _spec(name="mnist-run", namespace="team-a", **shape)
  job, policy = yaml.safe_load_all(tfjob.to_yaml(tfjob.manifests(spec)))
  assert validator.errors(job) == []
  replicas = {rtype: r["replicas"] for rtype, r in job["spec"]["tfReplicaSpecs"].items()}
  evaluator = (shape["workers"] > 1 or shape["ps"] > 0) and shape["evaluator"]
  # On parameter servers Keras's chief coordinates: --workers Worker replicas compute.
  workers = shape["workers"] - (shape["backend"] == "estimator" or not shape["ps"])
  assert replicas == {"Chief": 1, **({"Worker": workers} if workers else {}),
                      **({"Evaluator": 1} if evaluator else {}),
                      **({"PS": shape["ps"]} if shape["ps"] else {})}
  assert {r["restartPolicy"] for r in job["spec"]["tfReplicaSpecs"].values()} == {"ExitCode"}
  # The trainer is not the pod's PID 1, which would ignore the start-up watchdog's SIGALRM.
  assert {r["template"]["spec"]["shareProcessNamespace"]
          for r in job["spec"]["tfReplicaSpecs"].values()} == {True}
  container = job["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]
  assert container["command"][:3] == ["python", "-m", f"trainers.{shape['backend']}_main"]
  assert f"--workers={shape['workers']}" in container["command"]
  assert (f"--ps={shape['ps']}" in container["command"]) == bool(shape["ps"])
  assert policy["spec"]["podSelector"]["matchLabels"] == {tfjob.JOB_NAME_LABEL: "mnist-run"}

  # Each pod's TF_CONFIG, as the operator writes it, is one the trainers run.
  tasks = {pod: cluster.parse_tf_config({"TF_CONFIG": raw} if raw else {})
           for pod, raw in kubeflow_tf_configs("mnist-run", "team-a", replicas).items()}
  if shape["workers"] == 1 and not shape["ps"]:
    assert tasks == {"chief-0": None}  # No TF_CONFIG: one process, as --workers=1 locally.
    return
  assert [pod for pod, task in tasks.items() if task.is_chief] == ["chief-0"]
  assert {task.num_workers for task in tasks.values()} == {workers + 1}
  # The trainer's own check: the --ps in the command is the ps tasks TF_CONFIG lists.
  assert {task.num_ps for task in tasks.values()} == {shape["ps"]}
  assert {task.has_evaluator for task in tasks.values()} == {evaluator}
  assert tasks["chief-0"].address == f"mnist-run-chief-0.team-a.svc:{tfjob.PORT}"


@pytest.mark.parametrize("path, bad, error", [
    (("spec", "tfReplicaSpecs", "Worker", "restartPolicy"), "OnFailur", "is not one of"),
    (("spec", "runPolicy", "cleanPodPolicy"), "all", "is not one of"),
    (("spec", "tfReplicaSpecs", "Worker", "replicas"), "2", "is not integer"),
    (("spec", "tfReplicaSpecs", "Worker", "template", "spec", "containers", 0, "name"),
     "tf", "no container named tensorflow"),
    (("spec", "tfReplicaSpecs", "Worker", "template", "spec", "containers", 0, "image"),
     "", "has no image"),
    (("spec", "tfReplicaSpecs", "Worker", "template", "spec", "containers", 0, "resources",
      "requests", "memory"), "4 GiB", "matches none of"),
    (("metadata", "name"), "MNIST", "not a DNS-1035 label"),
])
def test_a_typo_in_a_manifest_is_caught(validator, path, bad, error):
  job = tfjob.manifests(_spec())[0]
  broken = copy.deepcopy(job)
  node = broken
  for key in path[:-1]:
    node = node[key]
  node[path[-1]] = bad
  assert any(error in e for e in validator.errors(broken)), validator.errors(broken)


@pytest.mark.parametrize("change, error", [
    (lambda s: s["tfReplicaSpecs"].__setitem__("Evaluater", s["tfReplicaSpecs"].pop("Worker")),
     "Evaluater: not one of"),
    (lambda s: s["tfReplicaSpecs"]["Worker"].__setitem__("replica", 2), "replica: unknown field"),
    (lambda s: s["tfReplicaSpecs"].__setitem__("Master", s["tfReplicaSpecs"]["Chief"]),
     "more than 1 Chief or Master"),
    (lambda s: s["runPolicy"].__setitem__("cleanPodPolicies", "None"), "unknown field"),
])
def test_a_wrong_replica_type_or_field_is_caught(validator, change, error):
  job = copy.deepcopy(tfjob.manifests(_spec())[0])
  change(job["spec"])
  assert any(error in e for e in validator.errors(job)), validator.errors(job)


def test_the_upstream_example_passes(validator):
  """The validator is not stricter than the operator: Kubeflow's own example passes."""
  example = yaml.safe_load((SCHEMA_DIR / "example-multi_worker_tfjob.yaml").read_text())
  assert validator.errors(example) == []


def test_restarts_retry_exactly_the_retryable_exit_codes():
  """TFJob's ExitCode policy retries 128-255 and never 1-127 (common_types.go)."""
  assert tfjob.RESTART_POLICY == "ExitCode"
  assert exit_codes.PEER_LOST >= 128 and exit_codes.STARTUP_TIMEOUT >= 128
  assert all(1 <= code < 128 for code in exit_codes.NOT_RETRIED)


@pytest.mark.parametrize("changes, error", [
    (dict(backend="estimator", evaluator=False), "--noevaluator is for Keras"),
    (dict(model_dir="gs://bucket/mnist"), "is not under --mount_path"),
    (dict(model_dir="/data/mnist"), "is not under --mount_path"),
    (dict(name="Mnist_Run"), "DNS-1035"),
    (dict(name="a" * 60), "at most 63 characters"),
    (dict(memory="4 GB"), "Kubernetes quantity"),
    (dict(workers=0), "at least 1"),
    (dict(ps=-1), "--ps must be at least 0"),
    (dict(ps=1, evaluator=False), "--noevaluator (or a TF_CONFIG with no evaluator task)"),
    (dict(backend="estimator", ps=1, trainer_args=("--early_stopping_metric=loss",)),
     "--early_stopping_metric is not run on parameter servers"),
    (dict(name="a" * 50, backend="estimator", ps=300), "at most 63 characters"),
    (dict(trainer_args=("--train_steps=abc",)), "Trainer flags after --"),
    (dict(trainer_args=("--model_dir=/tmp/x",)), "--model_dir: set by this tool"),
    (dict(trainer_args=("--batch_size=7",)), "Trainer flags after --"),
    (dict(trainer_args=("--global_batch_size=7",)), "divisible"),
    (dict(trainer_args=("--model=resnet",)), "unknown model 'resnet'"),
    (dict(trainer_args=("--estimator_program=team.program",)),
     "unknown estimator program 'team.program'"),
])
def test_bad_input_is_refused_naming_the_fix(changes, error):
  with pytest.raises(ValueError, match=re.escape(error)):
    tfjob.manifests(_spec(**changes))


def test_a_users_model_need_only_be_in_the_image():
  args = ("--model=team_models_in_the_image:SPEC", "--model_options=dropout=0")
  assert tfjob.validate(_spec(trainer_args=args)).model == "team_models_in_the_image:SPEC"
  program = "--estimator_program=team_programs_in_the_image:PROGRAM"
  assert tfjob.validate(_spec(trainer_args=(program,))).estimator_program == program[20:]


def test_cli_writes_yaml_for_kubectl_and_refuses_bad_flags(validator):
  args = ["--backend=estimator", "--workers=3", "--image=registry.example.com/mnist:1",
          "--pvc=mnist-runs", "--namespace=team-a", "--ps=2", "--", "--train_steps=3000"]
  result = run_module("launch.tfjob", args, timeout=60)
  assert result.returncode == 0, result.stderr
  job, policy = yaml.safe_load_all(result.stdout)
  assert validator.errors(job) == [] and policy["kind"] == "NetworkPolicy"
  assert job["spec"]["tfReplicaSpecs"]["PS"]["replicas"] == 2
  command = job["spec"]["tfReplicaSpecs"]["Evaluator"]["template"]["spec"]["containers"][0][
      "command"]
  assert command[-4:] == ["--workers=3", "--ps=2", "--model_dir=/train/mnist",
                          "--train_steps=3000"]
  assert "&" not in result.stdout  # No YAML anchors: every replica's template in full.
  for bad in (["--workers=abc"], ["--", "--learning_rate=nan"], ["--", "stray"],
              ["--", "--ps=2"]):
    result = run_module("launch.tfjob", args[:5] + bad, timeout=60)
    assert result.returncode == 2 and result.stdout == "", (bad, result.stderr[-500:])


def test_the_dockerfile_installs_the_pinned_stack_and_every_package_the_manifest_runs():
  """The image cannot be built here (no Docker engine): this checks what it is built from."""
  dockerfile = (REPO / "Dockerfile").read_text()
  assert re.search(r"^FROM python:3\.11", dockerfile, re.M)
  assert re.search(r'pip install[^\n]*"?\.\[tf215\]"?', dockerfile)
  for package in ("data", "trainers", "launch"):
    assert re.search(rf"^COPY [^\n]*\b{package}\b", dockerfile, re.M), package
  ignored = (REPO / ".dockerignore").read_text().split()
  assert ".ci-venv*" in ignored and ".git" in ignored
