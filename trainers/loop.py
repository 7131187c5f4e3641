"""The outer loop, written once for both backends: strategy, set-up, model, train, evaluate,
export, summary.

A backend supplies only what differs, as a `Backend` subclass built for one run:

  evaluate_checkpoints()  the evaluator task: evaluate each new checkpoint to the end
  train()                 train from wherever model_dir stands to config.train_steps
  evaluate(step)          the chief's own evaluation, when no evaluator task exists
  export()                write the SavedModel (--export=final); returns its directory
  export_evaluation(step, metrics)
                          the chief's evaluation exported as --export=latest|best says

`train_and_evaluate` runs them, decides which task does what (the evaluator
dispatch, the chief's share), sets aside what a divergence left, stops a preempted
run at the step its tasks agree on (trainers.preemption) and an early-stopped one at its
last step (trainers.early_stopping), waits for the evaluator's final result and writes the
summary.
"""

import abc
import dataclasses
from typing import Any, ClassVar, Dict, List, Optional, Type

import tensorflow as tf

from launch import cluster
from trainers import checkpoints
from trainers import distribute
from trainers import early_stopping
from trainers import evaluation
from trainers import export as export_lib
from trainers import failures
from trainers import inputs
from trainers import model_dir as layout
from trainers import preemption as preemption_lib
from trainers import program as program_lib
from trainers import progress
from trainers import step_duties as step_duties_lib
from trainers import warm_start as warm_start_lib
from trainers.config import Config


@dataclasses.dataclass(frozen=True)
class Run:
  """What a backend is given: the run's settings, and this task's place in it.

  Attributes:
    config: hyperparameters and run settings.
    model_dir: the run's directory (only the chief writes to it).
    input_fn: the input both backends read (inputs.default_input_fn, or a test's).
    task: this process's TF_CONFIG task; None for a lone process.
    strategy: the training strategy; None in the evaluator task; on parameter servers the
      backend's (Backend.parameter_server_strategy): the Estimator's default strategy (one
      replica, no collectives), each training task stepping alone; Keras's
      ParameterServerStrategy on the coordinating chief.
    chief: whether this task writes model_dir.
    chief_evaluates: no evaluator task exists, so the chief evaluates the final step.
    preemption: where a preemption stops training; the backend's loop asks it after
      every step (or execution), `if preemption.pending and preemption.reached(step)`,
      and on True ends as at its last step, saving the step it is at.
    warm_start: the values a training task starts its model from (--warm_start_from), or
      None: none asked, or the run resumes.
    early_stop: with --early_stopping_metric, where an early stop ends training (every
      training task), decided by the chief's checks (trainers.early_stopping).
  """

  config: Config
  model_dir: str
  input_fn: inputs.InputFn
  task: Optional[cluster.Task]
  strategy: Optional[tf.distribute.Strategy]
  chief: bool
  chief_evaluates: bool
  preemption: Optional[preemption_lib.Agreement] = None
  warm_start: Optional[warm_start_lib.Plan] = None
  early_stop: Optional[preemption_lib.Agreement] = None

  @property
  def workers(self) -> int:
    """The processes that compute gradients (not a coordinating chief's)."""
    if not self.on_parameter_servers:
      return distribute.num_workers(self.strategy)
    return self.task.num_workers - isinstance(self.strategy, tf.distribute.ParameterServerStrategy)

  @property
  def on_parameter_servers(self) -> bool:
    """Whether the variables live on ps tasks, each worker stepping alone (asynchronously)
    against them: the Estimator's parameter-server mode, or Keras's chief coordinating."""
    return bool(self.task and self.task.num_ps)

  def step_duties(self) -> step_duties_lib.StepDuties:
    """What this training task does as steps end (both backends' loops feed it): progress
    records on the chief, the preemption and early-stop agreements, a program's step hooks
    and, on the chief, the early-stopping checks."""
    config = self.config
    rule = early_stopping.Rule.of(config)
    checks = (early_stopping.Checks(rule, self.model_dir, self.early_stop)
              if rule and self.chief else None)
    return step_duties_lib.StepDuties(
        config.log_every_steps, config.train_steps, self.model_dir if self.chief else None,
        self.preemption, program_lib.step_hooks(config.estimator_program, self.chief),
        config.estimator_program or "", self.early_stop, checks,
        step_duties_lib.TensorLog(config.logged_tensors(), config.log_every_steps))


@dataclasses.dataclass(frozen=True)
class Trained:
  """What training reports back.

  Attributes:
    global_step: the step the model is at now.
    report: the run's progress (times, steps trained in this process).
    losses: every step's global-batch training loss, when config.record_dir asks.
    learning_rates: the rate each of those steps trained with (not a canned model's).
  """

  global_step: int
  report: progress.Progress
  losses: List[float]
  learning_rates: List[float] = dataclasses.field(default_factory=list)


class Backend(abc.ABC):
  """One backend's part of one run (see the module docstring)."""

  name: ClassVar[str]

  def __init__(self, run: Run):
    self.run = run

  @staticmethod
  def parameter_server_strategy(task: cluster.Task) -> tf.distribute.Strategy:
    """The strategy of a training task on parameter servers: by default the default
    strategy, one replica and no collectives, each task stepping alone against variables
    its own graph places on the ps tasks (the Estimator)."""
    return tf.distribute.get_strategy()

  @abc.abstractmethod
  def evaluate_checkpoints(self) -> None:
    """As the evaluator task: evaluates each new checkpoint until config.train_steps."""

  @abc.abstractmethod
  def train(self) -> Trained:
    """Trains to config.train_steps, or to where run.preemption or run.early_stop stops it
    (every training task); raises DivergedError."""

  @abc.abstractmethod
  def evaluate(self, step: int) -> Dict[str, float]:
    """The chief's own evaluation of the trained model on the whole test split, written to
    model_dir/eval at `step`."""

  @abc.abstractmethod
  def export(self) -> Optional[str]:
    """Writes the SavedModel (chief only); returns its directory."""

  @abc.abstractmethod
  def export_evaluation(self, step: int, metrics: Dict[str, float]) -> Optional[str]:
    """The chief evaluates (no evaluator task): its evaluation of the final `step` exported
    by the run's export.Policy, once; returns the current export (the latest, the best)."""


def train_and_evaluate(
    backend: Type[Backend],
    config: Config,
    model_dir: str,
    *,
    strategy: Optional[tf.distribute.Strategy] = None,
    input_fn: Optional[inputs.InputFn] = None,
) -> Optional[Dict[str, Any]]:
  """Runs `backend` as this process's task: trains, and on the chief evaluates, exports and
  writes the summary.

  Args:
    backend: keras_trainer.Backend or estimator_trainer.Backend.
    config: hyperparameters.
    model_dir: the chief's output directory (checkpoints, events, export, summary.json).
    strategy: defaults to MultiWorkerMirroredStrategy from TF_CONFIG (none for
      the evaluator task); tests inject a one-process strategy.
    input_fn: defaults to the shared MNIST input_fn.

  Returns:
    The summary on the chief; None on other tasks.

  Raises:
    failures.DivergedError: the loss or the weights became NaN or Inf; on the
      chief, what holds them has been set aside first.
    preemption_lib.Preempted: a signal stopped training, at a step that was saved (or,
      outside training, stopped this task).
    warm_start_lib.WarmStartError: --warm_start_from cannot start this model.
  """
  task = cluster.parse_tf_config()
  input_fn = input_fn or inputs.default_input_fn(config)
  config = early_stopping.for_run(config, model_dir)  # An early-stopped run's last step.
  if task is not None and task.type == cluster.EVALUATOR:
    # Outside the training cluster: no strategy, nothing written but model_dir/eval.
    config.validate(num_replicas=1)
    inputs.setup_determinism(config)
    backend(Run(config, model_dir, input_fn, task, None, chief=False,
                chief_evaluates=False)).evaluate_checkpoints()
    return None

  on_ps = bool(task and task.num_ps)
  strategy = strategy or (backend.parameter_server_strategy(task) if on_ps else
                          distribute.create_strategy())
  # On parameter servers no task agrees with another on where a preemption stops it.
  run = Run(config, model_dir, input_fn, task, strategy,
            chief=task.is_chief if on_ps else distribute.is_chief(strategy),
            chief_evaluates=task is None or not task.has_evaluator,
            preemption=distribute.preemption_agreement(None if on_ps else strategy),
            warm_start=warm_start_lib.for_run(backend.name, config, model_dir),
            early_stop=distribute.preemption_agreement(
                strategy, early_stopping.PREFIX, alone_at_once=False)
            if config.early_stopping_metric else None)
  config.validate(strategy.num_replicas_in_sync)
  inputs.setup_determinism(config)
  trainer = backend(run)
  try:
    with preemption_lib.training(run.preemption):
      trained = trainer.train()
  except failures.DivergedError as e:
    if not run.chief:
      raise
    raise checkpoints.set_aside_diverged(model_dir, e) from e
  finally:
    if run.early_stop:
      run.early_stop.close()
  try:
    preemption_lib.stopped(run.preemption, trained.global_step)
  except preemption_lib.Preempted as e:
    if run.chief:
      layout.record_progress(model_dir, "preempted", step=trained.global_step,
                             signal=e.name)
    raise
  if not run.chief:
    if not on_ps:
      distribute.leave_together(strategy)
    return None
  if run.early_stop and run.early_stop.stopped_at is not None:
    layout.record_progress(model_dir, "early_stopped", step=trained.global_step)
  if config.record_dir:
    layout.record_losses(config.record_dir, backend.name, trained.losses,
                         trained.learning_rates)

  step = trained.global_step
  metrics = (trainer.evaluate(step) if run.chief_evaluates else
             evaluation.wait_for_result(model_dir, step))
  evaluation.log_result(step, metrics)
  report = trained.report
  # A re-run that trains nothing re-evaluates, and keeps the export and training figures.
  kept = layout.finished_summary(model_dir, step) if report.trained_steps == 0 else None
  policy = export_lib.Policy.of(config)
  if kept:
    export_dir = kept["export_dir"]
  elif not policy:
    export_dir = trainer.export()
  elif run.chief_evaluates:
    export_dir = trainer.export_evaluation(step, metrics)
  else:
    export_dir = export_lib.wait_for(model_dir, policy, step)
  if not on_ps:
    distribute.leave_together(strategy)  # Before the summary, the last line on stdout.
  return layout.write_summary(
      backend.name, config, model_dir,
      workers=run.workers,
      global_step=step,
      metrics=metrics,
      train_seconds=report.train_seconds,
      trained_steps=report.trained_steps,
      export_dir=export_dir,
      first_step_time=report.first_step_time,
      kept=kept,
      early_stop=(early_stopping.read_record(model_dir) if config.early_stopping_metric
                  else None),
  )
