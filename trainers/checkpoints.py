"""Checkpoints on disk, for the trainers and the converter: both backends' key layouts,
whose a checkpoint is and its step, whether a backend can resume from it, and setting
aside the ones that must not be resumed from.

Keras writes object-based checkpoints (`tf.train.Checkpoint(model=model)`,
`ckpt-<step>`): every key is an object path ending in `/.ATTRIBUTES/VARIABLE_VALUE`,
with the object graph under `_CHECKPOINTABLE_OBJECT_GRAPH`. The Estimator writes
name-based ones (`model.ckpt-<step>`), keyed by variable name (`conv/kernel`,
`global_step`). Both keep the same newest ones in model_dir (`retention`), named in its
`checkpoint` file.
"""

import collections
import json
import os
import re
from typing import (Any, Callable, Collection, Dict, List, Mapping, Optional, Sequence,
                    Tuple)

import numpy as np
import tensorflow as tf
from absl import logging
from tensorflow.core.protobuf import trackable_object_graph_pb2

from trainers import failures
from trainers import model as model_lib
from trainers import model_dir as layout
from trainers import program as program_lib
from trainers import run_record
from trainers.config import Config

KEEP = 3  # The checkpoints model_dir keeps unless --keep_checkpoint_max or a program says.
KERAS_PREFIX = "ckpt"  # Keras: ckpt-<step>.
ESTIMATOR_PREFIX = "model.ckpt"  # The Estimator: model.ckpt-<step>.
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"  # Only object-based checkpoints have it.
ESTIMATOR_STEP_KEY = "global_step"
# What a tf.compat.v1.train optimizer adds to an Estimator checkpoint: slots named
# `<variable>/<its name>` (a second slot gets `_1`; see `v1_slot` for the other forms),
# and Adam's two powers of beta.
V1_SLOT_SUFFIXES = ("/Momentum", "/Adagrad", "/Adam", "/Adam_1", "/Ftrl", "/Ftrl_1", "/RMSProp",
                    "/RMSProp_1")
# A partitioned variable's (one) part, in its slots' names: `<variable>/part_0/Ftrl`.
_PART = re.compile(r"/(?:part|t)_\d+$")
V1_OPTIMIZER_VARIABLES = ("beta1_power", "beta2_power")
# Where a TF2 canned Estimator's Keras legacy optimizer keeps its state: slots as
# `training/<Optimizer>/<variable>/<slot>`, hyperparameters as `training/<Optimizer>/<name>`.
CANNED_OPTIMIZER_SCOPE = "training/"
KERAS = "keras"
ESTIMATOR = "estimator"


def retention(config: Config) -> Tuple[Optional[int], Optional[float]]:
  """How many checkpoints model_dir keeps (None: all) and every how many hours one more is
  kept for good, the same in both backends: the Estimator's Saver and Keras's
  CheckpointManager keep the newest `max` and, with `hours`, the first saved in each such
  span of wall time. --keep_checkpoint_max (0: all), or a team's program's RunConfig
  settings, or KEEP."""
  own = (program_lib.load(config.estimator_program).run_config if config.estimator_program
         else {})
  most = (config.keep_checkpoint_max if config.keep_checkpoint_max is not None
          else own.get("keep_checkpoint_max", KEEP))
  return most or None, own.get("keep_checkpoint_every_n_hours")


INDEX_FILE = "checkpoint"  # The index naming the newest checkpoint, and the others kept.
_NAME = re.compile(r"^(?:model\.)?ckpt-(\d+)\.index$")  # Either backend's, by its step.


def find(model_dir: str) -> List[str]:
  """Every checkpoint in model_dir (either backend's), oldest step first, found by what is
  on disk: their `.index` files, whatever the `checkpoint` index says or whether it exists.

  This is the one way the trainers and the converter find checkpoints: the index is
  rewritten from it (`repair_index`) when it is missing, unreadable or wrong, so a run
  never starts from step 0 in a model_dir that holds a checkpoint.
  """
  found = []
  for name in tf.io.gfile.listdir(model_dir) if tf.io.gfile.isdir(model_dir) else []:
    match = _NAME.match(name)
    if match:
      found.append((int(match.group(1)), os.path.join(model_dir, name[:-len(".index")])))
  return [path for _, path in sorted(found)]


def newest(model_dir: str) -> Optional[str]:
  """model_dir's newest checkpoint by step (see `find`), or None."""
  paths = find(model_dir)
  return paths[-1] if paths else None


def _indexed(model_dir: str) -> Optional[List[str]]:
  """The checkpoints model_dir's index names, newest last; None if it is missing or unreadable."""
  try:
    state = tf.train.get_checkpoint_state(model_dir)
  except ValueError:  # An index naming no checkpoint.
    return None
  if state is None:
    return None
  paths = list(state.all_model_checkpoint_paths)
  if state.model_checkpoint_path not in paths:
    paths.append(state.model_checkpoint_path)
  return paths


def repair_index(model_dir: str) -> Optional[str]:
  """The writer, before a resume: rewrites the `checkpoint` index from what `find` finds,
  with relative paths, when it is missing or unreadable, names a checkpoint that is not on
  disk, or does not name the newest one as the newest.

  Returns:
    What was wrong and what the index names now, or None if it was right.
  """
  on_disk = find(model_dir)
  indexed = _indexed(model_dir)
  if not on_disk or (indexed and os.path.abspath(indexed[-1]) == os.path.abspath(on_disk[-1])
                     and all(tf.io.gfile.exists(p + ".index") for p in indexed)):
    return None
  path = os.path.join(model_dir, INDEX_FILE)
  why = ("missing" if not tf.io.gfile.exists(path) else "unreadable" if indexed is None
         else f"naming {[os.path.basename(p) for p in indexed]}")
  names = [os.path.basename(p) for p in on_disk]
  text = f"model_checkpoint_path: {json.dumps(names[-1])}\n" + "".join(
      f"all_model_checkpoint_paths: {json.dumps(name)}\n" for name in names)
  with tf.io.gfile.GFile(path + ".tmp", "w") as f:
    f.write(text)
  tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
  message = (f"{path} was {why}; rewritten from the checkpoints on disk: {', '.join(names)} "
             f"(resuming from {names[-1]}).")
  logging.warning("%s", message)
  return message


def keras_key(object_path: str) -> str:
  """The key under which an object-based checkpoint keeps the variable at `object_path`."""
  return f"{object_path}/.ATTRIBUTES/VARIABLE_VALUE"


def keras_weight_key(layer_index: int, attribute: str) -> str:
  """The key of a weight (`kernel`, `bias`) of the model's `layer_index`-th layer with
  weights, as `tf.train.Checkpoint(model=model)` writes it (tf-keras 2.15)."""
  return keras_key(f"model/layer_with_weights-{layer_index}/{attribute}")


KERAS_STEP_KEY = keras_key("model/optimizer/_iterations")
# A tf_keras legacy optimizer's (a canned model's twin) keeps its step as `iter`.
KERAS_LEGACY_STEP_KEY = keras_key("model/optimizer/iter")


def keras_step(reader: Any) -> int:
  """The step of a Keras checkpoint: its optimizer's iterations."""
  key = KERAS_STEP_KEY if reader.has_tensor(KERAS_STEP_KEY) else KERAS_LEGACY_STEP_KEY
  return int(reader.get_tensor(key))


def saved_names(reader: Any) -> Dict[str, str]:
  """An object-based checkpoint's keys -> the name each variable had when saved
  (`SGD/m/conv/kernel`), from its object graph."""
  graph = trackable_object_graph_pb2.TrackableObjectGraph()
  graph.ParseFromString(reader.get_tensor(OBJECT_GRAPH_KEY))
  return {a.checkpoint_key: a.full_name for node in graph.nodes for a in node.attributes}


def v1_slot(name: str, variables: Collection[str]) -> Optional[Tuple[str, str]]:
  """(variable, slot) if `name` is a tf.compat.v1.train optimizer's slot of one of
  `variables`, with the slot's name (`Ftrl_1`); else None.

  Besides `<variable>/<slot>`, the forms the v1 canned Estimators write: under the scope
  their model_fn minimizes in when a strategy trains them
  (`linear/linear/linear_model/<feature>/weights/Ftrl`), and with the variable's one
  part when none does (`<variable>/part_0/Ftrl`, `<variable>/t_0/Adagrad`).
  """
  suffix = next((s for s in V1_SLOT_SUFFIXES if name.endswith(s)), None)
  if suffix is None:
    return None
  parts = _PART.sub("", name[:-len(suffix)]).split("/")
  for i in range(len(parts)):
    variable = "/".join(parts[i:])
    if variable in variables:
      return variable, suffix[1:]
  return None


def v1_counter(name: str) -> Optional[str]:
  """`beta1_power` or `beta2_power` if `name` is a v1 Adam's power of beta: bare, or as the
  v1 canned classes name it under their scopes (`dnn/head/dnn/beta1_power`); else None."""
  return next((c for c in V1_OPTIMIZER_VARIABLES if name == c or name.endswith("/" + c)), None)


def owner(shapes: Mapping[str, Sequence[int]]) -> str:
  """KERAS for object-based checkpoints (tf.train.Checkpoint), ESTIMATOR for name-based."""
  return KERAS if OBJECT_GRAPH_KEY in shapes else ESTIMATOR


def checkpoint_step(path: str) -> Tuple[str, int]:
  """The backend that wrote a checkpoint and its global step; raises if it cannot be read."""
  reader = tf.train.load_checkpoint(path)
  whose = owner(reader.get_variable_to_shape_map())
  return whose, (keras_step(reader) if whose == KERAS
                 else int(reader.get_tensor(ESTIMATOR_STEP_KEY)))


def layer_attribute(layer, weight) -> str:
  """The path a layer tracks `weight` under (`kernel`; a custom layer's add_weight name;
  `columns/2/embedding_weights` in a layer of layers), escaped as its object-based
  checkpoint key holds it. The checkpoint names each object by its first path breadth
  first, which a weight two layers share (a shared embedding table) has too."""
  queue, seen = collections.deque([(layer, [])]), {id(layer)}
  while queue:
    node, path = queue.popleft()
    for name, child in node._trackable_children().items():  # pylint: disable=protected-access
      if child is weight:
        # As tf.train.Checkpoint escapes a name in an object path: "/" separates them.
        return "/".join(p.replace(".", "..").replace("/", ".S") for p in [*path, name])
      if id(child) not in seen and not isinstance(child, tf.Variable):
        seen.add(id(child))
        queue.append((child, [*path, name]))
  return model_lib.weight_name(weight).split("/")[-1]


def _model_mismatch(whose: str, shapes: Mapping[str, Sequence[int]], config: Config,
                    program_variables: bool = True) -> Optional[str]:
  """How a checkpoint's weights differ from `config.model`'s (an Estimator's from its
  --estimator_program's variables, unless not `program_variables`), or None if they
  match."""
  if whose == ESTIMATOR and config.estimator_program:
    if not program_variables:
      return None
    from trainers import estimator_program  # noqa: PLC0415 -- imports tf.estimator.
    expected = estimator_program.variables(config)
    return _missing(expected, shapes)
  # graph_model: an eager op here would start TensorFlow's runtime before the
  # strategy can configure it.
  built = model_lib.graph_model(config)
  if whose == ESTIMATOR:
    expected = {name: list(shape) for name, shape in built.shapes.items()}
  else:
    layers = [layer for layer in built.model.layers if layer.weights]
    expected = {keras_weight_key(i, layer_attribute(layer, w)): w.shape.as_list()
                for i, layer in enumerate(layers) for w in layer.weights}
  return _missing(expected, shapes)


def _missing(expected: Mapping[str, Sequence[int]], shapes: Mapping[str, Sequence[int]]
             ) -> Optional[str]:
  """The first of `expected` variables `shapes` lacks or holds in another shape, or None."""
  for key, shape in expected.items():
    if key not in shapes:
      return f"it has no variable {key}"
    if list(shapes[key]) != list(shape):
      return f"{key} has shape {list(shapes[key])}, this model's has {list(shape)}"
  return None


def resume_problem(backend: str, model_dir: str, config: Config,
                   program_variables: bool = True) -> Optional[str]:
  """Why `backend` cannot resume `config.model` from model_dir's checkpoint, or None if it
  can (or has none). A team's program's variables are built from its code, its input_fn
  too (which may start TensorFlow's runtime): `program_variables` False leaves them out.

  The Estimator resumes from `model_dir`'s checkpoint, Keras from its final
  checkpoint or its backup. A checkpoint of the other backend, or of another
  model, is reported (naming it, whose it is, and the fix) and left untouched.
  """
  backup = tf.train.latest_checkpoint(os.path.join(model_dir, layout.BACKUP_SUBDIR, "chief"))
  for path in (newest(model_dir), backup):
    if path is None:
      continue
    try:
      shapes = dict(tf.train.list_variables(path))
    except tf.errors.NotFoundError:
      # Removed since it was found: a task that starts beside a running chief (an
      # evaluator restarted alone) races the chief's rotation of its checkpoints.
      continue
    whose = owner(shapes)
    if whose != backend:
      return (f"--model_dir={model_dir} holds a checkpoint of the {whose} backend ({path}); "
              f"the {backend} backend cannot resume from it and will not overwrite it. Choose a "
              f"new --model_dir, resume it with python -m trainers.{whose}_main, or carry it "
              f"across with python -m launch.convert --from_{whose}={model_dir} "
              f"--to_{backend}=NEW_MODEL_DIR.")
    mismatch = _model_mismatch(whose, shapes, config, program_variables)
    flag = ("--estimator_program" if whose == ESTIMATOR and config.estimator_program
            else "--model")
    # A canned model's variables follow its settings too (--features, --hidden_units, ...).
    settings = (" and settings" if flag == "--model" and config.canned_settings() else "")
    if mismatch:
      return (f"--model_dir={model_dir} holds a checkpoint of a different model than "
              f"{flag}={getattr(config, flag[2:])} ({path}: {mismatch}); it will not be "
              f"overwritten. Choose a new --model_dir, or the {flag}{settings} it was "
              f"trained with ({_named_by(whose, model_dir, path)} names them).")
  return None


def _named_by(whose: str, model_dir: str, path: str) -> str:
  """Where a user reads what a checkpoint was trained with."""
  if whose == ESTIMATOR:
    return f"python -m launch.convert --inspect={path}"
  return os.path.join(model_dir, run_record.RECORD_FILE)


def keras_backup_step(model_dir: str) -> Optional[int]:
  """The step of the Keras backup an interrupted run left (`backup/chief`), or None."""
  path = tf.train.latest_checkpoint(os.path.join(model_dir, layout.BACKUP_SUBDIR, "chief"))
  return None if path is None else checkpoint_step(path)[1]


def _non_finite(path: str) -> Optional[str]:
  """Why the checkpoint at `path` is no good to resume from after a divergence, or None."""
  reader = tf.train.load_checkpoint(path)
  bad = [name for name, dtype in reader.get_variable_to_dtype_map().items()
         if dtype.is_floating and not np.isfinite(reader.get_tensor(name)).all()]
  return f"holds NaN or Inf in {bad[0]}" if bad else None


def _damage(path: str) -> Optional[str]:
  """Why the checkpoint at `path` does not load (a truncated or missing file), or None."""
  try:
    reader = tf.train.load_checkpoint(path)
    for name in reader.get_variable_to_shape_map():
      reader.get_tensor(name)
  except Exception as e:
    # Every way a read fails is damage to report: a truncated file raises
    # IndexError, OutOfRangeError or DataLossError, by where it ends.
    return f"{type(e).__name__}: {str(e).splitlines()[0]}"
  return None


def newest_good(model_dir: str, why: Callable[[str], Optional[str]] = _damage
                ) -> Tuple[Optional[str], List[Tuple[str, str]]]:
  """model_dir's newest checkpoint (by `find`, so with or without an index) that `why`
  does not fault (by default: that loads whole), and each newer one with why it was
  passed over, newest first. The trainers' resume and the converter start from it.

  Returns:
    (the checkpoint's path or None if none passes, [(path, why) for each passed over]).
  """
  passed_over = []
  for path in reversed(find(model_dir)):
    reason = why(path)
    if not reason:
      return path, passed_over
    passed_over.append((path, reason))
  return None, passed_over


class NoCheckpointError(ValueError):
  """A model_dir holds no checkpoint to carry on from; the message says why and the fix."""


def newest_of(model_dir: str, backend: str, from_backup: bool = False
              ) -> Tuple[str, List[Tuple[str, str]]]:
  """model_dir's newest checkpoint that loads (`newest_good`), which must be `backend`'s and
  (Keras's) no older than the backup an interrupted run left, and each newer one passed
  over, with why. `from_backup`: Keras's BackupAndRestore backup instead. The converter
  starts there.

  Raises:
    NoCheckpointError: none loads, none is there, it is the other backend's, or a Keras
      backup is newer; the message names the fix.
  """
  backup = os.path.join(model_dir, layout.BACKUP_SUBDIR, "chief")
  where = backup if from_backup else model_dir
  path, passed_over = newest_good(where)
  if path is None and passed_over:
    raise NoCheckpointError(
        f"No checkpoint in {where} loads: " + "; ".join(
            f"{os.path.basename(p)}: {why}" for p, why in passed_over)
        + ". Restore the files from a copy.")
  if path is None:
    hint = (f" It holds only a Keras backup ({backup}): convert that with --from_backup."
            if find(backup) and not from_backup else "")
    raise NoCheckpointError(f"No checkpoint in {where} (no ckpt-<step> or model.ckpt-<step> "
                            f"files): give the {backend} model_dir of a finished or stopped "
                            f"run.{hint}")
  try:
    whose, step = checkpoint_step(path)
  except (tf.errors.OpError, KeyError, ValueError) as e:  # Not a training checkpoint.
    raise NoCheckpointError(f"Cannot read the step of the checkpoint {path}: {e}") from e
  if whose != backend:
    raise NoCheckpointError(f"{path} is a {whose} checkpoint, not a {backend} one: convert it "
                            f"with --from_{whose}.")
  # Only a Keras run leaves a backup; reading it loads every tensor, so only then.
  backup_path = newest_good(backup)[0] if backend == KERAS and not from_backup else None
  backup_step = checkpoint_step(backup_path)[1] if backup_path else None
  if backup_step is not None and backup_step > step:
    raise NoCheckpointError(
        f"{model_dir} holds a BackupAndRestore backup at step {backup_step}, newer than its "
        f"newest checkpoint {path} (step {step}): the run was interrupted after that "
        "checkpoint. Convert the backup with --from_backup, or resume the run with "
        "python -m trainers.keras_main to its end and convert that.")
  return path, passed_over


def _set_aside(model_dir: str, subdir: str, why: Callable[[str], Optional[str]],
               keep_one: bool = False) -> Tuple[List[str], Optional[str]]:
  """Moves into `model_dir/subdir/` (never deletes) a Keras backup that `why` faults, and
  the newest checkpoints it faults, newest first until one passes; the `checkpoint`
  file then names that one.

  Args:
    keep_one: if checkpoints exist and none passes, raise instead, moving nothing.

  Returns:
    "file: why" for each set aside, and the newest checkpoint that passes, or None.

  Raises:
    ValueError: with `keep_one`, when no checkpoint passes.
  """
  backup = os.path.join(model_dir, layout.BACKUP_SUBDIR)
  newest_backup = tf.train.latest_checkpoint(os.path.join(backup, "chief"))
  backup_reason = newest_backup and why(newest_backup)
  kept, faulted = newest_good(model_dir, why)
  paths = [path for path in find(model_dir) if path not in dict(faulted)]
  moved = ([f"{layout.BACKUP_SUBDIR}/: {backup_reason}"] if backup_reason else []) + [
      f"{os.path.basename(path)}: {reason}" for path, reason in faulted]
  if keep_one and faulted and not paths:
    raise ValueError(
        f"no checkpoint in --model_dir={model_dir} loads ({'; '.join(moved)}). Nothing was "
        "moved or deleted. Restore the files from a copy, move them away to start afresh "
        "in this directory, or choose a new --model_dir.")
  aside = os.path.join(model_dir, subdir)
  if moved:
    tf.io.gfile.makedirs(aside)
  if backup_reason:
    _move_aside(backup, aside)
  for path, _ in faulted:
    for name in tf.io.gfile.glob(path + ".*"):
      _move_aside(name, aside)
  if faulted:
    if paths:
      tf.compat.v1.train.update_checkpoint_state(model_dir, paths[-1],
                                                 all_model_checkpoint_paths=paths)
    elif tf.io.gfile.exists(os.path.join(model_dir, INDEX_FILE)):
      tf.io.gfile.remove(os.path.join(model_dir, INDEX_FILE))
  return moved, kept


def _move_aside(path: str, aside: str) -> str:
  """Moves `path` into the directory `aside`, under its own name or, if that is taken (an
  earlier set-aside), `<name>.1`, `<name>.2`, ...: evidence is never overwritten."""
  name = os.path.basename(path)
  target, n = os.path.join(aside, name), 0
  while tf.io.gfile.exists(target):
    n += 1
    target = os.path.join(aside, f"{name}.{n}")
  tf.io.gfile.rename(path, target)
  return target


def set_aside_diverged(model_dir: str, error: failures.DivergedError
                       ) -> failures.DivergedError:
  """Chief only, after a divergence: moves what holds NaN or Inf into `model_dir/diverged/`.

  The weights go non-finite one step before the loss shows it, so the newest
  checkpoints (and a Keras backup) may already hold NaN: each is moved aside,
  never deleted, newest first until one is finite, and the `checkpoint` file
  then names that one, which a run with better settings resumes from.

  Returns:
    `error`, its message extended with what was moved and what is kept.
  """
  moved, kept = _set_aside(model_dir, layout.DIVERGED_SUBDIR, _non_finite)
  where = (f"Moved to {os.path.join(model_dir, layout.DIVERGED_SUBDIR)}: {'; '.join(moved)}. "
           if moved else "Nothing saved holds NaN or Inf. ")
  kept = (f"The newest finite checkpoint, {kept}, is kept." if kept else
          "No finite checkpoint is left.")
  return failures.DivergedError(f"{error} {where}{kept}")


def set_aside_damaged(model_dir: str) -> List[str]:
  """Writer only, before a resume: moves checkpoints that do not load into `model_dir/corrupt/`.

  A crash or a full disk mid-save can truncate the newest checkpoint (or Keras
  backup); the run then resumes from the newest one that loads. A save cut
  short leaves its staging directory (`<checkpoint>_temp`, which a complete
  save merges and removes): it is moved there too.

  Returns:
    "file: why" for each one moved.

  Raises:
    ValueError: if checkpoints exist and none loads; nothing is moved then.
  """
  moved, kept = _set_aside(model_dir, layout.CORRUPT_SUBDIR, _damage, keep_one=True)
  aside = os.path.join(model_dir, layout.CORRUPT_SUBDIR)
  for staging in sorted(tf.io.gfile.glob(os.path.join(model_dir, "*ckpt-*_temp"))):
    tf.io.gfile.makedirs(aside)
    _move_aside(staging, aside)
    moved.append(f"{os.path.basename(staging)}/: a save cut short")
  if moved:
    logging.warning("Set aside in %s what does not load: %s. Resuming from %s.",
                    aside, "; ".join(moved), kept or "the start")
  return moved
