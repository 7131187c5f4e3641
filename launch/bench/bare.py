"""Bare tf.function loops the benchmark measures the trainers against.

- `train_ceiling_loop`: the ceiling run, the fastest honest loop trained to
  the end: K steps (Keras's steps per execution) per `tf.function` call, on
  the shared input pipeline; no strategy in one process, the bare
  MultiWorkerMirroredStrategy step in a cluster.
- `probe_step_costs`: what a step costs, part by part, and the ceiling's
  loops side by side (one or K steps per call, each with the input pipeline
  or with one batch held in memory), run in every task of a cluster (or alone,
  without a strategy).

Both train the shared model on the shared input_fn with the trainers' update
(the run's optimizer rule, written out as the reference loop has it: a v1 rule with a
cosine-decayed learning rate, or a canned model's legacy rules at their constant rates),
so their numbers compare with the trainers' ms/step.
"""

import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf
import tf_keras
from absl import logging

from data import mnist
from data.mnist import pipeline
from data.mnist import ready
from launch import cluster
from launch.proofs import reference
from trainers import distribute
from trainers import inputs
from trainers import keras_trainer
from trainers import model as model_lib
from trainers import model_dir as layout
from trainers.models import canned as canned_models
from trainers import optimizers
from trainers import runner
from trainers import schedules
from trainers import step_duties
from trainers.config import Config

CEILING = "ceiling"
PROBE_WINDOWS = 5
PROBE_STEPS_PER_WINDOW = 30
# The ceiling's loops: steps per call (one, or K as Keras runs them) by where
# the batch comes from (the input pipeline, or one batch held in memory).
LOOPS = {"step": (False, False), "step_memory": (False, True), "step_k": (True, False),
         "step_k_memory": (True, True)}
# At 1 worker also the Estimator's own graph, one Session.run per step, no hooks.
SESSION_STEP = "session_step"
CEILING_LOOPS = (*LOOPS, SESSION_STEP)
# Keras's compiled train function of the trainer's model (K steps per call, as fit
# calls it, under the trainers' strategy), its windows taken in turn with the loops':
# what Keras's step adds to the bare K-step loop, before fit's own loop.
KERAS_TRAIN_FUNCTION = "keras_train_function"
# Keras's Model.fit of the trainer's compiled model, K steps per execution, with
# none of the trainer's callbacks (what fit adds to its train function), then with
# them (what they add to fit).
KERAS_FIT = "keras_fit"
KERAS_FIT_CALLBACKS = "keras_fit_callbacks"
PARTS = ("input", "compute", "all_reduce", *CEILING_LOOPS, KERAS_TRAIN_FUNCTION, KERAS_FIT,
         KERAS_FIT_CALLBACKS)


def steps_per_epoch(config: Config) -> int:
  """Steps until every pipeline has read its shard once (and its cache serves the rest)."""
  return -(-pipeline.num_examples("train", config.data_dir) // config.global_batch_size)


class _Step:
  """The shared model and its update, with no strategy in them.

  Variables are plain: under MultiWorkerMirroredStrategy each worker holds
  one replica, so a step may update them in replica context. The loss is
  summed over this replica's examples and divided by the global batch, as
  both backends do; the gradients are the global batch's once summed over
  the replicas.
  """

  def __init__(self, config: Config):
    self._config = config
    self._loss = model_lib.example_loss(config)
    self.model = model_lib.build(config, model_lib.initial_weights(config.init_weights))
    self.variables = self.model.trainable_variables
    rule_of = reference.rules(config)
    self._rules = [rule_of(model_lib.weight_name(v)) for v in self.variables]
    self._slots = [[tf.Variable(s, trainable=False) for s in r.update.slots(v, r.hyperparameters)]
                   for v, r in zip(self.variables, self._rules)]
    self._step = tf.Variable(0, dtype=tf.int64, trainable=False)
    self._schedule = schedules.keras_schedule(config)  # The run's rate, as Keras has it.

  def gradients(self, images: tf.Tensor, labels: tf.Tensor):
    with tf.GradientTape() as tape:
      logits = self.model(images, training=True)
      loss = tf.reduce_sum(self._loss(labels, logits))
      if model_lib.loss_reduction(self._config) == model_lib.MEAN:
        loss /= self._config.global_batch_size
    gradients = tape.gradient(loss, self.variables)
    if self._config.clip_global_norm:  # This replica's, before the all-reduce, as v1 clips.
      gradients, _ = tf.clip_by_global_norm(gradients, self._config.clip_global_norm)
    return loss, gradients

  def apply(self, gradients: Sequence[tf.Tensor]) -> None:
    scheduled = self._schedule(self._step)
    for variable, rule, slots, gradient in zip(self.variables, self._rules, self._slots,
                                               gradients):
      rate = scheduled if rule.constant_rate is None else rule.constant_rate
      rule.update.apply(variable, gradient, slots, rate, rule.hyperparameters)
    self._step.assign_add(1)


def _strategy_for_this_task() -> tf.distribute.Strategy:
  """MultiWorkerMirroredStrategy in a TF_CONFIG cluster; no strategy (the default) alone."""
  return distribute.create_strategy() if cluster.parse_tf_config() else tf.distribute.get_strategy()


class _Loops:
  """The bare step under a strategy, as tf.functions of one or K steps per call.

  `strategy.run` over plain variables: each worker holds one replica (see
  _Step). Under the default strategy (one process) `run` is a plain call and
  the all-reduce of the one replica's gradients is skipped: nothing to sum.
  """

  def __init__(self, config: Config, strategy: tf.distribute.Strategy,
               input_fn: inputs.InputFn):
    self.strategy = strategy
    self.step = _Step(config)
    self.steps_per_call = config.keras_steps_per_execution()
    self.iterator = iter(strategy.distribute_datasets_from_function(
        lambda ctx: input_fn(mnist.TRAIN, ctx)))
    self._sum = strategy.num_replicas_in_sync > 1

  def run(self, fn: Callable[..., Any], *args: Any) -> Any:
    return self.strategy.experimental_local_results(self.strategy.run(fn, args=args))

  def _replica_step(self, all_reduce: bool) -> Callable[..., tf.Tensor]:
    def replica_fn(images, labels):
      loss, gradients = self.step.gradients(images, labels)
      if all_reduce and self._sum:
        gradients = tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, gradients)
      self.step.apply(gradients)
      return loss
    return replica_fn

  def train(self, steps: int, *, all_reduce: bool = True, held: Optional[Any] = None
            ) -> Callable[[], Any]:
    """A call that trains `steps` steps, on the next batches or on the `held` batch."""
    replica_fn = self._replica_step(all_reduce)

    @tf.function
    def call(*batch):
      losses = self.run(replica_fn, *(batch or next(self.iterator)))
      if steps > 1:
        for _ in tf.range(steps - 1):  # As Keras's train_function with steps_per_execution.
          losses = self.run(replica_fn, *(batch or next(self.iterator)))
      return losses
    # The held batch is an argument, not a captured constant, as a real batch would be.
    return lambda: call(*(held or ()))


def train_ceiling_loop(config: Config, model_dir: str,
                       strategy: Optional[tf.distribute.Strategy] = None) -> Dict[str, Any]:
  """Trains the shared model with the ceiling's loop: K steps per tf.function call.

  Same model, loss, optimizer rule and learning rate, global batch and input_fn as
  both backends; K is Keras's steps per execution. The chief writes what the
  trainers write for the benchmark to read: `loss` and `global_step/sec`
  events every `log_every_steps`, test `accuracy`/`loss` in `eval/` every
  `checkpoint_every_steps` and at the end (evaluated by the chief while the
  other workers wait, as Keras with --noevaluator), and `summary.json`.
  Other workers write nothing.

  Args:
    config: hyperparameters.
    model_dir: where the chief's events and summary.json go.
    strategy: default: MultiWorkerMirroredStrategy from TF_CONFIG in a
      cluster, no strategy alone.

  Returns:
    The summary (the chief's; other workers return it without writing it).
  """
  strategy = strategy or _strategy_for_this_task()
  workers = distribute.num_workers(strategy)
  config.validate(strategy.num_replicas_in_sync)
  chief = distribute.is_chief(strategy)
  inputs.setup_determinism(config)
  input_fn = inputs.default_input_fn(config)
  loops = _Loops(config, strategy, input_fn)
  k = loops.steps_per_call
  train_call = loops.train(k)
  loss = model_lib.example_loss(config)
  eval_step = tf.function(lambda images, labels: model_lib.eval_sums(loops.step.model, loss,
                                                                     images, labels))

  def evaluate() -> Dict[str, float]:
    totals = [0.0, 0.0, 0.0]
    for images, labels in input_fn(mnist.EVAL, None):
      totals = [t + float(x) for t, x in zip(totals, eval_step(images, labels).numpy())]
    return {"accuracy": totals[1] / totals[2], "loss": totals[0] / totals[2]}

  # Only the chief writes to model_dir.
  writer, eval_writer = ((tf.summary.create_file_writer(model_dir),
                          tf.summary.create_file_writer(
                              os.path.join(model_dir, layout.EVAL_SUBDIR)))
                         if chief else (tf.summary.create_noop_writer(),) * 2)
  start = last_time = time.time()
  first_step_time, last_step, metrics = 0.0, 0, {}
  for i in range(k, config.train_steps + 1, k):
    # The host waits for a call's last step here only when it reads the loss.
    losses = train_call()
    if i == k:
      tf.nest.map_structure(lambda t: t.numpy(), losses)
      first_step_time = time.time()
    if chief and (i % config.log_every_steps == 0 or i == config.train_steps):
      value, now = float(losses[0]), time.time()
      with writer.as_default(step=i):
        tf.summary.scalar("loss", value)
        tf.summary.scalar("global_step/sec", (i - last_step) / max(now - last_time, 1e-9))
      writer.flush()
      last_step, last_time = i, now
    if chief and (i % config.checkpoint_every_steps == 0 or i == config.train_steps):
      metrics = evaluate()
      logging.info("Test metrics at step %d: %s", i, metrics)
      with eval_writer.as_default(step=i):
        for name, value in metrics.items():
          tf.summary.scalar(name, value)
      eval_writer.flush()
  train_seconds = time.time() - start
  # The chief's last evaluation runs while the others wait here: no task
  # leaves the cluster before every task is done with it.
  distribute.barrier(strategy, "ceiling_end")
  writer.close()
  eval_writer.close()
  summary = dict(global_step=config.train_steps, metrics=metrics, train_seconds=train_seconds,
                 trained_steps=config.train_steps, export_dir="", first_step_time=first_step_time)
  if not chief:
    return summary
  return layout.write_summary(CEILING, config, model_dir, workers=workers, **summary)


def _window_ms(fn: Callable[[], Any], steps_per_call: int) -> float:
  """ms per step of one window of about PROBE_STEPS_PER_WINDOW steps of `fn`."""
  calls = max(1, PROBE_STEPS_PER_WINDOW // steps_per_call)
  start = time.perf_counter()
  for _ in range(calls):
    out = fn()
  # Waits for the window's last step: a call may return before its step has run.
  tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)
  return 1000 * (time.perf_counter() - start) / (calls * steps_per_call)


def _medians(windows: Sequence[float], steps_per_call: int) -> Dict[str, Any]:
  return {"ms": round(statistics.median(windows), 3), "windows": [round(w, 3) for w in windows],
          "steps_per_call": steps_per_call}


def _median_ms_per_step(fn: Callable[[], Any], steps_per_call: int, warmup_calls: int
                        ) -> Dict[str, Any]:
  """Median ms per step of `fn` over PROBE_WINDOWS windows, after `warmup_calls`."""
  return _interleaved_ms_per_step({"": (fn, steps_per_call, warmup_calls)})[""]


def _interleaved_ms_per_step(loops: Dict[str, Tuple[Callable[[], Any], int, int]]
                             ) -> Dict[str, Dict[str, Any]]:
  """Median ms per step of each loop (fn, steps per call, warm-up calls), their windows
  taken in turn: the machine's slow spells fall on every loop alike, so the fastest
  loop's median is not the luck of when it ran. Each round starts with the next loop."""
  for fn, _, warmup_calls in loops.values():
    for _ in range(warmup_calls):
      fn()
  names = list(loops)
  windows: Dict[str, List[float]] = {name: [] for name in names}
  for i in range(PROBE_WINDOWS):
    for name in names[i % len(names):] + names[:i % len(names)]:
      fn, steps_per_call, _ = loops[name]
      windows[name].append(_window_ms(fn, steps_per_call))
  return {name: _medians(windows[name], loops[name][1]) for name in names}


def _session_step_ms(config: Config, input_fn: inputs.InputFn, warmup_calls: int
                     ) -> Dict[str, Any]:
  """ms per step of the Estimator's step without the Estimator: its v1 graph (the v1
  loss, the run's tf.compat.v1.train optimizer, cosine_decay; a canned model's legacy
  Keras optimizers at their constant rates), one Session.run per step fetching the
  loss, as the Estimator's does, and no MonitoredSession or hooks. One process, no
  strategy.

  Timed alone, after the eager loops: a Keras model built in a v1 graph invalidates
  the models built outside it, so its windows cannot take turns with theirs."""
  with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(config.seed)
    images, labels = tf.compat.v1.data.make_one_shot_iterator(
        input_fn(mnist.TRAIN, None)).get_next()
    model = model_lib.build(config, model_lib.initial_weights(config.init_weights))
    loss = model_lib.v1_loss(config, labels, model(images, training=True))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    rate = schedules.v1_rate(config, global_step)
    canned = model_lib.spec(config).canned
    # As the Estimator's model_fn: the graph's trainable variables, and the layers'
    # updates (BatchNorm's moving statistics) run with the train op.
    with tf.control_dependencies(model.get_updates_for(images)):
      if canned and canned.v1_scope is not None:  # A tf.compat.v1.estimator class's.
        train_op = canned_models.v1_train_op(config, loss, tf.compat.v1.trainable_variables())
      elif canned:  # As the canned head's train op, which counts its steps itself.
        optimizer = canned.keras_optimizer(config)
        train_op = optimizer.get_updates(loss, tf.compat.v1.trainable_variables())
      else:
        optimizer = optimizers.v1_optimizer(config, rate)
        train_op = optimizer.minimize(
            loss, global_step=global_step, var_list=tf.compat.v1.trainable_variables())
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      return _median_ms_per_step(lambda: session.run([train_op, loss]), 1, warmup_calls)


def _keras_model_and_dataset(config: Config, strategy: tf.distribute.Strategy,
                             input_fn: inputs.InputFn
                             ) -> Tuple[tf_keras.Model, Any]:
  """The trainer's compiled model under `strategy`, and a training pipeline of its own."""
  with strategy.scope():
    model = keras_trainer.compile_model(config)
  return model, strategy.distribute_datasets_from_function(lambda ctx: input_fn(mnist.TRAIN, ctx))


def _keras_train_function(config: Config, strategy: tf.distribute.Strategy,
                          input_fn: inputs.InputFn) -> Tuple[Callable[[], Any], int, int]:
  """Keras's train function of the trainer's compiled model, on a pipeline of its own,
  as `_interleaved_ms_per_step` takes a loop: (call, steps per call, warm-up calls). The
  warm-up reads the first epoch, which fills the pipeline's cache."""
  model, dataset = _keras_model_and_dataset(config, strategy, input_fn)
  train_function, iterator = model.make_train_function(), iter(dataset)
  k = config.keras_steps_per_execution()
  return lambda: train_function(iterator), k, -(-steps_per_epoch(config) // k) + 2


class _ExecutionEnds(tf_keras.callbacks.Callback):
  """When each execution of `fit` ended; it reads no logs, so `fit` syncs nothing for it."""

  def __init__(self):
    super().__init__()
    self._supports_tf_logs = True
    self.times = []

  def on_train_batch_end(self, batch, logs=None):
    self.times.append(time.perf_counter())


def _keras_fit_ms(config: Config, strategy: tf.distribute.Strategy, input_fn: inputs.InputFn,
                  trainer_callbacks: bool) -> Dict[str, Any]:
  """ms per step of Keras Model.fit on the trainer's compiled model (its loss, optimizer,
  schedule and steps per execution) and the same pipeline, with or without the trainer's
  callbacks (`keras_trainer.training_callbacks`: divergence check, checkpoints, backups,
  progress, saving into a temporary directory of this task's).

  Medians of PROBE_WINDOWS windows of `log_every_steps` steps after the first epoch
  (a new iterator fills its cache again): the benchmark's windows between two loss
  events, each holding one progress report and, at the default intervals, one backup.
  """
  model, dataset = _keras_model_and_dataset(config, strategy, input_fn)
  k, every = config.keras_steps_per_execution(), config.log_every_steps
  warmup = -(-steps_per_epoch(config) // every) * every
  total = warmup + PROBE_WINDOWS * every
  ends = _ExecutionEnds()
  callbacks = [ends]
  model_dir = tempfile.mkdtemp(prefix="probe-fit-")
  try:
    if trainer_callbacks:
      chief = distribute.is_chief(strategy)
      steps = keras_trainer.StepsCallback(
          step_duties.StepDuties(every, total, model_dir if chief else None),
          model_dir if chief else None)
      callbacks = keras_trainer.training_callbacks(
          dataclasses.replace(config, train_steps=total),
          os.path.join(model_dir, layout.BACKUP_SUBDIR), model_dir, chief, steps) + callbacks
    model.fit(dataset, epochs=1, steps_per_epoch=total, callbacks=callbacks, verbose=0)
  finally:
    shutil.rmtree(model_dir, ignore_errors=True)
  # times[i] is when the execution ending at step (i + 1) * k ended, its callbacks done.
  ends_at = {(i + 1) * k: t for i, t in enumerate(ends.times)}
  return _medians([1000 * (ends_at[warmup + (i + 1) * every] - ends_at[warmup + i * every]) / every
                   for i in range(PROBE_WINDOWS)], k)


def probe_step_costs(config: Config, out_path: Optional[str],
                     strategy: Optional[tf.distribute.Strategy] = None) -> Dict[str, Any]:
  """Times the parts of a training step, and the ceiling's loops, in this task.

  All tasks of a cluster run it in step, so the collectives line up; each
  on its shard and per-replica batch. In this order:
  - input: fetching the next per-replica batch, after the first epoch has
    filled the pipeline's cache (as the benchmark's warm-up does);
  - compute: forward, backward and update, no collective: each worker alone,
    sharing the cores with the others as in training;
  - all_reduce: the gradients' all-reduce alone (the same tensors);
  - the loops (LOOPS): a bare training step, all-reduce included, one step
    per call (`step`) or K, Keras's steps per execution, per call
    (`step_k`), each on the input pipeline or on one batch held in memory
    (`_memory`), and keras_train_function (Keras's train function of the
    trainer's model, K steps per call, under the trainers' strategy), their
    windows taken in turn; at 1 worker also `session_step` (see
    _session_step_ms). The fastest loop is the ceiling at this worker count;
  - keras_fit and keras_fit_callbacks: Keras's fit of the same step under
    the trainers' strategy, without and with the trainer's callbacks (see
    _keras_fit_ms).
  A trainer's ms/step minus a loop's is what Keras or the Estimator add
  around the step; `step` minus `compute` is what the all-reduce and waiting
  for the other workers cost inside it.

  Args:
    config: hyperparameters (batch size, data, steps per execution).
    out_path: the chief writes its numbers there as JSON; None writes nothing.
    strategy: default: MultiWorkerMirroredStrategy from TF_CONFIG in a
      cluster, no strategy alone.

  Returns:
    This task's numbers: ms per step of each part, and their windows.
  """
  injected = strategy is not None
  strategy = strategy or _strategy_for_this_task()
  workers = distribute.num_workers(strategy)
  # keras_fit runs under the trainers' own strategy: MultiWorkerMirroredStrategy at
  # 1 worker too, made before any op runs, as the trainers make it.
  fit_strategy = strategy if injected or workers > 1 else distribute.create_strategy()
  config.validate(strategy.num_replicas_in_sync)
  inputs.setup_determinism(config)
  loops = _Loops(config, strategy, inputs.default_input_fn(config))
  k = loops.steps_per_call
  replica = tf.distribute.get_replica_context

  @tf.function
  def fetch():
    return loops.run(lambda images, labels: tf.shape(labels)[0], *next(loops.iterator))

  @tf.function
  def all_reduce_only():
    return loops.run(lambda: replica().all_reduce(tf.distribute.ReduceOp.SUM,
                                                  [tf.identity(v) for v in loops.step.variables]))

  held = next(loops.iterator)
  threads = tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count()
  costs = {"workers": workers, "intra_op_threads": threads, "steps_per_execution": k,
           "per_replica_batch": config.global_batch_size // strategy.num_replicas_in_sync}
  phases = [("input", fetch, 1, steps_per_epoch(config) + 5),
            ("compute", loops.train(1, all_reduce=False), 1, 5),
            ("all_reduce", all_reduce_only, 1, 5)]
  for part, fn, steps, warmup_calls in phases:
    # Every task starts each part together, so they share the cores as in training.
    distribute.barrier(strategy, f"probe_{part}")
    costs[part] = _median_ms_per_step(fn, steps, warmup_calls)
  timed_in_turn = {}
  for name, (k_steps, memory) in LOOPS.items():
    steps = k if k_steps else 1
    timed_in_turn[name] = (loops.train(steps, held=held if memory else None), steps,
                           max(2, 5 // steps))
  timed_in_turn[KERAS_TRAIN_FUNCTION] = _keras_train_function(config, fit_strategy,
                                                              inputs.default_input_fn(config))
  distribute.barrier(strategy, "probe_loops")
  costs.update(_interleaved_ms_per_step(timed_in_turn))
  for part, trainer_callbacks in ((KERAS_FIT, False), (KERAS_FIT_CALLBACKS, True)):
    distribute.barrier(strategy, f"probe_{part}")
    costs[part] = _keras_fit_ms(config, fit_strategy, inputs.default_input_fn(config),
                                trainer_callbacks)
  if workers == 1:
    costs[SESSION_STEP] = _session_step_ms(config, inputs.default_input_fn(config),
                                           steps_per_epoch(config) + 5)
  logging.info("Step costs (ms per step): %s",
               {part: v["ms"] for part, v in costs.items() if isinstance(v, dict)})
  if out_path and distribute.is_chief(strategy):
    with open(out_path, "w") as f:
      json.dump(costs, f, indent=2)
  return costs


def run_bare(config: Config, model_dir: Optional[str], probe_out: Optional[str],
             idx_dir: Optional[str] = None) -> int:
  """The bare binary's body: the ceiling run, or the probe, in this task.

  Missing data is prepared first (from `idx_dir`, $MNIST_IDX_DIR, or a download).
  """
  try:
    ready.ensure_prepared(config.data_dir, idx_dir, idx_dir_flag=runner.IDX_DIR_FLAG)
  except ready.MissingDataError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  try:
    task = cluster.parse_tf_config()
  except cluster.TFConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  distribute.setup_process(task)  # The same per-process set-up as a trainer's.
  if probe_out:
    probe_step_costs(config, probe_out)
  else:
    train_ceiling_loop(config, model_dir or tempfile.mkdtemp(prefix="mnist_ceiling_"))
  return 0
