"""MNIST made ready for a run: `ensure_prepared` checks the data without TensorFlow and loads
the builder (`build`) only when the data is missing; its errors say what was tried and the
fixes, in the words of the command that called it.
"""

import os
from typing import Any, Dict, Optional

from data.mnist import IDX_DIR_ENV
from data.mnist.idx import IdxFormatError
from data.mnist.store import MissingDataError, dataset_path, is_prepared, prepare_hint

__all__ = ["MissingDataError", "ensure_prepared"]  # MissingDataError: for the callers' except.


def ensure_prepared(data_dir: Optional[str], idx_dir: Optional[str] = None, *,
                    idx_dir_flag: Optional[str], overwrite: bool = False,
                    builder_cls: Any = None) -> Optional[Dict[str, int]]:
  """Prepares MNIST unless it is there: from local IDX files, else by TFDS's download.

  Safe to call from several processes at once: one prepares, the others wait
  for it and find it done.

  Args:
    data_dir: TFDS data directory; None means TFDS's default.
    idx_dir: directory of the four IDX files; None means `$MNIST_IDX_DIR`,
      and when that is unset too, download.
    idx_dir_flag: the calling command's flag that gave `idx_dir` (the trainers'
      `--mnist_idx_dir`, `python -m data.prepare`'s `--idx_dir`), named in the
      error message; None for a caller without one.
    overwrite: rebuild the dataset even if it is prepared.
    builder_cls: the download's builder (`build.download`); None means TFDS's.

  Returns:
    The number of examples in each split it prepared; None if it was there.

  Raises:
    MissingDataError: if the given IDX files are missing or malformed, or the
      download failed and no IDX files were given; the message says what was
      tried and how to fix it.
  """
  if is_prepared(data_dir) and not overwrite:
    return None
  from data.mnist import build  # noqa: PLC0415 -- imports TensorFlow: only for missing data.
  idx_dir = idx_dir or os.environ.get(IDX_DIR_ENV) or None
  try:
    return build.prepare_once(data_dir, idx_dir, overwrite, builder_cls)
  except IdxFormatError as e:
    raise MissingDataError(
        f"{e}\nNothing was written. Fix or re-fetch the IDX files and run again.") from e
  except build.DownloadError as e:
    given = f"no {idx_dir_flag} given, " if idx_dir_flag else ""
    raise MissingDataError(
        f"MNIST is not prepared at {dataset_path(data_dir)}, and preparing it failed.\n"
        f"  Tried: {e}\n"
        f"  Not tried: local IDX files ({given}${IDX_DIR_ENV} not set).\n"
        f"Fix it either way: run where TFDS can download ({e.url} reachable), "
        f"or {prepare_hint(data_dir, idx_dir_flag)}."
    ) from e
