"""The independent reference: a plain GradientTape loop in one process, no strategy.

It takes one step per global batch, made of the N workers' per-replica batches in
worker order, with the update of the run's tf.compat.v1.train optimizer and learning-rate
schedule written out by hand, from their documented formulas (`UPDATES`), not from
either backend's code. Each worker's batch goes through the model on its own,
as each replica's does under the strategy: BatchNorm normalizes it with its own
statistics and updates that replica's own moving statistics, and the weights returned
hold their mean over the replicas (what both backends save: a read averages them).

`train_as_workers` computes it with a worker's intra-op threads, as the tools do.
"""

import concurrent.futures
import functools
import math
import multiprocessing
import os
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import tensorflow as tf
from absl import logging

from data import mnist
from trainers import config as config_lib
from trainers import distribute
from trainers import inputs
from trainers import model as model_lib
from trainers import warm_start
from trainers.config import Config


def rate(config: Config, step: int) -> float:
  """The run's learning rate at `step` (0-based): its --learning_rate_schedule's, after any
  --warmup_steps, written out from the tf.compat.v1.train functions' documented formulas.

  In float32, in a graph whose constants are the schedule's, as both backends evaluate
  it (the Estimator's graph, Keras's train step): Grappler rewrites such a graph, and
  its float32 rounding follows. Computed in double, the cosine rate is an ulp off at 869
  of 1500 steps (7 of 10); op by op (eagerly), cos lands an ulp apart on AVX-512 CPUs,
  which 1 + cos near -1 magnifies to 2.5e-6 of the rate; and Adagrad at rate 0.1 grows
  an ulp of the rate to 3.4e-6 in the weights within 10 steps.
  """
  settings = tuple(sorted(config.schedule_settings().items()))
  schedule = _schedule(config.learning_rate_schedule, settings, config.initial_learning_rate(),
                       config.schedule_steps(), config.warmup_steps,
                       tuple(config.piecewise()[0]) if config.boundaries else ())
  return float(schedule(tf.constant(step, tf.int64)))


@functools.lru_cache(maxsize=None)
def _schedule(name: str, settings: Tuple[Tuple[str, Any], ...], initial: float,
              decay_steps: int, warmup_steps: int, boundaries: Tuple[int, ...]
              ) -> Callable[[tf.Tensor], tf.Tensor]:
  s = dict(settings)

  @tf.function
  def rate_at(step: tf.Tensor) -> tf.Tensor:
    x, decay = tf.cast(step, tf.float32), tf.constant(decay_steps, tf.float32)
    if name == "constant":
      rate = tf.constant(initial, tf.float32)
    elif name == "cosine":  # initial * (1 + cos(pi * min(x, decay) / decay)) / 2
      done = tf.minimum(x, decay) / decay
      rate = initial * (0.5 * (1.0 + tf.cos(tf.constant(math.pi, tf.float32) * done)))
    elif name in ("exponential", "inverse_time"):
      periods = x / decay  # initial * rate^p, or initial / (1 + rate * p); p whole if staircase
      periods = tf.floor(periods) if s["staircase"] else periods
      rate = (initial * tf.pow(tf.constant(s["decay_rate"], tf.float32), periods)
              if name == "exponential"
              else initial / (1.0 + tf.constant(s["decay_rate"], tf.float32) * periods))
    elif name == "polynomial":  # (initial - end) * (1 - x / decay)^power + end
      if s["cycle"]:  # Over the multiple of decay_steps above x (the first at x = 0).
        decay = decay * tf.where(tf.equal(x, 0.0), 1.0, tf.math.ceil(x / decay_steps))
      else:
        x = tf.minimum(x, decay)
      end = tf.constant(s["end_learning_rate"], tf.float32)
      rate = (initial - end) * tf.pow(1 - x / decay, tf.constant(s["power"], tf.float32)) + end
    else:  # piecewise: values[i] for boundaries[i - 1] < step <= boundaries[i].
      values = [float(v) for v in s["values"].split(",")]
      index = tf.reduce_sum(tf.cast(step > tf.constant(boundaries, tf.int64), tf.int32))
      rate = tf.gather(tf.constant(values, tf.float32), index)
    if not warmup_steps:
      return rate
    # BERT's warm-up: step / warmup_steps of the starting rate, before warmup_steps.
    warming = tf.cast(tf.cast(step, tf.int32) < warmup_steps, tf.float32)
    fraction = tf.cast(tf.cast(step, tf.int32), tf.float32) / float(warmup_steps)
    return (1.0 - warming) * rate + warming * (initial * fraction)
  return rate_at


class Update(NamedTuple):
  """One optimizer's rule: `slots(variable, h)` gives each slot's initial value;
  `apply(variable, gradient, slots, rate, h)` takes one step with hyperparameters h."""
  slots: Callable[[tf.Variable, Dict[str, float]], List[tf.Tensor]]
  apply: Callable[..., None]


def _ftrl(variable, g, slots, rate, h):
  accum, linear = slots
  new_accum = accum + tf.square(g)
  power = -h["learning_rate_power"]
  sigma = (tf.pow(new_accum, power) - tf.pow(accum, power)) / rate
  linear.assign(linear + g - sigma * variable)
  quadratic = tf.pow(new_accum, power) / rate + 2 * h["l2"]
  shrunk = (tf.sign(linear) * h["l1"] - linear) / quadratic
  variable.assign(tf.where(tf.abs(linear) > h["l1"], shrunk, tf.zeros_like(shrunk)))
  accum.assign(new_accum)


def _adam(variable, g, slots, rate, h):
  # As the v1 kernel evaluates it: 1 - beta in float32, beta^t as a running product
  # (each variable keeps its own copy of beta1^t and beta2^t, equal to v1's one). Adam
  # divides by sqrt(v), so rounding otherwise moves weights by 1e-6 within 10 steps.
  m, v, beta1_power, beta2_power = slots
  beta1, beta2 = tf.constant(h["beta1"], tf.float32), tf.constant(h["beta2"], tf.float32)
  step_rate = rate * tf.sqrt(1 - beta2_power) / (1 - beta1_power)
  m.assign_add((g - m) * (1 - beta1))
  v.assign_add((tf.square(g) - v) * (1 - beta2))
  variable.assign_sub((m * step_rate) / (tf.sqrt(v) + h["epsilon"]))
  beta1_power.assign(beta1_power * beta1)
  beta2_power.assign(beta2_power * beta2)


def _rmsprop(variable, g, slots, rate, h):
  mean_square, moment = slots
  mean_square.assign(h["rho"] * mean_square + (1 - h["rho"]) * tf.square(g))
  moment.assign(h["momentum"] * moment + rate * g / tf.sqrt(mean_square + h["epsilon"]))
  variable.assign_sub(moment)


def _adagrad(variable, g, slots, rate, h):
  del h
  slots[0].assign_add(tf.square(g))
  # (g * rate) * rsqrt(accum), in the kernel's order. Grappler reorders a chain of
  # products so that a scalar multiplies last; the rate as a full tensor keeps the order
  # (reordered, it rounds otherwise, and 10 steps at rate 0.1 grow that to 4.6e-6).
  variable.assign_sub(g * tf.fill(tf.shape(g), rate) * tf.math.rsqrt(slots[0]))


def _zeros(n):
  return lambda variable, h: [tf.zeros_like(variable)] * n


# tf.compat.v1.train's update rules, as its optimizers' docstrings and papers give them.
UPDATES: Dict[str, Update] = {
    "sgd": Update(_zeros(0), lambda variable, g, slots, rate, h: variable.assign_sub(rate * g)),
    "momentum": Update(_zeros(1), lambda variable, g, slots, rate, h: (
        slots[0].assign(h["momentum"] * slots[0] + g),
        variable.assign_sub(rate * slots[0]))),
    "adagrad": Update(
        lambda variable, h: [tf.fill(variable.shape, h["initial_accumulator_value"])],
        _adagrad),
    "adam": Update(lambda variable, h: [tf.zeros_like(variable), tf.zeros_like(variable),
                                        tf.constant(h["beta1"], tf.float32),
                                        tf.constant(h["beta2"], tf.float32)], _adam),
    "ftrl": Update(
        lambda variable, h: [tf.fill(variable.shape, h["initial_accumulator_value"]),
                             tf.zeros_like(variable)],
        _ftrl),
    # v1 starts the mean square at ones, not zeros.
    "rmsprop": Update(lambda variable, h: [tf.ones_like(variable), tf.zeros_like(variable)],
                      _rmsprop),
}

def _legacy_adam(variable, g, slots, rate, h):
  # As tf_keras's legacy Adam: beta^t by tf.pow of the step in float32 (not a running
  # product), epsilon 1e-7, then the same kernel as v1's.
  m, v, step = slots
  beta1, beta2 = tf.constant(0.9, tf.float32), tf.constant(0.999, tf.float32)
  step_rate = rate * tf.sqrt(1 - tf.pow(beta2, step)) / (1 - tf.pow(beta1, step))
  m.assign_add((g - m) * (1 - beta1))
  v.assign_add((tf.square(g) - v) * (1 - beta2))
  variable.assign_sub((m * step_rate) / (tf.sqrt(v) + _LEGACY_EPSILON))
  step.assign_add(1.0)


def _legacy_rmsprop(variable, g, slots, rate, h):
  # tf_keras's legacy RMSprop without momentum: the mean square from zeros, epsilon
  # outside the square root.
  rho = tf.constant(0.9, tf.float32)
  slots[0].assign(rho * slots[0] + (1 - rho) * tf.square(g))
  variable.assign_sub(rate * g / (tf.sqrt(slots[0]) + _LEGACY_EPSILON))


# The tf_keras legacy optimizers a canned Estimator builds (and its twin), by the canned
# name, with their Keras defaults (epsilon 1e-7, outside the square root; Ftrl is v1's
# rule), each at the model's constant learning rate.
_LEGACY_EPSILON = 1e-7
CANNED_UPDATES: Dict[str, Tuple[Update, Dict[str, float]]] = {
    "sgd": (UPDATES["sgd"], {}),
    "adagrad": (Update(
        lambda variable, h: [tf.fill(variable.shape, 0.1)],
        lambda variable, g, slots, rate, h: (
            slots[0].assign_add(tf.square(g)),
            variable.assign_sub(rate * g / (tf.sqrt(slots[0]) + _LEGACY_EPSILON)))),
        {}),
    "adam": (Update(lambda variable, h: [tf.zeros_like(variable), tf.zeros_like(variable),
                                         tf.constant(1.0)], _legacy_adam), {}),
    "ftrl": (UPDATES["ftrl"], {"learning_rate_power": -0.5, "l1": 0.0, "l2": 0.0,
                               "initial_accumulator_value": 0.1}),
    "rmsprop": (Update(_zeros(1), _legacy_rmsprop), {}),
}


class Rule(NamedTuple):
  """How one variable is updated: the rule, its hyperparameters, and its learning rate
  (`constant_rate`, or None for v1's cosine decay)."""
  update: Update
  hyperparameters: Dict[str, float]
  constant_rate: Optional[float]


def rules(config: Config) -> Callable[[str], Rule]:
  """The run's rule for each variable, by its name: --optimizer's for every one, or a
  canned model's part's (a `linear/` variable the linear part's, the others the DNN's)."""
  settings = config.canned_settings()
  if not settings:
    every = Rule(UPDATES[config.optimizer], config.hyperparameters(), None)
    return lambda name: every
  v1 = model_lib.spec(config).canned.v1
  by_part = {}
  for part in ("dnn", "linear"):
    if f"{part}_optimizer" in settings:
      name = settings[f"{part}_optimizer"]
      # A v1 canned class's optimizer is tf.compat.v1.train's, at its defaults.
      update, hyperparameters = ((UPDATES[name], config_lib.OPTIMIZER_DEFAULTS[name]) if v1
                                 else CANNED_UPDATES[name])
      by_part[part] = Rule(update, hyperparameters, settings[f"{part}_learning_rate"])
  return lambda name: by_part["linear" if name.startswith("linear/") else "dnn"]


def clip_by_global_norm(gradients: List[tf.Tensor], clip_norm: float
                        ) -> Tuple[List[tf.Tensor], tf.Tensor]:
  """tf.clip_by_global_norm written out from its documented formula: each gradient times
  clip_norm / max(global_norm, clip_norm), global_norm the square root of the sum of every
  element's square; and whether that clipped them."""
  norm = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(g)) for g in gradients]))
  return [g * (clip_norm / tf.maximum(norm, clip_norm)) for g in gradients], norm > clip_norm


def train_reference(config: Config, num_workers: int,
                    input_fn: Optional[inputs.InputFn] = None, *, any_batch_size: bool = False,
                    clipped: Optional[List[int]] = None, clip_after_all_reduce: bool = False
                    ) -> Tuple[List[float], model_lib.Weights]:
  """Trains `config.train_steps` steps as N workers' data would.

  Args:
    config: hyperparameters (init_weights, warm start, seed and data as the backends use
      them).
    num_workers: how many worker pipelines to read, one batch of each per step.
    input_fn: defaults to the shared MNIST input_fn.
    any_batch_size: compile the step for batches of any size rather than the one it
      is given: the same arithmetic, which Grappler and the kernels order otherwise.
      How far the two end apart is the reference's rounding floor (launch.parity).
    clipped: with --clip_global_norm, how many replicas' gradients each step clipped is
      appended here.
    clip_after_all_reduce: clip the summed gradients instead, as Keras's own clipnorm
      does: not what either backend does (a negative control).

  Returns:
    Each step's global-batch loss (before its update) and the final weights.
  """
  inputs.setup_determinism(config)
  input_fn = input_fn or inputs.default_input_fn(config)
  pipelines = [iter(input_fn(mnist.TRAIN, tf.distribute.InputContext(num_workers, i,
                                                                     num_workers)))
               for i in range(num_workers)]
  # As a run with nothing to resume starts; planned first, as it builds the model in a graph
  # of its own, which leaves a model built outside it unusable.
  started = warm_start.plan("keras", config) if config.warm_start_from else None
  model = model_lib.build(config, model_lib.initial_weights(config.init_weights))
  if started:
    warm_start.assign(model, started)
  summed = model_lib.loss_reduction(config) == model_lib.SUM
  example_loss = model_lib.example_loss(config)
  variables, statistics = model.trainable_variables, model.non_trainable_variables
  rule_of = rules(config)
  variable_rules = [rule_of(model_lib.weight_name(v)) for v in variables]
  slots = [[tf.Variable(s) for s in r.update.slots(v, r.hyperparameters)]
           for v, r in zip(variables, variable_rules)]
  replica_statistics = [[tf.Variable(s) for s in statistics] for _ in pipelines]

  # Compiled, as both backends' steps are: on CPU, Grappler fuses a convolution with its
  # BatchNorm, which rounds otherwise than eager ops do (1.8e-5 apart after 6 steps).
  def step(batches, rate):
    # As each replica does under the strategy: the gradient of its own batch's mean
    # loss over the replicas (or of its sum), then the sum of the replicas' gradients,
    # in worker order.
    replica_losses, replica_gradients, clips = [], [], [tf.constant(False)]
    for (images, labels, *weights), own in zip(batches, replica_statistics):
      for statistic, value in zip(statistics, own):
        statistic.assign(value)
      with tf.GradientTape() as tape:
        logits = model(images, training=True)
        losses = example_loss(labels, logits)
        if weights:  # A --weight_column's: each example's loss times its weight.
          losses = losses * weights[0]
        if summed:
          loss = scaled = tf.reduce_sum(losses)
        else:
          loss = tf.reduce_mean(losses)
          scaled = loss / len(batches)
      gradients = tape.gradient(scaled, variables)
      if config.clip_global_norm and not clip_after_all_reduce:  # Each replica's, as v1 does.
        gradients, clip = clip_by_global_norm(gradients, config.clip_global_norm)
        clips.append(clip)
      replica_gradients.append(gradients)
      replica_losses.append(loss)
      for statistic, value in zip(statistics, own):
        value.assign(statistic)
    summed_gradients = [tf.add_n(g) for g in zip(*replica_gradients)]
    if config.clip_global_norm and clip_after_all_reduce:
      summed_gradients, clip = clip_by_global_norm(summed_gradients, config.clip_global_norm)
      clips.append(clip)
    for variable, rule, own, gradient in zip(variables, variable_rules, slots, summed_gradients):
      rule.update.apply(variable, gradient, own,
                        rate if rule.constant_rate is None else rule.constant_rate,
                        rule.hyperparameters)
    # Equal per-replica batches: the mean of their means is the global batch's mean.
    return (tf.add_n(replica_losses) / (1 if summed else len(replica_losses)),
            tf.add_n([tf.cast(c, tf.int32) for c in clips]))

  signature = None
  if any_batch_size:
    def any_batch(spec):  # A tabular feature's rows may be sparse.
      kind = tf.SparseTensorSpec if isinstance(spec, tf.SparseTensorSpec) else tf.TensorSpec
      return kind([None, *spec.shape[1:]], spec.dtype)

    signature = [[tf.nest.map_structure(any_batch, p.element_spec) for p in pipelines],
                 tf.TensorSpec([], tf.float32)]
  # A tabular batch's sparse rows differ in width batch to batch: traced again for each
  # width, the step would be traced every step; an image batch's shape never changes.
  step = tf.function(step, input_signature=signature, reduce_retracing=True)
  losses = []
  for i in range(config.train_steps):
    batches = [next(p) for p in pipelines]
    loss, clips = step(batches, tf.constant(rate(config, i), tf.float32))
    losses.append(float(loss))
    if clipped is not None:
      clipped.append(int(clips))
  for statistic, *values in zip(statistics, *replica_statistics):
    statistic.assign(tf.add_n(values) / len(values))
  return losses, model_lib.get_weights(model)


def train_as_workers(config: Config, num_workers: int, **options: Any
                     ) -> Tuple[List[float], model_lib.Weights, List[int]]:
  """`train_reference(config, num_workers, **options)` computed with the intra-op threads
  each of the backends' `num_workers` workers computes with (distribute.intra_op_threads):
  in this process if it has that many, else in a child process that does (so `options`
  are pickled: no `input_fn`). Returns the losses, the weights and, with
  --clip_global_norm, each step's clipped replicas.

  The threads split a kernel's sums (a convolution's filter gradient over the batch) in
  their own order: at 2 workers on 2 cores, with the 2 threads of this process against
  each worker's 1, the reference ended 2.98e-8 from both backends in the weights here, and
  1.67e-6 on an AVX-512 EPYC at sgd's rate of 0.3 (issue 66); with 1, 0 apart.
  """
  threads = distribute.intra_op_threads(num_workers)
  here = (tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count()) == threads
  logging.info("Training the reference loop%s: %d step(s) as %d worker(s), in %s.",
               " compiled for any batch size (its rounding floor)"
               if options.get("any_batch_size") else "", config.train_steps, num_workers,
               "this process" if here else f"a child process of {threads} intra-op thread(s)")
  if here:
    return _train_with_clipped(config, num_workers, options)
  return _child(threads).submit(_train_with_clipped, config, num_workers, options).result()


def compute_as_workers(num_workers: int) -> None:
  """Gives this process the intra-op threads of a `num_workers`-worker task, so that
  `train_as_workers` at that count trains here rather than in a child process (which
  costs a TensorFlow import and the data's set-up again). Call it before TensorFlow runs
  anything, as a tool starts: the threads cannot change after."""
  tf.config.threading.set_intra_op_parallelism_threads(distribute.intra_op_threads(num_workers))


def _train_with_clipped(config: Config, num_workers: int, options: Dict[str, Any]
                        ) -> Tuple[List[float], model_lib.Weights, List[int]]:
  clipped: List[int] = []
  losses, weights = train_reference(config, num_workers, clipped=clipped, **options)
  return losses, weights, clipped


@functools.lru_cache(maxsize=None)
def _child(threads: int) -> concurrent.futures.ProcessPoolExecutor:
  """A process computing with `threads` intra-op threads, kept for the next reference."""
  # Spawned, not forked: a fork would copy this process's TensorFlow runtime, threads set.
  return concurrent.futures.ProcessPoolExecutor(
      1, mp_context=multiprocessing.get_context("spawn"), initializer=_set_threads,
      initargs=(threads,))


def _set_threads(threads: int) -> None:
  tf.config.threading.set_intra_op_parallelism_threads(threads)
