"""How to run, as opposed to what to train (that is the `Config`): `RunOptions`, declared once.

Each field with a help text is the trainer binaries' flag of the same name, with the field's
type and default (`trainers.flags` defines them from here); `relaunch` and `verbosity` come
from the command line and absl's own flag. TensorFlow-free: a launcher reads it before any
task starts.
"""

import dataclasses
from typing import Any, Optional, Sequence

from launch import restarts
from trainers import preemption


def _flag(default: Any, help_text: str) -> Any:
  return dataclasses.field(default=default, metadata={"help": help_text})


@dataclasses.dataclass(frozen=True)
class RunOptions:
  """How to run: the workers, the directories, the limits (see each field's help)."""

  workers: Optional[int] = _flag(
      None, "Training workers (default: as many as TF_CONFIG's cluster has, else 1). Above 1, "
      "this process starts a local cluster with one process per worker, plus an evaluator "
      "(see --evaluator). A process with TF_CONFIG set runs as that task.")
  ps: Optional[int] = _flag(
      None, "Parameter servers (default: as many as TF_CONFIG's cluster has, else 0). Above "
      "0 the variables live on the ps tasks and --workers processes compute gradients, each "
      "stepping alone (asynchronously): the Estimator's chief and --workers - 1 workers "
      "(its parameter-server mode); Keras's --workers workers, which a chief that computes "
      "nothing steps (ParameterServerStrategy). This process starts them as a local "
      "cluster.")
  evaluator: bool = _flag(
      True, "With --workers > 1: also run an 'evaluator' task that evaluates each checkpoint "
      "off the training path (Keras: SidecarEvaluator). Keras only: --noevaluator evaluates "
      "on the chief instead, while the workers wait.")
  model_dir: Optional[str] = _flag(
      None, "Output directory: events, checkpoints, export, summary.json, progress.jsonl. "
      "Default: a new directory under the system temp dir. On one that holds a run, the "
      "flags left out take the values its run.json records.")
  max_restarts: int = _flag(
      restarts.DEFAULT_MAX_RESTARTS, "With --workers > 1: times every task is started again "
      "(resuming from the last backup or checkpoint) after one fails.")
  stall_timeout: Optional[float] = _flag(
      300.0, "With --workers > 1: seconds without output from any training task (the "
      "evaluator's does not count) before the run is stopped as hung.")
  timeout: Optional[float] = _flag(
      None, "With --workers > 1: seconds before the whole run is stopped and the launcher "
      "exits non-zero.")
  startup_timeout: float = _flag(
      600.0, "Seconds a training task waits for every other training task of its TF_CONFIG "
      "cluster to start, saying whom it waits for; then it exits 142, which the launcher and "
      "orchestrators retry.")
  grace_seconds: float = _flag(
      preemption.DEFAULT_GRACE_SECONDS, "Seconds a task may take, after SIGTERM, to stop at a "
      "step every training task agrees on, save it and exit 143, which orchestrators retry; a "
      "second SIGTERM stops at once. Keep it below the orchestrator's grace period "
      "(Kubernetes: 30 s). A local cluster's launcher gives its tasks this long, plus 5 s, "
      "before SIGKILL.")
  task_log_dir: Optional[str] = _flag(
      None, "With --workers > 1: where each task's log and tasks.json go. Default: "
      "<model_dir>/logs.")
  fork_tasks: bool = _flag(
      True, "With --workers > 1 and no --ps: start the tasks by forking them from one "
      "process that has imported TensorFlow (launch.zygote), sparing each task its imports "
      "(4 to 5 CPU-s); --nofork_tasks starts each as a process of its own.")
  allow_config_change: bool = _flag(
      False, "Resume a model_dir whose run had other settings (model options, batch, the "
      "optimizer's hyperparameters, seed, schedule; see its run.json): the change is recorded "
      "in progress.jsonl. Without it such a resume exits 2, listing the differences. The "
      "optimizer itself cannot change.")
  mnist_idx_dir: Optional[str] = _flag(
      None, "If MNIST is not prepared in --data_dir: prepare it from the four MNIST IDX files "
      "in this directory (default: $MNIST_IDX_DIR), with no network. Without either, TFDS "
      "downloads it.")
  # The command line that runs this binary again, for each task of a local cluster.
  relaunch: Sequence[str] = ()
  # absl's --verbosity: below 1 the terminal shows the run's own lines, warnings and
  # errors, not TensorFlow's INFO logs (launch.console).
  verbosity: int = 0


FLAG_FIELDS = tuple(f for f in dataclasses.fields(RunOptions) if "help" in f.metadata)


def flag(name: str) -> str:
  """The flag that sets the field `name`, as messages name it (`--mnist_idx_dir`)."""
  if name not in {f.name for f in FLAG_FIELDS}:
    raise KeyError(f"RunOptions.{name} is not a flag")
  return f"--{name}"
