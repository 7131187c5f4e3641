"""Where a conversion is written: a staged target, moved into place whole or not at all.

`write_target` runs a conversion's `write(staging)` in a staging directory
(`staged_target`), carries the source's run record beside the checkpoint
(`carry_record`), checks that the backend would resume from it, and only then
moves it into place; a failure or a signal removes the staging directory and
leaves an existing target as it was. `check_target` refuses a non-empty target
before any work. `write_name_based` saves a checkpoint by name as the
Estimator's Saver does, and `read_back` checks what was written.
"""

import contextlib
import os
import secrets
import shutil
from typing import Callable, Iterator, List, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from launch.convert.kinds import ConversionError
from trainers import checkpoints
from trainers import config as config_lib
from trainers import run_record
from trainers.config import Config


def check_target(dst: str) -> None:
  """Refuses a target that exists and is not an empty directory, before any work."""
  if os.path.exists(dst) and (not os.path.isdir(dst) or os.listdir(dst)):
    raise ConversionError(f"The target {dst} exists and is not empty; it is left untouched. "
                          "Give a new directory.")


@contextlib.contextmanager
def staged_target(dst: str) -> Iterator[str]:
  """A temporary directory the conversion writes into, whose files appear in `dst` only if
  the block succeeds; removed if it fails or is interrupted.

  A new `dst`: a sibling renamed to it. An existing empty `dst` (a mounted
  volume, a directory made for the run) is kept, its mode and owner with it:
  the files are staged inside it and moved up, each checkpoint's `.index` and
  the `checkpoint` file last, as a trainer finds a checkpoint by those.
  """
  dst = os.path.abspath(dst)
  existing = os.path.isdir(dst)
  if not existing:
    os.makedirs(os.path.dirname(dst), exist_ok=True)
  # Named before it is made, so that a signal landing as it is made (the conversion's
  # SIGINT and SIGTERM raise) finds it to remove. os.mkdir: the mode os.makedirs gives.
  staging = (os.path.join(dst, f".convert-{secrets.token_hex(6)}") if existing else
             os.path.join(os.path.dirname(dst),
                          f".{os.path.basename(dst)}.tmp-{secrets.token_hex(6)}"))
  moved: List[str] = []
  try:
    os.mkdir(staging)
    yield staging
    _move_into_place(staging, dst, existing, moved)
  except BaseException:
    _unstage(staging, moved)
    raise


def _move_into_place(staging: str, dst: str, existing: bool, moved: List[str]) -> None:
  """`staged_target`'s last step; appends to `moved` each file moved into an existing `dst`."""
  try:
    if not existing:
      check_target(dst)  # Again: something may have written there meanwhile.
      os.rename(staging, dst)  # Replaces an empty directory, atomically.
      return
    if os.listdir(dst) != [os.path.basename(staging)]:
      raise ConversionError(f"Something wrote into the target {dst} while converting; the "
                            "conversion is not moved there. Give a new directory.")
    for name in sorted(os.listdir(staging), key=lambda n: (n == checkpoints.INDEX_FILE,
                                                           n.endswith(".index"))):
      os.rename(os.path.join(staging, name), os.path.join(dst, name))
      moved.append(os.path.join(dst, name))
    os.rmdir(staging)
  except OSError as e:
    raise ConversionError(f"Could not move the converted checkpoint to {dst}: {e}") from e


def _unstage(staging: str, moved: Sequence[str]) -> None:
  """Removes a failed conversion's staging directory and what it moved into the target."""
  for path in reversed(moved):
    with contextlib.suppress(OSError):
      os.remove(path)
  shutil.rmtree(staging, ignore_errors=True)


def write_target(src_model_dir: str, dst_model_dir: str, backend: str, config: Config,
                 write: Callable[[str], str], reset_for: Optional[Config] = None,
                 check_resume: bool = True) -> str:
  """Writes the target through a staging directory: `write(staging)` saves (and reads back)
  the checkpoint, returning its path; the source's run record is carried (`carry_record`),
  and `backend` must be able to resume from it. Returns the checkpoint's final path."""
  with staged_target(dst_model_dir) as staging:
    saved = write(staging)
    carry_record(src_model_dir, staging, backend, reset_for, config)
    problem = checkpoints.resume_problem(backend, staging, config)
    if problem and check_resume:
      raise ConversionError(f"The converted checkpoint would not resume: {problem}")
  return os.path.join(os.path.abspath(dst_model_dir), os.path.basename(saved))


def carry_record(src_model_dir: str, staging: str, backend: str,
                  optimizer: Optional[Config] = None, config: Optional[Config] = None) -> None:
  """The source's run record, for `backend`: the converted run resumes with the settings
  the source was trained with, and no --allow_config_change (trainers.run_record).
  `optimizer`: the optimizer settings the slots were reset for, recorded instead. Between a
  team's program and its port (config.estimator_program) the two records name different
  things (their model_fn; the port and its recipe): `config`'s, as `backend` records it."""
  record = run_record.read(src_model_dir)
  if record is None:
    return
  if config is not None and config.estimator_program:
    record = run_record.settings(backend, config, record.get("workers", 1))
  record = {**record, "backend": backend}
  if optimizer is not None:
    trained = run_record.optimizer_of(record)
    kept = config_lib.OPTIMIZER_DEFAULTS.get(trained, {})
    record = {k: v for k, v in record.items() if k not in kept}
    record.update(optimizer=optimizer.optimizer, **optimizer.hyperparameters())
  run_record.write(staging, record)


def read_back(path: str, expected: Mapping[str, np.ndarray]) -> None:
  """Raises unless the checkpoint at `path` holds exactly these values at these keys."""
  reader = tf.train.load_checkpoint(path)
  for key, value in expected.items():
    if not reader.has_tensor(key):
      raise ConversionError(f"The written checkpoint {path} has no {key}: this TensorFlow writes "
                            "another layout than this converter knows.")
    got = reader.get_tensor(key)
    if got.dtype != value.dtype or not np.array_equal(got, value):
      raise ConversionError(f"The written checkpoint {path} holds another value at {key}.")


def write_name_based(values: Mapping[str, np.ndarray], directory: str, step: int) -> str:
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
