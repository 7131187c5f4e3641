"""Carries a canned Estimator's training run to its Keras twin and back
(`--model=dnn|linear|wide_deep`, trainers/models/canned.py).

A TF2 canned Estimator trains with tf_keras legacy optimizers made under the
`training/` name scope; its twin trains with the same legacy classes (one per
part for `wide_deep`: `canned.PartOptimizers`). So each variable of the
Estimator's checkpoint has one place in the twin:

- `dnn/hiddenlayer_0/kernel`, `linear/linear_model/<feature>/weights`, ...: the
  twin's weight of that name;
- `training/<Optimizer>/<weight>/<slot>`: that optimizer's slot of the weight;
- `training/<Optimizer>/<hyperparameter>` (`learning_rate`, `decay`, ...): the
  optimizer's own, which must equal the run's (its flags): a difference stops
  the conversion naming the flag, never carried silently;
- `global_step`: the step, the (DNN part's) optimizer's iterations;
- `training/<Optimizer>/iter`: the linear part's own count in `wide_deep`.

Anything else, or anything missing (a run with another `--hidden_units` or
`--dnn_optimizer`), stops it. The `tf.compat.v1.estimator` canned classes (v1
optimizers, whose slots are the CNN's) are carried by `carry` itself.
"""

from typing import Dict, List, NamedTuple, Tuple

import numpy as np
import tensorflow as tf
import tf_keras
from absl import logging

from launch.convert import source
from launch.convert import write
from launch.convert.kinds import Conversion, ConversionError, Ignored, Kind, Mapped
from launch.convert.report import starts_at
from trainers import checkpoints
from trainers import keras_trainer
from trainers import model as model_lib
from trainers.config import Config
from trainers.models import canned

_SCOPE = checkpoints.CANNED_OPTIMIZER_SCOPE


class CannedState(NamedTuple):
  """One variable of a canned Estimator's checkpoint and its place in the twin."""
  name: str  # In the Estimator's checkpoint.
  variable: tf.Variable  # The twin's.
  kind: Kind  # WEIGHT, SLOT, STEP or HYPERPARAMETER.
  flag: str = ""  # HYPERPARAMETER: the flag that sets it, if one does.


def _parts(model: tf_keras.Model, config: Config
           ) -> List[Tuple[str, tf_keras.optimizers.legacy.Optimizer, List[tf.Variable]]]:
  """(part, its optimizer, the variables it updates); the step's part first."""
  optimizer = model.optimizer
  if isinstance(optimizer, canned.PartOptimizers):
    return [(part, getattr(optimizer, part),
             [v for v in model.trainable_variables if canned.part_of(v.name) == part])
            for part in ("dnn", "linear")]
  return [("dnn" if "dnn_optimizer" in config.canned_settings() else "linear", optimizer,
           model.trainable_variables)]


def canned_state(model: tf_keras.Model, config: Config) -> List[CannedState]:
  """Every variable of the twin (compiled, its optimizers' slots made here) under the name
  the canned Estimator's checkpoint gives it."""
  state = [CannedState(model_lib.weight_name(w), w, Kind.WEIGHT) for w in model.weights]
  for i, (part, optimizer, variables) in enumerate(_parts(model, config)):
    optimizer._create_all_weights(variables)  # pylint: disable=protected-access
    scope = f"{_SCOPE}{optimizer._name}"  # pylint: disable=protected-access
    state += [CannedState(f"{scope}/{model_lib.weight_name(v)}/{slot}",
                          optimizer.get_slot(v, slot), Kind.SLOT)
              for v in variables for slot in optimizer.get_slot_names()]
    state += [CannedState(f"{scope}/{name}",
                          optimizer._get_hyper(name),  # pylint: disable=protected-access
                          Kind.HYPERPARAMETER,
                          f"--{part}_learning_rate" if name == "learning_rate" else "")
              for name in sorted(optimizer._hyper)]  # pylint: disable=protected-access
    state.append(CannedState(checkpoints.ESTIMATOR_STEP_KEY if i == 0 else f"{scope}/iter",
                             optimizer.iterations, Kind.STEP))
  return state


def _hyperparameter_problems(path: str, state: List[CannedState],
                             values: Dict[str, np.ndarray],
                             run: Dict[str, np.ndarray]) -> List[str]:
  """Each hyperparameter of the checkpoint (`values`) that is not the run's (`run`), with
  the fix."""
  problems = []
  for s in (s for s in state if s.kind == Kind.HYPERPARAMETER):
    ours = run[s.name]
    if not np.allclose(values[s.name], ours, rtol=1e-6, atol=0):
      fix = (f"give {s.flag}={float(values[s.name]):.6g} as it was trained" if s.flag else
             "it is the canned optimizer's default, which this twin does not change")
      problems.append(f"{s.name} is {float(values[s.name]):.6g} in {path}, "
                      f"{float(ours):.6g} in this run ({fix})")
  return problems


def _hyperparameters(state: List[CannedState]) -> Dict[str, np.ndarray]:
  """The twin's hyperparameter values now, by their checkpoint names."""
  return {s.name: s.variable.numpy() for s in state if s.kind == Kind.HYPERPARAMETER}


def _check_names(path: str, held: Dict[str, List[int]], state: List[CannedState],
                 config: Config) -> None:
  """Raises unless the checkpoint (`held`: name -> shape) holds exactly the twin's state."""
  expected = {s.name: s.variable.shape.as_list() for s in state}
  unknown = sorted(set(held) - set(expected) - {checkpoints.OBJECT_GRAPH_KEY})
  missing = sorted(set(expected) - set(held))
  reshaped = sorted(f"{n} is {list(held[n])}, the twin's {shape}" for n, shape in
                    expected.items() if n in held and list(held[n]) != shape)
  if unknown or missing or reshaped:
    raise ConversionError(
        f"{path} is not a checkpoint of --model={config.model} with these settings "
        f"({', '.join(f'{k}={v}' for k, v in config.canned_settings().items())}): "
        + "".join(f"{what} {', '.join(names[:4])}{', ...' if len(names) > 4 else ''}; "
                  for what, names in (("it holds what the twin has no place for:", unknown),
                                      ("it lacks", missing), ("", reshaped)) if names)
        + "give the canned flags it was trained with (--hidden_units, --dnn_optimizer, "
        "--linear_optimizer, --feature_name, --features, --feature_columns, ...): "
        f"python -m launch.convert --inspect={path} names them.")


def _read_back(path: str, config: Config, written: Dict[str, np.ndarray]) -> None:
  """Raises unless a fresh twin restores exactly `written` from the Keras checkpoint."""
  model = keras_trainer.compile_model(config)
  state = canned_state(model, config)
  tf.train.Checkpoint(model=model).restore(path).assert_consumed()
  for s in state:
    if not np.array_equal(s.variable.numpy(), written[s.name]):
      raise ConversionError(f"The written checkpoint {path} restores another value "
                                    f"for {s.name}.")


def estimator_to_keras(src_model_dir: str, dst_model_dir: str, config: Config,
                       reset_slots: bool = False) -> Conversion:
  """A canned Estimator's newest checkpoint as its twin's Keras model_dir (see the module's
  docstring); `carry.estimator_to_keras` hands canned models here."""
  write.check_target(dst_model_dir)
  path, skipped = source.newest(src_model_dir, checkpoints.ESTIMATOR)
  reader = source.read_checkpoint(path)
  model = keras_trainer.compile_model(config)
  state = canned_state(model, config)
  _check_names(path, reader.get_variable_to_shape_map(), state, config)
  values = {s.name: reader.get_tensor(s.name) for s in state}
  problems = _hyperparameter_problems(path, state, values, _hyperparameters(state))
  if problems:
    raise ConversionError("The optimizer's settings differ: " + "; ".join(problems))
  mapped, reset, written = [], [], {}
  for s in state:
    if reset_slots and s.kind == Kind.SLOT:
      reset.append(Ignored(s.name, starts_at(s.variable.numpy())))
    else:
      s.variable.assign(values[s.name].astype(s.variable.dtype.as_numpy_dtype))
      mapped.append(Mapped(s.name, s.variable.name.split(":")[0], s.kind))
    written[s.name] = s.variable.numpy()
  step = int(values[checkpoints.ESTIMATOR_STEP_KEY])
  def write_checkpoint(staging: str) -> str:
    saved = keras_trainer.save_checkpoint(model, staging, step)
    _read_back(saved, config, written)
    return saved

  output = write.write_target(src_model_dir, dst_model_dir, checkpoints.KERAS, config,
                              write_checkpoint)
  logging.info("Wrote %s (step %d) from %s", output, step, path)
  return Conversion(path, output, step, mapped, [], reset, skipped)


def keras_to_estimator(src_model_dir: str, dst_model_dir: str, config: Config,
                       reset_slots: bool = False, from_backup: bool = False
                       ) -> Conversion:
  """The twin's newest Keras checkpoint as the canned Estimator's model_dir;
  `carry.keras_to_estimator` hands canned models here."""
  write.check_target(dst_model_dir)
  path, skipped = source.newest(src_model_dir, checkpoints.KERAS, from_backup)
  model = keras_trainer.compile_model(config)
  state = canned_state(model, config)
  configured = _hyperparameters(state)
  try:
    tf.train.Checkpoint(model=model).restore(path).assert_existing_objects_matched()
  except (AssertionError, ValueError, tf.errors.OpError) as e:
    raise ConversionError(f"{path} is not a checkpoint of --model={config.model} with "
                                  f"these settings: {str(e).splitlines()[0]}") from e
  values = {s.name: s.variable.numpy() for s in state}
  problems = _hyperparameter_problems(path, state, values, configured)
  if problems:
    raise ConversionError("The optimizer's settings differ: " + "; ".join(problems))
  reset: List[Ignored] = []
  if reset_slots:
    fresh = canned_state(keras_trainer.compile_model(config), config)
    for s in (s for s in fresh if s.kind == Kind.SLOT):
      values[s.name] = s.variable.numpy()
      reset.append(Ignored(s.name, starts_at(values[s.name])))
  mapped = [Mapped(s.variable.name.split(":")[0], s.name, s.kind) for s in state
            if not (reset_slots and s.kind == Kind.SLOT)]
  step = int(values[checkpoints.ESTIMATOR_STEP_KEY])
  def write_checkpoint(staging: str) -> str:
    saved = write.write_name_based(values, staging, step)
    write.read_back(saved, values)
    return saved

  output = write.write_target(src_model_dir, dst_model_dir, checkpoints.ESTIMATOR, config,
                              write_checkpoint)
  logging.info("Wrote %s (step %d) from %s", output, step, path)
  return Conversion(path, output, step, mapped, [], reset, skipped)
