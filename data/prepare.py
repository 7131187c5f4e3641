r"""Builds the TFDS `mnist` dataset from local IDX files, with no network.

  python -m data.prepare --idx_dir=../shared/datasets/mnist [--data_dir=DIR]

Afterwards `tfds.load('mnist', data_dir=DIR)` works offline, and so do both
trainers with `--data_dir=DIR`. Without `--data_dir`, TFDS's default is used
(`$TFDS_DATA_DIR`, else ~/tensorflow_datasets).
"""

import sys
from typing import Sequence

from absl import app
from absl import flags

from data import mnist
from data import paths

_IDX_DIR = flags.DEFINE_string(
    "idx_dir", None, "Directory holding the four gzip'd MNIST IDX files.", required=True
)
_DATA_DIR = flags.DEFINE_string("data_dir", None, "TFDS data directory to write to.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Rebuild the dataset if it exists.")


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}", exitcode=2)
  try:
    counts = mnist.prepare(_IDX_DIR.value, _DATA_DIR.value, overwrite=_OVERWRITE.value)
  except FileExistsError as e:
    print(e)  # Already there: nothing to do, and nothing was touched.
    return
  except mnist.IdxFormatError as e:
    sys.exit(f"error: {e}\nNothing was written. Fix or re-fetch the IDX files and run again.")
  print(f"Prepared MNIST at {paths.dataset_path(_DATA_DIR.value)}: {counts}")


if __name__ == "__main__":
  app.run(main)
