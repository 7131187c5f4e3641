"""What a checkpoint holds, variable by variable, and the `--assignment_map` that would carry
it onto one of this project's models (`python -m launch.convert --inspect=DIR`).

For any checkpoint, from this project or not. Each variable is one of:

- weight: a value of the model (a kernel, a bias, a moving statistic);
- slot: an optimizer's value for one weight: a v1 optimizer's `<weight>/Momentum`
  (also in the forms `tf.compat.v1.estimator`'s canned classes write,
  `linear/linear/linear_model/<feature>/weights/Ftrl` and `<weight>/part_0/Ftrl`:
  `checkpoints.v1_slot`), or a Keras legacy
  optimizer's `training/<Optimizer>/<weight>/<slot>` (the TF2 canned Estimators);
- step: `global_step`, or a Keras optimizer's `_iterations` / `iter`;
- counter: Adam's `beta1_power` / `beta2_power`;
- hyperparameter: a Keras legacy optimizer's `training/<Optimizer>/<name>` scalar
  (`learning_rate`, `decay`);
- other: none of these (an EMA, a metric, a variable of the program's own).

The proposed map names, for each weight whose name is not one of the model's,
the model weight it goes to: by name first (the same name under a scope prefix), then
by shape (the one model weight of that shape left), then by order (the n-th of that
shape, in the checkpoint's sorted order and the model's build order). Shape and order
are guesses, and marked so; a weight that matches nothing gets null, to be checked.
A canned Estimator's checkpoint also gets its Keras twin's flags
(`--model=dnn --hidden_units=32,16`, `--model=linear_v1` for a tf.compat.v1.estimator
class's, its optimizers and rates where not the defaults), and over feature columns
`--features=tabular` with the columns it keeps variables for (their module, when they are
not the built-in ones, is for the user to give as --feature_columns).
"""

import collections
import dataclasses
import json
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from data import mnist
from launch.convert.kinds import Kind
from trainers import checkpoints
from trainers import config as config_lib
from trainers import model as model_lib
from trainers import optimizers
from trainers.config import Config

_KERAS_STEP_NAMES = ("_iterations", "iter")
_BY_NAME, _BY_SHAPE, _BY_ORDER, _NONE = "name", "shape (guess)", "order (guess)", "none"


@dataclasses.dataclass
class Variable:
  name: str
  shape: List[int]
  dtype: str
  kind: Kind
  of: str = ""  # Kind.SLOT: the weight it belongs to.
  detail: str = ""  # Kind.SLOT: the slot's name and whose; Kind.HYPERPARAMETER: whose.


@dataclasses.dataclass
class Inspection:
  path: str
  backend: str  # checkpoints.KERAS or ESTIMATOR.
  step: Optional[int]
  variables: List[Variable]
  model: str  # The model the map is proposed onto.
  assignment_map: Dict[str, Optional[str]]  # Ready for --assignment_map.
  matched_by: Dict[str, str]  # Each map entry's (and each same-named weight's) rule.
  unfilled: List[str]  # Model weights nothing in the checkpoint gives a value.
  # A canned Estimator's checkpoint: the flags of its twin, as far as it tells them.
  canned_flags: List[str] = dataclasses.field(default_factory=list)
  # Its feature columns that keep variables (`feature_columns`), over --features=tabular.
  feature_columns: List[str] = dataclasses.field(default_factory=list)

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=2)


def _slot_of(name: str, shapes: Mapping[str, Sequence[int]]) -> Optional[Tuple[str, str]]:
  """(weight, what) if `name` is an optimizer's slot of a variable in `shapes`."""
  if name.startswith(checkpoints.CANNED_OPTIMIZER_SCOPE):
    # training/<Optimizer>/<weight>/<slot>: a Keras legacy optimizer.
    parts = name.split("/")
    weight = "/".join(parts[2:-1])
    if weight in shapes:
      return weight, f"the Keras {parts[1]} optimizer's {parts[-1]} (a TF2 canned Estimator's)"
  slot = checkpoints.v1_slot(name, shapes)
  if slot:
    return slot[0], f"the v1 {optimizers.trained_with([slot[1]])} optimizer's {slot[1]}"
  return None


def _estimator_variables(shapes: Mapping[str, Sequence[int]],
                         dtypes: Mapping[str, tf.DType]) -> List[Variable]:
  found = []
  for name in sorted(n for n in shapes if n != checkpoints.OBJECT_GRAPH_KEY):
    shape, dtype = list(shapes[name]), dtypes[name].name
    slot = _slot_of(name, shapes)
    if name == checkpoints.ESTIMATOR_STEP_KEY:
      found.append(Variable(name, shape, dtype, Kind.STEP))
    elif checkpoints.v1_counter(name):
      found.append(Variable(name, shape, dtype, Kind.COUNTER, detail="Adam's power of beta"))
    elif slot:
      found.append(Variable(name, shape, dtype, Kind.SLOT, of=slot[0], detail=slot[1]))
    elif name.startswith(checkpoints.CANNED_OPTIMIZER_SCOPE) and not shape:
      found.append(Variable(name, shape, dtype, Kind.HYPERPARAMETER,
                            detail=f"of the Keras {name.split('/')[1]} optimizer"))
    elif dtypes[name].is_floating and shape:
      found.append(Variable(name, shape, dtype, Kind.WEIGHT))
    else:
      found.append(Variable(name, shape, dtype, Kind.OTHER))
  return found


def _keras_variables(reader) -> List[Variable]:
  """An object-based checkpoint's variables by the names they were saved with."""
  names = checkpoints.saved_names(reader)
  shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
  paths = {key: key[:-len(checkpoints.keras_key(""))] for key in shapes
           if key != checkpoints.OBJECT_GRAPH_KEY}
  weights = {names.get(k, k) for k, path in paths.items()
             if path.startswith("model/") and not path.startswith("model/optimizer/")}
  found = []
  for key, path in sorted(paths.items(), key=lambda item: names.get(item[0], item[0])):
    name, shape, dtype = names.get(key, key), list(shapes[key]), dtypes[key].name
    of = next((w for w in weights if name.endswith("/" + w)), "")
    if path.startswith("model/optimizer/") and path.split("/")[-1] in _KERAS_STEP_NAMES:
      found.append(Variable(name, shape, dtype, Kind.STEP, detail=key))
    elif name in weights:
      found.append(Variable(name, shape, dtype, Kind.WEIGHT, detail=key))
    elif path.startswith("model/optimizer/") and of:
      slot = name[:-len(of) - 1].split("/")[-1]
      found.append(Variable(name, shape, dtype, Kind.SLOT, of=of,
                            detail=f"the Keras optimizer's {slot} ({key})"))
    elif path.startswith("model/optimizer/") and name.endswith("_power"):
      found.append(Variable(name, shape, dtype, Kind.COUNTER, detail=key))
    else:
      found.append(Variable(name, shape, dtype, Kind.OTHER, detail=key))
  return found


_HIDDEN = re.compile(r"^dnn/hiddenlayer_(\d+)/kernel$")
# A canned DNN's batch normalization after a hidden layer (its moving statistics too).
_BATCH_NORM = re.compile(r"^dnn/hiddenlayer_\d+/batchnorm_\d+/")
# The canned DNN's settings no variable keeps: the inspection cannot tell them.
UNKNOWN_SETTINGS = ("--dropout", "--activation")
_LINEAR_WEIGHTS = re.compile(r"^linear/linear_model/(\w+)/weights$")
_EMBEDDINGS = re.compile(r"^dnn/input_from_feature_columns/input_layer/(\w+)/embedding_weights$")
# Flags naming what only the run knows: its feature columns' module.
FEATURE_COLUMNS_FLAG = "--feature_columns=<package.module:NAME>"


def feature_columns(variables: Sequence[Variable]) -> List[str]:
  """The feature columns a canned Estimator's checkpoint keeps variables for (its linear
  part's weights, its DNN part's embeddings), or [] for the image's one numeric column.

  A DNN part keeps no variable for a numeric or indicator column: those are not named.
  """
  shapes = {v.name: v.shape for v in variables}
  linear = [m.group(1) for m in map(_LINEAR_WEIGHTS.match, shapes) if m]
  embedded = [m.group(1) for m in map(_EMBEDDINGS.match, shapes) if m]
  if not embedded and len(linear) == 1 and shapes[f"linear/linear_model/{linear[0]}/weights"][
      0] == int(np.prod(mnist.IMAGE_SHAPE)):
    return []  # --feature_name: the image, flattened.
  return sorted(linear) + sorted(set(embedded) - set(linear))


def _builtin_columns(linear: bool, dnn: bool) -> List[str]:
  """The names feature_columns() gives trainers/models/tabular.py's COLUMNS, of the parts
  a model has."""
  from trainers.models import tabular  # noqa: PLC0415 -- builds tf.feature_column objects.
  wide = [c.name for c in tabular.COLUMNS["linear"]] if linear else []
  embedded = [c.name for c in tabular.COLUMNS["dnn"] if c.name.endswith("_embedding")
              ] if dnn else []
  return sorted(wide) + sorted(set(embedded) - set(wide))


def canned_flags(variables: Sequence[Variable], values: Callable[[str], Any]) -> List[str]:
  """The flags of the Keras twin (trainers/models/canned.py) of the canned Estimator
  whose checkpoint holds `variables` (`values(name)` reads one), or [] if it is not one.

  A DNN keeps no variable of its feature: `--feature_name` is only told by a linear part;
  a v1 optimizer keeps no rate: `--<part>_learning_rate` is only told by a TF2 one. Over
  feature columns (`--features=tabular`): `--feature_columns` only when they are not
  the built-in ones, and then as a placeholder (the names are in `feature_columns`).
  """
  names = {v.name: v for v in variables}
  hidden = sorted((int(m.group(1)), names[m.group(0)].shape[1])
                  for m in map(_HIDDEN.match, names) if m)
  linear = [m.group(1) for m in map(_LINEAR_WEIGHTS.match, names) if m]
  v1_slots = {v.of: v.name for v in variables if v.kind == Kind.SLOT
              and not v.name.startswith(checkpoints.CANNED_OPTIMIZER_SCOPE)}
  if "dnn/logits/kernel" not in names and not linear:
    return []
  model = "wide_deep" if hidden and linear else "dnn" if hidden else "linear"
  if v1_slots:  # A tf.compat.v1.estimator class's: its twin sums the loss.
    model += "_v1"
  flags = [f"--model={model}"]
  if hidden:
    flags.append("--hidden_units=" + ",".join(str(width) for _, width in hidden))
  if any(map(_BATCH_NORM.match, names)):
    flags.append("--batch_norm")
  columns = feature_columns(variables)
  if columns:
    flags.append("--features=tabular")
    if columns != _builtin_columns(bool(linear), bool(hidden)):
      flags.append(FEATURE_COLUMNS_FLAG)
  elif linear:
    flags.append(f"--feature_name={linear[0]}")
  defaults = config_lib.CANNED[model]
  for part in ("dnn", "linear"):
    if f"{part}_optimizer" not in defaults:
      continue
    if v1_slots:  # Its v1 optimizer, by its slots' names; it keeps no rate.
      slots = [checkpoints.v1_slot(name, names)[1] for weight, name in v1_slots.items()
               if weight.startswith(part + "/")]
      name = optimizers.trained_with(slots) if slots else "sgd"
      if name != defaults[f"{part}_optimizer"]:
        flags.append(f"--{part}_optimizer={name}")
      continue
    # Its optimizer: the one keeping a slot of a weight of the part.
    scopes = {v.name.split("/")[1] for v in variables if v.kind == Kind.SLOT
              and v.name.startswith(checkpoints.CANNED_OPTIMIZER_SCOPE)
              and v.of.startswith(part + "/")}
    if len(scopes) != 1:  # A v1 optimizer's, or SGD's (no slots): not told here.
      continue
    scope = scopes.pop()
    name = scope.split("_")[0].lower()  # "Adagrad_1": the second optimizer of a kind.
    if name in config_lib.CANNED_OPTIMIZERS and name != defaults[f"{part}_optimizer"]:
      flags.append(f"--{part}_optimizer={name}")
    rate = f"{checkpoints.CANNED_OPTIMIZER_SCOPE}{scope}/learning_rate"
    if rate in names and not np.isclose(values(rate), defaults[f"{part}_learning_rate"]):
      flags.append(f"--{part}_learning_rate={float(values(rate)):.6g}")
  return flags


def propose_map(variables: Sequence[Variable], weights: Mapping[str, Sequence[int]]
                ) -> Tuple[Dict[str, Optional[str]], Dict[str, str], List[str]]:
  """The map of the checkpoint's weights onto `weights` (the model's, in build order).

  Returns:
    (old name -> model weight or None, each checkpoint weight's rule, model weights left
    without a value).
  """
  mapping: Dict[str, Optional[str]] = {}
  rule: Dict[str, str] = {}
  free = dict(weights)
  candidates = [v for v in variables if v.kind == Kind.WEIGHT]
  for v in candidates:  # By name: itself, or itself under a scope prefix.
    match = next((w for w in free if v.name == w or v.name.endswith("/" + w)), None)
    if match and list(free[match]) == v.shape:
      if match != v.name:
        mapping[v.name] = match
      rule[v.name] = _BY_NAME
      del free[match]
  left = [v for v in candidates if v.name not in rule]
  # How many of each shape there are, before any is matched: one of each is a match by shape.
  left_shapes = collections.Counter(tuple(v.shape) for v in left)
  free_shapes = collections.Counter(tuple(shape) for shape in free.values())
  for v in left:  # By shape, then by order.
    same = [w for w, shape in free.items() if list(shape) == v.shape]
    if not same:
      mapping[v.name], rule[v.name] = None, _NONE
      continue
    unique = left_shapes[tuple(v.shape)] == 1 and free_shapes[tuple(v.shape)] == 1
    mapping[v.name], rule[v.name] = same[0], _BY_SHAPE if unique else _BY_ORDER
    del free[same[0]]
  return mapping, rule, list(free)


def inspect(model_dir: str, config: Config) -> Inspection:
  """Every variable of model_dir's newest checkpoint that loads (or of the checkpoint at
  that path), and the map onto `config.model`.

  Raises:
    ValueError: no checkpoint loads there; the message names each one that does not.
  """
  path, passed_over = (model_dir, []) if tf.io.gfile.exists(model_dir + ".index") else (
      checkpoints.newest_good(model_dir))
  if path is None:
    raise ValueError(f"No checkpoint in {model_dir} loads" + (": " + "; ".join(
        f"{p}: {why}" for p, why in passed_over) if passed_over else
        " (no ckpt-<step> or model.ckpt-<step> files)."))
  reader = tf.train.load_checkpoint(path)
  shapes = reader.get_variable_to_shape_map()
  backend = checkpoints.owner(shapes)
  if backend == checkpoints.KERAS:
    variables = _keras_variables(reader)
    step = checkpoints.keras_step(reader) if any(v.kind == Kind.STEP for v in variables) else None
  else:
    variables = _estimator_variables(shapes, reader.get_variable_to_dtype_map())
    step = (int(reader.get_tensor(checkpoints.ESTIMATOR_STEP_KEY))
            if checkpoints.ESTIMATOR_STEP_KEY in shapes else None)
  weights = model_lib.graph_model(config).shapes
  if backend == checkpoints.KERAS:  # Object-based: weights go by their layer, not a map.
    assignment_map, rule, unfilled = {}, {}, []
  else:
    assignment_map, rule, unfilled = propose_map(variables, weights)
  flags = [] if backend == checkpoints.KERAS else canned_flags(variables, reader.get_tensor)
  columns = feature_columns(variables) if flags else []
  return Inspection(path, backend, step, variables, config.model, assignment_map, rule,
                    unfilled, flags, columns)


def format_text(inspection: Inspection) -> str:
  """The table of variables, then the proposed map with each guess marked."""
  rows = [(v.name, str(v.shape), v.dtype,
           v.kind + (f" of {v.of}: {v.detail}" if v.of else f": {v.detail}" if v.detail
                     else "")) for v in inspection.variables]
  widths = [max(len(r[i]) for r in rows + [("variable", "shape", "dtype", "")])
            for i in range(3)]
  step = "no step" if inspection.step is None else f"step {inspection.step}"
  lines = [f"{inspection.path} ({inspection.backend} checkpoint, {step})", ""]
  lines += [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d}"
            for a, b, c, d in [("variable", "shape", "dtype", "what"), *rows]]
  lines.append("")
  if inspection.backend == checkpoints.KERAS:
    lines.append("A Keras checkpoint: its weights are read by layer, no map applies.")
    return "\n".join(lines)
  if inspection.canned_flags:
    told = any(f.startswith(("--feature_name", "--features")) for f in inspection.canned_flags)
    lines += ["A canned Estimator's checkpoint: its Keras twin is "
              + " ".join(inspection.canned_flags)
              + ("" if told else " (with --feature_name=<its feature column's name>, if not "
                 "image)")]
    if "--hidden_units" in " ".join(inspection.canned_flags):
      lines.append(f"  Unknown, as no variable keeps them: {' and '.join(UNKNOWN_SETTINGS)}; "
                   "give the values its Estimator was built with (defaults: no dropout, "
                   "relu).")
    if FEATURE_COLUMNS_FLAG in inspection.canned_flags:
      lines.append("  --feature_columns: the module and name of the list (or dict by part) "
                   "of the feature columns it was built with: "
                   + ", ".join(inspection.feature_columns) + ", and any numeric or indicator "
                   "columns of its DNN part, which keep no variables.")
    elif inspection.feature_columns:
      lines.append("  Its feature columns are the built-in ones (trainers/models/tabular.py): "
                   + ", ".join(inspection.feature_columns) + ".")
    lines.append("")
  lines.append(f"Proposed --assignment_map onto --model={inspection.model} "
               "(slots follow their weight):")
  lines.append(json.dumps(inspection.assignment_map, indent=2)
               + ("  (every weight is named as the model's: no map needed)"
                  if not inspection.assignment_map and not inspection.unfilled else ""))
  by = [f"  {name} -> {inspection.assignment_map.get(name, name)}: by {rule}"
        for name, rule in inspection.matched_by.items() if rule != _BY_NAME]
  if by:
    lines += ["Check these (not matched by name):", *by]
  if inspection.unfilled:
    lines.append("Model weights nothing here gives a value: " + ", ".join(inspection.unfilled))
  return "\n".join(lines)
