"""A team's EstimatorProgram (trainers/program.py) in a graph: their model_fn called as the
Estimator calls it, what its failures say, and what its train op applies.

    recipe = find_recipe(ops_created_by_their_model_fn)
    recipe.optimizer        # "adam": the tf.compat.v1.train optimizer its update op is
    recipe.rate             # the learning-rate tensor that op reads, every step
    recipe.hyperparameters  # {"beta1": <tensor>, ...}, by the project's flag names

    built = build_graph(program, params, input_fn, "train")  # In a graph of its own.

Nothing here changes their code: the recipe is read off the update ops their optimizer
made (`ResourceApplyAdam` and its `lr` input), which is how launch.parity holds a port's
--optimizer, its hyperparameters and its schedule to the program's before it trains.
Needs tf.estimator (TensorFlow 2.15).
"""

import dataclasses
import inspect
import os
import shutil
import sysconfig
import tempfile
import traceback
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

import tensorflow as tf

from trainers import inputs
from trainers import program as program_lib
from trainers.config import Config

# Each tf.compat.v1.train optimizer by the update op it makes (without its Resource and
# Sparse prefixes), and the op's inputs that are its hyperparameters, by the flag's name.
_OPTIMIZER_OF_OP = {"ApplyGradientDescent": "sgd", "ApplyMomentum": "momentum",
                    "ApplyAdagrad": "adagrad", "ApplyAdam": "adam", "ApplyFtrl": "ftrl",
                    "ApplyFtrlV2": "ftrl", "ApplyRMSProp": "rmsprop"}
_HYPERPARAMETER_OF_INPUT = {"lr": "learning_rate", "alpha": "learning_rate",
                            "momentum": "momentum", "beta1": "beta1", "beta2": "beta2",
                            "epsilon": "epsilon", "rho": "rho", "l1": "l1", "l2": "l2",
                            "lr_power": "learning_rate_power"}
# Frames that are not the team's: the trainers', the installed packages' (TensorFlow's) and
# Python's own (frozen ones are named "<frozen posixpath>").
_NOT_THEIRS = (os.path.dirname(os.path.abspath(__file__)),
               os.path.dirname(os.path.dirname(os.path.abspath(tf.__file__))),
               sysconfig.get_paths()["stdlib"], "<")


def call_model_fn(model_fn: Callable[..., Any], features: Any, labels: Any, mode: str,
                  params: Mapping[str, Any], config: Any) -> Any:
  """Calls `model_fn` as `tf.estimator.Estimator._call_model_fn` does (estimator.py):
  features by keyword, and only those of labels, mode, params and config it declares."""
  declared = inspect.signature(model_fn).parameters
  takes_all = any(p.kind == p.VAR_KEYWORD for p in declared.values())
  given = {"labels": labels, "mode": mode, "params": dict(params), "config": config}
  kwargs = {k: v for k, v in given.items() if takes_all or k in declared}
  if "labels" not in kwargs and labels is not None:
    raise program_lib.ProgramError("the program's model_fn takes no labels, but its input_fn "
                                   "gives them: declare a labels argument.")
  return model_fn(features=features, **kwargs)


def failure(error: BaseException, name: str, what: str) -> program_lib.ProgramError:
  """A ProgramError for `error`, raised by the program `name`'s code while it did `what`
  ("its model_fn built the train graph"), naming the last frame in the team's own files."""
  frames = [f for f in traceback.extract_tb(error.__traceback__)
            if not f.filename.startswith(_NOT_THEIRS)
            and not os.path.abspath(f.filename).startswith(_NOT_THEIRS)]
  where = (f" (at {frames[-1].filename}:{frames[-1].lineno}, in {frames[-1].name})"
           if frames else "")
  first_line = (str(error).strip().splitlines() or [""])[0]
  return program_lib.ProgramError(
      f"--estimator_program={name}: {what} and failed: {type(error).__name__}: "
      f"{first_line}{where}. Fix it there, then run again.")


class TheirHook(tf.estimator.SessionRunHook):
  """A SessionRunHook of a team's program, run as the Estimator runs it; what it raises
  (but the Estimator's own signals: a TensorFlow error, a NaN loss) becomes a ProgramError
  naming the hook, its method and the frame of theirs."""

  def __init__(self, hook: tf.estimator.SessionRunHook, name: str):
    self._hook, self._name = hook, name

  def _call(self, method: str, *args):
    try:
      return getattr(self._hook, method)(*args)
    except (tf.errors.OpError, tf.compat.v1.train.NanLossDuringTrainingError):
      raise
    except Exception as e:  # Their code: what it raises is theirs to fix.
      raise failure(e, self._name, f"its hook {type(self._hook).__name__}.{method} "
                    f"ran") from e

  def begin(self):
    self._call("begin")

  def after_create_session(self, session, coord):
    self._call("after_create_session", session, coord)

  def before_run(self, run_context):
    return self._call("before_run", run_context)

  def after_run(self, run_context, run_values):
    self._call("after_run", run_context, run_values)

  def end(self, session):
    self._call("end", session)


def named_hooks(spec: Any, name: str) -> Any:
  """`spec` (an EstimatorSpec of the program `name`) with each of its hooks a TheirHook."""
  kinds = ("training_hooks", "training_chief_hooks", "evaluation_hooks", "prediction_hooks")
  return spec._replace(**{kind: [TheirHook(h, name) for h in getattr(spec, kind)]
                          for kind in kinds})


@dataclasses.dataclass(frozen=True)
class Recipe:
  """What a train op applies: the optimizer, the rate and hyperparameters its update ops read.

  Attributes:
    optimizer: the flag's name of the tf.compat.v1.train optimizer ("adam"), or the update
      op's type where there is none ("ResourceApplyAdadelta").
    rate: the learning-rate tensor of its first update op.
    hyperparameters: the op's other inputs that are settings, by the flag's name.
    others: the optimizers of other update ops, if they differ (two optimizers).
  """

  optimizer: str
  rate: tf.Tensor
  hyperparameters: Dict[str, tf.Tensor]
  others: Sequence[str] = ()


def _optimizer(op: tf.Operation) -> Optional[str]:
  """The optimizer an update op is of, or None if `op` is no optimizer's update."""
  kind = op.type.replace("Resource", "", 1).replace("Sparse", "", 1)
  if not kind.startswith("Apply"):
    return None
  optimizer = _OPTIMIZER_OF_OP.get(kind, op.type)
  if kind == "ApplyMomentum" and op.get_attr("use_nesterov"):
    optimizer = "momentum (nesterov)"
  return optimizer


def find_recipe(ops: Sequence[tf.Operation]) -> Optional[Recipe]:
  """The recipe of the update ops among `ops`, or None if there are none."""
  updates = [op for op in ops if _optimizer(op)]
  if not updates:
    return None
  first = updates[0]
  inputs = dict(zip([a.name for a in first.op_def.input_arg], first.inputs))
  settings = {_HYPERPARAMETER_OF_INPUT[k]: t for k, t in inputs.items()
              if k in _HYPERPARAMETER_OF_INPUT}
  rate = settings.pop("learning_rate")
  optimizer = _optimizer(first)
  others = sorted({_optimizer(op) for op in updates} - {optimizer})
  return Recipe(optimizer, rate, settings, others)


@dataclasses.dataclass(frozen=True)
class Built:
  """A program's graph for one mode, built in a graph of its own.

  Attributes:
    graph: the graph.
    spec: the EstimatorSpec its model_fn returned.
    features: what its input_fn gave (a batch's tensors).
    variables: every global variable's name and shape (model, slots, global step).
    trainable: the trainable ones' names.
    recipe: in "train" mode, what its train op applies; None in "eval".
  """

  graph: tf.Graph
  spec: Any
  features: Any
  variables: Dict[str, List[int]]
  trainable: List[str]
  recipe: Optional[Recipe]


def build_graph(program: program_lib.EstimatorProgram, params: Mapping[str, Any],
                input_fn: Callable[..., tf.data.Dataset], mode: str, name: str,
                seed: int = 1) -> Built:
  """`program`'s model_fn in `mode` ("train" or "eval") on a batch of `input_fn` (called as
  `input_fn(mode, None)`), in a graph of its own with the
  global seed `seed`, as the Estimator builds it outside a strategy (its RunConfig's
  model_dir a new empty directory, removed after: nothing runs that would write there).

  Raises:
    program_lib.ProgramError: their input_fn or model_fn failed (naming the last frame of
      theirs), or the model_fn returned no EstimatorSpec, or no train op in "train" mode.
  """
  graph = tf.Graph()
  with graph.as_default():
    tf.compat.v1.set_random_seed(seed)
    tf.compat.v1.train.get_or_create_global_step()
    try:
      dataset = input_fn(mode, None)
      features, labels = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    except Exception as e:  # Their code: what it raises is theirs to fix.
      raise failure(e, name, f"its input_fn built the {mode} input") from e
    first = len(graph.get_operations())
    spec = _call_in_graph(program, features, labels, mode, params, name,
                          f"its model_fn built the {mode} graph", seed)
    if not isinstance(spec, tf.estimator.EstimatorSpec):
      raise program_lib.ProgramError(
          f"--estimator_program={name}: its model_fn returned a {type(spec).__name__} in "
          f"{mode} mode, not a tf.estimator.EstimatorSpec.")
    recipe = find_recipe(graph.get_operations()[first:]) if mode == "train" else None
    if mode == "train" and (spec.train_op is None or recipe is None):
      raise program_lib.ProgramError(
          f"--estimator_program={name}: its model_fn's train op updates no variable with a "
          f"tf.compat.v1.train optimizer, which the project needs to read its rate.")
    variables = {v.op.name: v.shape.as_list() for v in tf.compat.v1.global_variables()}
    trainable = [v.op.name for v in tf.compat.v1.trainable_variables()]
  return Built(graph, spec, features, variables, trainable, recipe)


def _call_in_graph(program: program_lib.EstimatorProgram, features: Any, labels: Any,
                   mode: str, params: Mapping[str, Any], name: str, what: str,
                   seed: Optional[int] = None) -> Any:
  """`program`'s model_fn called in the default graph, as the Estimator calls it, with a
  RunConfig whose model_dir is a new empty directory (removed after); ProgramError naming
  the frame of theirs if it raises (`what` it was doing)."""
  model_dir = tempfile.mkdtemp(prefix="program-graph-")
  try:
    return call_model_fn(program.model_fn, features, labels, mode, params,
                         tf.estimator.RunConfig(model_dir=model_dir, tf_random_seed=seed))
  except program_lib.ProgramError:
    raise
  except Exception as e:  # Their code: what it raises is theirs to fix.
    raise failure(e, name, what) from e
  finally:
    shutil.rmtree(model_dir, ignore_errors=True)


def serving_graph(program: program_lib.EstimatorProgram, params: Mapping[str, Any],
                  name: str, check: Callable[[Any], None] = lambda features: None) -> Any:
  """`program`'s receiver and its model_fn's infer graph on the receiver's features, in a
  graph of their own: the EstimatorSpec. `check(features)` runs on the receiver's features
  first (the port's fit, say)."""
  with tf.Graph().as_default():
    try:
      receiver = program.serving_input_receiver_fn()
    except Exception as e:  # Their code.
      raise failure(e, name, "its serving_input_receiver_fn built its receiver") from e
    check(receiver.features)
    return _call_in_graph(program, receiver.features, None, "infer", params, name,
                          "its model_fn built the infer graph on its receiver's features")


def recipe_values(built: Built, steps: Iterable[int]) -> Dict[str, Any]:
  """The train graph's recipe as numbers: {"optimizer", "others", "hyperparameters",
  "rates"}, the rate at each of `steps` (0-based) read with the global step set to it (a
  schedule on global_step; the model's variables start from their initializers)."""
  recipe = built.recipe
  with built.graph.as_default(), tf.compat.v1.Session(graph=built.graph) as session:
    session.run(tf.compat.v1.global_variables_initializer())
    step = tf.compat.v1.placeholder(tf.int64, [])
    set_step = tf.compat.v1.assign(tf.compat.v1.train.get_global_step(), step)
    rates = []
    for i in steps:
      session.run(set_step, {step: i})
      rates.append(float(session.run(recipe.rate)))
    hyperparameters = {k: float(v) for k, v in session.run(recipe.hyperparameters).items()}
  return {"optimizer": recipe.optimizer, "others": list(recipe.others),
          "hyperparameters": hyperparameters, "rates": rates}


def graph(config: Config, mode: str = "train") -> Built:
  """config.estimator_program's graph in `mode`, with its params and --program_params, on its
  input (inputs.default_input_fn): build_graph."""
  the_program = program_lib.load(config.estimator_program)
  return build_graph(the_program, the_program.params_with(config.program_params),
                     inputs.default_input_fn(config), mode, config.estimator_program,
                     config.seed)


def check(config: Config, workers: int = 1) -> None:
  """Raises ProgramError unless config.estimator_program's model_fn builds its train and
  eval graphs, its train op has an optimizer's update, and `workers` can train it
  (`check_workers`)."""
  train, _ = graph(config, "train"), graph(config, "eval")
  check_workers(train, config.estimator_program, workers)


def check_workers(train: Built, name: str, workers: int) -> None:
  """Raises ProgramError if the program of the train graph `train` updates a variable by
  rows and `workers` is more than one: MultiWorkerMirroredStrategy cannot train it then."""
  by_rows = sparse_updates(train)
  if workers > 1 and by_rows:
    shown = ", ".join(by_rows[:3]) + (f" and {len(by_rows) - 3} more" if by_rows[3:] else "")
    raise program_lib.ProgramError(
        f"--estimator_program={name}: its train op updates {shown} by rows (a sparse "
        f"gradient: an embedding's, a categorical column's weights), which "
        f"MultiWorkerMirroredStrategy all-gathers in the Estimator's graph and cannot when "
        f"workers touch different numbers of rows (\"Shape mismatch in the collective "
        f"instance\", tensorflow#24003). Train the program with --workers=1 (its Keras port "
        f"trains on any number).")


def sparse_updates(built: Built) -> List[str]:
  """The trainable variables `built`'s train op updates by rows (a sparse apply or scatter
  of a gradient's IndexedSlices into the variable or one of its slots), by name, sorted."""
  by_length = sorted(built.trainable, key=len, reverse=True)
  names = set()
  for op in built.graph.get_operations():
    kind = op.type.replace("Resource", "", 1)
    if not (kind.startswith("SparseApply") or kind.startswith("Scatter")) or not op.inputs:
      continue
    target = op.inputs[0].op
    while target.type == "Identity" and target.inputs:
      target = target.inputs[0].op
    # A slot is named under its variable: `table/Adam` is Adam's first slot of `table`.
    owner = next((v for v in by_length
                  if target.name == v or target.name.startswith(v + "/")), None)
    if owner:
      names.add(owner)
  return sorted(names)


def variables(config: Config) -> Dict[str, List[int]]:
  """Every variable a checkpoint of config.estimator_program's training holds, by name, with
  its shape (its train graph's global variables)."""
  return graph(config).variables
