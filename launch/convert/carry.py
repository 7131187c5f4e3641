"""A training run carried across backends: Estimator `model.ckpt-<step>` <-> Keras
`ckpt-<step>`, for every model; the entry points of `python -m launch.convert`.

Every variable of the source checkpoint is accounted for (`assign`: weights, slots, step,
counters, ignored), or the conversion fails naming it and the `--assignment_map` entry that
fixes it. A Keras checkpoint holds, besides the model and optimizer state, derived values
that are not carried (`keras_state.KERAS_DERIVED`); any other unknown entry fails the
conversion. A checkpoint trained with another optimizer than `config.optimizer` stops it,
naming the two ways on: that optimizer's settings, or `reset_slots`, which carries the
weights and the step and starts the optimizer's slots as it builds them, listing each.

The source is only read: its newest checkpoint that loads is converted (`source.newest`),
and the newer ones passed over are listed. The target is written into a staging directory,
read back, and moved into place when complete (`write`); an existing non-empty target is
refused, untouched. The TF2 canned models go to `canned`; every other model, the
`tf.compat.v1.estimator` canned ones too (each part's optimizer as `--optimizer` is:
`parts`), is carried here.
"""

from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import tf_keras
from absl import logging

from launch.convert import assign
from launch.convert import canned
from launch.convert import keras_state
from launch.convert import parts
from launch.convert import source
from launch.convert import write
from launch.convert.kinds import (AssignmentMap, Conversion, ConversionError, Entry, Ignored,
                                  Kind, Mapped)
from launch.convert.report import starts_at
from trainers import checkpoints
from trainers import keras_trainer
from trainers import optimizers
from trainers.config import Config


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
  config = parts.single_or_v1(config or Config(), assignment_map)
  if parts.is_tf2_canned(config):
    return canned.estimator_to_keras(src_model_dir, dst_model_dir, config, reset_slots)
  write.check_target(dst_model_dir)
  path, skipped = source.newest(src_model_dir, checkpoints.ESTIMATOR)
  entries = assign.estimator_accounting(path, config, assignment_map, reset_slots)
  assign.check_complete(entries, path, config, reset_slots)
  reader = source.read_checkpoint(path)
  step = int(reader.get_tensor(checkpoints.ESTIMATOR_STEP_KEY))
  model = keras_trainer.compile_model(config)
  mapped, written, reset = _assign_to_keras(model, config, entries, reader, path, reset_slots)
  if not reset_slots:
    source.check_counters({e.slot: reader.get_tensor(e.name) for e in entries
                           if e.kind == Kind.COUNTER}, step, parts.adam_part(config), path)

  def write_checkpoint(staging: str) -> str:
    saved = keras_trainer.save_checkpoint(model, staging, step)
    write.read_back(saved, written)
    return saved

  output = write.write_target(src_model_dir, dst_model_dir, checkpoints.KERAS, config,
                              write_checkpoint, config if reset_slots else None)
  logging.info("Wrote %s (step %d) from %s", output, step, path)
  return Conversion(path, output, step, mapped,
                    [Ignored(e.name, e.note) for e in entries if e.kind == Kind.IGNORED],
                    reset, skipped)


def _assign_to_keras(model: tf_keras.Model, config: Config, entries: List[Entry], reader: Any,
                     path: str, reset_slots: bool
                     ) -> Tuple[List[Mapped], Dict[str, np.ndarray], List[Ignored]]:
  """Assigns each carried value of the Estimator checkpoint (`entries`, read by `reader`) to
  the compiled model; returns what was mapped, each Keras key's value, and what was reset."""
  sources = {(e.weight or "", e.kind, e.slot): e.name for e in entries
             if e.kind in (Kind.WEIGHT, Kind.SLOT, Kind.COUNTER)}
  sources[("", Kind.STEP, "")] = checkpoints.ESTIMATOR_STEP_KEY
  mapped, written, reset = [], {}, []
  for key, variable, weight, kind, slot, _ in keras_state.state(model, config)[0]:
    if reset_slots and kind in (Kind.SLOT, Kind.COUNTER):  # As the optimizer built it.
      reset.append(Ignored(f"{weight}/{slot}" if weight else slot, starts_at(variable.numpy())))
      written[key] = variable.numpy()
      continue
    name = sources[("", Kind.STEP, "") if kind == Kind.PART_STEP else (weight, kind, slot)]
    value = reader.get_tensor(name)
    if kind in (Kind.STEP, Kind.PART_STEP):
      value = np.int64(value)  # Very old Estimators kept an int32 global_step.
    elif value.dtype != variable.dtype.as_numpy_dtype:
      raise ConversionError(f"{path}: {name} is {value.dtype}, the model's {weight} "
                            f"{variable.dtype.name}.")
    variable.assign(value)
    mapped.append(Mapped(name, key, kind))
    written[key] = np.asarray(value)
  return mapped, written, reset


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
  config = parts.single_or_v1(config or Config(), assignment_map)
  if parts.is_tf2_canned(config):
    return canned.keras_to_estimator(src_model_dir, dst_model_dir, config, reset_slots,
                                     from_backup)
  write.check_target(dst_model_dir)
  names = assign.inverse_map(assignment_map, config)
  path, skipped = source.newest(src_model_dir, checkpoints.KERAS, from_backup)
  model = keras_trainer.compile_model(config)
  reader = source.read_checkpoint(path)
  state, derived, saved = _keras_source(path, reader, model, config, reset_slots)
  values, mapped, part_steps = _estimator_values(state, reader, path, config, names)
  step = int(values[checkpoints.ESTIMATOR_STEP_KEY])
  source.check_part_steps(part_steps, step, path)
  reset, written_zero = _v1_state_to_write(values, state, names, config, step, path,
                                           reset_slots)

  def write_checkpoint(staging: str) -> str:
    saved = write.write_name_based(values, staging, step)
    write.read_back(saved, values)
    return saved

  # Renamed weights are not this model's names, by design: no resume check then, but for a
  # team's program, whose own variables they are.
  output = write.write_target(src_model_dir, dst_model_dir, checkpoints.ESTIMATOR, config,
                              write_checkpoint, config if reset_slots else None,
                              check_resume=not names or bool(config.estimator_program))
  logging.info("Wrote %s (step %d) from %s", output, step, path)
  ignored = [Ignored(k, why) for k, why in {**keras_state.KERAS_DERIVED, **derived}.items()
             if k in saved] + written_zero
  ignored += [Ignored(k, "the linear part's own count of steps, the step's") for k in part_steps]
  return Conversion(path, output, step, mapped, ignored, reset, skipped)


def _keras_source(path: str, reader: Any, model: tf_keras.Model, config: Config,
                  reset_slots: bool
                  ) -> Tuple[List[keras_state.KerasState], Dict[str, str], Dict[str, str]]:
  """What is carried of the Keras checkpoint at `path` into the compiled model, what it holds
  that is not (key -> why), and its keys' saved names. Refuses another optimizer's state
  (unless `reset_slots`) and any entry it does not know."""
  state, derived = keras_state.state(model, config)  # The optimizer built, its slots made.
  saved = checkpoints.saved_names(reader)
  if not reset_slots and not keras_state.holds_state_of(saved, model, config):
    raise assign.optimizer_differs(path, keras_state.trained_with(saved, config), config)
  if reset_slots:  # The source's optimizer variables, whichever: none is carried.
    derived.update({k: f"{assign.RESET} (it held {saved[k]})" for k in saved
                    if keras_state.optimizer_variable(k)})
    state = [s for s in state if s.kind in (Kind.WEIGHT, Kind.STEP, Kind.PART_STEP)]
  unknown = sorted(set(saved) - {s.key for s in state} - set(keras_state.KERAS_DERIVED)
                   - set(derived))
  if unknown:
    raise ConversionError(f"{path} holds {', '.join(unknown)}, which this converter does not "
                          "know how to carry.")
  return state, derived, saved


def _estimator_values(state: List[keras_state.KerasState], reader: Any, path: str,
                      config: Config, names: Mapping[str, str]
                      ) -> Tuple[Dict[str, np.ndarray], List[Mapped], Dict[str, int]]:
  """Each carried value of the Keras checkpoint (read by `reader`) under its Estimator name
  (`names`: a renamed weight's), what was mapped, and each part's own count of steps."""
  values: Dict[str, np.ndarray] = {}
  mapped, part_steps = [], {}
  for key, variable, weight, kind, slot, _ in state:
    if not reader.has_tensor(key):
      raise ConversionError(f"{path} has no {key} ({weight or 'the step'}): it does not match "
                            f"--model={config.model}.")
    value = reader.get_tensor(key)
    if value.shape != tuple(variable.shape):
      raise ConversionError(f"{path}: {key} ({weight}) has shape "
                            f"{assign.fmt_shape(value.shape)}, --model={config.model}'s "
                            f"{assign.fmt_shape(variable.shape)}.")
    if kind == Kind.PART_STEP:  # The Estimator counts one step: this one must equal it.
      part_steps[key] = int(value)
      continue
    name = {Kind.STEP: checkpoints.ESTIMATOR_STEP_KEY, Kind.WEIGHT: names.get(weight, weight),
            Kind.COUNTER: parts.v1_counter_name(config, slot),
            Kind.SLOT: parts.v1_slot_name(config, names.get(weight, weight), slot)}[kind]
    values[name] = np.int64(value) if kind == Kind.STEP else value
    mapped.append(Mapped(key, name, kind))
  return values, mapped, part_steps


def _v1_state_to_write(values: Dict[str, np.ndarray], state: List[keras_state.KerasState],
                       names: Mapping[str, str], config: Config, step: int, path: str,
                       reset_slots: bool) -> Tuple[List[Ignored], List[Ignored]]:
  """Adds to `values` (the Estimator checkpoint's, by name) the v1 optimizers' state the Keras
  checkpoint did not give, for the trainable weights of `state` (written under `names`):
  with `reset_slots`, each part's as its v1 optimizer starts; else zeros for the slots v1
  keeps and the twin does not (never read: the Estimator restores every slot it makes),
  after checking Adam's counters against `step`. Returns (reset, written as zeros)."""
  model_parts = parts.parts(config)
  trained: Dict[str, Dict[str, Any]] = {}  # Each part's trainable weights, by name written.
  for s in state:
    if s.kind == Kind.WEIGHT and s.variable.trainable:
      trained.setdefault(parts.part_of(model_parts, s.weight), {})[
          names.get(s.weight, s.weight)] = s.variable
  if reset_slots:
    initial = {}
    for part_name, part in model_parts.items():
      initial.update(optimizers.v1_initial_state(part, {
          name: variable.shape for name, variable in trained[part_name].items()}))
    initial = {parts.v1_counter_name(config, name)
               if name in checkpoints.V1_OPTIMIZER_VARIABLES
               else parts.v1_slot_name(config, *name.rsplit("/", 1)): value
               for name, value in initial.items()}
    values.update(initial)
    return [Ignored(name, starts_at(value)) for name, value in sorted(initial.items())], []
  source.check_counters({checkpoints.v1_counter(k): v for k, v in values.items()
                         if checkpoints.v1_counter(k)}, step, parts.adam_part(config), path)
  written_zero = []
  for part_name, part in model_parts.items():
    for slot, why in optimizers.unread_slots(part):
      for weight, variable in trained[part_name].items():
        name = parts.v1_slot_name(config, weight, slot.v1)
        values[name] = np.zeros(variable.shape, variable.dtype.as_numpy_dtype)
        written_zero.append(Ignored(name, f"written as zeros: {why}"))
  return [], written_zero
