"""Carries a training run across backends: Estimator `model.ckpt-<step>` <-> Keras `ckpt-<step>`.

Every variable of the source checkpoint is accounted for, or the conversion
fails naming it and the `--assignment_map` entry that fixes it:

- weight: a model weight, by name ("conv/kernel"), or renamed through the
  assignment map ({"dense_1/kernel": "hidden/kernel"}, old name -> shared
  model weight name);
- slot: `<variable>/Momentum`, the v1 MomentumOptimizer's accumulator, which
  goes to the Keras optimizer's momentum slot of its variable's weight (the
  Keras trainer's optimizers.V1MomentumSGD keeps the v1 accumulator there);
- step: `global_step`, which becomes the Keras optimizer's `iterations` (the
  cosine schedule reads it);
- ignored: only what the assignment map drops with null (`"beta1_power": null`).
  Nothing is ignored by default: an Estimator checkpoint of a
  MomentumOptimizer holds no variable that is not state to carry, and a
  legacy one's extras (Adam's `beta1_power` and its `/Adam` slots, moving
  averages) are state this optimizer has no place for: dropping them changes
  the run, so the user says so, by name, and the table shows it.

A Keras checkpoint holds, besides the model and optimizer state, two derived
values that are not carried: tf.train.Checkpoint's `save_counter` and the
optimizer's `_current_learning_rate` (recomputed from `iterations` before
every update). Any other unknown entry fails the conversion.

The target is written beside its final name and renamed into place when
complete and read back; an existing non-empty target is refused, untouched.
"""

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
from typing import Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tf_keras
from absl import logging

from data import mnist
from trainers import checkpoints
from trainers import keras_trainer
from trainers import model as model_lib
from trainers import model_dir as layout
from trainers import run_record
from trainers.config import Config

AssignmentMap = Mapping[str, Optional[str]]  # Old checkpoint name -> model weight, or None.
STEP_VARIABLE = checkpoints.ESTIMATOR_STEP_KEY
MOMENTUM_SUFFIX = "/Momentum"  # tf.compat.v1.train.MomentumOptimizer's slot name.
WEIGHT, SLOT, STEP, IGNORED, UNMAPPED = "weight", "slot", "step", "ignored", "unmapped"
# Keras checkpoint entries that are derived, not state: (key, why it is not carried).
KERAS_DERIVED = {
    checkpoints.keras_key("save_counter"): "tf.train.Checkpoint's count of its own saves",
    checkpoints.keras_key("model/optimizer/_current_learning_rate"):
        "the schedule's rate at the last update, recomputed from the step before every update",
}
_SLOT_OF_UNMAPPED = "the slot of unmapped "


class ConversionError(ValueError):
  """A checkpoint cannot be converted as asked; the message names the variable and the fix."""


class Entry(NamedTuple):
  """One variable of a source checkpoint and what the conversion does with it."""
  name: str  # In the source checkpoint.
  shape: Tuple[int, ...]
  kind: str  # WEIGHT, SLOT, STEP, IGNORED or UNMAPPED.
  weight: Optional[str]  # The model weight it is (WEIGHT) or belongs to (SLOT).
  note: str = ""  # Why it is ignored or unmapped.


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


def _weight_shapes(config: Config) -> Dict[str, Tuple[int, ...]]:
  """`config.model`'s weights by name (no eager state)."""
  return model_lib.graph_model(config).shapes


def _fmt_shape(shape: Sequence[int]) -> str:
  return str(list(shape))


def _slot_base(name: str) -> Optional[str]:
  """The variable whose v1 optimizer slot `name` is, or None."""
  suffix = next((s for s in checkpoints.V1_SLOT_SUFFIXES if name.endswith(s)), None)
  return name[:-len(suffix)] if suffix else None


def _check_map(assignment_map: AssignmentMap, weights: Mapping[str, Tuple[int, ...]]) -> None:
  """Raises unless the map sends old names to distinct model weights (or null)."""
  targets: Dict[str, str] = {}
  for old, new in assignment_map.items():
    if not isinstance(old, str) or not (new is None or isinstance(new, str)):
      raise ConversionError(f"--assignment_map entry {json.dumps(old)}: {json.dumps(new)}: "
                            "keys must be names, values a model weight's name or null.")
    if new is None:
      continue
    if old == STEP_VARIABLE or _slot_base(old) is not None:
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
             assignment_map: Optional[AssignmentMap] = None) -> List[Entry]:
  """Classifies every variable of an Estimator checkpoint, by name (sorted).

  Args:
    shapes: the checkpoint's variables and shapes (`tf.train.list_variables`).
    config: its model (`config.model`) is the one converted to.
    assignment_map: old name -> model weight name, or None to drop it.

  Returns:
    One Entry per variable: weight, slot, step, ignored or unmapped (with why).
  """
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

  entries = []
  for name in sorted(n for n in shapes if n != checkpoints.OBJECT_GRAPH_KEY):
    shape = tuple(shapes[name])
    base = _slot_base(name)
    if name in assignment_map and assignment_map[name] is None:
      entries.append(Entry(name, shape, IGNORED, None, "dropped by --assignment_map (null)"))
    elif name == STEP_VARIABLE:
      entries.append(Entry(name, shape, STEP, None))
    elif name in checkpoints.V1_OPTIMIZER_VARIABLES:
      entries.append(Entry(name, shape, IGNORED, None, "Adam's state, not carried yet"))
    elif name.startswith(checkpoints.CANNED_OPTIMIZER_SCOPE):
      entries.append(Entry(name, shape, IGNORED, None,
                           "a canned Estimator's optimizer state, not carried yet"))
    elif base is not None and base in shapes:
      weight = weight_of(base)
      if weight:
        entries.append(Entry(name, shape, SLOT, weight))
      elif base in assignment_map:  # Dropped with null: its slot goes with it.
        entries.append(Entry(name, shape, IGNORED, None, f"the slot of dropped {base}"))
      else:
        entries.append(Entry(name, shape, UNMAPPED, None, f"{_SLOT_OF_UNMAPPED}{base}"))
    elif weight_of(name):
      entries.append(Entry(name, shape, WEIGHT, weight_of(name)))
    else:
      entries.append(Entry(name, shape, UNMAPPED, None, "no model weight of this name"))
  return entries


def estimator_accounting(checkpoint_path: str, config: Config,
                         assignment_map: Optional[AssignmentMap] = None) -> List[Entry]:
  """`classify` of an Estimator checkpoint's variables, read from `checkpoint_path`."""
  return classify(dict(tf.train.list_variables(checkpoint_path)), config, assignment_map)


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


def check_complete(entries: Sequence[Entry], checkpoint_path: str, config: Config) -> None:
  """Raises ConversionError unless every variable is accounted for and every weight of
  `config.model`, its momentum slot and the step get exactly one value of the right shape."""
  built = model_lib.graph_model(config)
  weights = built.shapes
  unmapped = [e for e in entries if e.kind == UNMAPPED and not _follows(e)]
  if unmapped:
    slots = sum(1 for e in entries if e.kind == UNMAPPED and _follows(e))
    raise ConversionError(
        f"{checkpoint_path}: {len(unmapped)} variable(s) map to no model weight: "
        + ", ".join(f"{e.name} {_fmt_shape(e.shape)}" for e in unmapped)
        + (f" (their {slots} Momentum slot(s) follow them)" if slots else "")
        + ". Add to the --assignment_map JSON object (old name -> model weight, or null to "
        "drop it):\n" + _fix(entries, weights)
        + "\nModel weights: " + ", ".join(f"{w} {_fmt_shape(s)}" for w, s in weights.items()))
  for kind, what in ((WEIGHT, "value"), (SLOT, "momentum accumulator")):
    received: Dict[str, str] = {}
    for e in (e for e in entries if e.kind == kind):
      if e.weight in received:
        raise ConversionError(f"{checkpoint_path}: {received[e.weight]} and {e.name} both map "
                              f"to {e.weight}: fix --assignment_map.")
      received[e.weight] = e.name
      if e.shape != weights[e.weight]:
        raise ConversionError(
            f"{checkpoint_path}: {e.name} has shape {_fmt_shape(e.shape)}, but the model weight "
            f"{e.weight} it maps to has shape {_fmt_shape(weights[e.weight])}.")
    # Only what the optimizer updates has a momentum accumulator (not BatchNorm's
    # moving statistics).
    for weight in weights if kind == WEIGHT else built.trainable:
      if weight not in received:
        raise ConversionError(
            f"{checkpoint_path}: no variable gives the model weight {weight} its {what}"
            + (f" (expected {_received_name(entries, weight)}{MOMENTUM_SUFFIX})"
               if kind == SLOT else "; map one to it in --assignment_map") + ".")
  steps = [e for e in entries if e.kind == STEP]
  if not steps or steps[0].shape != ():
    raise ConversionError(f"{checkpoint_path} has no scalar {STEP_VARIABLE}: it is not an "
                          "Estimator training checkpoint.")


def _received_name(entries: Sequence[Entry], weight: str) -> str:
  """The source variable that gives `weight` its value."""
  return next(e.name for e in entries if e.kind == WEIGHT and e.weight == weight)


def _latest(model_dir: str, backend: str) -> str:
  """model_dir's newest checkpoint, which must be `backend`'s."""
  path = checkpoints.newest(model_dir)
  if path is None:
    backup = os.path.join(model_dir, layout.BACKUP_SUBDIR)
    hint = (f" It holds only a Keras backup ({backup}): finish the run with "
            "python -m trainers.keras_main first." if os.path.isdir(backup) else "")
    raise ConversionError(f"No checkpoint in {model_dir} (no ckpt-<step> or "
                          "model.ckpt-<step> files): "
                          f"give the {backend} model_dir of a finished or stopped run.{hint}")
  try:
    owner, _ = checkpoints.checkpoint_step(path)
  except (tf.errors.OpError, KeyError) as e:  # Files missing, truncated, or not a training one.
    raise ConversionError(f"Cannot read the checkpoint {path}: {e}") from e
  if owner != backend:
    raise ConversionError(f"{path} is a {owner} checkpoint, not a {backend} one: convert it "
                          f"with --from_{owner}.")
  return path


def _check_target(dst: str) -> None:
  if os.path.exists(dst) and (not os.path.isdir(dst) or os.listdir(dst)):
    raise ConversionError(f"The target {dst} exists and is not empty; it is left untouched. "
                          "Give a new directory.")


@contextlib.contextmanager
def _staging(dst: str) -> Iterator[str]:
  """A temporary sibling of `dst`, renamed to `dst` if the block succeeds, else removed.

  A conversion that fails or is killed half-way leaves no target a trainer
  could resume from.
  """
  dst = os.path.abspath(dst)
  parent = os.path.dirname(dst)
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=f".{os.path.basename(dst)}.tmp-", dir=parent)
  try:
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)  # As os.makedirs would: mkdtemp's 0700 is for scratch.
    yield staging
    _check_target(dst)  # Again: something may have written there meanwhile.
    try:
      os.rename(staging, dst)  # Replaces an empty directory, atomically.
    except OSError as e:
      raise ConversionError(f"Could not move the converted checkpoint to {dst}: {e}") from e
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise


def _carry_record(src_model_dir: str, staging: str, backend: str) -> None:
  """The source's run record, for `backend`: the converted run resumes with the settings
  the source was trained with, and no --allow_config_change (trainers.run_record)."""
  record = run_record.read(src_model_dir)
  if record is not None:
    run_record.write(staging, {**record, "backend": backend})


def _keras_state(model: tf_keras.Model) -> List[Tuple[str, tf.Variable, str, str]]:
  """(checkpoint key, variable, model weight name or "", kind) of everything carried.

  Keys as `tf.train.Checkpoint(model=model)` writes them (tf-keras 2.15):
  weights under `model/layer_with_weights-<i>/<attribute>`, the optimizer's
  step as `model/optimizer/_iterations` and its momentum slots as
  `model/optimizer/_variables/<j>`, j their place in `optimizer.variables`
  (0 is the step; `optimizer.momentums` is not itself a checkpoint
  dependency). Conversions read back what they write by these keys, so a
  different layout fails them rather than carrying the wrong values.
  """
  optimizer = model.optimizer
  optimizer.build(model.trainable_variables)  # Creates the slots (no-op once built).
  state = [(checkpoints.KERAS_STEP_KEY, optimizer.iterations, "", STEP)]
  slots = dict(zip((id(v) for v in model.trainable_variables), optimizer.momentums))
  positions = {id(v): j for j, v in enumerate(optimizer.variables)}
  for i, layer in enumerate(layer for layer in model.layers if layer.weights):
    for weight in layer.weights:
      name = model_lib.weight_name(weight)
      attribute = name.split("/")[-1]
      state.append((checkpoints.keras_weight_key(i, attribute), weight, name, WEIGHT))
      if id(weight) not in slots:  # Not trained by the optimizer (a moving statistic).
        continue
      slot = slots[id(weight)]
      if slot.shape != weight.shape:
        raise ConversionError(f"The Keras optimizer's slot for {name} has shape {slot.shape}.")
      state.append((checkpoints.keras_key(f"model/optimizer/_variables/{positions[id(slot)]}"),
                    slot, name, SLOT))
  return state


def _read_back(path: str, expected: Mapping[str, np.ndarray]) -> None:
  """Raises unless the checkpoint at `path` holds exactly these values at these keys."""
  reader = tf.train.load_checkpoint(path)
  for key, value in expected.items():
    if not reader.has_tensor(key):
      raise ConversionError(f"The written checkpoint {path} has no {key}: this TensorFlow writes "
                            "another layout than this converter knows.")
    got = reader.get_tensor(key)
    if got.dtype != value.dtype or not np.array_equal(got, value):
      raise ConversionError(f"The written checkpoint {path} holds another value at {key}.")


def _inverse_map(assignment_map: Optional[AssignmentMap], config: Config) -> Dict[str, str]:
  """model weight -> the Estimator name to write it under (the same map, read backwards)."""
  assignment_map = dict(assignment_map or {})
  _check_map(assignment_map, _weight_shapes(config))
  return {new: old for old, new in assignment_map.items() if new is not None}


def estimator_to_keras(src_model_dir: str, dst_model_dir: str, *,
                       assignment_map: Optional[AssignmentMap] = None,
                       config: Optional[Config] = None) -> Conversion:
  """Writes the Estimator's newest checkpoint as a Keras model_dir that keras_main resumes.

  Args:
    src_model_dir: the Estimator's model_dir.
    dst_model_dir: the new Keras model_dir (must not exist, or be empty).
    assignment_map: old checkpoint name -> model weight name ("dense_1/kernel":
      "hidden/kernel"), or None to drop a variable that is not state to carry.
    config: builds the model and optimizer (seed, learning rate, schedule)
      before the converted values are assigned.

  Returns:
    What was read, written and carried.

  Raises:
    ConversionError: no checkpoint, a non-empty target, or a variable that is
      unmapped, or of the wrong shape, or a model weight without a value.
  """
  _check_target(dst_model_dir)
  config = config or Config()
  path = _latest(src_model_dir, "estimator")
  entries = estimator_accounting(path, config, assignment_map)
  check_complete(entries, path, config)
  reader = tf.train.load_checkpoint(path)
  step = int(reader.get_tensor(STEP_VARIABLE))

  model = keras_trainer.compile_model(config)
  sources = {(e.weight or "", e.kind): e.name for e in entries if e.kind in (WEIGHT, SLOT)}
  sources[("", STEP)] = STEP_VARIABLE
  mapped, written = [], {}
  for key, variable, weight, kind in _keras_state(model):
    name = sources[(weight, kind)]
    value = reader.get_tensor(name)
    if kind == STEP:
      value = np.int64(value)  # Very old Estimators kept an int32 global_step.
    elif value.dtype != variable.dtype.as_numpy_dtype:
      raise ConversionError(f"{path}: {name} is {value.dtype}, the model's {weight} "
                            f"{variable.dtype.name}.")
    variable.assign(value)
    mapped.append(Mapped(name, key, kind))
    written[key] = np.asarray(value)

  with _staging(dst_model_dir) as staging:
    saved = keras_trainer.save_checkpoint(model, staging, step)
    _read_back(saved, written)
    _carry_record(src_model_dir, staging, "keras")
    problem = checkpoints.resume_problem("keras", staging, config)
    if problem:
      raise ConversionError(f"The converted checkpoint would not resume: {problem}")
  output = os.path.join(os.path.abspath(dst_model_dir), os.path.basename(saved))
  logging.info("Wrote %s (step %d) from %s", output, step, path)
  return Conversion(path, output, step, mapped,
                    [Ignored(e.name, e.note) for e in entries if e.kind == IGNORED])


def keras_to_estimator(src_model_dir: str, dst_model_dir: str, *,
                       assignment_map: Optional[AssignmentMap] = None,
                       config: Optional[Config] = None) -> Conversion:
  """Writes Keras's newest `ckpt-<step>` as an Estimator model_dir that estimator_main resumes.

  Writes `model.ckpt-<step>` (and its `checkpoint` file): the weights, their
  `<name>/Momentum` slots and an int64 `global_step`, name-based, as the
  Estimator's own Saver does.

  Args:
    src_model_dir: the Keras model_dir.
    dst_model_dir: the new Estimator model_dir (must not exist, or be empty).
    assignment_map: the same map as for `estimator_to_keras`, read backwards:
      each model weight is written under the old name that maps to it.
    config: builds the model and optimizer the checkpoint is restored into.

  Returns:
    What was read, written and carried.

  Raises:
    ConversionError: no checkpoint, a non-empty target, or a checkpoint entry
      that is neither carried nor known to be derived.
  """
  _check_target(dst_model_dir)
  config = config or Config()
  names = _inverse_map(assignment_map, config)
  path = _latest(src_model_dir, "keras")
  model = keras_trainer.compile_model(config)
  status = tf.train.Checkpoint(model=model).restore(path)
  state = _keras_state(model)  # Builds the slots: a deferred restore fills them.
  try:
    status.assert_consumed()
  except AssertionError as e:
    raise ConversionError(f"{path} does not match the model and optimizer: {e}") from e
  keys = {key for key, _ in tf.train.list_variables(path)}
  carried = {key for key, *_ in state}
  unknown = sorted(keys - carried - set(KERAS_DERIVED) - {checkpoints.OBJECT_GRAPH_KEY})
  if unknown:
    raise ConversionError(f"{path} holds {', '.join(unknown)}, which this converter does not "
                          "know how to carry.")
  # The restored values are the checkpoint's, by key: the key layout above is checked too.
  reader = tf.train.load_checkpoint(path)
  values: Dict[str, np.ndarray] = {}
  mapped = []
  for key, variable, weight, kind in state:
    value = variable.numpy()
    if not np.array_equal(value, reader.get_tensor(key)):
      raise ConversionError(f"{path}: {key} did not restore into {weight or 'the step'}.")
    if kind == STEP:
      name = STEP_VARIABLE
    else:
      name = names.get(weight, weight) + (MOMENTUM_SUFFIX if kind == SLOT else "")
    values[name] = np.int64(value) if kind == STEP else value
    mapped.append(Mapped(key, name, kind))
  step = int(values[STEP_VARIABLE])

  with _staging(dst_model_dir) as staging:
    saved = _write_name_based(values, staging, step)
    _read_back(saved, values)
    _carry_record(src_model_dir, staging, "estimator")
    problem = checkpoints.resume_problem("estimator", staging, config)
    if problem and not names:  # Renamed weights are not this model's names, by design.
      raise ConversionError(f"The converted checkpoint would not resume: {problem}")
  output = os.path.join(os.path.abspath(dst_model_dir), os.path.basename(saved))
  logging.info("Wrote %s (step %d) from %s", output, step, path)
  return Conversion(path, output, step, mapped,
                    [Ignored(k, why) for k, why in KERAS_DERIVED.items() if k in keys])


def _write_name_based(values: Mapping[str, np.ndarray], directory: str, step: int) -> str:
  """Saves `values` by name as `directory/model.ckpt-<step>`, as the Estimator's Saver does."""
  with tf.Graph().as_default():
    # The Saver writes each under its dict key; the graph's op names do not matter.
    variables = {name: tf.compat.v1.Variable(value, name=name.replace("/", "_"),
                                             dtype=tf.as_dtype(value.dtype))
                 for name, value in values.items()}
    # Relative paths in the `checkpoint` file: the directory is renamed after.
    saver = tf.compat.v1.train.Saver(var_list=variables, save_relative_paths=True)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      return saver.save(session, os.path.join(directory, checkpoints.ESTIMATOR_PREFIX),
                        global_step=step, write_meta_graph=False)


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


def prediction_identity(estimator_export_dir: str, keras_model_dir: str,
                        config: Config) -> Tuple[bool, float, int]:
  """Compares the Estimator's SavedModel with the Keras model of a (converted) checkpoint.

  Runs both on the whole test split of `config.data_dir`, in batches of
  `config.eval_batch_size`.

  Returns:
    (whether every predicted class is the same, max |logit difference|, images compared).
  """
  serve = tf.saved_model.load(estimator_export_dir).signatures["serving_default"]
  model = model_lib.build(config)
  path = _latest(keras_model_dir, "keras")
  # The model only: the checkpoint's optimizer state is not needed to predict.
  tf.train.Checkpoint(model=model).restore(path).expect_partial().assert_existing_objects_matched()
  same, max_diff, count = True, 0.0, 0
  for images, _ in mnist.input_fn(mnist.EVAL, None, global_batch_size=config.eval_batch_size,
                                  data_dir=config.data_dir):
    exported = serve(image=images)
    logits = model(images, training=False).numpy()
    same &= bool(np.array_equal(exported["classes"].numpy(), np.argmax(logits, axis=-1)))
    max_diff = max(max_diff, float(np.max(np.abs(exported["logits"].numpy() - logits))))
    count += len(logits)
  return same, max_diff, count


def format_table(conversion: Conversion) -> str:
  """The mapping (source -> destination, kind), the ignore list, the step and the output."""
  width = max(len(m.source) for m in conversion.mapped)
  lines = [f"Converted {conversion.source}", "",
           f"{'source variable':<{width}}  ->  destination  (kind)"]
  lines += [f"{m.source:<{width}}  ->  {m.destination}  ({m.kind})" for m in conversion.mapped]
  lines += ["", "Ignored (not carried):"]
  lines += [f"  {i.name}: {i.reason}" for i in conversion.ignored] or ["  none"]
  lines += ["", f"Step: {conversion.step}", f"Wrote: {conversion.output}",
            f"Output directory: {os.path.dirname(conversion.output)}"]
  return "\n".join(lines)
