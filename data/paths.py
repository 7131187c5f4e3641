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
PREPARE_HINT = (
    "give local copies of the four MNIST IDX files (DIR holds train-images-idx3-ubyte.gz "
    "and the other three) with --mnist_idx_dir=DIR or ${env}=DIR, or prepare them ahead "
    "of time with `python -m data.prepare --idx_dir=DIR{data_dir_flag}`"
).replace("{env}", IDX_DIR_ENV)


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
    flag = f" --data_dir={data_dir}" if data_dir else ""
    raise MissingDataError(
        f"MNIST is not prepared at {dataset_path(data_dir)}. The binaries prepare it "
        f"before they train (a TFDS download, or local IDX files); here, "
        + PREPARE_HINT.format(data_dir_flag=flag) + "."
    )
