"""Where TFDS stores the prepared MNIST (`<data_dir>/mnist/<version>/`), whether it is
there, and what to do when it is not, without TensorFlow; tests check the layout against
TFDS's own.

The fixes a message names are this layer's own command (`python -m data.prepare --idx_dir`)
and `$MNIST_IDX_DIR`; a binary with a flag of its own for local IDX files names it through
`idx_dir_flag`.
"""

import os
from typing import Optional

from data.mnist import IDX_DIR_ENV

DATASET = "mnist"
VERSION = "3.0.1"  # TFDS's MNIST builder, which data.prepare fills.
PREPARE_COMMAND = "python -m data.prepare"
PREPARE_IDX_DIR_FLAG = "--idx_dir"  # PREPARE_COMMAND's flag for local IDX files.


class MissingDataError(RuntimeError):
  """The TFDS `mnist` dataset is not prepared in the data directory; the message says what
  was tried and how to fix it."""


def dataset_path(data_dir: Optional[str]) -> str:
  """Where the prepared dataset lives; None means TFDS's default data directory."""
  root = data_dir or os.environ.get("TFDS_DATA_DIR",
                                    os.path.join(os.path.expanduser("~"), "tensorflow_datasets"))
  return os.path.join(os.path.expanduser(root), DATASET, VERSION)


def data_root(data_dir: Optional[str]) -> str:
  """The TFDS data directory itself: dataset_path is <root>/mnist/<version>."""
  return os.path.dirname(os.path.dirname(dataset_path(data_dir)))


def is_prepared(data_dir: Optional[str]) -> bool:
  """As TFDS decides it: the version directory holds the dataset and feature info."""
  path = dataset_path(data_dir)
  return all(os.path.isfile(os.path.join(path, name))
             for name in ("dataset_info.json", "features.json"))


def prepare_hint(data_dir: Optional[str], idx_dir_flag: Optional[str] = None) -> str:
  """How to give MNIST from local files, for an error message.

  Args:
    data_dir: the data directory the command was given; None means TFDS's default.
    idx_dir_flag: the calling command's own flag for local IDX files, if it has one
      (then named first); None from `python -m data.prepare` itself (then the hint
      does not send it to itself) or from a program without one.

  Returns:
    A clause to follow "Fix it: " or "or ", with no final period.
  """
  files = ("local copies of the four MNIST IDX files (DIR holds train-images-idx3-ubyte.gz "
           "and the other three)")
  if idx_dir_flag == PREPARE_IDX_DIR_FLAG:
    return f"give {files} with {idx_dir_flag}=DIR or ${IDX_DIR_ENV}=DIR"
  data_dir_flag = f" --data_dir={data_dir}" if data_dir else ""
  prepare = f"`{PREPARE_COMMAND} {PREPARE_IDX_DIR_FLAG}=DIR{data_dir_flag}`"
  if idx_dir_flag is None:
    return f"prepare it from {files} with {prepare}"
  return (f"give {files} with {idx_dir_flag}=DIR or ${IDX_DIR_ENV}=DIR, or prepare them "
          f"ahead of time with {prepare}")


def check_prepared(data_dir: Optional[str]) -> None:
  """Raises MissingDataError, naming the fix, unless the dataset is prepared."""
  if not is_prepared(data_dir):
    # Raised inside the trainers and tools after they prepared the data, or in a
    # program that calls the input_fn itself.
    raise MissingDataError(
        f"MNIST is not prepared at {dataset_path(data_dir)}. The binaries prepare it "
        f"before they train (a TFDS download, or local IDX files); here, "
        f"{prepare_hint(data_dir)}."
    )
