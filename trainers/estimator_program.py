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
import traceback
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

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
# Frames that are not the team's: the trainers', and the installed packages' (TensorFlow's).
_NOT_THEIRS = (os.path.dirname(os.path.abspath(__file__)),
               os.path.dirname(os.path.dirname(os.path.abspath(tf.__file__))))


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
            if not os.path.abspath(f.filename).startswith(_NOT_THEIRS)]
  where = (f" (at {frames[-1].filename}:{frames[-1].lineno}, in {frames[-1].name})"
           if frames else "")
  first_line = (str(error).strip().splitlines() or [""])[0]
  return program_lib.ProgramError(
      f"--estimator_program={name}: {what} and failed: {type(error).__name__}: "
      f"{first_line}{where}. Fix it there, then run again.")


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
    recipe: in "train" mode, what its train op applies.
  """

  graph: tf.Graph
  spec: Any
  features: Any
  variables: Dict[str, List[int]]
  recipe: Optional[Recipe]


def build_graph(program: program_lib.EstimatorProgram, params: Mapping[str, Any],
                input_fn: Callable[..., tf.data.Dataset], mode: str, name: str,
                seed: int = 1) -> Built:
  """`program`'s model_fn in `mode` ("train", "eval", "infer") on a batch of `input_fn`
  (called as `input_fn(mode, None)`; "train" for "infer"), in a graph of its own with the
  global seed `seed`, as the Estimator builds it outside a strategy.

  Raises:
    program_lib.ProgramError: their input_fn or model_fn failed (naming the last frame of
      theirs), or the model_fn returned no EstimatorSpec, or no train op in "train" mode.
  """
  graph = tf.Graph()
  with graph.as_default():
    tf.compat.v1.set_random_seed(seed)
    tf.compat.v1.train.get_or_create_global_step()
    try:
      dataset = input_fn("eval" if mode == "eval" else "train", None)
      features, labels = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    except Exception as e:  # Their code: what it raises is theirs to fix.
      raise failure(e, name, f"its input_fn built the {mode} input") from e
    run_config = tf.estimator.RunConfig(tf_random_seed=seed)
    first = len(graph.get_operations())
    try:
      spec = call_model_fn(program.model_fn, features, None if mode == "infer" else labels,
                           mode, params, run_config)
    except program_lib.ProgramError:
      raise
    except Exception as e:  # Their code.
      raise failure(e, name, f"its model_fn built the {mode} graph") from e
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
  return Built(graph, spec, features, variables, recipe)


def recipe_values(built: Built, steps: int) -> Dict[str, Any]:
  """The train graph's recipe as numbers: {"optimizer", "hyperparameters", "rates"}, each
  step's rate from 0 to `steps` - 1 read with the global step set to it (a schedule on
  global_step; the model's variables start from their initializers)."""
  recipe = built.recipe
  with built.graph.as_default(), tf.compat.v1.Session(graph=built.graph) as session:
    session.run(tf.compat.v1.global_variables_initializer())
    step = tf.compat.v1.placeholder(tf.int64, [])
    set_step = tf.compat.v1.assign(tf.compat.v1.train.get_global_step(), step)
    rates = []
    for i in range(steps):
      session.run(set_step, {step: i})
      rates.append(float(session.run(recipe.rate)))
    hyperparameters = {k: float(v) for k, v in session.run(recipe.hyperparameters).items()}
  return {"optimizer": recipe.optimizer, "others": list(recipe.others),
          "hyperparameters": hyperparameters, "rates": rates}


def check(config: Config) -> None:
  """Raises ProgramError unless config.estimator_program's model_fn builds its train and
  eval graphs on its input (inputs.default_input_fn), with its params and --program_params,
  and its train op has an optimizer's update; builds them in graphs of their own."""
  the_program = program_lib.load(config.estimator_program)
  params = the_program.params_with(config.program_params)
  for mode in ("train", "eval"):
    build_graph(the_program, params, inputs.default_input_fn(config), mode,
                config.estimator_program, config.seed)


def variables(config: Config) -> Dict[str, List[int]]:
  """Every variable a checkpoint of config.estimator_program's training holds, by name, with
  its shape (its train graph's global variables)."""
  the_program = program_lib.load(config.estimator_program)
  return build_graph(the_program, the_program.params_with(config.program_params),
                     inputs.default_input_fn(config), "train", config.estimator_program,
                     config.seed).variables
