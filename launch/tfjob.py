r"""Writes a Kubeflow TFJob (and a NetworkPolicy) that trains on Kubernetes.

  python -m launch.tfjob --backend=estimator --workers=4 --image=REGISTRY/mnist:TAG \
      --pvc=mnist-runs [--model_dir=/train/mnist] [--noevaluator] [--ps=N] [--namespace=NS] \
      [-- TRAINER FLAGS, e.g. --train_steps=3000] > job.yaml
  kubectl apply -f job.yaml

Build the image with the Dockerfile at the repository root. Every pod mounts
the PersistentVolumeClaim --pvc (ReadWriteMany) at --mount_path, and
--model_dir must be on it. docs/kubernetes.md.
"""

import sys
from typing import Sequence

from absl import app
from absl import flags

from launch import console
from launch.kube import tfjob

_BACKEND = flags.DEFINE_enum("backend", None, ["keras", "estimator"], "Which trainer runs.",
                             required=True)
_WORKERS = flags.DEFINE_integer("workers", 2, "Training replicas: one Chief and N-1 Workers.")
_IMAGE = flags.DEFINE_string("image", None, "Container image built from the Dockerfile.",
                             required=True)
_PVC = flags.DEFINE_string("pvc", None, "A ReadWriteMany PersistentVolumeClaim that every pod "
                           "mounts at --mount_path: model_dir lives there.", required=True)
_MODEL_DIR = flags.DEFINE_string("model_dir", None, "The run's directory, under --mount_path "
                                 "(default: <mount_path>/<name>).")
_EVALUATOR = flags.DEFINE_bool("evaluator", True, "With --workers > 1: an Evaluator replica "
                               "(the Estimator needs it; Keras: --noevaluator evaluates on the "
                               "chief).")
_PS = flags.DEFINE_integer("ps", 0, "PS replicas: both backends train on parameter servers, "
                           "--workers replicas computing gradients (Keras: beside a Chief "
                           "that coordinates them).")
_NAME = flags.DEFINE_string("name", "mnist", "The TFJob's name (pods: <name>-<type>-<index>).")
_NAMESPACE = flags.DEFINE_string("namespace", "default", "The TFJob's namespace.")
_MOUNT_PATH = flags.DEFINE_string("mount_path", "/train", "Where --pvc is mounted in each pod.")
_CPU = flags.DEFINE_string("cpu", "2", "CPU request of each pod.")
_MEMORY = flags.DEFINE_string("memory", "4Gi", "Memory request and limit of each pod.")
_BACKOFF_LIMIT = flags.DEFINE_integer("backoff_limit", 3, "Pod restarts before the job fails.")
_NETWORK_POLICY = flags.DEFINE_bool("network_policy", True, "Also write a NetworkPolicy that "
                                    "lets only the job's pods reach its pods.")


def main(argv: Sequence[str]) -> None:
  spec = tfjob.JobSpec(
      backend=_BACKEND.value, workers=_WORKERS.value, image=_IMAGE.value, pvc=_PVC.value,
      model_dir=_MODEL_DIR.value or f"{_MOUNT_PATH.value.rstrip('/')}/{_NAME.value}",
      evaluator=_EVALUATOR.value, ps=_PS.value, name=_NAME.value, namespace=_NAMESPACE.value,
      mount_path=_MOUNT_PATH.value, cpu=_CPU.value, memory=_MEMORY.value,
      backoff_limit=_BACKOFF_LIMIT.value, trainer_args=tuple(argv[1:]))
  try:
    objects = tfjob.manifests(spec, with_network_policy=_NETWORK_POLICY.value)
  except ValueError as e:
    raise app.UsageError(str(e), exitcode=2) from e
  sys.stdout.write(tfjob.to_yaml(objects))


if __name__ == "__main__":
  app.run(main, flags_parser=console.parse_flags)
