"""Estimator backend: train_and_evaluate with RunConfig(train_distribute=strategy).

tf.estimator exists up to TensorFlow 2.15; on a later TensorFlow this module
raises ImportError with the fix, and the Keras backend still works.
"""

import json
import os
import re
import shutil
import tempfile
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import tensorflow as tf
import tf_keras
from absl import logging

from data import mnist
from launch import cluster
from trainers import checkpoints
from trainers import distribute
from trainers import early_stopping
from trainers import evaluation
from trainers import export
from trainers import failures
from trainers import heads
from trainers import loop
from trainers import model as model_lib
from trainers import estimator_program
from trainers import optimizers
from trainers import program as program_lib
from trainers import schedules
from trainers import serving
from trainers import step_duties
from trainers.config import Config
from trainers.models import canned

if not hasattr(tf, "estimator"):
  raise ImportError(
      f"TensorFlow {tf.__version__} has no tf.estimator (removed in 2.16). The Estimator "
      "backend needs tensorflow==2.15.1: `pip install -e \".[tf215]\"` in a fresh virtualenv "
      "installs it. "
      "The Keras backend (python -m trainers.keras_main) works on newer TensorFlow via tf-keras."
  )

_ModeKeys = tf.estimator.ModeKeys
EVALUATOR_POLL_SECONDS = 1  # How often the evaluator task looks for a new checkpoint.
# TensorFlow's own input_ops.auto_shard_dataset reads the input's options in graph mode,
# as the Estimator builds it under a strategy, and tf.data warns of that call: of TF's code,
# on every good run's terminal, nothing a user can act on.
warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options",
                        category=UserWarning)
# The graph collection of the "weights are finite after this step" check, for _Steps.
_WEIGHTS_FINITE = "weights_finite_after_step"


class _Recorder(tf.estimator.SessionRunHook):
  """Records the rate every step trained with and (unless None) its global-batch loss
  (chief only)."""

  def __init__(self, loss: Optional[tf.Tensor], rate: tf.Tensor, losses: List[float],
               rates: List[float]):
    self._loss, self._rate, self._losses, self._rates = loss, rate, losses, rates

  def before_run(self, run_context):
    return tf.estimator.SessionRunArgs({"rate": self._rate, **(
        {"loss": self._loss} if self._loss is not None else {})})

  def after_run(self, run_context, run_values):
    if "loss" in run_values.results:
      self._losses.append(float(run_values.results["loss"]))
    self._rates.append(float(run_values.results["rate"]))


def update_ops(model: tf_keras.Model, features: tf.Tensor) -> List[tf.Operation]:
  """What the train op must run besides the update: the layers' own updates.

  Keras layers called in a graph leave their updates (BatchNorm's moving statistics)
  to the caller; they join UPDATE_OPS, where tf.compat.v1.layers put theirs. A train
  op without them trains, but the moving statistics never move, and evaluation and
  serving normalize with their initial values (docs/MIGRATION.md, "Bring your model").
  """
  for update in model.get_updates_for(features):
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, update)
  return tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)


def make_model_fn(config: Config, losses: Optional[List[float]] = None,
                  rates: Optional[List[float]] = None):
  """The Estimator model_fn: the shared Keras model, a v1 optimizer, the head's metrics.

  Args:
    config: hyperparameters.
    losses: with config.record_dir, the chief appends every step's global-batch
      loss here,
    rates: and the learning rate it trained with here.
  """
  initial_weights = model_lib.initial_weights(config.init_weights)
  losses = [] if losses is None else losses
  rates = [] if rates is None else rates

  head = heads.head(config)

  def model_fn(features, labels, mode):
    model = model_lib.build(config, initial_weights)
    # Training with --log_tensors naming layers: the same layers, giving their outputs too.
    taps = model_lib.layer_taps(model, config.logged_tensors()) if mode == _ModeKeys.TRAIN \
        else None
    if taps:
      logits, *outputs = taps(features, training=True)
    else:
      logits, outputs = model(features, training=mode == _ModeKeys.TRAIN), []
    if mode == _ModeKeys.PREDICT:
      predicted = serving.predictions(logits, head)
      return tf.estimator.EstimatorSpec(mode, predictions=predicted,
                                        export_outputs=serving.estimator_export_outputs(
                                            predicted, head))
    if mode == _ModeKeys.EVAL:
      return _eval_spec(config, head, features, labels, logits)
    loss = model_lib.v1_loss(config, labels, logits)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    learning_rate = schedules.v1_rate(config, global_step)
    # A dashboard's learning-rate curve; Keras's reporter writes the same tag.
    tf.compat.v1.summary.scalar(schedules.SUMMARY_TAG, learning_rate)
    optimizer = optimizers.v1_optimizer(config, learning_rate)
    # The graph's, which are the model's: a Keras model built in a graph does not track
    # what tf.compat.v1.layers create in it (for Keras layers the lists are equal).
    trainable = tf.compat.v1.trainable_variables()
    with tf.control_dependencies(update_ops(taps or model, features)):
      train_op = _minimize(optimizer, loss, global_step, trainable, config.clip_global_norm)
    layers = [name for name in config.logged_tensors() if name not in model_lib.LOGGED]
    logged = {"loss": loss, "learning_rate": learning_rate, **dict(zip(layers, outputs))}
    hooks = [_LogTensors(step_duties.TensorLog(config.logged_tensors(), config.log_every_steps),
                         logged)] if config.log_tensors else []
    chief_hooks = []
    if config.record_dir:
      # The global-batch loss (as Keras reports it) needs an all-reduce that
      # every worker runs each step: the train op depends on it.
      global_loss = tf.distribute.get_replica_context().all_reduce(
          tf.distribute.ReduceOp.SUM if model_lib.loss_reduction(config) == model_lib.SUM
          else tf.distribute.ReduceOp.MEAN, loss)
      train_op = tf.group(train_op, global_loss)
      chief_hooks.append(_Recorder(global_loss, learning_rate, losses, rates))
    _check_weights_after(train_op, global_step, trainable, config.keras_steps_per_execution())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                      training_chief_hooks=chief_hooks, training_hooks=hooks)

  return model_fn


class _LogTensors(tf.estimator.SessionRunHook):
  """--log_tensors in every training task, as LoggingTensorHook in a model_fn's
  training_hooks logs them, at the steps Keras logs them (step_duties.TensorLog):
  `tensors` (this replica's) and `global_step`, the step that ran."""

  def __init__(self, log: step_duties.TensorLog, tensors: Dict[str, tf.Tensor]):
    self._log, self._tensors = log, tensors
    self._step = 0

  def after_create_session(self, session, coord):
    self._step = int(session.run(tf.compat.v1.train.get_global_step()))

  def before_run(self, run_context):
    if self._log.due(self._step + 1):
      return tf.estimator.SessionRunArgs(self._tensors)
    return None

  def after_run(self, run_context, run_values):
    self._step += 1
    if run_values.results:
      self._log.log(self._step, {**run_values.results, "global_step": self._step})


def _eval_spec(config: Config, head: heads.Head, features: Any, labels: tf.Tensor,
               logits: tf.Tensor) -> tf.estimator.EstimatorSpec:
  """EVAL: the loss (the spec's mean) and the head's metrics, updated by the canned head
  itself (trainers/heads.py; a spec's own loss is not the head's `average_loss`), and the
  spec's declared metrics by their v1 functions (trainers/v1_metrics.py)."""
  loss = model_lib.v1_loss(config, labels, logits, reduction=model_lib.MEAN)
  canned = head.estimator_head()
  features = features if isinstance(features, dict) else {serving.IMAGE: features}
  metrics = canned.update_metrics(canned.metrics(), features, logits, labels)
  keys = model_lib.metric_keys(config)
  metrics = {k: v for k, v in metrics.items() if k in keys}
  for key, metric in model_lib.declared_metrics(config).items():  # By the v1 functions.
    metrics[key] = metric.estimator_op(head, labels, logits)
  return tf.estimator.EstimatorSpec(_ModeKeys.EVAL, loss=loss, eval_metric_ops=metrics)


def _check_weights_after(train_op: tf.Operation, global_step: tf.Variable,
                         trainable: List[tf.Variable], every: int) -> None:
  """Whether the weights are finite, read after the update in the same run: _Steps stops
  on NaN or Inf weights before the checkpoint hook saves them (see failures.weights_finite).
  Checked where Keras checks them, every `every` steps (its steps per execution), on which
  every save falls: a check between two saves would protect no checkpoint."""
  with tf.control_dependencies([train_op]):
    tf.compat.v1.add_to_collection(_WEIGHTS_FINITE, tf.cond(
        tf.equal(global_step.read_value() % every, 0),
        lambda: failures.weights_finite(trainable),
        lambda: tf.constant(True)))


def make_program_model_fn(config: Config, rates: Optional[List[float]] = None):
  """The model_fn of a team's program (--estimator_program): theirs, called as the Estimator
  calls it with their params (and --program_params), with what the project adds to every
  train graph: the weights' check, and with config.record_dir the rate each step trained
  with appended to `rates` (read off their optimizer's update op: estimator_program.Recipe).

  Their model_fn's errors, and their hooks', raise program.ProgramError, naming the frame
  of theirs (estimator_program.TheirHook).
  """
  name, record, every = (config.estimator_program, config.record_dir,
                         config.keras_steps_per_execution())
  the_program = program_lib.load(name)
  params = the_program.params_with(config.program_params)
  rates = [] if rates is None else rates

  # `config` as the Estimator passes it (their RunConfig), by the name it looks for.
  def model_fn(features, labels, mode, config):  # pylint: disable=redefined-outer-name
    graph = tf.compat.v1.get_default_graph()
    first = len(graph.get_operations())
    try:
      spec = estimator_program.call_model_fn(the_program.model_fn, features, labels, mode,
                                             params, config)
    except program_lib.ProgramError:
      raise
    except Exception as e:  # Their code: what it raises is theirs to fix.
      raise estimator_program.failure(e, name, f"its model_fn built the {mode} graph") from e
    spec = estimator_program.named_hooks(spec, name)  # Run as the Estimator runs them.
    if mode != _ModeKeys.TRAIN:
      return spec
    recipe = estimator_program.find_recipe(graph.get_operations()[first:])
    if recipe is not None and record:
      spec = spec._replace(training_chief_hooks=[*spec.training_chief_hooks,
                                                 _Recorder(None, recipe.rate, [], rates)])
    _check_weights_after(spec.train_op, tf.compat.v1.train.get_global_step(),
                         tf.compat.v1.trainable_variables(), every)
    return spec

  return model_fn


def _minimize(optimizer: tf.compat.v1.train.Optimizer, loss: tf.Tensor, global_step: tf.Variable,
              variables: List[tf.Variable], clip_norm: Optional[float]) -> tf.Operation:
  """`optimizer.minimize`, with each replica's gradients (already scaled for the replicas)
  clipped by their global norm first, as a v1 model_fn's tf.clip_by_global_norm between
  compute_gradients and apply_gradients, which all-reduces them.

  Ungated (GATE_NONE) as Keras computes gradients: the default GATE_OP's control
  dependencies keep TensorFlow's oneDNN rewrite from merging a convolution's
  Conv2DBackpropFilter and BiasAddGrad, which it merges in Keras's graph, so the bias's
  gradient was summed in another order (docs/parity.md, "One worker's long run"; issue 66).
  Gating orders gradient ops, not their values."""
  gate = tf.compat.v1.train.Optimizer.GATE_NONE
  if clip_norm is None:
    return optimizer.minimize(loss, global_step=global_step, var_list=variables,
                              gate_gradients=gate)
  gradients, variables = zip(*optimizer.compute_gradients(loss, var_list=variables,
                                                           gate_gradients=gate))
  clipped, _ = tf.clip_by_global_norm(gradients, clip_norm)
  return optimizer.apply_gradients(zip(clipped, variables), global_step=global_step)


def warm_start_from(weights: model_lib.Weights, directory: str
                    ) -> tf.estimator.WarmStartSettings:
  """Starts the Estimator's variables named in `weights` from their values (--init_weights
  for a canned Estimator or a team's model_fn, which take no initializer, and
  --warm_start_from's, trainers/warm_start.py): they are written to a name-based checkpoint
  in `directory`, from which the Estimator initializes each of them (trainable or not)
  before its first step, unless model_dir holds a checkpoint to restore."""
  with tf.Graph().as_default():
    variables = [tf.compat.v1.Variable(value, name=name) for name, value in weights.items()]
    saver = tf.compat.v1.train.Saver(variables)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      path = saver.save(session, os.path.join(directory, "initial"), write_meta_graph=False)
  # A list (not the default ".*", trainable variables only) reaches BatchNorm's statistics.
  return tf.estimator.WarmStartSettings(
      path, vars_to_warm_start=[f"^{re.escape(name)}(:0)?$" for name in sorted(weights)])


class _Steps(tf.estimator.SessionRunHook):
  """The run's step duties (step_duties.StepDuties) after each step, as Keras's
  StepsCallback feeds them.

  Synchronous training: every run of the train op is one global step (on parameter
  servers, `global_steps`: one of the steps the tasks take between them). The loss is the one
  the Estimator reports (its `loss` summary): the global-batch loss, all-reduced over the
  workers, which the Estimator's own session run fetches every step anyway; the weights
  are checked every K steps, as Keras does. It runs before the checkpoint hook's turn, so
  nothing diverged is saved (the Estimator's own NanTensorHook catches a NaN loss only);
  at the agreed preemption step it ends the session as at its last step: every task's
  checkpoint hook saves that step as the session ends (the chief's in model_dir).

  A TF2 canned Estimator reports the sum of the replicas' batch means (it reduces its loss
  by MEAN only after a tf.compat.v1.train optimizer, which the TF2 canned ones do not use):
  `scale` (1 / the replicas) makes that the global batch's mean. Under
  --loss_reduction=sum it reports the sum of the replicas' batch sums, the global batch's,
  as a v1 canned one does by default: as Keras reports a summed loss. A v1 one under
  sum_over_batch_size reports the global batch's mean (measured: launch.parity).

  A team's program (--estimator_program) may reduce its loss either way: `scale` None reads
  from the graph how the Estimator reduced it (`_reported_loss_scale`).
  """

  def __init__(self, duties: step_duties.StepDuties, scale: Optional[float] = 1.0,
               replicas: int = 1, global_steps: bool = False):
    self.duties, self._scale, self._replicas = duties, scale, replicas
    self._global_steps = global_steps
    self._loss: Optional[tf.Tensor] = None
    self._weights_finite: List[tf.Tensor] = []

  def begin(self):
    # The Estimator adds its reported (reduced) loss to LOSSES after the
    # model_fn's own per-replica loss, and before the session starts.
    self._loss = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)[-1]
    self._weights_finite = tf.compat.v1.get_collection(_WEIGHTS_FINITE)
    if self._scale is None:
      self._scale = _reported_loss_scale(self._replicas)

  def after_create_session(self, session, coord):
    self.duties.start(int(session.run(tf.compat.v1.train.get_global_step())))

  def before_run(self, run_context):
    return tf.estimator.SessionRunArgs((self._loss, self._weights_finite))

  def after_run(self, run_context, run_values):
    loss, weights_finite = run_values.results
    # On parameter servers the other workers step too: the global step this step ended
    # at is read after it (one more read from the ps task), its loss this task's own.
    step = (int(run_context.session.run(tf.compat.v1.train.get_global_step()))
            if self._global_steps else self.duties.step + 1)
    self.duties.stepped(step, float(loss) * self._scale, all(weights_finite), steps=1)
    self.duties.report_due()
    if self.duties.should_stop():
      run_context.request_stop()

  def end(self, session):
    self.duties.end()


class _EndAtEarlyStop(tf.estimator.Exporter):
  """Exports nothing: the evaluator's continuous evaluation runs its exporters after each
  evaluation is written, and ends only at --train_steps; this one ends it once an
  early-stopped run's last step is evaluated (early_stopping.end_if_final)."""

  def __init__(self, config: Config, model_dir: str):
    self._config, self._model_dir = config, model_dir

  @property
  def name(self) -> str:
    return "end_at_early_stop"

  def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
    early_stopping.end_if_final(self._config, self._model_dir,
                                int(eval_result[tf.compat.v1.GraphKeys.GLOBAL_STEP]))


class _Recorded(tf.estimator.Exporter):
  """The run's tf.estimator.LatestExporter or BestExporter (`exporter`, of `policy`), each of
  its decisions recorded in its directory's exports.jsonl (trainers.export.record)."""

  def __init__(self, exporter: tf.estimator.Exporter, policy: export.Policy):
    self._exporter, self._policy = exporter, policy

  @property
  def name(self) -> str:
    return self._exporter.name

  def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
    step = int(eval_result[tf.compat.v1.GraphKeys.GLOBAL_STEP])
    if self._policy.kind == export.BEST:
      self._policy.value(eval_result, step)  # Every evaluation has the metric, the first too.
    path = self._exporter.export(estimator, export_path, checkpoint_path, eval_result,
                                 is_the_final_export)
    path = path.decode() if isinstance(path, bytes) else path
    export.record(export_path, step, eval_result, path)
    return path


def make_exporter(config: Config, policy: export.Policy) -> tf.estimator.Exporter:
  """The Estimator's own exporter for --export=latest or best, recorded (`_Recorded`)."""
  receiver = _receiver(config)
  if receiver is None:
    raise program_lib.ProgramError(
        f"--export={policy.kind} exports through the program's serving_input_receiver_fn, and "
        f"{config.estimator_program} has none: add one, or leave --export out.")
  if policy.kind == export.LATEST:
    return _Recorded(tf.estimator.LatestExporter(policy.name, receiver,
                                                 exports_to_keep=policy.keep), policy)

  def compare_fn(best_eval_result, current_eval_result):  # BestExporter checks these names.
    return policy.metric not in best_eval_result or policy.better(current_eval_result,
                                                                  best_eval_result)

  return _Recorded(tf.estimator.BestExporter(policy.name, receiver, compare_fn=compare_fn,
                                             exports_to_keep=policy.keep), policy)


def _reported_loss_scale(replicas: int) -> float:
  """What makes the loss the Estimator reports (in the train graph being built) the global
  batch's: a tf.compat.v1.train optimizer that scaled a mean loss for the replicas makes it
  reduce them by that reduction (a mean of means, a sum of sums: 1); otherwise it sums them,
  which for a mean (tf.compat.v1.losses' default reduction, or none said) is 1 / replicas
  of it (estimator.py, _get_loss_reduce_op_for_reporting)."""
  if getattr(tf.compat.v1.get_default_graph(), "_is_loss_scaled_by_optimizer", False):
    return 1.0
  summed = tf.compat.v1.distribute.get_loss_reduction() == tf.distribute.ReduceOp.SUM
  return 1.0 if summed else 1 / replicas


class _OneSessionPerRun(tf.estimator.SessionRunHook):
  """Ends a training task of a cluster, as a lost peer does (exit PEER_LOST: the cluster is
  restarted from its last checkpoint), when TensorFlow creates its training session again.

  MonitoredSession recovers from an AbortedError or UnavailableError by restoring the
  last checkpoint into a new session, on this worker alone: it is then steps behind its
  peers, and each waits in a collective for the other until the launcher's
  --stall_timeout (seen in CI after a gRPC retry, "The same RunGraph (Worker) request was
  received twice").
  """

  def __init__(self):
    self._created = False

  def after_create_session(self, session, coord):
    if self._created:
      raise RuntimeError("the training session was created again") from tf.errors.AbortedError(
          None, None, "TensorFlow recovered this worker's training session from its last "
          "checkpoint, out of step with its peers")
    self._created = True


class Backend(loop.Backend):
  """`tf.estimator.train_and_evaluate` with `RunConfig(train_distribute=strategy)`.

  One local process trains and evaluates each checkpoint itself. In a
  cluster, workers train under the strategy and the evaluator task evaluates
  the newest checkpoint each time it looks.
  """

  name = "estimator"

  def __init__(self, run: loop.Run):
    super().__init__(run)
    self._losses: List[float] = []
    self._rates: List[float] = []
    self._canned = model_lib.spec(run.config).canned
    self._program = (program_lib.load(run.config.estimator_program)
                     if run.config.estimator_program else None)
    if self._program and run.task is not None:
      # A cluster's task checks it here, once its strategy is made (runner._check_code).
      estimator_program.check(run.config, distribute.num_workers(run.strategy))
      problem = checkpoints.resume_problem(self.name, run.model_dir, run.config)
      if problem:
        raise program_lib.ProgramError(problem)
    self._warm_start_dir: Optional[str] = None
    self._estimator = self._make_estimator()
    self._result: Optional[Tuple[Optional[Dict[str, float]], object]] = None
    policy = export.Policy.of(run.config)
    self._exporter = make_exporter(run.config, policy) if policy else None

  def _make_estimator(self) -> tf.estimator.Estimator:
    run, config = self.run, self.run.config
    if run.on_parameter_servers:
      distribute.poll_for_the_chiefs_variables_often()
    # RunConfig reads TF_CONFIG; it wants a "chief" job in an evaluator's
    # cluster, which a TFJob without a Chief replica does not have.
    if run.task is not None and run.task.type == cluster.EVALUATOR and not run.task.has_chief_job:
      os.environ["TF_CONFIG"] = json.dumps(cluster.evaluator_tf_config_with_chief(run.task))
    run_config = tf.estimator.RunConfig(
        model_dir=run.model_dir,
        # The global seed in the Estimator's graph, as tf.random.set_seed for Keras.
        tf_random_seed=config.seed,
        # On parameter servers, the Estimator's own mode: no strategy, its replica device
        # setter places the variables on the ps tasks; no worker waits to start.
        train_distribute=None if run.on_parameter_servers else run.strategy,
        **({"experimental_max_worker_delay_secs": 0} if run.on_parameter_servers else {}),
        save_checkpoints_steps=config.checkpoint_every_steps,
        save_summary_steps=config.log_every_steps,
        log_step_count_steps=config.log_every_steps,
        **_retention(config),
    )
    # Training tasks start from --init_weights (a canned Estimator, or a program's model_fn,
    # takes no initializer) and --warm_start_from's values over them.
    weights = {**(model_lib.initial_weights(config.init_weights) or {}
                  if (self._canned or self._program) and run.strategy is not None else {}),
               **(run.warm_start.values if run.warm_start else {})}
    warm_start = None
    if weights:
      # Every task's own copy, outside model_dir, which only the chief writes.
      self._warm_start_dir = tempfile.mkdtemp(prefix="warm-start-")
      warm_start = warm_start_from(weights, self._warm_start_dir)
    return _estimator(config, run_config, (self._losses, self._rates), warm_start)

  def _input_fn(self, mode: str, input_context=None) -> tf.data.Dataset:
    """The run's input; a canned Estimator takes its features as a dict, the weights of a
    --weight_column among them."""
    dataset = self.run.input_fn(mode, input_context)
    if not self._canned:
      return dataset
    settings = self.run.config.canned_settings()
    feature, column = settings["feature_name"], settings["weight_column"]

    def as_dict(features):  # The image, or the tabular features' dict already.
      return features if isinstance(features, dict) else {feature: features}

    if column:
      return dataset.map(lambda features, label, weight: (
          {**as_dict(features), column: weight}, label))
    return dataset.map(lambda features, label: (as_dict(features), label))

  def _train_and_evaluate(self, hooks: List[tf.estimator.SessionRunHook]):
    """tf.estimator.train_and_evaluate on the shared input_fn (called once per worker with
    its InputContext), evaluating the whole test split."""
    run = self.run
    evaluator = run.strategy is None
    train_spec = tf.estimator.TrainSpec(
        lambda input_context=None: self._input_fn(mnist.TRAIN,
                                                  input_context or self._own_shard()),
        max_steps=run.config.train_steps, hooks=hooks)
    eval_spec = tf.estimator.EvalSpec(
        lambda: self._input_fn(mnist.EVAL),
        steps=None,  # The whole test split.
        start_delay_secs=0,
        # In one process, evaluate every checkpoint. The evaluator task polls
        # for the next one: with 0 it spun, taking a third of a 2-core machine
        # from training and logging a warning per poll (35 MB a minute).
        throttle_secs=EVALUATOR_POLL_SECONDS if evaluator else 0,
        # Run in this order after each evaluation is written: the export --export asks of
        # it, then the evaluator task's end at an early stop.
        exporters=[*([self._exporter] if self._exporter else []),
                   *([_EndAtEarlyStop(run.config, run.model_dir)]
                     if evaluator and run.config.early_stopping_metric else [])],
    )
    return tf.estimator.train_and_evaluate(self._estimator, train_spec, eval_spec)

  def _own_shard(self) -> Optional[tf.distribute.InputContext]:
    """On parameter servers, where no strategy gives one: this training task's shard of
    the input, a whole global batch a step (each step is one update, as in synchronous
    training). None otherwise."""
    task = self.run.task
    if not self.run.on_parameter_servers or task.type == cluster.EVALUATOR:
      return None
    ordinal = task.index + (1 if task.type == cluster.WORKER and task.has_chief_job else 0)
    return tf.distribute.InputContext(num_input_pipelines=task.num_workers,
                                      input_pipeline_id=ordinal, num_replicas_in_sync=1)

  def evaluate_checkpoints(self) -> None:
    while True:
      try:
        self._train_and_evaluate([])
        return
      except early_stopping.EvaluationDone:
        return
      except (ValueError, tf.errors.NotFoundError) as e:
        # The evaluator lags the chief, which keeps only the newest checkpoints:
        # the one being evaluated can be deleted under it. Go on with a newer one.
        newest = tf.train.latest_checkpoint(self.run.model_dir)
        if not newest or newest in str(e):
          raise
        logging.warning("A checkpoint was removed while being evaluated (%s); evaluating %s.",
                        str(e).splitlines()[0], newest)

  def train(self) -> loop.Trained:
    run, config = self.run, self.run.config
    tf2_mean = (self._canned and not self._canned.v1
                and model_lib.loss_reduction(config) == model_lib.MEAN)
    scale = (None if self._program else 1 / run.strategy.num_replicas_in_sync if tf2_mean
             else 1.0)
    duties = run.step_duties()
    worker = run.task is not None and not run.chief
    with distribute.lost_peers_end_the_process(run.strategy):
      try:
        # _OneSessionPerRun first: a session created again ends the task before _Steps
        # records a start for it.
        self._result = self._train_and_evaluate(
            [*([_OneSessionPerRun()] if distribute.num_workers(run.strategy) > 1 else []),
             _Steps(duties, scale, run.strategy.num_replicas_in_sync,
                    global_steps=run.on_parameter_servers)])
      except tf.compat.v1.train.NanLossDuringTrainingError as e:
        # The Estimator's default NanTensorHook (NaN only); _Steps raises
        # DivergedError itself, for NaN and Inf.
        raise failures.diverged(duties.step) from e
      finally:
        if self._warm_start_dir:
          shutil.rmtree(self._warm_start_dir, ignore_errors=True)
        if worker:
          # MonitoredTrainingSession makes every non-chief worker save its
          # (collective) checkpoints and summaries under model_dir/tmp_<type>_<i>,
          # and leaves them there, even when training fails; they are copies of
          # the chief's, so remove them on every way out.
          shutil.rmtree(os.path.join(run.model_dir, f"tmp_{run.task.type}_{run.task.index}"),
                        ignore_errors=True)
      # A worker that exits while the chief is still closing its gRPC session
      # stalls that close until the worker's heartbeat times out (MIGRATION.md, item 9).
      distribute.barrier(run.strategy, "estimator_training_done")
    # Read from the chief's newest checkpoint; only the chief's is used.
    step = (self._estimator.get_variable_value(tf.compat.v1.GraphKeys.GLOBAL_STEP)
            if run.chief else duties.step)
    # A canned model_fn, or a program's, records no loss: theirs are the ones the Estimator
    # reports.
    losses = (duties.step_losses if (self._canned or self._program) and config.record_dir
              else self._losses)
    return loop.Trained(int(step), duties.report, losses, self._rates)

  def evaluate(self, step: int) -> Dict[str, float]:
    if self._result is not None and self._result[0] is not None:
      # One process: train_and_evaluate evaluated every checkpoint, the final one last.
      return evaluation.mean_loss(self._result[0])
    # Nothing was trained (so nothing evaluated), or a cluster without an
    # evaluator task: the chief evaluates, outside the strategy (no eval_distribute).
    return evaluation.mean_loss(
        self._estimator.evaluate(lambda: self._input_fn(mnist.EVAL), steps=None))

  def export(self) -> Optional[str]:
    return _export(self._estimator, self.run.config, self.run.model_dir)

  def export_evaluation(self, step: int, metrics: Dict[str, float]) -> Optional[str]:
    policy = export.Policy.of(self.run.config)
    if not any(entry["step"] == step for entry in export.read_record(self.run.model_dir, policy)):
      # A cluster without an evaluator task: its chief evaluated the final step alone.
      self._exporter.export(self._estimator, policy.directory(self.run.model_dir),
                            tf.train.latest_checkpoint(self.run.model_dir),
                            {**metrics, tf.compat.v1.GraphKeys.GLOBAL_STEP: step}, True)
    # One process: train_and_evaluate ran the exporter after each evaluation.
    return export.current(self.run.model_dir, policy)


def _estimator(config: Config, run_config: tf.estimator.RunConfig,
               records: Optional[Tuple[List[float], List[float]]] = None,
               warm_start: Optional[tf.estimator.WarmStartSettings] = None
               ) -> tf.estimator.Estimator:
  """The run's Estimator (`warm_start` from the initial weights): a team's program's
  (with its RunConfig settings), the canned class's, or one of `make_model_fn`; the last two
  record each step's rate in `records` (and `make_model_fn` the loss)."""
  losses, rates = records or ([], [])
  if config.estimator_program:
    return tf.estimator.Estimator(make_program_model_fn(config, rates), config=run_config,
                                  warm_start_from=warm_start)
  canned = model_lib.spec(config).canned
  if canned:
    return canned.estimator(config, run_config, warm_start)
  return tf.estimator.Estimator(make_model_fn(config, losses, rates), config=run_config,
                                warm_start_from=warm_start)


def _retention(config: Config) -> Dict[str, Any]:
  """RunConfig's settings for the checkpoints model_dir keeps (checkpoints.retention)."""
  most, hours = checkpoints.retention(config)  # RunConfig's None keeps all, as the manager's.
  # None is not the Saver's "never": it multiplies the hours.
  return {"keep_checkpoint_max": most,
          **({"keep_checkpoint_every_n_hours": hours} if hours else {})}


def _export(estimator: tf.estimator.Estimator, config: Config, out_dir: str) -> Optional[str]:
  """The SavedModel of `estimator`'s newest checkpoint under `out_dir/export/`; with a team's
  program, through its serving_input_receiver_fn (None if it has none)."""
  receiver = _receiver(config)
  if receiver is None:
    return None
  return estimator.export_saved_model(export.final_export_parent(out_dir),
                                      receiver).decode()


def _receiver(config: Config) -> Optional[Callable[[], Any]]:
  """The run's serving_input_receiver_fn: a team's program's (None if it has none), or the
  one of the serving contract (trainers/serving.py)."""
  if config.estimator_program:
    return program_lib.load(config.estimator_program).serving_input_receiver_fn
  return serving.estimator_receiver_fn(serving.feature_name(config),
                                       as_dict=bool(model_lib.spec(config).canned),
                                       spec=canned.parse_spec(config.canned_settings()))


def export_checkpoint(model_dir: str, config: Config, out_dir: str) -> str:
  """Exports the model of the newest checkpoint in `model_dir` (one `launch.convert` wrote,
  say) as this backend exports it, under `out_dir/export/`; returns its path. Reads
  `model_dir` only."""
  run_config = tf.estimator.RunConfig(model_dir=model_dir, tf_random_seed=config.seed)
  return _export(_estimator(config, run_config), config, out_dir)
