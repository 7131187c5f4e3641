"""Keras backend: Model.fit under MultiWorkerMirroredStrategy (or, on parameter servers,
ParameterServerStrategy from the chief), and its evaluator task."""

import math
import os
import shutil
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf
import tf_keras
from absl import logging

from data import mnist
from data.mnist import pipeline
from trainers import checkpoints
from trainers import distribute
from trainers import early_stopping
from trainers import evaluation
from trainers import export
from trainers import failures
from trainers import heads
from trainers import inputs
from trainers import loop
from trainers import model as model_lib
from trainers import model_dir as layout
from trainers import optimizers
from trainers import preemption
from trainers import schedules
from trainers import serving
from trainers import step_duties
from trainers import warm_start
from trainers.config import Config
from trainers.models import canned


def make_optimizer(config: Config) -> tf_keras.optimizers.Optimizer:
  """The Keras twin of the Estimator's v1 optimizer at the run's schedule; for a canned
  model, the optimizer its canned Estimator builds."""
  canned = model_lib.spec(config).canned
  if canned:
    return canned.keras_optimizer(config)
  return optimizers.keras_optimizer(config, schedules.keras_schedule(config))


class SpecLoss(tf_keras.losses.Loss):
  """A spec's per-example loss (`ModelSpec.loss`), as `compile` takes it."""

  def __init__(self, loss: Callable[[tf.Tensor, tf.Tensor], tf.Tensor], reduction: str):
    super().__init__(reduction=reduction, name="loss")
    self._loss = loss

  def call(self, y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
    # compile gives labels of shape (B,) a last axis to match the logits' rank; the
    # spec takes them as the input_fn gives them, and as the Estimator passes them.
    if y_true.shape.rank == y_pred.shape.rank:
      y_true = tf.squeeze(y_true, axis=-1)
    return self._loss(y_true, y_pred)


def make_loss(config: Config, training: bool = True) -> tf_keras.losses.Loss:
  """The model's loss, reduced as it trains (`training`) or as it is evaluated (the mean)."""
  model_spec = model_lib.spec(config)
  # With a strategy, Keras divides the mean's sum by the global batch size, so the
  # summed replica gradients are the gradient of the global-batch mean; a sum it
  # leaves as it is, and they are the gradient of the global-batch sum.
  summed = training and model_lib.loss_reduction(config) == model_lib.SUM
  reduction = (tf_keras.losses.Reduction.SUM if summed
               else tf_keras.losses.Reduction.SUM_OVER_BATCH_SIZE)
  if model_spec.loss is model_lib.sparse_softmax_cross_entropy:
    # The head's, as Keras's own class computes it: an export compiled with it loads in
    # tf_keras.models.load_model, which cannot rebuild a SpecLoss.
    return heads.head(config).keras_loss(reduction)
  return SpecLoss(model_lib.example_loss(config), reduction)


def _eval_metrics(config: Config) -> List[tf_keras.metrics.Metric]:
  """The metrics the run reports (model.metric_keys): the head's, and the spec's declared
  v1 metrics (trainers/v1_metrics.py)."""
  keys, head = model_lib.metric_keys(config), heads.head(config)
  declared = [metric.keras_metric(key, head)
              for key, metric in model_lib.declared_metrics(config).items()]
  return [m for m in head.keras_metrics() if m.name in keys] + declared


def _loss_and_metrics(config: Config) -> Dict[str, Any]:
  """What evaluation compiles with: the loss (the mean), and the head's metrics, weighted
  under a --weight_column (Keras gives sample weights to `weighted_metrics` only)."""
  return {"loss": make_loss(config, training=False),
          "weighted_metrics" if config.example_weights() else "metrics": _eval_metrics(config)}


class _OneCollectiveModel(tf_keras.Model):
  """The shared model (the same layers and checkpoints), trained with one collective
  per step.

  Keras's own train_step reads its loss metric after every step, and under
  MultiWorkerMirroredStrategy each read all-reduces the metric's total and count
  across the workers: two collectives per step besides the gradients', a fifth of
  a step at 2 workers (docs/MIGRATION.md, item 3). Here each replica's
  loss (its batch mean over the number of replicas, as Keras scales it) is summed
  in the gradients' all-reduce, so every worker holds the global batch's loss, and
  keeps its mean since `fit` began (what Keras logs as `loss`) with no collective.
  It updates no `metrics` given to `compile`: reading them would cost those collectives.
  """

  def __init__(self, model: tf_keras.Model, clip_norm: Optional[float] = None,
               logged: Sequence[str] = (), summed: bool = False):
    """clip_norm: clip each replica's gradients by their global norm before the all-reduce,
    as a v1 model_fn does (--clip_global_norm). logged: the --log_tensors each step gives
    among its logs (as `logged/<name>`): this replica's, as a model_fn's are; its loss
    `summed` (model.SUM), else a mean."""
    super().__init__(model.inputs, model.outputs, name=model.name)
    self._clip_norm, self._logged, self._summed = clip_norm, list(logged), summed
    # Past the attribute tracking too: the same layers, which the model tracks.
    object.__setattr__(self, "_taps", model_lib.layer_taps(model, logged))
    # Set past Keras's attribute tracking: a tracked metric would be saved in
    # checkpoints and listed among the model's weights. In float64: StepsCallback takes
    # each step's loss as the difference of two running sums, which in float32 keep
    # about 7 digits of the sum, not of the step (after a loss of 4e5, later steps of
    # 0.2 came out 28% off).
    object.__setattr__(self, "_loss_mean", tf_keras.metrics.Mean("loss", dtype=tf.float64))

  @property
  def metrics(self) -> List[tf_keras.metrics.Metric]:
    return [self._loss_mean]  # What fit resets when it begins.

  def train_step(self, data):
    images, labels, weights = tf_keras.utils.unpack_x_y_sample_weight(data)
    with tf.GradientTape() as tape:
      if self._taps:
        logits, *outputs = self._taps(images, training=True)
      else:
        logits, outputs = self(images, training=True), []
      loss = self.compute_loss(images, labels, logits, weights)
    replica_loss = loss
    variables = self.trainable_variables
    gradients = tape.gradient(loss, variables)
    if self._clip_norm is not None:  # This replica's, before the all-reduce: v1's meaning.
      gradients, _ = tf.clip_by_global_norm(gradients, self._clip_norm)
    if tf.distribute.get_strategy().num_replicas_in_sync > 1:
      # A column's rows (tf.IndexedSlices) all-reduced as a dense gradient, as the canned
      # Estimator's are here: the all-gather of rows that differ in number between
      # workers fails (canned._dense_across_workers says why and what it costs).
      gradients = [g for g, _ in canned.dense_gradients(zip(gradients, variables))]
    # The loss goes last, so the gradients are packed as Keras's own all-reduce packs them.
    *gradients, loss = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, [*gradients, loss])
    if isinstance(self.optimizer, tf_keras.optimizers.legacy.Optimizer):  # A canned twin's.
      self.optimizer.apply_gradients(zip(gradients, variables),
                                     experimental_aggregate_gradients=False)
    else:
      self.optimizer.apply_gradients(zip(gradients, variables),
                                     skip_gradients_aggregation=True)
    self._loss_mean.update_state(loss)
    # This worker's own copy, the same on every worker: Mean.result() would
    # all-reduce it.
    return {"loss": self._loss_mean.total / self._loss_mean.count,
            **(self._logged_values(replica_loss, outputs) if self._logged else {})}

  def _logged_values(self, loss: tf.Tensor, outputs: List[tf.Tensor]) -> Dict[str, tf.Tensor]:
    """Each --log_tensors value of this step (`logged/<name>`), once its update is applied:
    the rate it trained with, the step it is."""
    # compile's mean is this replica's sum over the global batch: its own mean is that
    # times the replicas.
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    layers = [name for name in self._logged if name not in model_lib.LOGGED]
    values = {"loss": loss if self._summed else loss * replicas,
              "learning_rate": tf.identity(self.optimizer.learning_rate),
              "global_step": tf.identity(self.optimizer.iterations),
              **dict(zip(layers, outputs))}
    return {f"logged/{name}": values[name] for name in self._logged}


def compile_model(config: Config) -> tf_keras.Model:
  """Builds and compiles the shared model, in the current strategy's scope."""
  weights = model_lib.initial_weights(config.init_weights)
  model = _OneCollectiveModel(model_lib.build(config, weights), config.clip_global_norm,
                              config.logged_tensors(),
                              model_lib.loss_reduction(config) == model_lib.SUM)
  # Callbacks run, and the host waits for the device, once per execution.
  # No training accuracy: nothing reads it (the Estimator computes none while
  # training either), and _OneCollectiveModel's step would not update it.
  model.compile(optimizer=make_optimizer(config), loss=make_loss(config),
                steps_per_execution=config.keras_steps_per_execution())
  # The logged loss is already the global batch's, the same on every worker;
  # tf-keras 2.15's default ("auto" = "sum" under MultiWorkerMirroredStrategy)
  # sums it again across workers, reporting N times the true value.
  model.distribute_reduction_method = "first"
  return model


def evaluate_weights(config: Config, weights: model_lib.Weights,
                     input_fn: Optional[inputs.InputFn] = None) -> Dict[str, float]:
  """Keras `evaluate` of the given weights on the whole test split, in this process: the
  head's metrics (model.metric_keys)."""
  model = model_lib.build(config, weights)
  model.compile(**_loss_and_metrics(config))
  input_fn = input_fn or inputs.default_input_fn(config)
  return evaluation.mean_loss(model.evaluate(input_fn(mnist.EVAL, None), verbose=0,
                                             return_dict=True))


class StepsCallback(tf_keras.callbacks.Callback):
  """The run's step duties (step_duties.StepDuties) after each execution; its `reporter`
  reports progress, and the loss under the Estimator's summary tag.

  Keras reports the mean loss since this `fit` began; the difference of two running sums
  gives the losses of the steps since the last execution. First in the callback list, so
  nothing of a diverged execution is saved, and a stop at the agreed preemption step ends
  `fit` as at its last step (_Checkpoints saves it in model_dir; the backup goes); the
  reporter goes last, after the saves. Steps are global: a run resumed from a backup goes
  on from the backup's step.
  """

  def __init__(self, duties: step_duties.StepDuties, summary_dir: Optional[str],
               rates: Optional[List[float]] = None, rate_summary: bool = False):
    """rates: where to record the rate each step trained with (one step per execution), if
    anywhere. rate_summary: the reporter writes the rate too (not a canned model's: the
    canned Estimator writes none)."""
    super().__init__()
    self.duties, self.rates = duties, rates
    self.reporter = _Reporter(duties, summary_dir, rate_summary)
    self._first_batch: Optional[int] = None
    self._previous_sum = 0.0

  def on_train_begin(self, logs=None):
    variables = self.model.trainable_variables
    self._weights_finite = tf.function(lambda: failures.weights_finite(variables))

  def on_train_batch_begin(self, batch, logs=None):
    if self._first_batch is None:
      # A resumed fit starts mid-epoch; BackupAndRestore, whose on_train_begin runs after
      # this callback's, has restored the step by now.
      self._first_batch = batch
      self.duties.start(int(self.model.optimizer.iterations.numpy()))

  def on_train_batch_end(self, batch, logs=None):
    seen = batch - self._first_batch + 1
    loss_sum = logs["loss"] * seen
    self.duties.stepped(self.duties.report.first_step + seen, loss_sum - self._previous_sum,
                        bool(self._weights_finite()))
    self._previous_sum = loss_sum
    if self.rates is not None:  # The rate the step trained with, set by apply_gradients.
      self.rates.append(float(self.model.optimizer.learning_rate.numpy()))
    tensors = self.duties.tensors
    if tensors.due(self.duties.step):  # An execution ends at each logging step.
      tensors.log(self.duties.step, {name: logs[f"logged/{name}"] for name in tensors.names})
    if self.duties.should_stop():
      self.model.stop_training = True


class _Reporter(tf_keras.callbacks.Callback):
  """The progress report of StepsCallback's duties, last in the callback list: a progress
  record at a checkpoint's or backup's step means that save exists. On the chief, the
  Estimator's TensorBoard tags with it: `loss`, `global_step/sec` and (`rate_summary`) the
  `learning_rate` the step trained with, which the project's model_fn writes."""

  def __init__(self, duties: step_duties.StepDuties, summary_dir: Optional[str],
               rate_summary: bool = False):
    super().__init__()
    self._duties, self._rate_summary = duties, rate_summary
    self._writer = tf.summary.create_file_writer(summary_dir) if summary_dir else None

  def on_train_batch_end(self, batch, logs=None):
    self.report()

  def report(self) -> None:
    """The report, if one is due (on parameter servers, _Epochs calls it at an epoch's end)."""
    reported = self._duties.report_due()
    if reported and self._writer:
      with self._writer.as_default(step=self._duties.step):
        tf.summary.scalar("loss", reported.loss)
        tf.summary.scalar("global_step/sec", reported.steps_per_sec)
        if self._rate_summary:  # Set by the step's apply_gradients.
          tf.summary.scalar(schedules.SUMMARY_TAG, self.model.optimizer.learning_rate)

  def on_train_end(self, logs=None):
    self._duties.end()
    if self._writer:
      self._writer.close()


class _Backup(tf_keras.callbacks.BackupAndRestore):
  """BackupAndRestore that counts steps, and records the step it saved.

  tf-keras 2.15 counts `save_freq` in callback calls (one per execution) and
  records the first step of the execution being saved, so with
  steps_per_execution > 1 a resumed `fit` would run past the last step.
  """

  def __init__(self, backup_dir: str, every_steps: int, steps_per_execution: int):
    super().__init__(backup_dir, save_freq=every_steps // steps_per_execution)

  def on_train_batch_begin(self, batch, logs=None):
    pass  # Recorded at the end of the execution instead.

  def on_train_batch_end(self, batch, logs=None):
    self._training_state._ckpt_saved_batch.assign(batch)
    super().on_train_batch_end(batch, logs)


def backup_origin(backup_dir: str) -> Optional[int]:
  """The step at which the fit that wrote the backup began; None without a backup.

  BackupAndRestore resumes at the batch after the one it saved, counted from
  that fit's start: its model step minus that batch count is where it began.
  """
  path = tf.train.latest_checkpoint(os.path.join(backup_dir, "chief"))
  if path is None:
    return None
  reader = tf.train.load_checkpoint(path)
  return (checkpoints.keras_step(reader) -
          int(reader.get_tensor(checkpoints.keras_key("ckpt_saved_batch"))) - 1)


def _per_worker_dataset(run: loop.Run) -> tf_keras.utils.experimental.DatasetCreator:
  """On parameter servers: each worker's pipeline, shard <worker index> of the workers'
  (the index known only on the worker), with the global batch: each worker steps alone."""
  workers = run.workers
  config = run.config
  if config.record_dir and inputs.reads_the_shared_pipeline(config):  # A program's: none.
    for index in range(workers):
      pipeline.record_shard(config.record_dir, pipeline.SPLIT_FOR_MODE[mnist.TRAIN],
                            config.data_dir, tf.distribute.InputContext(workers, index, 1))

  def dataset_fn(_: tf.distribute.InputContext) -> tf.data.Dataset:
    index = tf.distribute.coordinator.experimental_get_current_worker_index()
    tf.print("Reading shard", index, "of", workers, "of the train split.")  # In its log.
    return run.input_fn(mnist.TRAIN, tf.distribute.InputContext(workers, index, 1))

  return tf_keras.utils.experimental.DatasetCreator(dataset_fn)


def save_checkpoint(model: tf_keras.Model, directory: str, step: int) -> str:
  """`directory/ckpt-<step>` of model and optimizer: what this trainer resumes from.

  Relative paths in its `checkpoint` file, so the directory can be moved.
  """
  return _checkpoint_manager(model, directory, (1, None)).save(checkpoint_number=step)


def _checkpoint_manager(model: tf_keras.Model, directory: str,
                        retention: Tuple[Optional[int], Optional[float]]
                        ) -> tf.train.CheckpointManager:
  """`directory/ckpt-<step>` of model and optimizer, kept as `retention`
  (checkpoints.retention) says."""
  keep, hours = retention
  return tf.train.CheckpointManager(tf.train.Checkpoint(model=model), directory,
                                    max_to_keep=keep, keep_checkpoint_every_n_hours=hours,
                                    checkpoint_name=checkpoints.KERAS_PREFIX)


class _Checkpoints(tf_keras.callbacks.Callback):
  """Saves model and optimizer as `model_dir/ckpt-<step>` every `every` steps, and at step 0
  and when `fit` ends, keeping those `checkpoints.retention` keeps, as the Estimator does
  (whose first session saves step 0 too).

  The evaluator task evaluates them; a finished run resumes from the last.
  The final save runs before BackupAndRestore deletes its backup, so a run
  stopped after `fit` resumes from it. Every worker saves, since a save may
  need collectives; only the chief's go to model_dir, the others' to
  `directory`, a scratch directory of their own.
  """

  def __init__(self, directory: str, chief: bool, every: int,
               retention: Tuple[Optional[int], Optional[float]]):
    super().__init__()
    self._directory = directory
    self._chief, self._every = chief, every
    self._retention = retention
    self._manager: Optional[tf.train.CheckpointManager] = None
    self._saved_step = -1

  def _save(self) -> None:
    step = int(self.model.optimizer.iterations.numpy())
    if step == self._saved_step:
      return
    if self._manager is None:
      self._manager = _checkpoint_manager(self.model, self._directory, self._retention)
    path = self._manager.save(checkpoint_number=step)
    self._saved_step = step
    if self._chief:
      logging.info("Saved %s", path)

  def on_train_batch_begin(self, batch, logs=None):
    # Here, not in on_train_begin: BackupAndRestore's, after this one's, restores the step.
    if self._saved_step < 0 and int(self.model.optimizer.iterations.numpy()) == 0:
      self._save()

  def on_train_batch_end(self, batch, logs=None):
    if int(self.model.optimizer.iterations.numpy()) % self._every == 0:
      self._save()

  def on_train_end(self, logs=None):
    self._save()


class _Epochs(tf_keras.callbacks.Callback):
  """The chief's duties on parameter servers, at the end of each epoch (every step scheduled
  in it has ended): the step duties (the epoch's mean loss, divergence, where a preemption
  stops), `model_dir/ckpt-<step>` at step 0, at the first epoch end at or past each multiple
  of --checkpoint_every_steps and at the last, then the progress report and the Estimator's
  TensorBoard tags, as StepsCallback and _Reporter do each execution under
  MultiWorkerMirroredStrategy."""

  def __init__(self, duties: step_duties.StepDuties, model_dir: str, config: Config,
               rates: Optional[List[float]], rate_summary: bool):
    """rates: where to record the rate each step trained with (an epoch a step), if
    anywhere."""
    super().__init__()
    self._duties, self._rates = duties, rates
    self._every, self._total = config.checkpoint_every_steps, config.train_steps
    self._retention, self._model_dir = checkpoints.retention(config), model_dir
    self._reporter = _Reporter(duties, model_dir, rate_summary)
    self._manager: Optional[tf.train.CheckpointManager] = None
    self._saved = -1

  def _step(self) -> int:
    return int(self.model.optimizer.iterations.numpy())

  def _save(self, step: int) -> None:
    if self._manager is None:
      self._manager = _checkpoint_manager(self.model, self._model_dir, self._retention)
    logging.info("Saved %s", self._manager.save(checkpoint_number=step))
    self._saved = step

  def on_train_begin(self, logs=None):
    self._reporter.set_model(self.model)
    variables = self.model.trainable_variables
    self._weights_finite = tf.function(lambda: failures.weights_finite(variables))
    step = self._step()
    self._duties.start(step)
    self._saved = step
    if step == 0:
      self._save(0)

  def on_epoch_end(self, epoch, logs=None):
    step = self._step()
    steps = step - self._duties.step
    # The epoch's mean loss (fit resets it each epoch), over the steps every worker took.
    self._duties.stepped(step, logs["loss"] * steps, bool(self._weights_finite()), steps=steps)
    if self._rates is not None:  # Set by the step's apply_gradients.
      self._rates.append(float(self.model.optimizer.learning_rate.numpy()))
    stop = self._duties.should_stop()
    # The final save at the last epoch only: a lost worker's steps run again can take the
    # step to --train_steps sooner, and the evaluator stops at the first checkpoint there.
    last = stop or epoch + 1 == self.params["epochs"]
    if last or (step // self._every > self._saved // self._every and step < self._total):
      self._save(step)
    self._reporter.report()
    if stop:
      self.model.stop_training = True

  def on_train_end(self, logs=None):
    self._reporter.on_train_end()


def training_callbacks(config: Config, backup_dir: str, checkpoint_dir: str, chief: bool,
                       steps: StepsCallback) -> List[tf_keras.callbacks.Callback]:
  """The callbacks of every training `fit`, in their order (the benchmark times them too).

  Args:
    config: the intervals (checkpoints, backups, steps per execution).
    backup_dir: where backups go (non-chief workers' to `workertemp_<i>` there,
      deleted after each save).
    checkpoint_dir: this task's `ckpt-<step>`: model_dir on the chief, a
      scratch directory on other workers.
    chief: whether this task is the chief.
    steps: the run's step duties (progress, divergence, where a preemption stops).
  """
  # The step duties run first, so nothing diverged is saved; their report last, after the
  # saves.
  return [steps, _Checkpoints(checkpoint_dir, chief, config.checkpoint_every_steps,
                             checkpoints.retention(config)),
          _Backup(backup_dir, config.backup_every_steps, config.keras_steps_per_execution()),
          steps.reporter]


class _EvalSummaries(tf_keras.callbacks.Callback):
  """The evaluator task's results, as the Estimator's evaluator writes them: the head's
  metrics in `model_dir/eval`, at the checkpoint's step; the export --export asks of it, as
  the Estimator's exporters run then; then the evaluator ends if that was an early-stopped
  run's last step (early_stopping.EvaluationDone)."""

  def __init__(self, config: Config, model_dir: str):
    super().__init__()
    self._config, self._model_dir = config, model_dir
    policy = export.Policy.of(config)
    self._exports = export.Exports(policy, model_dir) if policy else None

  def on_test_end(self, logs=None):
    step = int(self.model.optimizer.iterations.numpy())  # Restored from the checkpoint.
    evaluation.log_result(step, logs)
    evaluation.write_result(self._model_dir, step, logs)
    if self._exports:
      self._exports.after_evaluation(step, logs, servable_saver(
          self._config, model_lib.get_weights(self.model)))
    early_stopping.end_if_final(self._config, self._model_dir, step)


def run_evaluator(config: Config, model_dir: str, input_fn: Optional[inputs.InputFn] = None
                  ) -> None:
  """The evaluator task: evaluates each new checkpoint in model_dir until the final step.

  `tf_keras.utils.SidecarEvaluator`, the Keras counterpart of the Estimator's
  evaluator, in this process outside any strategy, on the whole test split.
  It picks the newest checkpoint each time it looks, so checkpoints written
  during an evaluation are skipped, as the Estimator's evaluator skips them;
  one deleted under it is skipped too (it logs and goes on).
  """
  model = model_lib.build(config)
  # The optimizer gives SidecarEvaluator the checkpoint's step (its iterations).
  model.compile(optimizer=make_optimizer(config), **_loss_and_metrics(config))
  input_fn = input_fn or inputs.default_input_fn(config)
  logging.info("Evaluating each new checkpoint in %s up to step %d.", model_dir,
               config.train_steps)
  evaluator = tf_keras.utils.SidecarEvaluator(
      model, input_fn(mnist.EVAL, None), model_dir, steps=None,
      # It stops after evaluating a checkpoint named ckpt-<N> with N >= this.
      max_evaluations=config.train_steps,
      callbacks=[_EvalSummaries(config, model_dir)])
  if isinstance(model.optimizer, tf_keras.optimizers.legacy.Optimizer):  # A canned twin's.
    # SidecarEvaluator looks for a legacy optimizer's step in a checkpoint's top-level
    # `optimizer`, and raises without it; ours is the model's (model/optimizer/iter),
    # which restoring the model restores: give it that variable to read.
    evaluator._iterations = model.optimizer.iterations  # pylint: disable=protected-access
  try:
    evaluator.start()
  except early_stopping.EvaluationDone:
    pass


class _PeriodicEval(tf_keras.callbacks.Callback):
  """Chief only: evaluates the whole test split every `every` steps, as the Estimator's
  evaluator does for each checkpoint, writes the head's metrics to `model_dir/eval` and
  exports as --export=latest|best says (`exports`).

  The evaluation model is built before `fit`, outside the strategy (as in
  `evaluate_weights`), and gets the training weights copied in; the final step (an early
  stop's too) is left to the end-of-training evaluation. Callbacks run inside fit's
  strategy scope, where Keras `evaluate` would shard the test set across the
  workers, so a plain loop updates the metrics `evaluate` would.
  """

  def __init__(self, config: Config, eval_model: Optional[tf_keras.Model],
               dataset: Optional[tf.data.Dataset], model_dir: str,
               exports: Optional[export.Exports],
               early_stop: Optional[preemption.Agreement]):
    super().__init__()
    self._eval_model, self._dataset = eval_model, dataset
    self._every, self._total = config.checkpoint_every_steps, config.train_steps
    self._early_stop = early_stop
    self._config, self._model_dir, self._exports = config, model_dir, exports
    if eval_model is None:
      return
    if exports:
      # Compiled here, outside fit's strategy scope, as an export is (servable_saver); the
      # callbacks run inside it, where a model built would hold distributed variables.
      eval_model.compile(**_loss_and_metrics(config))
    loss = model_lib.example_loss(config)
    # As Keras's compiled loss tracks it: each batch's mean, weighted by its size.
    self._metrics = [tf_keras.metrics.Mean("loss"), *_eval_metrics(config)]

    @tf.function
    def update(images, labels, weights=None):
      logits = eval_model(images, training=False)
      self._metrics[0].update_state(tf.reduce_mean(loss(labels, logits)),
                                    sample_weight=tf.shape(labels)[0])
      for metric in self._metrics[1:]:
        metric.update_state(labels, logits, weights)

    self._update = update

  def on_train_batch_end(self, batch, logs=None):
    step = int(self.model.optimizer.iterations.numpy())  # Global, also after a resume.
    # The last step, an early stop's too (agreed by every task), is the loop's to evaluate.
    if (step % self._every or step >= self._total
        or (self._early_stop and self._early_stop.stopped_at is not None)):
      return
    # Every worker reads: a replica-local weight (BatchNorm's moving statistics) is
    # read as the mean over the workers, a collective that every worker must join.
    weights = self.model.get_weights()
    if self._eval_model is None:  # Not the chief.
      return
    self._eval_model.set_weights(weights)
    for metric in self._metrics:
      metric.reset_state()
    for batch in self._dataset:  # (images, labels), and weights with a --weight_column.
      self._update(*batch)
    metrics = {m.name: float(m.result()) for m in self._metrics}
    evaluation.log_result(step, metrics)
    evaluation.write_result(self._model_dir, step, metrics)
    if self._exports:
      self._exports.after_evaluation(step, metrics, saver(self._config, self._eval_model))


def export_model(config: Config, model: tf_keras.Model, model_dir: str) -> str:
  """Writes `model` as a SavedModel (`saver`) under `model_dir/export`, as --export=final
  does; returns its directory."""
  return export.write_staged(export.final_export_parent(model_dir), saver(config, model))


def servable_saver(config: Config, weights: model_lib.Weights) -> Callable[[str], None]:
  """`saver` of a model built when it saves, outside any strategy, holding `weights`,
  compiled as evaluation compiles it (a loaded export can `evaluate`)."""
  def save(directory: str) -> None:
    model = model_lib.build_holding(config, weights)
    model.compile(**_loss_and_metrics(config))
    saver(config, model)(directory)

  return save


def saver(config: Config, model: tf_keras.Model) -> Callable[[str], None]:
  """What writes `model` to a directory as a SavedModel answering the Estimator's signatures
  (trainers/serving.py), or a port's own (`ModelSpec.signatures`: its program's export's)."""
  own = model_lib.spec(config).signatures

  def save(directory: str) -> None:
    model.save(directory, save_format="tf",
               signatures=own(model) if own else serving.keras_signatures(
                   model, serving.feature_name(config), heads.head(config),
                   canned.parse_spec(config.canned_settings())))
    serving.mark_methods(directory)

  return save


class Backend(loop.Backend):
  """Model.fit under the run's strategy; `SidecarEvaluator` as the evaluator task."""

  name = "keras"
  _model: tf_keras.Model
  _weights: model_lib.Weights  # Every weight once trained, read on every worker.

  def __init__(self, run: loop.Run):
    super().__init__(run)
    policy = export.Policy.of(run.config)
    # The chief's exports of its own evaluations: one for the process, whose first the
    # exporters' rule counts.
    self._exports = (export.Exports(policy, run.model_dir)
                     if policy and run.chief and run.chief_evaluates else None)

  parameter_server_strategy = staticmethod(distribute.create_parameter_server_strategy)

  def evaluate_checkpoints(self) -> None:
    run_evaluator(self.run.config, self.run.model_dir, self.run.input_fn)

  def _step(self) -> int:
    return int(self._model.optimizer.iterations.numpy())

  def train(self) -> loop.Trained:
    run, config = self.run, self.run.config
    if config.estimator_program and run.task is not None:
      # A cluster's task checks it here, once its strategy is made (runner._check_code).
      inputs.check_fits(config, model_lib.input_shapes(config))
    # Each worker builds its own pipeline; the InputContext shards it.
    dataset = (_per_worker_dataset(run) if run.on_parameter_servers else
               run.strategy.distribute_datasets_from_function(
                   lambda ctx: run.input_fn(mnist.TRAIN, ctx)))
    # A finished (or extended: a larger --train_steps) run goes on from its
    # newest checkpoint; an interrupted one from its backup, in fit.
    with run.strategy.scope():
      self._model = compile_model(config)
      final = tf.train.latest_checkpoint(run.model_dir)
      restored = tf.train.Checkpoint(model=self._model).restore(final) if final else None
      if run.warm_start:  # Only when there is nothing to resume: warm_start.for_run.
        warm_start.assign(self._model, run.warm_start)
    backup_dir = os.path.join(run.model_dir, layout.BACKUP_SUBDIR)
    # A resumed fit must have as many steps as the fit it resumes: the backup
    # records the batch within that fit, not the step.
    # On parameter servers no backup is kept (one left by an earlier run is not read).
    origin = None if run.on_parameter_servers else backup_origin(backup_dir)
    fit_start = self._step() if origin is None else origin
    # Only the chief writes: other workers log, but keep no records or events.
    duties = run.step_duties()
    rates = [] if config.record_dir and not model_lib.spec(config).canned else None
    if fit_start < config.train_steps and run.on_parameter_servers:
      self._fit_coordinated(dataset, config.train_steps - fit_start, duties, rates)
    elif fit_start < config.train_steps:
      self._fit(dataset, config.train_steps - fit_start, backup_dir,
                StepsCallback(duties, run.model_dir if run.chief else None, rates,
                              rate_summary=not model_lib.spec(config).canned))
    else:
      logging.info("%s holds a finished run at step %d: nothing to train.", final, self._step())
      # The optimizer's slots, which only a step would create, are not needed.
      if restored:
        restored.expect_partial()
    if run.chief:
      # Left behind only by workers killed while saving: the run is over now.
      shutil.rmtree(backup_dir, ignore_errors=True)
    # Read on every worker, as _PeriodicEval reads them; the chief evaluates and exports these.
    self._weights = model_lib.get_weights(self._model)
    return loop.Trained(self._step(), duties.report, duties.step_losses, rates or [])

  def _fit(self, dataset: tf.distribute.DistributedDataset, steps: int, backup_dir: str,
           steps_callback: StepsCallback) -> None:
    run, config = self.run, self.run.config
    # Non-chief workers back up into backup_dir/workertemp_<i> and delete it
    # after each save (BackupAndRestore's own rule); all restore the chief's.
    # A non-chief worker's checkpoints go to its scratch directory, removed on
    # every way out of fit; one killed before that is cleared by its restart.
    scratch = run.model_dir if run.chief else layout.worker_scratch_dir(run.model_dir, run.task)
    callbacks = training_callbacks(config, backup_dir, scratch, run.chief, steps_callback)
    if run.chief_evaluates and config.checkpoint_every_steps < config.train_steps:
      callbacks.append(_PeriodicEval(
          config, model_lib.build(config) if run.chief else None,  # Outside the strategy.
          run.input_fn(mnist.EVAL, None) if run.chief else None, run.model_dir, self._exports,
          run.early_stop))
    try:
      self._model.fit(dataset, epochs=1, steps_per_epoch=steps, callbacks=callbacks, verbose=0)
    finally:
      if not run.chief:
        shutil.rmtree(scratch, ignore_errors=True)

  def _fit_coordinated(self, dataset: Any, steps: int, duties: step_duties.StepDuties,
                       rates: Optional[List[float]]) -> None:
    """`fit` on parameter servers, from the chief: epochs of as many steps as divide
    --log_every_steps, --checkpoint_every_steps and `steps`, each ended by every step
    scheduled in it, where the step duties, checkpoints and progress are done
    (ParameterServerStrategy runs no batch-level callback); a backup is the last
    checkpoint."""
    config = self.run.config
    # A record keeps each step's loss and rate: an epoch a step.
    every = 1 if config.record_dir else math.gcd(
        math.gcd(config.log_every_steps, config.checkpoint_every_steps), steps)
    self._model.fit(dataset, epochs=steps // every, steps_per_epoch=every, verbose=0,
                    callbacks=[_Epochs(duties, self.run.model_dir, config, rates,
                                       rate_summary=not model_lib.spec(config).canned)])

  def evaluate(self, step: int) -> Dict[str, float]:
    # The whole test split in this process, outside the strategy: no collective
    # can wait on a worker that has finished, and uneven shards cannot skew it.
    metrics = evaluate_weights(self.run.config, self._weights, self.run.input_fn)
    evaluation.write_result(self.run.model_dir, step, metrics)
    return metrics

  def export(self) -> str:
    return export.write_staged(export.final_export_parent(self.run.model_dir),
                               servable_saver(self.run.config, self._weights))

  def export_evaluation(self, step: int, metrics: Dict[str, float]) -> Optional[str]:
    return self._exports.after_evaluation(step, metrics,
                                          servable_saver(self.run.config, self._weights))
