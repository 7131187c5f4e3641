"""MNIST written as TFDS's `mnist` dataset: from local IDX files with no network (`prepare`),
or downloaded by TFDS's official builder, checksums enforced (`download`); one process at a
time (`prepare_lock`). Each builds beside the dataset and moves it in whole.
"""

import contextlib
import fcntl
import io
import os
import shutil
import sys
import tempfile
from typing import Any, Callable, Dict, Iterator, Optional, Tuple, Type

import numpy as np
import requests
import tensorflow_datasets as tfds
from absl import logging
from tensorflow_datasets.image_classification import mnist as tfds_mnist

from data.mnist import IDX_FILES
from data.mnist.idx import read_idx_split
from data.mnist.store import DATASET, data_root, dataset_path, is_prepared

_STAGING_PREFIX = ".mnist-prepare-"
LOCK_NAME = ".mnist-prepare.lock"
_PROBE_TIMEOUT_S = 10


class DownloadError(RuntimeError):
  """TFDS could not download MNIST from `url`, or a file did not match its checksum."""

  def __init__(self, url: str, message: str):
    super().__init__(message)
    self.url = url


class _IdxMnist(tfds_mnist.MNIST, skip_registration=True):
  """TFDS's own MNIST builder (same name, version, features), fed from arrays.

  TFDS's builder downloads the official files and checks their checksums and
  lengths; this one writes the same dataset from IDX files of any length.
  """

  name = DATASET

  def __init__(self, *, arrays: Dict[str, Tuple[np.ndarray, np.ndarray]], **kwargs):
    self._arrays = arrays
    super().__init__(**kwargs)

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    return {split: self._generate_examples(*arrays) for split, arrays in self._arrays.items()}

  def _generate_examples(self, images, labels):
    for index, (image, label) in enumerate(zip(images, labels)):
      yield index, {"image": image[..., None], "label": int(label)}


def _build_into_place(make_builder: Callable[[str], Any], data_dir: Optional[str],
                      download_config: tfds.download.DownloadConfig) -> None:
  """Runs a builder in a staging directory beside the dataset, then moves it in.

  Downloads go to the staging directory too, so a failure (or a kill) leaves
  neither a half-written dataset nor partial downloads in `data_dir`.
  """
  final, root = dataset_path(data_dir), data_root(data_dir)
  os.makedirs(root, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=root)
  try:
    # A builder that finds no dataset info makes an empty temporary directory and leaves it
    # (tfds.core.DatasetInfo.initialize_from_bucket): made in staging, it goes with it.
    saved_tempdir, tempfile.tempdir = tempfile.tempdir, staging
    try:
      builder = make_builder(staging)
    finally:
      tempfile.tempdir = saved_tempdir
    # TFDS prints where it prepares (the staging directory) and "Subsequent
    # calls will reuse this data", which is untrue of it: our own log lines
    # name the final place. Its progress bars (stderr) stay on a terminal; into a
    # file or a pipe they are a screen of cursor-up codes ("[A"), so they go there.
    tfds.display_progress_bar(sys.stderr.isatty())
    try:
      with contextlib.redirect_stdout(io.StringIO()):
        builder.download_and_prepare(download_dir=os.path.join(staging, "downloads"),
                                     download_config=download_config)
    finally:
      tfds.display_progress_bar(True)  # TFDS's default.
    os.makedirs(os.path.dirname(final), exist_ok=True)
    if os.path.exists(final):
      shutil.rmtree(final)
    os.replace(os.fspath(builder.data_path), final)
  finally:
    shutil.rmtree(staging, ignore_errors=True)


def prepare(idx_dir: str, data_dir: Optional[str] = None, overwrite: bool = False
            ) -> Dict[str, int]:
  """Writes the TFDS `mnist` dataset from gzip'd IDX files, with no network.

  The dataset is built in a temporary directory beside its destination and
  moved in only when complete, so a failure leaves any earlier copy intact.
  Call it under `prepare_lock` when another process may prepare at once.

  Args:
    idx_dir: directory with the four standard MNIST IDX files.
    data_dir: TFDS data directory; None means TFDS's default.
    overwrite: replace a dataset that is already prepared.

  Returns:
    The number of examples in each split.

  Raises:
    IdxFormatError: if a file is missing or malformed.
    FileExistsError: if the dataset exists and `overwrite` is False.
  """
  final = dataset_path(data_dir)
  if os.path.exists(final) and not overwrite:
    raise FileExistsError(
        f"MNIST is already prepared at {final}; pass --overwrite to rebuild it."
    )
  arrays = {split: read_idx_split(idx_dir, split) for split in IDX_FILES}
  _build_into_place(
      lambda staging: _IdxMnist(arrays=arrays, data_dir=staging), data_dir,
      tfds.download.DownloadConfig(compute_stats=tfds.download.ComputeStatsMode.SKIP))
  counts = {split: len(labels) for split, (_, labels) in arrays.items()}
  logging.info("Prepared MNIST at %s from the IDX files in %s: %s", final, idx_dir, counts)
  return counts


def download(data_dir: Optional[str] = None,
             builder_cls: Type[tfds.core.DatasetBuilder] = tfds_mnist.MNIST) -> Dict[str, int]:
  """Downloads and prepares MNIST with TFDS's official builder, checksums enforced.

  Args:
    data_dir: TFDS data directory; None means TFDS's default.
    builder_cls: the builder; tests give a subclass that reads a local server.

  Returns:
    The number of examples in each split.

  Raises:
    DownloadError: if the mirror cannot be reached, or a download fails or
      does not match its recorded checksum. Nothing is left in `data_dir`.
  """
  url = builder_cls.URL
  # TFDS retries a failed connection 10 times with backoff: 3 min 24 s here
  # before an offline machine hears why. One quick request says it at once.
  try:
    response = requests.head(url, timeout=_PROBE_TIMEOUT_S, allow_redirects=True)
    response.close()
  except requests.RequestException as e:
    raise DownloadError(url, f"cannot reach TFDS's MNIST mirror {url}: {e}") from e
  logging.info("Downloading MNIST from %s with TFDS (checksums checked)...", url)
  try:
    # force_checksums_validation: a URL without a recorded checksum is an
    # error, not a warning, so every file written was verified.
    _build_into_place(lambda staging: builder_cls(data_dir=staging), data_dir,
                      tfds.download.DownloadConfig(force_checksums_validation=True))
  except Exception as e:
    # TFDS raises requests', its own and OS errors: all mean "not downloaded".
    raise DownloadError(url, f"TFDS's download from {url} failed: {type(e).__name__}: {e}"
                        ) from e
  info = tfds.builder(DATASET, data_dir=data_dir).info
  counts = {split: info.splits[split].num_examples for split in IDX_FILES}
  logging.info("Prepared MNIST at %s: %s", dataset_path(data_dir), counts)
  return counts


@contextlib.contextmanager
def prepare_lock(data_dir: Optional[str]) -> Iterator[None]:
  """Holds `<data_dir>/.mnist-prepare.lock`, so one process prepares at a time.

  The lock is an OS file lock (`flock`): a process that dies releases it.
  While it is held, staging directories of earlier, killed preparations are
  removed. The holder deletes the file before it lets go, so none is left
  behind, failure or success (a killed holder's stays, until the next one).

  Deleting a locked file is safe only with one more check, done here: a
  process waiting for the lock holds the deleted file open and gets its lock
  once the holder lets go, while a newcomer creates a new file at the path
  and locks that one. So a process owns the lock only when the file it locked
  is still the file at the path; if not, it opens the path again and waits
  for that file's lock.
  """
  root = data_root(data_dir)
  os.makedirs(root, exist_ok=True)
  lock_path = os.path.join(root, LOCK_NAME)
  waited = False
  while True:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        if not waited:
          logging.info("Waiting for another process that is preparing MNIST in %s "
                       "(it holds %s)...", root, lock_path)
          waited = True
        fcntl.flock(fd, fcntl.LOCK_EX)
      if _same_file(fd, lock_path):
        break
    except BaseException:
      os.close(fd)
      raise
    os.close(fd)  # The holder deleted it while this process waited: lock the new one.
  try:
    for name in os.listdir(root):
      if name.startswith(_STAGING_PREFIX):
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    yield
  finally:
    try:
      # Always ours, unless someone deleted it by hand: then leave the new one be.
      if _same_file(fd, lock_path):
        os.unlink(lock_path)
    finally:
      os.close(fd)  # Releases the lock, after the unlink: a waiter finds it gone.


def _same_file(fd: int, path: str) -> bool:
  """Whether the open file `fd` is the file now at `path`."""
  try:
    at_path = os.stat(path)
  except FileNotFoundError:
    return False
  mine = os.fstat(fd)
  return (mine.st_dev, mine.st_ino) == (at_path.st_dev, at_path.st_ino)


def prepare_once(data_dir: Optional[str], idx_dir: Optional[str], overwrite: bool = False,
                 builder_cls: Optional[Type[tfds.core.DatasetBuilder]] = None
                 ) -> Optional[Dict[str, int]]:
  """Prepares MNIST under `prepare_lock` unless another process did while this one waited:
  from `idx_dir`'s IDX files if given, else by `download` (with `builder_cls`).

  Returns:
    The number of examples in each split it prepared; None if it was there.

  Raises:
    IdxFormatError: the IDX files are missing or malformed; nothing was written.
    DownloadError: the download failed; nothing was written.
  """
  with prepare_lock(data_dir):
    if is_prepared(data_dir) and not overwrite:  # Prepared while this process waited.
      logging.info("MNIST was prepared at %s by another process.", dataset_path(data_dir))
      return None
    logging.info("Preparing MNIST at %s, once.", dataset_path(data_dir))
    if idx_dir:
      # Replaces an incomplete copy (or, with `overwrite`, a complete one).
      return prepare(idx_dir, data_dir, overwrite=True)
    return download(data_dir, builder_cls or tfds_mnist.MNIST)
