"""What launch.parity and launch.handoff learn of a team's program (--estimator_program)
before they train, and refuse to train on.

    probed = probe(config, workers, steps, assignment_map)  # ProbeError: exit 2
    probed.checks          # what held: the names' map, the recipe, the input
    probed.to_port         # each program variable that is a weight -> the port's weight

Each probe builds the program's graphs in this process, as the Estimator would, and runs
nothing of the team's training:
- **the names**: every variable of its train graph maps onto a weight of the port
  (`--model`), by name or by `--assignment_map` (the converter's map, launch/convert/assign.py),
  and every weight of the port gets one;
- **the recipe**: its train op's update ops name the optimizer and read its hyperparameters
  and its rate (trainers/estimator_program.py); the port's flags must give the same, and
  the port's schedule the same rate at each step of the short run;
- **the input**: its input_fn gives each worker the same batches in a graph (the
  Estimator's) as eagerly (Keras's, the reference's). An op without a seed of its own draws
  otherwise in each (TensorFlow derives the missing op seed from the graph's op count, or
  from the eager context's): that is refused, naming the op, rather than feeding Keras the
  batches the Estimator read, because the port reads the input_fn itself wherever it runs
  and would read another order in production too;
- **chance in training**: with its params and `deterministic_params`, nothing in the loss
  draws randomness each step (a dropout without an op seed draws another mask in each
  backend, which no check could tell from a wrong port);
- **serving**: a program that exports (its `serving_input_receiver_fn`) has a port that
  serves the same signatures (`ModelSpec.signatures`) and takes its receiver's features.
"""

import dataclasses
import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from data import mnist
from launch.convert import assign
from launch.convert.kinds import ConversionError, Kind
from launch.proofs import harness
from launch.proofs import reference
from trainers import config as config_lib
from trainers import estimator_program
from trainers import inputs
from trainers import model as model_lib
from trainers import program as program_lib
from trainers.config import Config

Check = harness.Check
# Ops that draw randomness from a seed, by type (stateless ones take theirs as an input).
_RANDOM_OPS = ("RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
               "RandomShuffle", "Multinomial", "RandomGamma", "RandomPoisson", "RandomPoissonV2")
_RATE_RTOL = 1e-6  # A rate this close is the same schedule (to the bit: rate_checks).
PROGRAM_INIT_WEIGHTS_FILE = "program_init_weights.npz"  # A program's run's start.


class ProbeError(ValueError):
  """The program and the port cannot be held to each other; the message says why and the
  fix. launch.parity and launch.handoff exit 2 with it, having trained nothing."""


@dataclasses.dataclass(frozen=True)
class Probe:
  """What the probes found.

  Attributes:
    checks: each probe's result (all passed: a failure raises ProbeError).
    to_port: each program variable that is a model weight -> the port's weight.
    batch: the examples a worker's train batch holds.
    metrics: the names of the program's eval_metric_ops.
    own_input: whether the program reads an input_fn of its own (else the project's).
    exports: whether it exports (through its serving_input_receiver_fn).
    assignment_map: the program's names -> the port's (`--assignment_map`), as given.
  """

  checks: List[Check]
  to_port: Dict[str, str]
  batch: int
  metrics: List[str]
  own_input: bool
  exports: bool
  assignment_map: Dict[str, Optional[str]]


def probe(config: Config, workers: int, steps: int,
          assignment_map: Optional[Dict[str, Optional[str]]] = None) -> Probe:
  """Probes config.estimator_program against the port (config.model with its recipe) for a
  run of `steps` steps on `workers` workers (see the module docstring), with the settings
  that take chance out (harness.deterministic).

  Raises:
    ProbeError: naming what differs and the fix.
  """
  config = harness.deterministic(config)
  name = config.estimator_program
  try:
    the_program = program_lib.load(name)
    params = the_program.params_with(config.program_params)
    input_fn = inputs.default_input_fn(config)
    train = estimator_program.build_graph(the_program, params, input_fn, "train", name,
                                          config.seed)
    evaluate = estimator_program.build_graph(the_program, params, input_fn, "eval", name,
                                             config.seed)
    estimator_program.check_workers(train, name, workers)
  except program_lib.ProgramError as e:
    raise ProbeError(str(e)) from None
  checks = [_recipe(config, estimator_program.recipe_values(train, range(steps)))]
  mapping, to_port = _names(config, train.variables, assignment_map)
  checks += [mapping, _no_chance(config, train, params), *_input(config, input_fn, workers)]
  if the_program.serving_input_receiver_fn is not None:
    checks.append(_serving(config, the_program, params))
  metrics = sorted(evaluate.spec.eval_metric_ops or {})
  if "accuracy" not in metrics:
    raise ProbeError(f"--estimator_program={name}: its eval_metric_ops have no `accuracy`, "
                     f"which parity holds to the port's (its metrics: {', '.join(metrics)}). "
                     f"Add tf.compat.v1.metrics.accuracy as \"accuracy\" to them.")
  unreported = sorted(set(model_lib.spec(config).metrics) - set(metrics))
  if unreported:
    raise ProbeError(f"--model={config.model} declares the metric {unreported[0]!r}, which "
                     f"--estimator_program={name}'s eval_metric_ops do not report (they "
                     f"report {', '.join(metrics)}): name it as their key, or take it out.")
  return Probe(checks, to_port, _batch(input_fn), metrics, the_program.input_fn is not None,
               the_program.serving_input_receiver_fn is not None, dict(assignment_map or {}))


def _recipe(config: Config, found: Dict[str, Any]) -> Check:
  """The port's --optimizer, its hyperparameters and its rate at each step against what the
  program's update ops apply."""
  name, optimizer = config.estimator_program, found["optimizer"]
  if found["others"] or optimizer != config.optimizer:
    others = f" and {', '.join(found['others'])}" if found["others"] else ""
    raise ProbeError(
        f"--estimator_program={name} trains with {optimizer}{others} (its train op's update "
        f"ops), the port with --optimizer={config.optimizer}: "
        + (f"give the port --optimizer={optimizer} and the hyperparameters below."
           if optimizer in config_lib.OPTIMIZER_DEFAULTS and not others else
           "the project's ports train with one tf.compat.v1.train optimizer of "
           f"{', '.join(config_lib.OPTIMIZER_DEFAULTS)}.")
        + _hyperparameter_hint(found))
  port = config.hyperparameters()
  for key, value in sorted(found["hyperparameters"].items()):
    if key in port and np.float32(port[key]) != np.float32(value):
      raise ProbeError(f"--estimator_program={name}'s {optimizer} has {key}={_f32(value)}, "
                       f"the port --{key}={port[key]:g}: give the port --{key}={_f32(value)}.")
  for step, rate in enumerate(found["rates"]):
    ported = reference.rate(config, step)
    if abs(ported - rate) > _RATE_RTOL * abs(rate):
      raise ProbeError(
          f"--estimator_program={name} trains step {step + 1} at the rate {_f32(rate)}, the "
          f"port at {_f32(ported)} (--learning_rate_schedule={config.learning_rate_schedule}, "
          f"--learning_rate={config.initial_learning_rate():g}): give the port the schedule "
          f"and rate the program's model_fn uses (docs/training.md, \"Learning-rate "
          f"schedules\"; a constant rate is --learning_rate_schedule=constant).")
  settings = ", ".join(f"{k}={_f32(v)}" for k, v in sorted(found["hyperparameters"].items()))
  return Check("recipe: optimizer, hyperparameters and rate, program vs port", True,
               float(len(found["rates"])), float(len(found["rates"])),
               f"{optimizer} ({settings}); rate {_f32(found['rates'][0])} at step 1, the same at "
               f"each of {len(found['rates'])} steps")


def _f32(value: float) -> str:
  """A float32 as its shortest decimal (0.9, not 0.899999976)."""
  return str(np.float32(value))


def _hyperparameter_hint(found: Dict[str, Any]) -> str:
  values = " ".join(f"--{k}={_f32(v)}" for k, v in sorted(found["hyperparameters"].items()))
  return f" Its settings: --learning_rate={_f32(found['rates'][0])} {values}".rstrip() + "."


def _names(config: Config, variables: Dict[str, List[int]],
           assignment_map: Optional[Dict[str, Optional[str]]]) -> Tuple[Check, Dict[str, str]]:
  """Every program variable given its place in the port, and every port weight a value."""
  where = f"--estimator_program={config.estimator_program}'s variables"
  try:
    # The slots follow their weights; the recipe check has held the optimizer already.
    entries = assign.classify(variables, config, assignment_map, reset_slots=True)
    assign.check_complete(entries, where, config, reset_slots=True)
  except ConversionError as e:
    raise ProbeError(str(e)) from None
  to_port = {e.name: e.weight for e in entries if e.kind == Kind.WEIGHT}
  return Check("names: every program variable mapped, every port weight given one", True,
               float(len(to_port)), float(len(model_lib.graph_model(config).shapes)),
               ", ".join(f"{k} -> {v}" for k, v in sorted(to_port.items()) if k != v)
               or "the same names"), to_port


def _no_chance(config: Config, train: estimator_program.Built, params: Dict[str, Any]
               ) -> Check:
  """No op on the way to the loss draws randomness (the variables' initializers do, once,
  and parity replaces them)."""
  drawn = sorted({op.name for op in _ancestors(train.spec.loss.op) if op.type in _RANDOM_OPS})
  if drawn:
    raise ProbeError(
        f"--estimator_program={config.estimator_program}'s model_fn draws randomness every "
        f"step with params {params} ({', '.join(drawn)}: a dropout, say), another draw in each "
        f"backend: parity cannot hold the weights. Give EstimatorProgram(deterministic_params="
        f"...) the params that turn it off (dropout 0), or --program_params.")
  return Check("no chance in a step of the program (its loss draws nothing)", True, 0.0, 0.0,
               f"params {params}")


def _serving(config: Config, the_program: program_lib.EstimatorProgram,
             params: Dict[str, Any]) -> Check:
  """The program's receiver's features fit the port's inputs, and the port has signatures
  of its own to serve the program's export_outputs with."""
  name = config.estimator_program
  port_inputs = model_lib.input_shapes(config)
  try:
    spec = estimator_program.serving_graph(
        the_program, params, name, lambda features: inputs.check_fits(
            config, port_inputs, features, "its serving_input_receiver_fn"))
  except program_lib.ProgramError as e:
    raise ProbeError(str(e)) from None
  outputs = {k: sorted(getattr(v, "outputs", {}) or {})
             for k, v in sorted((spec.export_outputs or {}).items())}
  if model_lib.spec(config).signatures is None:
    raise ProbeError(
        f"--estimator_program={name} exports through its serving_input_receiver_fn "
        f"(export_outputs {outputs}), and --model={config.model} has no signatures of its own "
        f"to serve them: give its ModelSpec signatures=... (docs/MIGRATION.md, \"Prove your "
        f"port\"), or leave the receiver out of the program.")
  return Check("serving: the port takes the receiver's features and has its own signatures",
               True, float(len(outputs)), float(len(outputs)),
               f"the program's export_outputs {outputs}")


def _ancestors(op: tf.Operation) -> List[tf.Operation]:
  """Every op `op` reads, through its inputs and control inputs (not through variables)."""
  seen, stack, found = set(), [op], []
  while stack:
    current = stack.pop()
    if current in seen:
      continue
    seen.add(current)
    found.append(current)
    stack += [t.op for t in current.inputs] + list(current.control_inputs)
  return found


def _input(config: Config, input_fn: inputs.InputFn, workers: int) -> List[Check]:
  """Each worker's first batches from `input_fn` in a graph and eagerly: the same."""
  checks = []
  for worker in range(workers):
    context = tf.distribute.InputContext(workers, worker, workers)
    graph_batches = _graph_batches(input_fn, context, config.seed)
    tf.random.set_seed(config.seed)
    eager = iter(input_fn(mnist.TRAIN, context))
    for index, in_graph in enumerate(graph_batches):
      # A SparseTensor's parts, as a session gives them (a SparseTensorValue's fields).
      eagerly = [t.numpy() for t in tf.nest.flatten(next(eager), expand_composites=True)]
      if not all(np.array_equal(a, b) for a, b in zip(tf.nest.flatten(in_graph), eagerly)):
        raise ProbeError(
            f"--estimator_program={config.estimator_program}'s input_fn gives worker {worker} "
            f"another batch {index + 1} in the Estimator's graph than eagerly (Keras): an op "
            f"in it draws randomness without a seed of its own "
            f"({', '.join(_random_ops(input_fn, context)) or 'a random op'}), and TensorFlow "
            f"derives a missing op seed otherwise in a graph and eagerly. Give it one "
            f"(dataset.shuffle(n, seed=N), tf.random.uniform(..., seed=N)) and run again.")
    checks.append(Check(f"input: worker {worker}'s batches the same in a graph and eagerly",
                        True, float(len(graph_batches)), float(len(graph_batches)),
                        f"the first {len(graph_batches)} batches of {workers} pipeline(s)"))
  return checks


def _graph_batches(input_fn: inputs.InputFn, context: tf.distribute.InputContext, seed: int,
                   count: int = 2) -> List[Any]:
  """The first `count` batches of `input_fn` built in a graph with the global seed."""
  with tf.Graph().as_default() as graph:
    tf.compat.v1.set_random_seed(seed)
    batch = tf.compat.v1.data.make_one_shot_iterator(input_fn(mnist.TRAIN, context)).get_next()
    with tf.compat.v1.Session(graph=graph) as session:
      return [session.run(batch) for _ in range(count)]


def _random_ops(input_fn: inputs.InputFn, context: tf.distribute.InputContext) -> List[str]:
  """The ops of an input pipeline that draw from a seed: its shuffles and random ops."""
  graph = tf.compat.v1.GraphDef()
  graph.ParseFromString(input_fn(mnist.TRAIN, context)._as_serialized_graph().numpy())  # pylint: disable=protected-access
  nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
  return sorted({n.op for n in nodes if "Shuffle" in n.op or n.op in _RANDOM_OPS})


def _batch(input_fn: inputs.InputFn) -> int:
  """The examples in the first train batch of a lone pipeline."""
  _, labels = next(iter(input_fn(mnist.TRAIN, None)))
  return int(tf.shape(labels)[0])


def program_weights(weights: model_lib.Weights, to_port: Dict[str, str]) -> model_lib.Weights:
  """The port's `weights` under the program's names (the initial weights of its run)."""
  return {program_name: weights[port_name] for program_name, port_name in to_port.items()}


def estimator_changes(probed: Probe, config: Config, out_dir: str) -> Dict[str, Any]:
  """The Estimator's own changes to `config` (whose init_weights are the port's) for a run
  of the program: the same initial weights under the program's names, written to
  `out_dir/program_init_weights.npz`."""
  if not config.init_weights:
    return {}
  path = os.path.join(out_dir, PROGRAM_INIT_WEIGHTS_FILE)
  model_lib.save_weights_npz(path, program_weights(model_lib.load_weights_npz(
      config.init_weights), probed.to_port))
  return {"init_weights": path}
