r"""Prepares the TFDS `mnist` dataset ahead of time: from local IDX files, or downloaded.

  python -m data.prepare [--idx_dir=../shared/datasets/mnist] [--data_dir=DIR] [--overwrite]

With `--idx_dir` (or `$MNIST_IDX_DIR`) it reads the IDX files, with no
network; without, TFDS's official builder downloads MNIST and checks its
checksums. The binaries that train do the same when the data is missing.
Afterwards `tfds.load('mnist', data_dir=DIR)` works offline, and so do both
trainers with `--data_dir=DIR`. Without `--data_dir`, TFDS's default is used
(`$TFDS_DATA_DIR`, else ~/tensorflow_datasets).
"""

import sys
from typing import List, Sequence

from absl import app
from absl import flags

from data import mnist
from data.mnist import ready
from data.mnist import store

# --idx_dir, named from the constant that this binary's error messages name.
_IDX_DIR = flags.DEFINE_string(
    store.PREPARE_IDX_DIR_FLAG.lstrip("-"), None,
    f"Directory holding the four gzip'd MNIST IDX files (default: ${mnist.IDX_DIR_ENV}); "
    "without either, TFDS downloads MNIST.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "TFDS data directory to write to.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Rebuild the dataset if it exists.")


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}", exitcode=2)
  path = store.dataset_path(_DATA_DIR.value)
  try:
    counts = ready.ensure_prepared(_DATA_DIR.value, _IDX_DIR.value, overwrite=_OVERWRITE.value,
                                   idx_dir_flag=store.PREPARE_IDX_DIR_FLAG)
  except ready.MissingDataError as e:
    sys.exit(f"error: {e}")
  if counts is None:  # Already there: nothing to do, and nothing was touched.
    print(f"MNIST is already prepared at {path}; pass --overwrite to rebuild it.")
  else:
    print(f"Prepared MNIST at {path}: {counts}")


def _parse_flags(argv: List[str]) -> List[str]:
  # A bad flag is a usage error, exit 2, as in every binary (absl exits 1).
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(f"error: {e}\nPass --helpfull to see every flag.", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
