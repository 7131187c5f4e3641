"""Carries a training run across backends: Estimator `model.ckpt-<step>` <-> Keras `ckpt-<step>`.

Every variable of the source checkpoint is accounted for, or the conversion
fails naming it and the `--assignment_map` entry that fixes it:

- weight: a model weight, by name ("conv/kernel"), or renamed through the
  assignment map ({"dense_1/kernel": "hidden/kernel"}, old name -> shared
  model weight name);
- slot: `<variable>/<slot>`, a v1 optimizer's slot (`Momentum`; `Adagrad`;
  `Adam` and `Adam_1`; `Ftrl` and `Ftrl_1`; `RMSProp` and `RMSProp_1`), which goes
  to the same slot of its variable's weight in the Keras twin
  (`optimizers.SLOTS`);
- optimizer: Adam's `beta1_power` and `beta2_power`, V1Adam's powers;
- step: `global_step`, which becomes the Keras optimizer's `iterations` (the
  cosine schedule reads it; both parts' for `--model=wide_deep_v1`);
- ignored: what the assignment map drops with null, and a slot no update reads
  (RMSProp's momentum slot at momentum 0).

A checkpoint trained with another optimizer than `config.optimizer` (its slot
names tell which; a Keras checkpoint's, the names its object graph saved) stops
the conversion, naming the two ways on: that optimizer's settings, or
`reset_slots`, which carries the weights and the step and starts the
optimizer's slots as it builds them, listing each.

A Keras checkpoint holds, besides the model and optimizer state, derived
values that are not carried: tf.train.Checkpoint's `save_counter`, the
optimizer's `_current_learning_rate` (recomputed from `iterations` before
every update) and a backup's `ckpt_saved_epoch` / `ckpt_saved_batch`. Any
other unknown entry fails the conversion.

The source is only read: its newest checkpoint that loads is converted
(`checkpoints.newest_good`), and the newer ones passed over are listed. The
target is written into a staging directory, read back, and moved into place
when complete (`convert_write`); an existing non-empty target is refused,
untouched. The TF2 canned models go to `convert_canned`; the `tf.compat.v1.estimator`
ones are carried here, each part's optimizer as `--optimizer` is (`_parts`).
"""

import dataclasses
import json
import math
import os
from typing import (Any, Dict, List, Mapping, NamedTuple, Optional, Sequence,
                    Tuple)

import numpy as np
import tensorflow as tf
import tf_keras
from absl import logging

from launch.tools import convert_write
from launch.tools.convert_write import ConversionError
from trainers import checkpoints
from trainers import config as config_lib
from trainers import keras_trainer
from trainers import model as model_lib
from trainers import model_dir as layout
from trainers import optimizers
from trainers.config import Config
from trainers.models import canned

AssignmentMap = Mapping[str, Optional[str]]  # Old checkpoint name -> model weight, or None.
STEP_VARIABLE = checkpoints.ESTIMATOR_STEP_KEY
WEIGHT, SLOT, STEP, IGNORED, UNMAPPED = "weight", "slot", "step", "ignored", "unmapped"
OPTIMIZER = "optimizer"  # The optimizer's own state, not a slot: Adam's powers of beta.
PART_STEP = "part step"  # canned.PartOptimizers's linear part's own count of steps.
# Keras checkpoint entries that are derived, not state: (key, why it is not carried).
KERAS_DERIVED = {
    checkpoints.keras_key("save_counter"): "tf.train.Checkpoint's count of its own saves",
    checkpoints.keras_key("model/optimizer/_current_learning_rate"):
        "the schedule's rate at the last update, recomputed from the step before every update",
    # A v1 canned twin's constant rate (its --dnn_learning_rate or --linear_learning_rate).
    checkpoints.keras_key("model/optimizer/_learning_rate"):
        "the canned model's constant rate, which the run's flags give",
    # A BackupAndRestore backup's (--from_backup).
    checkpoints.keras_key("ckpt_saved_epoch"): "the epoch BackupAndRestore resumes fit at",
    checkpoints.keras_key("ckpt_saved_batch"): "the batch BackupAndRestore resumes fit at",
}
_SLOT_OF_UNMAPPED = "the slot of unmapped "
_FOREIGN = "state --optimizer={} does not keep"
_RESET = "optimizer state, not carried: --reset_slots"


class Entry(NamedTuple):
  """One variable of a source checkpoint and what the conversion does with it."""
  name: str  # In the source checkpoint.
  shape: Tuple[int, ...]
  kind: str  # WEIGHT, SLOT, STEP, IGNORED or UNMAPPED.
  weight: Optional[str]  # The model weight it is (WEIGHT) or belongs to (SLOT).
  note: str = ""  # Why it is ignored or unmapped.
  slot: str = ""  # SLOT: the v1 slot's name (`Momentum`); OPTIMIZER: the variable's.
  part: str = ""  # SLOT, OPTIMIZER: the part whose optimizer keeps it (`_parts`).


class Mapped(NamedTuple):
  source: str  # Variable name or key in the source checkpoint.
  destination: str  # Variable name or key in the written checkpoint.
  kind: str


class Ignored(NamedTuple):
  name: str
  reason: str


@dataclasses.dataclass
class Conversion:
  """What a conversion read, wrote and carried."""
  source: str  # The checkpoint read.
  output: str  # The checkpoint written, at its final path.
  step: int
  mapped: List[Mapped]
  ignored: List[Ignored]
  reset: List[Ignored]  # --reset_slots: each slot of the target's optimizer, as it starts.
  skipped: List[Ignored]  # Newer checkpoints than `source` that do not load.


def _weight_shapes(config: Config) -> Dict[str, Tuple[int, ...]]:
  """`config.model`'s weights by name (no eager state)."""
  return model_lib.graph_model(config).shapes


def _fmt_shape(shape: Sequence[int]) -> str:
  return str(list(shape))


def _check_map(assignment_map: AssignmentMap, weights: Mapping[str, Tuple[int, ...]]) -> None:
  """Raises unless the map sends old names to distinct model weights (or null)."""
  targets: Dict[str, str] = {}
  for old, new in assignment_map.items():
    if not isinstance(old, str) or not (new is None or isinstance(new, str)):
      raise ConversionError(f"--assignment_map entry {json.dumps(old)}: {json.dumps(new)}: "
                            "keys must be names, values a model weight's name or null.")
    if new is None:
      continue
    if old == STEP_VARIABLE or old.endswith(checkpoints.V1_SLOT_SUFFIXES):
      raise ConversionError(
          f"--assignment_map maps {old!r}, a step or slot: these follow their weight. Map the "
          f"weight instead (or drop {old!r} with null).")
    if new not in weights:
      raise ConversionError(f"--assignment_map maps {old!r} to {new!r}, which is not a weight of "
                            f"the model; its weights: {', '.join(weights)}.")
    if new in targets:
      raise ConversionError(f"--assignment_map maps both {targets[new]!r} and {old!r} to {new!r}.")
    targets[new] = old


def classify(shapes: Mapping[str, Sequence[int]], config: Config,
             assignment_map: Optional[AssignmentMap] = None,
             reset_slots: bool = False) -> List[Entry]:
  """Classifies every variable of an Estimator checkpoint, by name (sorted).

  Args:
    shapes: the checkpoint's variables and shapes (`tf.train.list_variables`).
    config: its model (`config.model`) is the one converted to.
    assignment_map: old name -> model weight name, or None to drop it.
    reset_slots: the optimizer's state is not carried: every slot (and Adam's
      powers) is ignored, saying so.

  Returns:
    One Entry per variable: weight, slot, step, ignored or unmapped (with why).
  """
  parts = _parts(config)
  assignment_map = dict(assignment_map or {})
  weights = _weight_shapes(config)
  _check_map(assignment_map, weights)
  absent = sorted(set(assignment_map) - set(shapes))
  if absent:  # A typo, or a map meant for another checkpoint.
    raise ConversionError(f"--assignment_map names {', '.join(absent)}, which the checkpoint "
                          "does not hold.")

  def weight_of(name: str) -> Optional[str]:
    if name in assignment_map:
      return assignment_map[name]
    return name if name in weights else None

  adam = [name for name, part in parts.items() if part.optimizer == "adam"]
  entries = []
  for name in sorted(n for n in shapes if n != checkpoints.OBJECT_GRAPH_KEY):
    shape = tuple(shapes[name])
    base, slot = checkpoints.v1_slot(name, shapes) or (None, name)
    counter = checkpoints.v1_counter(name)
    if name in assignment_map and assignment_map[name] is None:
      entries.append(Entry(name, shape, IGNORED, None, "dropped by --assignment_map (null)"))
    elif name == STEP_VARIABLE:
      entries.append(Entry(name, shape, STEP, None))
    elif reset_slots and (counter or base):
      entries.append(Entry(name, shape, IGNORED, None, _RESET, slot=counter or slot))
    elif counter:
      if adam:
        entries.append(Entry(name, shape, OPTIMIZER, None, slot=counter, part=adam[0]))
      else:
        entries.append(Entry(name, shape, UNMAPPED, None, _FOREIGN.format(
            "+".join(part.optimizer for part in parts.values())), slot=counter))
    elif name.startswith(checkpoints.CANNED_OPTIMIZER_SCOPE):
      entries.append(Entry(name, shape, IGNORED, None,
                           "a canned Estimator's optimizer state, not carried yet"))
    elif base:
      weight = weight_of(base)
      part_name = _part_of(parts, weight or base)
      part = parts[part_name]
      unread = {slot.v1: why for slot, why in optimizers.unread_slots(part)}
      if weight and slot in optimizers.kept_slots(part):
        kind, note = SLOT, ""
      elif weight and slot in unread:
        kind, weight, note = IGNORED, None, unread[slot]
      elif weight:
        kind, weight, note = UNMAPPED, None, _FOREIGN.format(part.optimizer)
      elif base in assignment_map:  # Dropped with null: its slot goes with it.
        kind, note = IGNORED, f"the slot of dropped {base}"
      else:
        kind, note = UNMAPPED, f"{_SLOT_OF_UNMAPPED}{base}"
      # Every slot names its optimizer's: `check_complete` tells which optimizer trained.
      entries.append(Entry(name, shape, kind, weight, note, slot=slot, part=part_name))
    elif weight_of(name):
      entries.append(Entry(name, shape, WEIGHT, weight_of(name)))
    else:
      entries.append(Entry(name, shape, UNMAPPED, None, "no model weight of this name"))
  return entries


def estimator_accounting(checkpoint_path: str, config: Config,
                         assignment_map: Optional[AssignmentMap] = None,
                         reset_slots: bool = False) -> List[Entry]:
  """`classify` of an Estimator checkpoint's variables, read from `checkpoint_path`."""
  return classify(dict(tf.train.list_variables(checkpoint_path)), config, assignment_map,
                  reset_slots)


def _follows(entry: Entry) -> bool:
  """Whether an unmapped entry is a slot, which a map entry for its variable fixes too."""
  return entry.note.startswith(_SLOT_OF_UNMAPPED)


def _fix(entries: Sequence[Entry], weights: Mapping[str, Tuple[int, ...]]) -> str:
  """The `--assignment_map` JSON object that would map each unmapped weight-like variable,
  then why any of them is given null."""
  taken = {e.weight for e in entries if e.kind == WEIGHT}
  lines, notes = [], []
  for e in entries:
    if e.kind != UNMAPPED or _follows(e):
      continue
    free = [w for w, shape in weights.items() if shape == e.shape and w not in taken]
    if len(free) == 1:
      lines.append(f"  {json.dumps(e.name)}: {json.dumps(free[0])}")
    elif free:
      lines.append(f"  {json.dumps(e.name)}: \"<one of {', '.join(free)}>\"")
    else:
      lines.append(f"  {json.dumps(e.name)}: null")
      notes.append(f"No model weight of shape {_fmt_shape(e.shape)} is left without a value: "
                   f"null drops {e.name}; do so only if it is not state to carry.")
  return "\n".join(["{", ",\n".join(lines), "}", *notes])


def optimizer_differs(path: str, trained: str, config: Config, part: str = ""
                      ) -> ConversionError:
  """The error for a checkpoint trained with another optimizer than `config`'s (that of
  `part`, a `_parts` key), naming the two ways on. `trained` says which
  ("--optimizer=adam", or what it holds)."""
  flag = f"{_optimizer_flag(part)}={config.optimizer}"
  return ConversionError(
      f"{path} was trained with {trained}, not {flag}: its optimizer "
      f"state has no place in the other's. Two ways on: convert it with the "
      f"{_optimizer_flag(part)} it was trained with (and its hyperparameter flags) and train "
      "on with that, or give --reset_slots, which carries the weights and the step and starts "
      f"{flag}'s slots at their initial values.")


def check_complete(entries: Sequence[Entry], checkpoint_path: str, config: Config,
                   reset_slots: bool = False) -> None:
  """Raises ConversionError unless every variable is accounted for and every weight of
  `config.model`, each of its optimizer's slots (unless `reset_slots`) and the step get
  exactly one value of the right shape."""
  built = model_lib.graph_model(config)
  weights = built.shapes
  parts = _parts(config)
  for name, part in parts.items():
    state = sorted({e.slot for e in entries if e.slot and e.part == name})
    trained = optimizers.trained_with(state)
    if not reset_slots and trained != part.optimizer:
      raise optimizer_differs(
          checkpoint_path, f"{_optimizer_flag(name)}={trained}" if trained else
          f"optimizer state no one optimizer keeps ({', '.join(state)})", part, name)
  unmapped = [e for e in entries if e.kind == UNMAPPED and not _follows(e)]
  if unmapped:
    slots = sum(1 for e in entries if e.kind == UNMAPPED and _follows(e))
    raise ConversionError(
        f"{checkpoint_path}: {len(unmapped)} variable(s) map to no model weight: "
        + ", ".join(f"{e.name} {_fmt_shape(e.shape)}" for e in unmapped)
        + (f" (their {slots} optimizer slot(s) follow them)" if slots else "")
        + ". Add to the --assignment_map JSON object (old name -> model weight, or null to "
        "drop it):\n" + _fix(entries, weights)
        + "\nModel weights: " + ", ".join(f"{w} {_fmt_shape(s)}" for w, s in weights.items()))
  received: Dict[Tuple[str, str], str] = {}
  for e in (e for e in entries if e.kind in (WEIGHT, SLOT)):
    if (e.weight, e.slot) in received:
      raise ConversionError(f"{checkpoint_path}: {received[e.weight, e.slot]} and {e.name} both "
                            f"map to {e.weight}: fix --assignment_map.")
    received[e.weight, e.slot] = e.name
    if e.shape != weights[e.weight]:
      raise ConversionError(
          f"{checkpoint_path}: {e.name} has shape {_fmt_shape(e.shape)}, but the model weight "
          f"{e.weight} it maps to has shape {_fmt_shape(weights[e.weight])}.")
  for weight in weights:
    if (weight, "") not in received:
      raise ConversionError(f"{checkpoint_path}: no variable gives the model weight {weight} "
                            "its value; map one to it in --assignment_map.")
  # Only what the optimizer updates has slots (not BatchNorm's moving statistics).
  for weight in built.trainable if not reset_slots else ():
    name = _part_of(parts, weight)
    for slot in optimizers.kept_slots(parts[name]):
      if (weight, slot) not in received:
        raise ConversionError(
            f"{checkpoint_path}: no variable gives the model weight {weight} its "
            f"{_optimizer_flag(name)}={parts[name].optimizer} {slot} slot (expected "
            f"{received[weight, '']}/{slot}): was it trained with another optimizer?")
  optimizer_state = {e.slot for e in entries if e.kind == OPTIMIZER}
  missing = sorted(set(checkpoints.V1_OPTIMIZER_VARIABLES) - optimizer_state)
  if any(p.optimizer == "adam" for p in parts.values()) and missing and not reset_slots:
    raise ConversionError(f"{checkpoint_path} has no {', '.join(missing)}, which Adam keeps: "
                          "was it trained with another optimizer?")
  steps = [e for e in entries if e.kind == STEP]
  if not steps or steps[0].shape != ():
    raise ConversionError(f"{checkpoint_path} has no scalar {STEP_VARIABLE}: it is not an "
                          "Estimator training checkpoint.")


def read_checkpoint(path: str) -> Any:
  try:
    return tf.train.load_checkpoint(path)
  except (tf.errors.OpError, ValueError) as e:
    raise ConversionError(f"Cannot read the checkpoint {path}: {e}") from e


def newest(model_dir: str, backend: str, from_backup: bool = False
            ) -> Tuple[str, List[Ignored]]:
  """model_dir's newest checkpoint that loads, which must be `backend`'s, and each newer
  one passed over with why. `from_backup`: Keras's BackupAndRestore backup instead."""
  backup = os.path.join(model_dir, layout.BACKUP_SUBDIR, "chief")
  path, passed_over = checkpoints.newest_good(backup if from_backup else model_dir)
  skipped = [Ignored(p, f"does not load ({why})") for p, why in passed_over]
  for p, why in passed_over:
    logging.warning("Skipping %s, which does not load: %s", p, why)
  if path is None:
    if passed_over:
      raise ConversionError(f"No checkpoint in {os.path.dirname(passed_over[0][0])} loads: "
                            + "; ".join(f"{os.path.basename(p)}: {why}"
                                        for p, why in passed_over)
                            + ". Nothing was written. Restore the files from a copy.")
    hint = (f" It holds only a Keras backup ({backup}): convert that with --from_backup."
            if checkpoints.find(backup) and not from_backup else "")
    where = backup if from_backup else model_dir
    raise ConversionError(f"No checkpoint in {where} (no ckpt-<step> or model.ckpt-<step> files): "
                          f"give the {backend} model_dir of a finished or stopped run.{hint}")
  try:
    owner, step = checkpoints.checkpoint_step(path)
  except (tf.errors.OpError, KeyError, ValueError) as e:  # Not a training checkpoint.
    raise ConversionError(f"Cannot read the step of the checkpoint {path}: {e}") from e
  if owner != backend:
    raise ConversionError(f"{path} is a {owner} checkpoint, not a {backend} one: convert it "
                          f"with --from_{owner}.")
  # Only a Keras run leaves a backup; reading it loads every tensor, so only then.
  backup_path = (checkpoints.newest_good(backup)[0]
                 if backend == checkpoints.KERAS and not from_backup else None)
  if backup_path:
    backup_step = checkpoints.checkpoint_step(backup_path)[1]
    if backup_step > step:
      raise ConversionError(
          f"{model_dir} holds a BackupAndRestore backup at step {backup_step}, newer than its "
          f"newest checkpoint {path} (step {step}): the run was interrupted after that "
          "checkpoint. Convert the backup with --from_backup, or resume the run with "
          "python -m trainers.keras_main to its end and convert that.")
  return path, skipped


def check_counters(values: Mapping[str, np.ndarray], step: int, config: Config,
                   path: str) -> None:
  """Raises unless Adam's powers of beta are beta^(step + 1) (the power the next step
  uses: v1 starts them at beta, and multiplies after each step): they are counters of their own,
  and a checkpoint whose counters disagree has no one step to go on from. beta1_power
  reaches float32's zero after about 800 steps (beta1 0.9); from then on beta2_power
  (0.999: 0.22 at step 1500) alone is checked."""
  if config.optimizer != "adam":
    return
  hyperparameters = config.hyperparameters()
  for name, beta in zip(checkpoints.V1_OPTIMIZER_VARIABLES,
                        (hyperparameters["beta1"], hyperparameters["beta2"])):
    power = float(values[name])
    if power == 0.0 or beta in (0.0, 1.0):
      continue  # Underflowed, or no count to read.
    counted = math.log(power) / math.log(beta)
    # A float32 running product drifts by about step x 6e-8 relative: well under a step.
    if abs(counted - (step + 1)) > 0.5:
      raise ConversionError(
          f"{path}: {name} is {power:.6g}, {beta}^{counted:.1f}, but the step is {step} "
          f"(so {beta}^{step + 1}): "
          "Adam's counters disagree, so the run has no one step to go on from. Convert "
          "another checkpoint, or go on training with the backend that wrote it.")


class KerasState(NamedTuple):
  """One carried value of a Keras checkpoint."""
  key: str  # Its checkpoint key.
  variable: tf.Variable
  weight: str  # The model weight it is or belongs to (a slot); "" for the optimizer's own.
  kind: str  # WEIGHT, SLOT, STEP, PART_STEP or OPTIMIZER.
  slot: str  # SLOT: the v1 slot's name; OPTIMIZER: the v1 variable's.
  part: str = ""  # SLOT, OPTIMIZER: the part whose optimizer keeps it (`_parts`).


class _OptimizerPart(NamedTuple):
  name: str  # A `_parts` key.
  config: Config
  optimizer: tf_keras.optimizers.Optimizer
  variables: List[tf.Variable]  # The trainable ones it updates.
  prefix: str  # Its object path in the checkpoint.


def _optimizer_parts(model: tf_keras.Model, config: Config) -> List[_OptimizerPart]:
  """The compiled model's optimizer, or `canned.PartOptimizers`'s two, with what each
  updates; the step's part first."""
  parts = _parts(config)
  if len(parts) == 1:
    ((name, part),) = parts.items()
    return [_OptimizerPart(name, part, model.optimizer, model.trainable_variables,
                           "model/optimizer")]
  return [_OptimizerPart(name, part, getattr(model.optimizer, name),
                         [v for v in model.trainable_variables if canned.part_of(v.name) == name],
                         f"model/optimizer/{name}") for name, part in parts.items()]


def _keras_state(model: tf_keras.Model, config: Config
                 ) -> Tuple[List[KerasState], Dict[str, str]]:
  """Everything carried of a compiled model, and the optimizer's variables that are not
  state (plain SGD's `momentums`), by key, with why.

  Keys as `tf.train.Checkpoint(model=model)` writes them (tf-keras 2.15):
  weights under `model/layer_with_weights-<i>/<attribute>`, the optimizer's
  step as `model/optimizer/_iterations` and its other variables as
  `model/optimizer/_variables/<j>`, j their place in `optimizer.variables`
  (0 is the step; the slot lists are not themselves checkpoint
  dependencies); for `canned.PartOptimizers`, each part's under
  `model/optimizer/<part>/`, and the DNN part's step, the model's, as
  `model/optimizer/iter`. Conversions read back what they write by these keys,
  so a different layout fails them rather than carrying the wrong values.
  """
  parts = _optimizer_parts(model, config)
  slots_of, keys = {}, {}
  for part in parts:
    slots = optimizers.keras_slots(part.config, part.optimizer, part.variables)  # Built.
    slots_of.update({id(v): (part.name, {name: held[i] for name, held in slots.items()})
                     for i, v in enumerate(part.variables)})
    keys.update({id(v): checkpoints.keras_key(f"{part.prefix}/_variables/{j}")
                 for j, v in enumerate(part.optimizer.variables)})
  if len(parts) == 1:
    state = [KerasState(checkpoints.KERAS_STEP_KEY, parts[0].optimizer.iterations, "", STEP, "")]
  else:  # The linear part counts its steps too: the same count, in a run that trained both.
    state = [KerasState(checkpoints.KERAS_LEGACY_STEP_KEY, parts[0].optimizer.iterations, "",
                        STEP, ""),
             KerasState(checkpoints.keras_key(f"{parts[1].prefix}/_iterations"),
                        parts[1].optimizer.iterations, "", PART_STEP, "", parts[1].name)]
  for i, layer in enumerate(layer for layer in model.layers if layer.weights):
    for weight in layer.weights:
      name = model_lib.weight_name(weight)
      state.append(KerasState(checkpoints.keras_weight_key(i, checkpoints.layer_attribute(
          layer, weight)), weight, name, WEIGHT, ""))
      # Only what the optimizer updates has slots (not a moving statistic).
      part, slots = slots_of.get(id(weight), ("", {}))
      for slot, variable in slots.items():
        if variable.shape != weight.shape:
          raise ConversionError(f"The Keras optimizer's {slot} slot for {name} has shape "
                                f"{variable.shape}.")
        state.append(KerasState(keys[id(variable)], variable, name, SLOT, slot, part))
  left = []
  for part in parts:
    if part.config.optimizer == "adam":  # optimizers.V1Adam's powers of beta, as v1 names them.
      for v1_name, variable in zip(checkpoints.V1_OPTIMIZER_VARIABLES,
                                   part.optimizer._powers):  # pylint: disable=protected-access
        state.append(KerasState(keys[id(variable)], variable, "", OPTIMIZER, v1_name, part.name))
    carried = {id(s.variable) for s in state}
    others = [v for v in part.optimizer.variables if id(v) not in carried]
    if others and part.config.optimizer != "sgd":
      raise ConversionError(f"The Keras {part.config.optimizer} optimizer holds "
                            f"{', '.join(v.name for v in others)}, which this converter does "
                            "not know how to carry.")
    left += others
  derived = {keys[id(v)]: "plain SGD's last update, which a momentum of 0 never reads"
             for v in left}
  if len(parts) > 1:
    derived.update({checkpoints.keras_key(f"{part.prefix}/_learning_rate"):
                    f"the {part.name} part's constant rate, which the run's flags give"
                    for part in parts})
  return state, derived


def _inverse_map(assignment_map: Optional[AssignmentMap], config: Config) -> Dict[str, str]:
  """model weight -> the Estimator name to write it under (the same map, read backwards)."""
  assignment_map = dict(assignment_map or {})
  _check_map(assignment_map, _weight_shapes(config))
  return {new: old for old, new in assignment_map.items() if new is not None}


def _canned() -> Any:
  """launch.tools.convert_canned, which builds on this module: the converter of canned models."""
  from launch.tools import convert_canned  # noqa: PLC0415
  return convert_canned


def _v1_parts(config: Config) -> Optional[Dict[str, Config]]:
  """For a `tf.compat.v1.estimator` canned model, each part's config as this module's
  single-optimizer path reads it (`--optimizer` the part's, at the v1 defaults), by part
  ("dnn", "linear"); None for any other model. Its twin trains each part with the v1-exact
  Keras optimizer, whose slots are the CNN's."""
  canned_spec = model_lib.spec(config).canned
  if canned_spec is None or not canned_spec.v1:
    return None
  settings = config.canned_settings()
  return {part: dataclasses.replace(config, optimizer=settings[f"{part}_optimizer"])
          for part in ("dnn", "linear") if f"{part}_optimizer" in settings}


def _parts(config: Config) -> Dict[str, Config]:
  """The model's optimizers, each as a config whose `--optimizer` is its: `_v1_parts`, or
  {"": config} for a model of one optimizer the Estimator builds from --optimizer."""
  return _v1_parts(config) or {"": config}


def _part_of(parts: Mapping[str, Config], weight: str) -> str:
  """Which of `parts` updates the weight of this name."""
  return canned.part_of(weight) if len(parts) > 1 else next(iter(parts))


def _optimizer_flag(part: str) -> str:
  return f"--{part}_optimizer" if part else "--optimizer"


def _single_or_v1(config: Config, assignment_map: Optional[AssignmentMap]) -> Config:
  """`config` as this module reads it: a one-part `tf.compat.v1.estimator` canned model's
  part's (`--optimizer` its), else `config` itself. Refuses a map for a TF2 canned model
  (its names are the canned Estimator's), and two Adam parts (whose powers of beta v1
  names apart only by the order it made them in)."""
  if config.canned_settings() and not _v1_parts(config):
    _no_map(assignment_map, config)
    return config
  parts = _parts(config)
  if sum(part.optimizer == "adam" for part in parts.values()) > 1:
    raise ConversionError(f"--model={config.model} with Adam in both parts is not carried: "
                          "give one part another optimizer, or go on training with the "
                          "backend that wrote the run.")
  return next(iter(parts.values())) if len(parts) == 1 else config


def _adam_part(config: Config) -> Config:
  """The part that trains with Adam (whose powers of beta `check_counters` reads), or any."""
  parts = list(_parts(config).values())
  return next((part for part in parts if part.optimizer == "adam"), parts[0])


def check_part_steps(part_steps: Mapping[str, int], step: int, path: str) -> None:
  """Raises unless each part's own count of steps (by its Keras key) is the model's `step`."""
  for key, counted in part_steps.items():
    if counted != step:
      raise ConversionError(f"{path}: {key} counted {counted} steps, the model's optimizer "
                            f"{step}: the Estimator keeps one step, so the run has no one step "
                            "to go on from. Convert another checkpoint.")


def _v1_slot_name(config: Config, weight: str, slot: str) -> str:
  """A v1 slot's name as the Estimator of `config.model` names it under a strategy."""
  canned = model_lib.spec(config).canned
  return f"{canned.v1_scope if canned else ''}{weight}/{slot}"


def _v1_counter_name(config: Config, counter: str) -> str:
  """Adam's power of beta (`beta1_power`) as the Estimator of `config.model` names it."""
  scope = model_lib.spec(config).canned.v1_scope if _v1_parts(config) else None
  return counter if scope is None else f"{scope}head/{scope}{counter}"


def _no_map(assignment_map: Optional[AssignmentMap], config: Config) -> None:
  if assignment_map:
    raise ConversionError(f"--model={config.model} is a canned model: its checkpoint names are "
                          "the canned Estimator's own, so no --assignment_map applies.")


def starts_at(value: np.ndarray) -> str:
  """What a reset slot starts at, for the table."""
  flat = np.ravel(value)
  return (f"starts at {flat[0]:.6g}" if flat.size and np.all(flat == flat[0])
          else "starts at its initial values")


def estimator_to_keras(src_model_dir: str, dst_model_dir: str, *,
                       assignment_map: Optional[AssignmentMap] = None,
                       config: Optional[Config] = None,
                       reset_slots: bool = False) -> Conversion:
  """Writes the Estimator's newest checkpoint as a Keras model_dir that keras_main resumes.

  Args:
    src_model_dir: the Estimator's model_dir.
    dst_model_dir: the new Keras model_dir (must not exist, or be empty).
    assignment_map: old checkpoint name -> model weight name ("dense_1/kernel":
      "hidden/kernel"), or None to drop a variable that is not state to carry.
    config: builds the model and optimizer (seed, learning rate, schedule)
      before the converted values are assigned.
    reset_slots: carry the weights and the step only; `config.optimizer`'s
      slots start at their initial values (for a source trained with another
      optimizer).

  Returns:
    What was read, written, carried and reset.

  Raises:
    ConversionError: no checkpoint, a non-empty target, a variable that is
      unmapped or of the wrong shape, a model weight without a value, or
      another optimizer's state (without `reset_slots`).
  """
  config = _single_or_v1(config or Config(), assignment_map)
  if config.canned_settings() and not _v1_parts(config):
    return _canned().estimator_to_keras(src_model_dir, dst_model_dir, config, reset_slots)
  convert_write.check_target(dst_model_dir)
  path, skipped = newest(src_model_dir, "estimator")
  entries = estimator_accounting(path, config, assignment_map, reset_slots)
  check_complete(entries, path, config, reset_slots)
  reader = read_checkpoint(path)
  step = int(reader.get_tensor(STEP_VARIABLE))

  model = keras_trainer.compile_model(config)
  sources = {(e.weight or "", e.kind, e.slot): e.name for e in entries
             if e.kind in (WEIGHT, SLOT, OPTIMIZER)}
  sources[("", STEP, "")] = STEP_VARIABLE
  mapped, written, reset = [], {}, []
  state, _ = _keras_state(model, config)
  for key, variable, weight, kind, slot, _ in state:
    if reset_slots and kind in (SLOT, OPTIMIZER):  # As the optimizer built it.
      reset.append(Ignored(f"{weight}/{slot}" if weight else slot, starts_at(variable.numpy())))
      written[key] = variable.numpy()
      continue
    name = sources[("", STEP, "") if kind == PART_STEP else (weight, kind, slot)]
    value = reader.get_tensor(name)
    if kind in (STEP, PART_STEP):
      value = np.int64(value)  # Very old Estimators kept an int32 global_step.
    elif value.dtype != variable.dtype.as_numpy_dtype:
      raise ConversionError(f"{path}: {name} is {value.dtype}, the model's {weight} "
                            f"{variable.dtype.name}.")
    variable.assign(value)
    mapped.append(Mapped(name, key, kind))
    written[key] = np.asarray(value)
  if not reset_slots:
    check_counters({e.slot: reader.get_tensor(e.name) for e in entries if e.kind == OPTIMIZER},
                   step, _adam_part(config), path)

  def write(staging: str) -> str:
    saved = keras_trainer.save_checkpoint(model, staging, step)
    convert_write.read_back(saved, written)
    return saved

  output = convert_write.write_target(src_model_dir, dst_model_dir, checkpoints.KERAS, config,
                                      write, config if reset_slots else None)
  logging.info("Wrote %s (step %d) from %s", output, step, path)
  return Conversion(path, output, step, mapped,
                    [Ignored(e.name, e.note) for e in entries if e.kind == IGNORED],
                    reset, skipped)


def _optimizer_variable(key: str) -> bool:
  """Whether a Keras checkpoint key is one of an optimizer's variables (not its step)."""
  return key.startswith("model/optimizer/") and "/_variables/" in key


def _holds_state_of(saved: Mapping[str, str], model: tf_keras.Model, config: Config) -> bool:
  """Whether a Keras checkpoint's optimizer variables (`checkpoints.saved_names`) are the compiled
  model's optimizer's (or optimizers'), one for one by key and name."""
  expected = {checkpoints.keras_key(f"{part.prefix}/_variables/{j}"): v.name.split(":")[0]
              for part in _optimizer_parts(model, config)
              for j, v in enumerate(part.optimizer.variables) if j}  # 0: the step.
  held = {k: name for k, name in saved.items() if _optimizer_variable(k)}
  return held.keys() == expected.keys() and all(
      held[k] == name or held[k].endswith("/" + name) for k, name in expected.items())


def _keras_trained_with(saved: Mapping[str, str], config: Config) -> str:
  """Which --optimizer wrote these optimizer variables (`checkpoints.saved_names`), for a message.
  tf_keras names SGD's and momentum's slots alike: the run record tells them apart."""
  if len(_parts(config)) > 1:
    return "other --dnn_optimizer and --linear_optimizer settings"
  plain = {name: None for name in config_lib.HYPERPARAMETERS}
  candidates = [(name, dataclasses.replace(config, optimizer=name, **plain))
                for name in optimizers.SLOTS]
  candidates.append(("rmsprop --momentum=0.9", dataclasses.replace(
      config, optimizer="rmsprop", **{**plain, "momentum": 0.9})))
  found = []
  for name, candidate in candidates:
    model = keras_trainer.compile_model(candidate)
    model.optimizer.build(model.trainable_variables)
    if _holds_state_of(saved, model, candidate):
      found.append(f"--optimizer={name}")
  return " or ".join(found) or "an optimizer this converter does not know"


def keras_to_estimator(src_model_dir: str, dst_model_dir: str, *,
                       assignment_map: Optional[AssignmentMap] = None,
                       config: Optional[Config] = None,
                       reset_slots: bool = False, from_backup: bool = False) -> Conversion:
  """Writes Keras's newest `ckpt-<step>` as an Estimator model_dir that estimator_main resumes.

  Writes `model.ckpt-<step>` (and its `checkpoint` file): the weights, the
  v1 optimizer's slots (`<name>/Momentum`, ...; Adam's powers) and an int64
  `global_step`, name-based, as the Estimator's own Saver does.

  Args:
    src_model_dir: the Keras model_dir.
    dst_model_dir: the new Estimator model_dir (must not exist, or be empty).
    assignment_map: the same map as for `estimator_to_keras`, read backwards:
      each model weight is written under the old name that maps to it.
    config: builds the model and optimizer the checkpoint is read into.
    reset_slots: carry the weights and the step only; the v1 optimizer's
      state is written as it starts.
    from_backup: convert the BackupAndRestore backup an interrupted run left
      (`backup/chief`), not the newest `ckpt-<step>`.

  Returns:
    What was read, written, carried and reset.

  Raises:
    ConversionError: no checkpoint, a non-empty target, a checkpoint entry
      that is neither carried nor known to be derived, or another optimizer's
      state (without `reset_slots`).
  """
  config = _single_or_v1(config or Config(), assignment_map)
  if config.canned_settings() and not _v1_parts(config):
    return _canned().keras_to_estimator(src_model_dir, dst_model_dir, config, reset_slots,
                                        from_backup)
  convert_write.check_target(dst_model_dir)
  names = _inverse_map(assignment_map, config)
  path, skipped = newest(src_model_dir, "keras", from_backup)
  model = keras_trainer.compile_model(config)
  state, derived = _keras_state(model, config)  # The optimizer built, its slots made.
  reader = read_checkpoint(path)
  saved = checkpoints.saved_names(reader)
  if not reset_slots and not _holds_state_of(saved, model, config):
    raise optimizer_differs(path, _keras_trained_with(saved, config), config)
  if reset_slots:  # The source's optimizer variables, whichever: none is carried.
    derived.update({k: f"{_RESET} (it held {saved[k]})" for k in saved
                    if _optimizer_variable(k)})
    state = [s for s in state if s.kind in (WEIGHT, STEP, PART_STEP)]
  unknown = sorted(set(saved) - {s.key for s in state} - set(KERAS_DERIVED) - set(derived))
  if unknown:
    raise ConversionError(f"{path} holds {', '.join(unknown)}, which this converter does not "
                          "know how to carry.")
  values: Dict[str, np.ndarray] = {}
  mapped, part_steps = [], {}
  for key, variable, weight, kind, slot, _ in state:
    if not reader.has_tensor(key):
      raise ConversionError(f"{path} has no {key} ({weight or 'the step'}): it does not match "
                            f"--model={config.model}.")
    value = reader.get_tensor(key)
    if value.shape != tuple(variable.shape):
      raise ConversionError(f"{path}: {key} ({weight}) has shape {_fmt_shape(value.shape)}, "
                            f"--model={config.model}'s {_fmt_shape(variable.shape)}.")
    if kind == PART_STEP:  # The Estimator counts one step: this one must equal it.
      part_steps[key] = int(value)
      continue
    name = {STEP: STEP_VARIABLE, WEIGHT: names.get(weight, weight),
            OPTIMIZER: _v1_counter_name(config, slot),
            SLOT: _v1_slot_name(config, names.get(weight, weight), slot)}[kind]
    values[name] = np.int64(value) if kind == STEP else value
    mapped.append(Mapped(key, name, kind))
  step = int(values[STEP_VARIABLE])
  check_part_steps(part_steps, step, path)
  trained = {}  # Each part's trainable weights, by the name written, and their variables.
  for s in state:
    if s.kind == WEIGHT and s.variable.trainable:
      trained.setdefault(_part_of(_parts(config), s.weight), {})[
          names.get(s.weight, s.weight)] = s.variable
  reset, written_zero = _v1_state_to_write(values, trained, config, step, path, reset_slots)

  def write(staging: str) -> str:
    saved = convert_write.write_name_based(values, staging, step)
    convert_write.read_back(saved, values)
    return saved

  # Renamed weights are not this model's names, by design: no resume check then.
  output = convert_write.write_target(src_model_dir, dst_model_dir, checkpoints.ESTIMATOR,
                                      config, write, config if reset_slots else None,
                                      check_resume=not names)
  logging.info("Wrote %s (step %d) from %s", output, step, path)
  return Conversion(path, output, step, mapped,
                    [Ignored(k, why) for k, why in {**KERAS_DERIVED, **derived}.items()
                     if k in saved] + written_zero
                    + [Ignored(k, "the linear part's own count of steps, the step's")
                       for k in part_steps], reset, skipped)


def _v1_state_to_write(values: Dict[str, np.ndarray], trained: Mapping[str, Mapping[str, Any]],
                       config: Config, step: int, path: str, reset_slots: bool
                       ) -> Tuple[List[Ignored], List[Ignored]]:
  """Adds to `values` (the Estimator checkpoint's, by name) the v1 optimizers' state the Keras
  checkpoint did not give: with `reset_slots`, each part's as its v1 optimizer starts (for
  `trained`, each part's trainable weights by name); else zeros for the slots v1 keeps and
  the twin does not (never read: the Estimator restores every slot it makes), after checking
  Adam's counters against `step`. Returns (reset, written as zeros)."""
  parts = _parts(config)
  if reset_slots:
    initial = {}
    for part_name, part in parts.items():
      initial.update(optimizers.v1_initial_state(part, {
          name: variable.shape for name, variable in trained[part_name].items()}))
    initial = {_v1_counter_name(config, name) if name in checkpoints.V1_OPTIMIZER_VARIABLES
               else _v1_slot_name(config, *name.rsplit("/", 1)): value
               for name, value in initial.items()}
    values.update(initial)
    return [Ignored(name, starts_at(value)) for name, value in sorted(initial.items())], []
  check_counters({checkpoints.v1_counter(k): v for k, v in values.items()
                  if checkpoints.v1_counter(k)}, step, _adam_part(config), path)
  written_zero = []
  for part_name, part in parts.items():
    for slot, why in optimizers.unread_slots(part):
      for weight, variable in trained[part_name].items():
        name = _v1_slot_name(config, weight, slot.v1)
        values[name] = np.zeros(variable.shape, variable.dtype.as_numpy_dtype)
        written_zero.append(Ignored(name, f"written as zeros: {why}"))
  return [], written_zero


def load_assignment_map(path: str) -> Dict[str, Optional[str]]:
  """Reads an assignment map: a JSON object of old name -> model weight name, or null."""
  try:
    with open(path, encoding="utf-8") as f:
      assignment_map = json.load(f)
  except (OSError, ValueError) as e:
    raise ConversionError(f"--assignment_map={path}: cannot read it as JSON: {e}") from e
  if not isinstance(assignment_map, dict) or not all(
      isinstance(v, str) or v is None for v in assignment_map.values()):
    raise ConversionError(f"--assignment_map={path} must hold a JSON object of old name -> model "
                          'weight name or null, e.g. {"dense_1/kernel": "hidden/kernel"}.')
  return assignment_map


def format_table(conversion: Conversion) -> str:
  """The mapping (source -> destination, kind), the ignore list, the step and the output."""
  width = max(len(m.source) for m in conversion.mapped)
  lines = [f"Converted {conversion.source}", "",
           f"{'source variable':<{width}}  ->  destination  (kind)"]
  lines += [f"{m.source:<{width}}  ->  {m.destination}  ({m.kind})" for m in conversion.mapped]
  lines += ["", "Ignored (not carried):"]
  lines += [f"  {i.name}: {i.reason}" for i in conversion.ignored] or ["  none"]
  if conversion.reset:
    lines += ["", "Reset (--reset_slots: the optimizer's slots start afresh):"]
    lines += [f"  {r.name}: {r.reason}" for r in conversion.reset]
  if conversion.skipped:
    lines += ["", "Skipped (newer checkpoints that do not load):"]
    lines += [f"  {s.name}: {s.reason}" for s in conversion.skipped]
  lines += ["", f"Step: {conversion.step}", f"Wrote: {conversion.output}",
            f"Output directory: {os.path.dirname(conversion.output)}"]
  return "\n".join(lines)
