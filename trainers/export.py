"""Where SavedModels go (`model_dir/export/<unix time>`, as the Estimator names them), and
writing one so that a crash leaves no half export."""

import os
import shutil
import tempfile
import time
from typing import Callable

import tensorflow as tf

from trainers import model_dir as layout


def new_export_dir(model_dir: str) -> str:
  """A fresh timestamped SavedModel directory under `model_dir/export` (not created)."""
  parent = os.path.join(model_dir, layout.EXPORT_SUBDIR)
  tf.io.gfile.makedirs(parent)
  return os.path.join(parent, str(int(time.time())))


def write_staged(model_dir: str, save: Callable[[str], None]) -> str:
  """Calls `save(directory)` on a staging directory beside the export's final name, then
  renames it into place; a failed save leaves nothing under that name.

  Returns:
    The export directory.
  """
  export_dir = new_export_dir(model_dir)
  staging = tempfile.mkdtemp(prefix=".tmp-export-", dir=os.path.dirname(export_dir))
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(staging, 0o777 & ~umask)  # As the Estimator's exports: mkdtemp's 0700 is for scratch.
  try:
    save(staging)
    os.rename(staging, export_dir)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
  return export_dir
