"""Keras backend: Model.fit under MultiWorkerMirroredStrategy."""

import os
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf
import tf_keras
from absl import logging

from data import mnist
from trainers import common
from trainers import distribute
from trainers import model as model_lib
from trainers.config import Config


class V1MomentumSGD(tf_keras.optimizers.SGD):
  """SGD with momentum, updating exactly as tf.compat.v1.train.MomentumOptimizer.

  v1: accum = momentum * accum + grad; var -= lr * accum.
  Keras SGD: velocity = momentum * velocity - lr * grad; var += velocity.
  The two agree while the learning rate is constant; under a schedule, v1
  applies today's rate to the whole accumulator, Keras folds each step's rate
  into the velocity. The Estimator trains with the v1 optimizer, so this one
  keeps the two backends step-for-step identical.
  """

  def update_step(self, gradient, variable):
    lr = tf.cast(self.learning_rate, variable.dtype)
    momentum = tf.cast(self.momentum, variable.dtype)
    accum = self.momentums[self._index_dict[self._var_key(variable)]]
    accum.assign(momentum * accum + gradient)
    variable.assign_sub(lr * accum)


def make_optimizer(config: Config) -> tf_keras.optimizers.Optimizer:
  """The Keras twin of the Estimator's MomentumOptimizer with cosine_decay."""
  schedule = tf_keras.optimizers.schedules.CosineDecay(config.learning_rate, config.train_steps)
  return V1MomentumSGD(schedule, momentum=config.momentum)


def _loss_and_metrics() -> Dict[str, Any]:
  # With a strategy, Keras divides this loss's sum by the global batch size,
  # so the summed replica gradients are the gradient of the global-batch mean.
  return {
      "loss": tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      "metrics": [tf_keras.metrics.SparseCategoricalAccuracy("accuracy")],
  }


def compile_model(config: Config) -> tf_keras.Model:
  """Builds and compiles the shared model, in the current strategy's scope."""
  model = model_lib.build_model(config.seed, common.initial_weights(config))
  model.compile(optimizer=make_optimizer(config), **_loss_and_metrics())
  # The logged loss and accuracy are already aggregated over all replicas;
  # tf-keras 2.15's default ("auto" = "sum" under MultiWorkerMirroredStrategy)
  # sums them again across workers, reporting N times the true values.
  model.distribute_reduction_method = "first"
  return model


def evaluate_weights(config: Config, weights: model_lib.Weights,
                     input_fn: Optional[common.InputFn] = None
                     ) -> Tuple[tf_keras.Model, Dict[str, float]]:
  """Keras `evaluate` of the given weights on the whole test split, in this process.

  Returns:
    The model holding `weights`, and its test "accuracy" and "loss".
  """
  model = model_lib.build_model(config.seed, weights)
  model.compile(**_loss_and_metrics())
  input_fn = input_fn or common.default_input_fn(config)
  return model, model.evaluate(input_fn(mnist.EVAL, None), verbose=0, return_dict=True)


class _Progress(tf_keras.callbacks.Callback):
  """Step logs and loss summaries every `every` steps, under Estimator's tags.

  Keras reports the mean loss since the epoch began; the difference of two
  running sums gives the mean over the last window, or the loss of one step.
  """

  def __init__(self, every: int, total: int, logdir: Optional[str]):
    super().__init__()
    self._every, self._total = every, total
    self._writer = tf.summary.create_file_writer(logdir) if logdir else None
    self._last_step, self._last_sum, self._last_time = 0, 0.0, 0.0
    self._previous_sum = 0.0
    self.step_losses: List[float] = []
    self.start_time = self.end_time = 0.0

  def on_train_begin(self, logs=None):
    self.start_time = self._last_time = time.time()

  def on_train_batch_end(self, batch, logs=None):
    step = batch + 1
    loss_sum = logs["loss"] * step
    self.step_losses.append(loss_sum - self._previous_sum)
    self._previous_sum = loss_sum
    if step % self._every and step != self._total:
      return
    now = time.time()
    window_loss = (loss_sum - self._last_sum) / (step - self._last_step)
    steps_per_sec = (step - self._last_step) / max(now - self._last_time, 1e-9)
    logging.info("step %d/%d: loss %.4f, %.1f steps/s", step, self._total, window_loss,
                 steps_per_sec)
    if self._writer:
      with self._writer.as_default(step=step):
        tf.summary.scalar("loss", window_loss)
        tf.summary.scalar("global_step/sec", steps_per_sec)
    self._last_step, self._last_sum, self._last_time = step, loss_sum, now

  def on_train_end(self, logs=None):
    self.end_time = time.time()
    if self._writer:
      self._writer.close()


def _export(model: tf_keras.Model, model_dir: str) -> str:
  """Writes the SavedModel with the serving signature the Estimator exports."""

  @tf.function(input_signature=[tf.TensorSpec((None,) + mnist.IMAGE_SHAPE, tf.float32, "image")])
  def serve(image):
    return model_lib.serving_outputs(model(image, training=False))

  export_dir = common.export_path(model_dir)
  # Written beside its final name and renamed, so a crash leaves no half export.
  staging = tempfile.mkdtemp(prefix=".tmp-export-", dir=os.path.dirname(export_dir))
  model.save(staging, save_format="tf", signatures={"serving_default": serve})
  os.rename(staging, export_dir)
  return export_dir


def train_and_evaluate(
    config: Config,
    model_dir: str,
    *,
    strategy: Optional[tf.distribute.Strategy] = None,
    input_fn: Optional[common.InputFn] = None,
) -> Optional[Dict[str, Any]]:
  """Trains with Model.fit, then the chief evaluates, exports and writes the summary.

  Args:
    config: hyperparameters.
    model_dir: the chief's output directory (events, export, summary.json).
    strategy: defaults to MultiWorkerMirroredStrategy from TF_CONFIG.
    input_fn: defaults to the shared MNIST input_fn.

  Returns:
    The summary on the chief; None on other workers.
  """
  strategy = strategy or distribute.create_strategy()
  config.validate(strategy.num_replicas_in_sync)
  # The global seed takes part in the shuffle order: the Estimator sets the
  # same one through RunConfig(tf_random_seed), so both read the same batches.
  common.setup_determinism(config)
  input_fn = input_fn or common.default_input_fn(config)
  chief = distribute.is_chief(strategy)
  with strategy.scope():
    model = compile_model(config)
  # Each worker builds its own pipeline; the InputContext shards it.
  dataset = strategy.distribute_datasets_from_function(lambda ctx: input_fn(mnist.TRAIN, ctx))
  # Only the chief writes: other workers log, but keep no events.
  progress = _Progress(config.log_every_steps, config.train_steps, model_dir if chief else None)
  model.fit(dataset, epochs=1, steps_per_epoch=config.train_steps, callbacks=[progress], verbose=0)
  global_step = int(model.optimizer.iterations.numpy())
  if not chief:
    return None

  if config.record_dir:
    common.record_losses(config, "keras", progress.step_losses)
  # The chief evaluates the whole test split in one process, outside the
  # strategy, as the Estimator's evaluator task does: no collective can wait
  # on a worker that has finished, and uneven shards cannot skew the metric.
  eval_model, metrics = evaluate_weights(config, model_lib.get_weights(model), input_fn)
  logging.info("Test metrics at step %d: %s", global_step, metrics)
  with tf.summary.create_file_writer(os.path.join(model_dir, common.EVAL_SUBDIR)).as_default():
    for name, value in metrics.items():
      tf.summary.scalar(name, value, step=global_step)
  return common.finish(
      "keras", config, model_dir,
      workers=distribute.num_workers(strategy),
      global_step=global_step,
      metrics=metrics,
      train_seconds=progress.end_time - progress.start_time,
      export_dir=_export(eval_model, model_dir),
  )
