"""Each variable of an Estimator checkpoint given its place in the model, or the conversion
refused naming it and the `--assignment_map` entry that fixes it.

- weight: a model weight, by name ("conv/kernel"), or renamed through the
  assignment map ({"dense_1/kernel": "hidden/kernel"}, old name -> model weight name);
- slot: `<variable>/<slot>`, a v1 optimizer's slot (`Momentum`; `Adagrad`; `Adam` and
  `Adam_1`; `Ftrl` and `Ftrl_1`; `RMSProp` and `RMSProp_1`), which follows its weight
  to the same slot of the Keras twin (`optimizers.SLOTS`);
- counter: Adam's `beta1_power` and `beta2_power`, V1Adam's powers;
- step: `global_step`, which becomes the Keras optimizer's `iterations` (the schedule
  reads it; both parts' for `--model=wide_deep_v1`);
- ignored: what the assignment map drops with null, and a slot no update reads
  (RMSProp's momentum slot at momentum 0).

A checkpoint trained with another optimizer than `config.optimizer` (its slot names tell
which) is refused naming the two ways on: that optimizer's settings, or `reset_slots`,
which carries the weights and the step and starts the optimizer's slots afresh.
"""

import json
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

from launch.convert import parts as parts_lib
from launch.convert.kinds import AssignmentMap, ConversionError, Entry, Kind
from trainers import checkpoints
from trainers import model as model_lib
from trainers import optimizers
from trainers.config import Config

_SLOT_OF_UNMAPPED = "the slot of unmapped "
_FOREIGN = "state --optimizer={} does not keep"
RESET = "optimizer state, not carried: --reset_slots"


def weight_shapes(config: Config) -> Dict[str, Tuple[int, ...]]:
  """`config.model`'s weights by name (no eager state)."""
  return model_lib.graph_model(config).shapes


def fmt_shape(shape: Sequence[int]) -> str:
  return str(list(shape))


def check_map(assignment_map: AssignmentMap, weights: Mapping[str, Tuple[int, ...]]) -> None:
  """Raises unless the map sends old names to distinct model weights (or null)."""
  targets: Dict[str, str] = {}
  for old, new in assignment_map.items():
    if not isinstance(old, str) or not (new is None or isinstance(new, str)):
      raise ConversionError(f"--assignment_map entry {json.dumps(old)}: {json.dumps(new)}: "
                            "keys must be names, values a model weight's name or null.")
    if new is None:
      continue
    if old == checkpoints.ESTIMATOR_STEP_KEY or old.endswith(checkpoints.V1_SLOT_SUFFIXES):
      raise ConversionError(
          f"--assignment_map maps {old!r}, a step or slot: these follow their weight. Map the "
          f"weight instead (or drop {old!r} with null).")
    if new not in weights:
      raise ConversionError(f"--assignment_map maps {old!r} to {new!r}, which is not a weight of "
                            f"the model; its weights: {', '.join(weights)}.")
    if new in targets:
      raise ConversionError(f"--assignment_map maps both {targets[new]!r} and {old!r} to {new!r}.")
    targets[new] = old


def inverse_map(assignment_map: Optional[AssignmentMap], config: Config) -> Dict[str, str]:
  """model weight -> the Estimator name to write it under (the same map, read backwards)."""
  assignment_map = dict(assignment_map or {})
  check_map(assignment_map, weight_shapes(config))
  return {new: old for old, new in assignment_map.items() if new is not None}


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
    One Entry per variable: weight, slot, step, counter, ignored or unmapped (with why).
  """
  model_parts = parts_lib.parts(config)
  assignment_map = dict(assignment_map or {})
  weights = weight_shapes(config)
  check_map(assignment_map, weights)
  absent = sorted(set(assignment_map) - set(shapes))
  if absent:  # A typo, or a map meant for another checkpoint.
    raise ConversionError(f"--assignment_map names {', '.join(absent)}, which the checkpoint "
                          "does not hold.")

  def weight_of(name: str) -> Optional[str]:
    if name in assignment_map:
      return assignment_map[name]
    return name if name in weights else None

  adam = [name for name, part in model_parts.items() if part.optimizer == "adam"]
  entries = []
  for name in sorted(n for n in shapes if n != checkpoints.OBJECT_GRAPH_KEY):
    shape = tuple(shapes[name])
    base, slot = checkpoints.v1_slot(name, shapes) or (None, name)
    counter = checkpoints.v1_counter(name)
    if name in assignment_map and assignment_map[name] is None:
      entries.append(Entry(name, shape, Kind.IGNORED, None, "dropped by --assignment_map (null)"))
    elif name == checkpoints.ESTIMATOR_STEP_KEY:
      entries.append(Entry(name, shape, Kind.STEP, None))
    elif reset_slots and (counter or base):
      entries.append(Entry(name, shape, Kind.IGNORED, None, RESET, slot=counter or slot))
    elif counter:
      entries.append(Entry(name, shape, Kind.COUNTER, None, slot=counter, part=adam[0]) if adam
                     else Entry(name, shape, Kind.UNMAPPED, None, _FOREIGN.format(
                         "+".join(part.optimizer for part in model_parts.values())),
                         slot=counter))
    elif name.startswith(checkpoints.CANNED_OPTIMIZER_SCOPE):
      entries.append(Entry(name, shape, Kind.IGNORED, None,
                           "a canned Estimator's optimizer state, not carried yet"))
    elif base:
      entries.append(_slot_entry(name, shape, base, slot, weight_of(base), model_parts,
                                 assignment_map))
    elif weight_of(name):
      entries.append(Entry(name, shape, Kind.WEIGHT, weight_of(name)))
    else:
      entries.append(Entry(name, shape, Kind.UNMAPPED, None, "no model weight of this name"))
  return entries


def _slot_entry(name: str, shape: Tuple[int, ...], base: str, slot: str,
                weight: Optional[str], model_parts: Mapping[str, Config],
                assignment_map: AssignmentMap) -> Entry:
  """The entry of `name`, the v1 slot `slot` of the variable `base` (the model's `weight`)."""
  part_name = parts_lib.part_of(model_parts, weight or base)
  part = model_parts[part_name]
  unread = {s.v1: why for s, why in optimizers.unread_slots(part)}
  if weight and slot in optimizers.kept_slots(part):
    kind, note = Kind.SLOT, ""
  elif weight and slot in unread:
    kind, weight, note = Kind.IGNORED, None, unread[slot]
  elif weight:
    kind, weight, note = Kind.UNMAPPED, None, _FOREIGN.format(part.optimizer)
  elif base in assignment_map:  # Dropped with null: its slot goes with it.
    kind, note = Kind.IGNORED, f"the slot of dropped {base}"
  else:
    kind, note = Kind.UNMAPPED, f"{_SLOT_OF_UNMAPPED}{base}"
  # Every slot names its optimizer's: `check_complete` tells which optimizer trained.
  return Entry(name, shape, kind, weight, note, slot=slot, part=part_name)


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
  taken = {e.weight for e in entries if e.kind == Kind.WEIGHT}
  lines, notes = [], []
  for e in entries:
    if e.kind != Kind.UNMAPPED or _follows(e):
      continue
    free = [w for w, shape in weights.items() if shape == e.shape and w not in taken]
    if len(free) == 1:
      lines.append(f"  {json.dumps(e.name)}: {json.dumps(free[0])}")
    elif free:
      lines.append(f"  {json.dumps(e.name)}: \"<one of {', '.join(free)}>\"")
    else:
      lines.append(f"  {json.dumps(e.name)}: null")
      notes.append(f"No model weight of shape {fmt_shape(e.shape)} is left without a value: "
                   f"null drops {e.name}; do so only if it is not state to carry.")
  return "\n".join(["{", ",\n".join(lines), "}", *notes])


def optimizer_differs(path: str, trained: str, config: Config, part: str = ""
                      ) -> ConversionError:
  """The error for a checkpoint trained with another optimizer than `config`'s (that of
  `part`, a `parts.parts` key), naming the two ways on. `trained` says which
  ("--optimizer=adam", or what it holds)."""
  flag = f"{parts_lib.optimizer_flag(part)}={config.optimizer}"
  return ConversionError(
      f"{path} was trained with {trained}, not {flag}: its optimizer "
      f"state has no place in the other's. Two ways on: convert it with the "
      f"{parts_lib.optimizer_flag(part)} it was trained with (and its hyperparameter flags) "
      "and train on with that, or give --reset_slots, which carries the weights and the step "
      f"and starts {flag}'s slots at their initial values.")


def check_complete(entries: Sequence[Entry], checkpoint_path: str, config: Config,
                   reset_slots: bool = False) -> None:
  """Raises ConversionError unless every variable is accounted for and every weight of
  `config.model`, each of its optimizer's slots (unless `reset_slots`) and the step get
  exactly one value of the right shape."""
  built, model_parts = model_lib.graph_model(config), parts_lib.parts(config)
  for name, part in model_parts.items():
    state = sorted({e.slot for e in entries if e.slot and e.part == name})
    trained = optimizers.trained_with(state)
    if not reset_slots and trained != part.optimizer:
      raise optimizer_differs(
          checkpoint_path, f"{parts_lib.optimizer_flag(name)}={trained}" if trained else
          f"optimizer state no one optimizer keeps ({', '.join(state)})", part, name)
  _check_all_mapped(entries, checkpoint_path, built.shapes)
  _check_each_value(entries, checkpoint_path, built, model_parts, reset_slots)
  steps = [e for e in entries if e.kind == Kind.STEP]
  if not steps or steps[0].shape != ():
    raise ConversionError(f"{checkpoint_path} has no scalar {checkpoints.ESTIMATOR_STEP_KEY}: "
                          "it is not an Estimator training checkpoint.")


def _check_all_mapped(entries: Sequence[Entry], checkpoint_path: str,
                      weights: Mapping[str, Tuple[int, ...]]) -> None:
  """Raises, with the map that would fix it, if a variable has no place in the model."""
  unmapped = [e for e in entries if e.kind == Kind.UNMAPPED and not _follows(e)]
  if not unmapped:
    return
  slots = sum(1 for e in entries if e.kind == Kind.UNMAPPED and _follows(e))
  raise ConversionError(
      f"{checkpoint_path}: {len(unmapped)} variable(s) map to no model weight: "
      + ", ".join(f"{e.name} {fmt_shape(e.shape)}" for e in unmapped)
      + (f" (their {slots} optimizer slot(s) follow them)" if slots else "")
      + ". Add to the --assignment_map JSON object (old name -> model weight, or null to "
      "drop it):\n" + _fix(entries, weights)
      + "\nModel weights: " + ", ".join(f"{w} {fmt_shape(s)}" for w, s in weights.items()))


def _check_each_value(entries: Sequence[Entry], checkpoint_path: str,
                      built: model_lib.GraphModel, model_parts: Mapping[str, Config],
                      reset_slots: bool) -> None:
  """Raises unless each model weight, each of its slots (unless `reset_slots`) and Adam's
  counters get exactly one value of the right shape."""
  weights = built.shapes
  received: Dict[Tuple[str, str], str] = {}
  for e in (e for e in entries if e.kind in (Kind.WEIGHT, Kind.SLOT)):
    if (e.weight, e.slot) in received:
      raise ConversionError(f"{checkpoint_path}: {received[e.weight, e.slot]} and {e.name} both "
                            f"map to {e.weight}: fix --assignment_map.")
    received[e.weight, e.slot] = e.name
    if e.shape != weights[e.weight]:
      raise ConversionError(
          f"{checkpoint_path}: {e.name} has shape {fmt_shape(e.shape)}, but the model weight "
          f"{e.weight} it maps to has shape {fmt_shape(weights[e.weight])}.")
  for weight in weights:
    if (weight, "") not in received:
      raise ConversionError(f"{checkpoint_path}: no variable gives the model weight {weight} "
                            "its value; map one to it in --assignment_map.")
  # Only what the optimizer updates has slots (not BatchNorm's moving statistics).
  for weight in built.trainable if not reset_slots else ():
    name = parts_lib.part_of(model_parts, weight)
    for slot in optimizers.kept_slots(model_parts[name]):
      if (weight, slot) not in received:
        raise ConversionError(
            f"{checkpoint_path}: no variable gives the model weight {weight} its "
            f"{parts_lib.optimizer_flag(name)}={model_parts[name].optimizer} {slot} slot "
            f"(expected {received[weight, '']}/{slot}): was it trained with another optimizer?")
  counters = {e.slot for e in entries if e.kind == Kind.COUNTER}
  missing = sorted(set(checkpoints.V1_OPTIMIZER_VARIABLES) - counters)
  if any(p.optimizer == "adam" for p in model_parts.values()) and missing and not reset_slots:
    raise ConversionError(f"{checkpoint_path} has no {', '.join(missing)}, which Adam keeps: "
                          "was it trained with another optimizer?")
