"""Where the prepared MNIST lives, and whether it is there, without TensorFlow.

A launcher checks the data before it starts any task, and it starts tasks
sooner when it has not imported TensorFlow (2 to 3 s here). The layout is
TFDS's (`<data_dir>/mnist/<version>/`); tests check it against TFDS's own.
"""

import os
from typing import Optional

DATASET = "mnist"
VERSION = "3.0.1"  # TFDS's MNIST builder, which data.prepare fills.
IDX_DIR_ENV = "MNIST_IDX_DIR"  # Local IDX files to prepare from, when no flag names them.
# The flag naming those IDX files: the trainers' and tools' binaries take one,
# `python -m data.prepare` the other. A message names the one its command takes.
TRAINER_IDX_DIR_FLAG = "--mnist_idx_dir"
PREPARE_IDX_DIR_FLAG = "--idx_dir"


def prepare_hint(data_dir: Optional[str], idx_dir_flag: str = TRAINER_IDX_DIR_FLAG) -> str:
  """How to give MNIST from local files, for an error message.

  Args:
    data_dir: the data directory the command was given; None means TFDS's default.
    idx_dir_flag: the IDX directory flag of the command that prints the message:
      TRAINER_IDX_DIR_FLAG for the trainers and tools, PREPARE_IDX_DIR_FLAG for
      `python -m data.prepare` (then the hint does not send it to itself).

  Returns:
    A clause to follow "Fix it: " or "or ", with no final period.
  """
  hint = ("give local copies of the four MNIST IDX files (DIR holds train-images-idx3-ubyte.gz "
          f"and the other three) with {idx_dir_flag}=DIR or ${IDX_DIR_ENV}=DIR")
  if idx_dir_flag == PREPARE_IDX_DIR_FLAG:
    return hint
  data_dir_flag = f" --data_dir={data_dir}" if data_dir else ""
  return (f"{hint}, or prepare them ahead of time with "
          f"`python -m data.prepare {PREPARE_IDX_DIR_FLAG}=DIR{data_dir_flag}`")


class MissingDataError(RuntimeError):
  """The TFDS `mnist` dataset is not prepared in the data directory."""


def dataset_path(data_dir: Optional[str]) -> str:
  """Where the prepared dataset lives; None means TFDS's default data directory."""
  root = data_dir or os.environ.get("TFDS_DATA_DIR",
                                    os.path.join(os.path.expanduser("~"), "tensorflow_datasets"))
  return os.path.join(os.path.expanduser(root), DATASET, VERSION)


def is_prepared(data_dir: Optional[str]) -> bool:
  """As TFDS decides it: the version directory holds the dataset and feature info."""
  path = dataset_path(data_dir)
  return all(os.path.isfile(os.path.join(path, name))
             for name in ("dataset_info.json", "features.json"))


def check_prepared(data_dir: Optional[str]) -> None:
  """Raises MissingDataError, naming the fix, unless the dataset is prepared."""
  if not is_prepared(data_dir):
    # Raised inside the trainers and tools (all take --mnist_idx_dir), after
    # they prepared the data, or in a program that calls the input_fn itself.
    raise MissingDataError(
        f"MNIST is not prepared at {dataset_path(data_dir)}. The binaries prepare it "
        f"before they train (a TFDS download, or local IDX files); here, "
        f"{prepare_hint(data_dir)}."
    )
