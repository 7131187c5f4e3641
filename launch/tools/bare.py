"""Bare tf.function loops the benchmark measures the trainers against.

- `train_bare_loop`: the reference, a bare `tf.function` step in a plain
  Python loop, one process, no strategy: the ceiling for this model here.
- `probe_step_costs`: what a step costs, part by part, under
  MultiWorkerMirroredStrategy, run in every task of a cluster (or alone).

Both train the shared model on the shared input_fn with the trainers' update
(v1 momentum, cosine-decayed learning rate), so their numbers compare with
the trainers' ms/step.
"""

import json
import math
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Optional, Sequence

import tensorflow as tf
from absl import logging

from data import mnist
from data import paths
from launch import cluster
from trainers import common
from trainers import distribute
from trainers import model as model_lib
from trainers.config import Config

REFERENCE = "reference"
PROBE_WINDOWS = 5
PROBE_CALLS_PER_WINDOW = 30


def steps_per_epoch(config: Config) -> int:
  """Steps until every pipeline has read its shard once (and its cache serves the rest)."""
  return -(-mnist.num_examples("train", config.data_dir) // config.global_batch_size)


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
    self.model = model_lib.build_model(config.seed, common.initial_weights(config))
    self.variables = self.model.trainable_variables
    self._accumulators = [tf.Variable(tf.zeros_like(v), trainable=False) for v in self.variables]
    self._step = tf.Variable(0, dtype=tf.int64, trainable=False)

  def gradients(self, images: tf.Tensor, labels: tf.Tensor):
    with tf.GradientTape() as tape:
      logits = self.model(images, training=True)
      loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels=labels, logits=logits)) / self._config.global_batch_size
    return loss, tape.gradient(loss, self.variables)

  def apply(self, gradients: Sequence[tf.Tensor]) -> None:
    done = tf.minimum(tf.cast(self._step, tf.float32) / self._config.schedule_steps(), 1.0)
    rate = self._config.learning_rate * 0.5 * (1.0 + tf.cos(math.pi * done))
    for variable, accumulator, gradient in zip(self.variables, self._accumulators, gradients):
      accumulator.assign(self._config.momentum * accumulator + gradient)
      variable.assign_sub(rate * accumulator)
    self._step.assign_add(1)


def train_bare_loop(config: Config, model_dir: str) -> Dict[str, Any]:
  """Trains the shared model with a bare tf.function step in a Python loop, no strategy.

  Same model, loss, v1-momentum + cosine update, global batch and input_fn as
  both backends (one pipeline, no InputContext). It writes what the trainers
  write for the benchmark to read: `loss` and `global_step/sec` events every
  `log_every_steps`, test `accuracy`/`loss` in `eval/` every
  `checkpoint_every_steps` and at the end, and `summary.json`.

  Args:
    config: hyperparameters.
    model_dir: where events and summary.json go.

  Returns:
    The summary.
  """
  config.validate(1)
  common.setup_determinism(config)
  input_fn = common.default_input_fn(config)
  step = _Step(config)
  iterator = iter(input_fn(mnist.TRAIN, None))

  @tf.function
  def train_step(iterator):
    loss, gradients = step.gradients(*next(iterator))
    step.apply(gradients)
    return loss

  eval_step = tf.function(lambda images, labels: model_lib.eval_sums(step.model, images, labels))

  def evaluate() -> Dict[str, float]:
    totals = [0.0, 0.0, 0.0]
    for images, labels in input_fn(mnist.EVAL, None):
      totals = [t + float(x) for t, x in zip(totals, eval_step(images, labels).numpy())]
    return {"accuracy": totals[1] / totals[2], "loss": totals[0] / totals[2]}

  writer = tf.summary.create_file_writer(model_dir)
  eval_writer = tf.summary.create_file_writer(os.path.join(model_dir, common.EVAL_SUBDIR))
  start = last_time = time.time()
  first_step_time, last_step, metrics = 0.0, 0, {}
  for i in range(1, config.train_steps + 1):
    loss = train_step(iterator)
    if i == 1:
      float(loss)  # Eager calls are synchronous already; this only makes it explicit.
      first_step_time = time.time()
    if i % config.log_every_steps == 0 or i == config.train_steps:
      value, now = float(loss), time.time()
      with writer.as_default(step=i):
        tf.summary.scalar("loss", value)
        tf.summary.scalar("global_step/sec", (i - last_step) / max(now - last_time, 1e-9))
      writer.flush()
      last_step, last_time = i, now
    if i % config.checkpoint_every_steps == 0 or i == config.train_steps:
      metrics = evaluate()
      logging.info("Test metrics at step %d: %s", i, metrics)
      with eval_writer.as_default(step=i):
        for name, value in metrics.items():
          tf.summary.scalar(name, value)
      eval_writer.flush()
  train_seconds = time.time() - start
  writer.close()
  eval_writer.close()
  return common.finish(REFERENCE, config, model_dir, workers=1, global_step=config.train_steps,
                       metrics=metrics, train_seconds=train_seconds,
                       trained_steps=config.train_steps, export_dir="",
                       first_step_time=first_step_time)


def _median_ms_per_call(fn: Callable[[], Any], warmup_calls: int) -> Dict[str, Any]:
  """Median ms per call of `fn` over PROBE_WINDOWS windows, after `warmup_calls`."""
  for _ in range(warmup_calls):
    fn()
  windows = []
  for _ in range(PROBE_WINDOWS):
    start = time.perf_counter()
    for _ in range(PROBE_CALLS_PER_WINDOW):
      out = fn()
    # A call returns once its step has run; reading the result only makes sure.
    tf.nest.map_structure(lambda t: t.numpy(), out)
    windows.append(1000 * (time.perf_counter() - start) / PROBE_CALLS_PER_WINDOW)
  return {"ms": round(statistics.median(windows), 3), "windows": [round(w, 3) for w in windows]}


def probe_step_costs(config: Config, out_path: Optional[str],
                     strategy: Optional[tf.distribute.Strategy] = None) -> Dict[str, Any]:
  """Times the parts of a training step under MultiWorkerMirroredStrategy.

  In this task (all tasks of a cluster run it in step, so the collectives
  line up), on this task's shard and per-replica batch, in this order:
  - input: fetching the next per-replica batch, after the first epoch has
    filled the pipeline's cache (as the benchmark's warm-up does);
  - compute: forward, backward and update, no collective: each worker alone,
    sharing the cores with the others as in training;
  - all_reduce: the gradients' all-reduce alone (the same tensors);
  - step: a bare training step, all-reduce included, one step per call.
  A trainer's ms/step minus `step` is what Keras or the Estimator add around
  the step; `step` minus `compute` is what the all-reduce and waiting for
  the other workers cost inside it.

  Args:
    config: hyperparameters (batch size, data).
    out_path: the chief writes its numbers there as JSON; None writes nothing.
    strategy: defaults to MultiWorkerMirroredStrategy from TF_CONFIG.

  Returns:
    This task's numbers: ms per call of each part, and their windows.
  """
  strategy = strategy or distribute.create_strategy()
  workers = distribute.num_workers(strategy)
  config.validate(strategy.num_replicas_in_sync)
  common.setup_determinism(config)
  input_fn = common.default_input_fn(config)
  step = _Step(config)  # Outside the strategy's scope: plain variables (see _Step).
  replica = tf.distribute.get_replica_context
  iterator = iter(strategy.distribute_datasets_from_function(
      lambda ctx: input_fn(mnist.TRAIN, ctx)))

  def run(fn: Callable[..., Any], *args: Any) -> Any:
    return strategy.experimental_local_results(strategy.run(fn, args=args))

  @tf.function
  def fetch():
    return run(lambda images, labels: tf.shape(labels)[0], *next(iterator))

  def train(all_reduce: bool):
    def replica_fn(images, labels):
      loss, gradients = step.gradients(images, labels)
      if all_reduce:
        gradients = replica().all_reduce(tf.distribute.ReduceOp.SUM, gradients)
      step.apply(gradients)
      return loss
    return tf.function(lambda: run(replica_fn, *next(iterator)))

  @tf.function
  def all_reduce_only():
    return run(lambda: replica().all_reduce(tf.distribute.ReduceOp.SUM,
                                            [tf.identity(v) for v in step.variables]))

  threads = tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count()
  costs = {"workers": workers, "intra_op_threads": threads,
           "per_replica_batch": config.global_batch_size // strategy.num_replicas_in_sync}
  phases = [("input", fetch, steps_per_epoch(config) + 5), ("compute", train(all_reduce=False), 5),
            ("all_reduce", all_reduce_only, 5), ("step", train(all_reduce=True), 5)]
  for part, fn, warmup_calls in phases:
    # Every task starts each part together, so they share the cores as in training.
    distribute.barrier(strategy, f"probe_{part}")
    costs[part] = _median_ms_per_call(fn, warmup_calls)
  logging.info("Step costs (ms per call): %s",
               {k: v["ms"] for k, v in costs.items() if isinstance(v, dict)})
  if out_path and distribute.is_chief(strategy):
    with open(out_path, "w") as f:
      json.dump(costs, f, indent=2)
  return costs


def run_bare(config: Config, model_dir: Optional[str], probe_out: Optional[str],
             idx_dir: Optional[str] = None) -> int:
  """The bare binary's body: the reference in one process, or the probe in this task.

  Missing data is prepared first (from `idx_dir`, $MNIST_IDX_DIR, or a download).
  """
  try:
    mnist.ensure_prepared(config.data_dir, idx_dir)
  except paths.MissingDataError as e:
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
  elif task:
    print("error: the reference runs in one process, without TF_CONFIG.", file=sys.stderr)
    return 2
  else:
    train_bare_loop(config, model_dir or tempfile.mkdtemp(prefix="mnist_reference_"))
  return 0
