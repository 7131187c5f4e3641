"""What a Keras checkpoint of a compiled model holds, key by key: the state a conversion
carries (`state`), what is derived and not carried (`KERAS_DERIVED`), and which optimizer
wrote a checkpoint's slots (`holds_state_of`, `trained_with`).

Keys as `tf.train.Checkpoint(model=model)` writes them (tf-keras 2.15): weights under
`model/layer_with_weights-<i>/<attribute>`, the optimizer's step as
`model/optimizer/_iterations` and its other variables as `model/optimizer/_variables/<j>`,
j their place in `optimizer.variables` (0 is the step; the slot lists are not themselves
checkpoint dependencies); for `canned.PartOptimizers`, each part's under
`model/optimizer/<part>/`, and the DNN part's step, the model's, as `model/optimizer/iter`.
Conversions read back what they write by these keys, so a different layout fails them
rather than carrying the wrong values.
"""

import dataclasses
from typing import Dict, List, Mapping, NamedTuple, Tuple

import tensorflow as tf
import tf_keras

from launch.convert import parts as parts_lib
from launch.convert.kinds import ConversionError, Kind
from trainers import checkpoints
from trainers import config as config_lib
from trainers import keras_trainer
from trainers import model as model_lib
from trainers import optimizers
from trainers.config import Config
from trainers.models import canned

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


class KerasState(NamedTuple):
  """One carried value of a Keras checkpoint."""
  key: str  # Its checkpoint key.
  variable: tf.Variable
  weight: str  # The model weight it is or belongs to (a slot); "" for the optimizer's own.
  kind: Kind  # WEIGHT, SLOT, STEP, PART_STEP or COUNTER.
  slot: str  # SLOT: the v1 slot's name; COUNTER: the v1 variable's.
  part: str = ""  # SLOT, COUNTER: the part whose optimizer keeps it (`parts.parts`).


class _OptimizerPart(NamedTuple):
  name: str  # A `parts.parts` key.
  config: Config
  optimizer: tf_keras.optimizers.Optimizer
  variables: List[tf.Variable]  # The trainable ones it updates.
  prefix: str  # Its object path in the checkpoint.


def _optimizer_parts(model: tf_keras.Model, config: Config) -> List[_OptimizerPart]:
  """The compiled model's optimizer, or `canned.PartOptimizers`'s two, with what each
  updates; the step's part first."""
  model_parts = parts_lib.parts(config)
  if len(model_parts) == 1:
    ((name, part),) = model_parts.items()
    return [_OptimizerPart(name, part, model.optimizer, model.trainable_variables,
                           "model/optimizer")]
  return [_OptimizerPart(name, part, getattr(model.optimizer, name),
                         [v for v in model.trainable_variables if canned.part_of(v.name) == name],
                         f"model/optimizer/{name}") for name, part in model_parts.items()]


def state(model: tf_keras.Model, config: Config) -> Tuple[List[KerasState], Dict[str, str]]:
  """Everything carried of a compiled model (its optimizers' slots built here), and the
  optimizers' variables that are not state (plain SGD's `momentums`), by key, with why."""
  opt_parts = _optimizer_parts(model, config)
  slots_of, keys = {}, {}
  for part in opt_parts:
    slots = optimizers.keras_slots(part.config, part.optimizer, part.variables)  # Built.
    slots_of.update({id(v): (part.name, {name: held[i] for name, held in slots.items()})
                     for i, v in enumerate(part.variables)})
    keys.update({id(v): checkpoints.keras_key(f"{part.prefix}/_variables/{j}")
                 for j, v in enumerate(part.optimizer.variables)})
  carried = _steps(opt_parts)
  for i, layer in enumerate(layer for layer in model.layers if layer.weights):
    for weight in layer.weights:
      name = model_lib.weight_name(weight)
      carried.append(KerasState(checkpoints.keras_weight_key(i, checkpoints.layer_attribute(
          layer, weight)), weight, name, Kind.WEIGHT, ""))
      # Only what the optimizer updates has slots (not a moving statistic).
      part, slots = slots_of.get(id(weight), ("", {}))
      for slot, variable in slots.items():
        if variable.shape != weight.shape:
          raise ConversionError(f"The Keras optimizer's {slot} slot for {name} has shape "
                                f"{variable.shape}.")
        carried.append(KerasState(keys[id(variable)], variable, name, Kind.SLOT, slot, part))
  left = []
  for part in opt_parts:
    if part.config.optimizer == "adam":  # optimizers.V1Adam's powers of beta, as v1 names them.
      for v1_name, variable in zip(checkpoints.V1_OPTIMIZER_VARIABLES,
                                   part.optimizer._powers):  # pylint: disable=protected-access
        carried.append(KerasState(keys[id(variable)], variable, "", Kind.COUNTER, v1_name,
                                  part.name))
    held = {id(s.variable) for s in carried}
    others = [v for v in part.optimizer.variables if id(v) not in held]
    if others and part.config.optimizer != "sgd":
      raise ConversionError(f"The Keras {part.config.optimizer} optimizer holds "
                            f"{', '.join(v.name for v in others)}, which this converter does "
                            "not know how to carry.")
    left += others
  derived = {keys[id(v)]: "plain SGD's last update, which a momentum of 0 never reads"
             for v in left}
  if len(opt_parts) > 1:
    derived.update({checkpoints.keras_key(f"{part.prefix}/_learning_rate"):
                    f"the {part.name} part's constant rate, which the run's flags give"
                    for part in opt_parts})
  return carried, derived


def _steps(opt_parts: List[_OptimizerPart]) -> List[KerasState]:
  """The step, and with two parts the linear part's own count (the same, in a run that
  trained both)."""
  if len(opt_parts) == 1:
    return [KerasState(checkpoints.KERAS_STEP_KEY, opt_parts[0].optimizer.iterations, "",
                       Kind.STEP, "")]
  return [KerasState(checkpoints.KERAS_LEGACY_STEP_KEY, opt_parts[0].optimizer.iterations, "",
                     Kind.STEP, ""),
          KerasState(checkpoints.keras_key(f"{opt_parts[1].prefix}/_iterations"),
                     opt_parts[1].optimizer.iterations, "", Kind.PART_STEP, "",
                     opt_parts[1].name)]


def optimizer_variable(key: str) -> bool:
  """Whether a Keras checkpoint key is one of an optimizer's variables (not its step)."""
  return key.startswith("model/optimizer/") and "/_variables/" in key


def holds_state_of(saved: Mapping[str, str], model: tf_keras.Model, config: Config) -> bool:
  """Whether a Keras checkpoint's optimizer variables (`checkpoints.saved_names`) are the compiled
  model's optimizer's (or optimizers'), one for one by key and name."""
  expected = {checkpoints.keras_key(f"{part.prefix}/_variables/{j}"): v.name.split(":")[0]
              for part in _optimizer_parts(model, config)
              for j, v in enumerate(part.optimizer.variables) if j}  # 0: the step.
  held = {k: name for k, name in saved.items() if optimizer_variable(k)}
  return held.keys() == expected.keys() and all(
      held[k] == name or held[k].endswith("/" + name) for k, name in expected.items())


def trained_with(saved: Mapping[str, str], config: Config) -> str:
  """Which --optimizer wrote these optimizer variables (`checkpoints.saved_names`), for a message.
  tf_keras names SGD's and momentum's slots alike: the run record tells them apart."""
  if len(parts_lib.parts(config)) > 1:
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
    if holds_state_of(saved, model, candidate):
      found.append(f"--optimizer={name}")
  return " or ".join(found) or "an optimizer this converter does not know"
