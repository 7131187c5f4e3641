"""Warm starting: a new run's variables from another run's checkpoint, by name, as
`tf.estimator.WarmStartSettings` starts a `model_fn`'s, the same in both backends.

    python -m trainers.keras_main --warm_start_from=OLD_MODEL_DIR \\
        [--warm_start_vars='conv.*'] [--warm_start_map=renamed.json] ...

- `--warm_start_from`: a model_dir of either backend (its newest checkpoint), a team's
  program's, or one checkpoint's path (`.../model.ckpt-1500`). A Keras checkpoint's
  variables are found by the names they had (its object graph's `full_name`).
- `--warm_start_vars`: as WarmStartSettings' `vars_to_warm_start`. A regex (default `.*`)
  selects the trainable variables whose name (`conv1/kernel:0`) it matches from the start
  (`re.match`, the Estimator's collection `scope`); a JSON list of regexes selects any of
  the model's variables one of them matches, BatchNorm's moving statistics too.
- `--warm_start_map`: a JSON file `{"new name": "name in the checkpoint"}`, WarmStartSettings'
  `var_name_to_prev_var_name`; every name it maps must be selected.

Never the optimizer's slots nor the step, in either backend: they start fresh, as
WarmStartSettings leaves them (its list form could reach them in an Estimator; here it
does not). The Estimator starts from the chosen values through WarmStartSettings (`plan`
gives them, written by the backend to a checkpoint of its own); Keras assigns them once the
model is built. A run whose model_dir holds a checkpoint (or a Keras backup) resumes
instead, and says so (`for_run`).
"""

import dataclasses
import json
import re
from typing import Dict, List, Optional, Set, Tuple, Union

import numpy as np
import tensorflow as tf
from absl import logging

from trainers import checkpoints
from trainers import model as model_lib
from trainers.config import Config


class WarmStartError(ValueError):
  """A warm start that cannot be done as asked; the message names the flag and the fix."""


@dataclasses.dataclass(frozen=True)
class Plan:
  """What a run starts from.

  Attributes:
    checkpoint: the source checkpoint's path.
    sources: each warm-started variable (this model's name) -> its name in the checkpoint.
    values: each warm-started variable's value, by this model's name.
  """

  checkpoint: str
  sources: Dict[str, str]
  values: Dict[str, np.ndarray]


def source_checkpoint(path: str) -> str:
  """The checkpoint `--warm_start_from=path` names: a directory's newest (either backend's,
  `checkpoints.find`), or `path` itself when `path.index` exists.

  Raises:
    WarmStartError: there is none there.
  """
  if tf.io.gfile.isdir(path):
    newest = checkpoints.newest(path)
    if newest is None:
      raise WarmStartError(
          f"--warm_start_from={path} holds no checkpoint (model.ckpt-N or ckpt-N): give the "
          "model_dir of a run that saved one, or one checkpoint's path.")
    return newest
  if tf.io.gfile.exists(path + ".index"):
    return path
  raise WarmStartError(f"--warm_start_from={path}: no such directory or checkpoint. Give a "
                       "model_dir, or a checkpoint's path without its .index suffix.")


def source_names(checkpoint: str) -> Dict[str, str]:
  """Every variable of `checkpoint` by its name -> its key: a name-based (Estimator)
  checkpoint's keys are the names; an object-based (Keras) one's are found by the name each
  variable of its model had (`checkpoints.saved_names`), its optimizer's left out.

  Raises:
    WarmStartError: the checkpoint does not load.
  """
  try:
    reader = tf.train.load_checkpoint(checkpoint)
    keys = reader.get_variable_to_shape_map()
  except (tf.errors.OpError, ValueError) as e:
    raise WarmStartError(f"--warm_start_from: {checkpoint} does not load "
                         f"({str(e).splitlines()[0]}); give another checkpoint.") from None
  if checkpoints.OBJECT_GRAPH_KEY not in keys:
    return {key: key for key in keys if key != checkpoints.OBJECT_GRAPH_KEY}
  return {name: key for key, name in checkpoints.saved_names(reader).items()
          if name and key in keys and key.startswith("model/")
          and not key.startswith("model/optimizer/") and "/.OPTIMIZER_SLOT/" not in key}


def read_map(path: Optional[str]) -> Dict[str, str]:
  """--warm_start_map's {new name: old name}; {} without one.

  Raises:
    WarmStartError: the file is missing, or not a JSON object of names.
  """
  if not path:
    return {}
  try:
    with open(path) as f:
      mapping = json.load(f)
  except OSError as e:
    raise WarmStartError(f"--warm_start_map={path}: {e.strerror}. Give a JSON file "
                         '{"new name": "name in the checkpoint"}.') from None
  except ValueError as e:
    raise WarmStartError(f"--warm_start_map={path} is not JSON ({e}).") from None
  if not isinstance(mapping, dict) or not all(
      isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
    raise WarmStartError(f"--warm_start_map={path} must be one JSON object of names, "
                         '{"new name": "name in the checkpoint"}.')
  return mapping


def model_variables(backend: str, config: Config) -> Tuple[Dict[str, Tuple[int, ...]], Set[str]]:
  """The variables a run of `backend` warm starts, by name with their shapes, and which are
  trainable: the model's (--model; the Estimator's of a team's program, its eval graph's,
  which holds no optimizer), never a slot or the step."""
  if backend == "estimator" and config.estimator_program:
    from trainers import estimator_program  # noqa: PLC0415 -- imports tf.estimator.
    built = estimator_program.graph(config, "eval")
    shapes = {name: tuple(shape) for name, shape in built.variables.items()
              if name != tf.compat.v1.GraphKeys.GLOBAL_STEP}
    return shapes, set(built.trainable) & set(shapes)
  built = model_lib.graph_model(config)
  return dict(built.shapes), set(built.trainable)


def select(shapes: Dict[str, Tuple[int, ...]], trainable: Set[str],
           selection: Union[str, List[str]]) -> List[str]:
  """The variables `selection` (Config.warm_start_selection) picks, as WarmStartSettings
  picks them: a regex, trainable ones whose `name:0` it matches from the start; a list, any
  that one of its regexes matches so."""
  if isinstance(selection, str):
    return [n for n in shapes if n in trainable and re.match(selection, f"{n}:0")]
  return [n for n in shapes if any(re.match(p, f"{n}:0") for p in selection)]


def plan(backend: str, config: Config) -> Plan:
  """What config.warm_start_from starts a run of `backend` from.

  Raises:
    WarmStartError: no checkpoint there; a selection that picks nothing; a map naming a
      variable the model lacks or the selection leaves out; a selected variable the
      checkpoint lacks, or holds in another shape.
  """
  checkpoint = source_checkpoint(config.warm_start_from)
  names = source_names(checkpoint)
  shapes, trainable = model_variables(backend, config)
  selection = config.warm_start_selection()
  chosen = select(shapes, trainable, selection)
  what = (f"model {config.model}" if backend == "keras" or not config.estimator_program
          else f"--estimator_program={config.estimator_program}")
  if not chosen:
    raise WarmStartError(
        f"--warm_start_vars={config.warm_start_vars or '.*'} selects none of {what}'s "
        f"{'trainable ' if isinstance(selection, str) else ''}variables "
        f"({', '.join(sorted(shapes))}): give a regex matching their names from the start.")
  mapping = read_map(config.warm_start_map)
  for new in mapping:
    if new not in shapes:
      raise WarmStartError(f"--warm_start_map={config.warm_start_map} maps {new}, which is not "
                           f"a variable of {what} ({', '.join(sorted(shapes))}).")
    if new not in chosen:
      raise WarmStartError(f"--warm_start_map={config.warm_start_map} maps {new}, which "
                           f"--warm_start_vars does not select: select it, or take it out.")
  reader = tf.train.load_checkpoint(checkpoint)
  sources, values = {}, {}
  for name in chosen:
    old = mapping.get(name, name)
    if old not in names:
      held = sorted(n for n in names if n != tf.compat.v1.GraphKeys.GLOBAL_STEP
                    and not n.endswith(checkpoints.V1_SLOT_SUFFIXES))
      raise WarmStartError(
          f"--warm_start_from={config.warm_start_from}: {checkpoint} has no variable {old}"
          f"{'' if old == name else f' for {name}'}. Map it to the checkpoint's name in "
          f"--warm_start_map, or leave it out of --warm_start_vars; the checkpoint holds "
          f"{', '.join(held[:20])}{' ...' if len(held) > 20 else ''}.")
    value = reader.get_tensor(names[old])
    if tuple(value.shape) != tuple(shapes[name]):
      raise WarmStartError(
          f"--warm_start_from={config.warm_start_from}: {old} has shape {list(value.shape)} "
          f"in {checkpoint}, {name} has {list(shapes[name])} here. Leave it out of "
          "--warm_start_vars, or map it to a variable of its shape.")
    sources[name], values[name] = old, value
  return Plan(checkpoint, sources, values)


def resumes(model_dir: str) -> Optional[str]:
  """What a run in model_dir resumes from instead of warm starting, or None."""
  newest = checkpoints.newest(model_dir)
  if newest:
    return newest
  step = checkpoints.keras_backup_step(model_dir)
  return None if step is None else f"its Keras backup at step {step}"


def for_run(backend: str, config: Config, model_dir: str) -> Optional[Plan]:
  """The warm start a training task of `backend` makes in model_dir: None without
  --warm_start_from, or when the run resumes (said in the log).

  Raises:
    WarmStartError: as `plan`.
  """
  if not config.warm_start_from:
    return None
  resumed = resumes(model_dir)
  if resumed:
    logging.info("Not warm starting from %s: model_dir resumes from %s, as the Estimator "
                 "resumes.", config.warm_start_from, resumed)
    return None
  started = plan(backend, config)
  logging.info("Warm starting %d variables from %s: %s", len(started.values),
               started.checkpoint, ", ".join(
                   n if n == old else f"{n} (from {old})" for n, old in started.sources.items()))
  return started


def assign(model, started: Plan) -> None:
  """Keras: sets `model`'s warm-started weights, by name (in its strategy's scope)."""
  for weight in model.weights:
    name = model_lib.weight_name(weight)
    if name in started.values:
      weight.assign(started.values[name])

