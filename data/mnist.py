"""MNIST as a TFDS dataset: offline preparation from IDX files, and the input_fn.

The same `input_fn(mode, input_context)` feeds both backends: Keras calls it
through `strategy.distribute_datasets_from_function`, the Estimator through
`train_and_evaluate`. Each call builds one input pipeline; with an
`InputContext` it reads only its shard and batches per replica.
"""

import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import os
import shutil
import tempfile
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Type

import numpy as np
import requests
import tensorflow as tf
import tensorflow_datasets as tfds
from absl import logging
from tensorflow_datasets.image_classification import mnist as tfds_mnist

from data.paths import (DATASET, IDX_DIR_ENV, TRAINER_IDX_DIR_FLAG, MissingDataError,
                        check_prepared, dataset_path, is_prepared, prepare_hint)

TRAIN = "train"  # Same strings as tf.estimator.ModeKeys, without importing it:
EVAL = "eval"  # the Keras path must work on TensorFlow >= 2.16 too.
SPLIT_FOR_MODE = {TRAIN: "train", EVAL: "test"}
IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
SHUFFLE_BUFFER = 10_000
PREFETCH_BATCHES = 2
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_IDX_DTYPES = {0x08: np.uint8}
_STAGING_PREFIX = ".mnist-prepare-"
LOCK_NAME = ".mnist-prepare.lock"
_PROBE_TIMEOUT_S = 10


class IdxFormatError(ValueError):
  """An IDX file is missing, truncated, or not an MNIST image or label file."""


class DownloadError(RuntimeError):
  """TFDS could not download MNIST, or a file did not match its checksum."""


def read_idx(path: str) -> np.ndarray:
  """Reads one IDX file (gzip'd or plain) of any length into a uint8 array.

  Args:
    path: the file; `.gz` files are decompressed.

  Returns:
    An array with the shape the IDX header declares.

  Raises:
    IdxFormatError: if the header or the payload size is wrong.
  """
  try:
    with open(path, "rb") as f:
      raw = f.read()
    if raw[:2] == b"\x1f\x8b":
      raw = gzip.decompress(raw)
  except (OSError, EOFError, gzip.BadGzipFile) as e:
    raise IdxFormatError(f"cannot read IDX file {path}: {e}") from e
  if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
    raise IdxFormatError(
        f"{path} is not an unsigned-byte IDX file (bad magic number "
        f"{raw[:4].hex() or 'empty'}); expected 00000801 or 00000803."
    )
  ndim = raw[3]
  header = 4 + 4 * ndim
  if len(raw) < header:
    raise IdxFormatError(f"{path} is truncated inside its IDX header.")
  shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
  expected = header + int(np.prod(shape))
  if len(raw) != expected:
    raise IdxFormatError(
        f"{path} has {len(raw)} bytes but its header declares shape {shape} "
        f"({expected} bytes): the file is truncated or corrupt."
    )
  return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def _find_idx(idx_dir: str, stem: str) -> str:
  for name in (stem + ".gz", stem):
    path = os.path.join(idx_dir, name)
    if os.path.exists(path):
      return path
  raise IdxFormatError(f"{stem}.gz (or {stem}) is missing from {idx_dir}.")


def read_idx_split(idx_dir: str, split: str) -> Tuple[np.ndarray, np.ndarray]:
  """Reads and validates one split's images (N, 28, 28) and labels (N,)."""
  image_path, label_path = (_find_idx(idx_dir, s) for s in IDX_FILES[split])
  images, labels = read_idx(image_path), read_idx(label_path)
  if images.ndim != 3 or images.shape[1:] != IMAGE_SHAPE[:2]:
    raise IdxFormatError(
        f"{image_path} holds arrays of shape {images.shape}; MNIST images are (N, 28, 28)."
    )
  if labels.ndim != 1 or len(labels) != len(images):
    raise IdxFormatError(
        f"{label_path} holds {labels.shape} labels for {len(images)} images in "
        f"{image_path}: the pair does not match."
    )
  if labels.size and labels.max() >= NUM_CLASSES:
    raise IdxFormatError(f"{label_path} has label {labels.max()}; MNIST labels are 0-9.")
  return images, labels


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


def _root(data_dir: Optional[str]) -> str:
  """The TFDS data directory itself: dataset_path is <root>/mnist/<version>."""
  return os.path.dirname(os.path.dirname(dataset_path(data_dir)))


def _build_into_place(make_builder: Callable[[str], Any], data_dir: Optional[str],
                      download_config: tfds.download.DownloadConfig) -> None:
  """Runs a builder in a staging directory beside the dataset, then moves it in.

  Downloads go to the staging directory too, so a failure (or a kill) leaves
  neither a half-written dataset nor partial downloads in `data_dir`.
  """
  final, root = dataset_path(data_dir), _root(data_dir)
  os.makedirs(root, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=root)
  try:
    builder = make_builder(staging)
    # TFDS prints where it prepares (the staging directory) and "Subsequent
    # calls will reuse this data", which is untrue of it: our own log lines
    # name the final place. Its progress bars (stderr) stay.
    with contextlib.redirect_stdout(io.StringIO()):
      builder.download_and_prepare(download_dir=os.path.join(staging, "downloads"),
                                   download_config=download_config)
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
    raise DownloadError(f"cannot reach TFDS's MNIST mirror {url}: {e}") from e
  logging.info("Downloading MNIST from %s with TFDS (checksums checked)...", url)
  try:
    # force_checksums_validation: a URL without a recorded checksum is an
    # error, not a warning, so every file written was verified.
    _build_into_place(lambda staging: builder_cls(data_dir=staging), data_dir,
                      tfds.download.DownloadConfig(force_checksums_validation=True))
  except Exception as e:
    # TFDS raises requests', its own and OS errors: all mean "not downloaded".
    raise DownloadError(f"TFDS's download from {url} failed: {type(e).__name__}: {e}") from e
  counts = {split: num_examples(split, data_dir) for split in ("train", "test")}
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
  root = _root(data_dir)
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


def ensure_prepared(data_dir: Optional[str], idx_dir: Optional[str] = None, *,
                    overwrite: bool = False,
                    builder_cls: Type[tfds.core.DatasetBuilder] = tfds_mnist.MNIST,
                    idx_dir_flag: str = TRAINER_IDX_DIR_FLAG
                    ) -> Optional[Dict[str, int]]:
  """Prepares MNIST unless it is there: from local IDX files, else by TFDS's download.

  Safe to call from several processes at once: one prepares, the others wait
  for it and find it done.

  Args:
    data_dir: TFDS data directory; None means TFDS's default.
    idx_dir: directory of the four IDX files; None means `$MNIST_IDX_DIR`,
      and when that is unset too, download.
    overwrite: rebuild the dataset even if it is prepared.
    builder_cls: the download's builder (see `download`).
    idx_dir_flag: the flag that gave `idx_dir` to the calling command, named
      in the error message: `--mnist_idx_dir` (the trainers and tools, the
      default) or `--idx_dir` (`python -m data.prepare`).

  Returns:
    The number of examples in each split it prepared; None if it was there.

  Raises:
    MissingDataError: if the given IDX files are missing or malformed, or the
      download failed and no IDX files were given; the message says what was
      tried and how to fix it.
  """
  if is_prepared(data_dir) and not overwrite:
    return None
  idx_dir = idx_dir or os.environ.get(IDX_DIR_ENV) or None
  with prepare_lock(data_dir):
    if is_prepared(data_dir) and not overwrite:  # Prepared while this process waited.
      logging.info("MNIST was prepared at %s by another process.", dataset_path(data_dir))
      return None
    logging.info("Preparing MNIST at %s, once.", dataset_path(data_dir))
    if idx_dir:
      try:
        # Replaces an incomplete copy (or, with `overwrite`, a complete one).
        return prepare(idx_dir, data_dir, overwrite=True)
      except IdxFormatError as e:
        raise MissingDataError(
            f"{e}\nNothing was written. Fix or re-fetch the IDX files and run again.") from e
    try:
      return download(data_dir, builder_cls)
    except DownloadError as e:
      raise MissingDataError(
          f"MNIST is not prepared at {dataset_path(data_dir)}, and preparing it failed.\n"
          f"  Tried: {e}\n"
          f"  Not tried: local IDX files (no {idx_dir_flag} given, ${IDX_DIR_ENV} not set).\n"
          f"Fix it either way: run where TFDS can download ({builder_cls.URL} reachable), "
          f"or {prepare_hint(data_dir, idx_dir_flag)}."
      ) from e


def num_examples(split: str, data_dir: Optional[str]) -> int:
  """Number of examples in a prepared split ('train' or 'test')."""
  check_prepared(data_dir)
  return tfds.builder(DATASET, data_dir=data_dir).info.splits[split].num_examples


def _load(split: str, data_dir: Optional[str]) -> tf.data.Dataset:
  return tfds.load(DATASET, split=split, data_dir=data_dir, download=False, as_supervised=True,
                   shuffle_files=False)


def shard_fingerprints(split: str, data_dir: Optional[str], num_shards: int = 1,
                       index: int = 0) -> List[str]:
  """Fingerprints (blake2b of image bytes and label) of one shard's examples, in order.

  Runs in a graph and session of its own, so it works both from eager code
  (Keras) and from inside the Estimator's input_fn graph.
  """
  graph = tf.Graph()
  graph.seed = 0  # Nothing here is random, but op determinism insists on a seed.
  with graph.as_default():
    ds = _load(split, data_dir).shard(num_shards, index).batch(1 << 30)
    batch = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    with tf.compat.v1.Session(graph=graph) as session:
      try:
        images, labels = session.run(batch)
      except tf.errors.OutOfRangeError:  # An empty shard.
        return []
  return [hashlib.blake2b(image.tobytes() + bytes([label]), digest_size=8).hexdigest()
          for image, label in zip(images, labels)]


def _record_shard(record_dir: str, split: str, data_dir: Optional[str],
                  input_context: Optional[tf.distribute.InputContext]) -> None:
  num, index = ((input_context.num_input_pipelines, input_context.input_pipeline_id)
                if input_context else (1, 0))
  fingerprints = shard_fingerprints(split, data_dir, num, index)
  tf.io.gfile.makedirs(record_dir)
  path = os.path.join(record_dir, f"shard-{index}-of-{num}.json")
  with tf.io.gfile.GFile(path, "w") as f:
    json.dump({"split": split, "num_pipelines": num, "pipeline_id": index,
               "fingerprints": fingerprints}, f)


def _scale(image: tf.Tensor, label: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
  return tf.cast(image, tf.float32) / 255.0, label


def input_fn(
    mode: str,
    input_context: Optional[tf.distribute.InputContext] = None,
    *,
    global_batch_size: int,
    data_dir: Optional[str] = None,
    seed: int = 0,
    record_dir: Optional[str] = None,
) -> tf.data.Dataset:
  """Builds one input pipeline of (image, label) batches for both backends.

  Args:
    mode: "train" (the train split, shuffled, repeated, full batches) or
      "eval" (the test split, one pass, in order).
    input_context: set by the strategy when each worker builds its own
      pipeline; then this pipeline reads shard `input_pipeline_id` of
      `num_input_pipelines` and yields per-replica batches.
    global_batch_size: examples per step across all replicas.
    data_dir: TFDS data directory; None means TFDS's default.
    seed: shuffle seed.
    record_dir: in "train" mode, also write this pipeline's example
      fingerprints to `<record_dir>/shard-<id>-of-<n>.json` (parity checks).

  Returns:
    A `tf.data.Dataset` of (float32 images in [0, 1] of shape (B, 28, 28, 1),
    int64 labels of shape (B,)).
  """
  if mode not in SPLIT_FOR_MODE:
    raise ValueError(f"mode must be one of {sorted(SPLIT_FOR_MODE)}, got {mode!r}")
  check_prepared(data_dir)
  training = mode == TRAIN
  if record_dir and training:
    _record_shard(record_dir, SPLIT_FOR_MODE[mode], data_dir, input_context)
  ds = _load(SPLIT_FOR_MODE[mode], data_dir)
  batch_size = global_batch_size
  if input_context is not None:
    # MNIST is one file, so shard by element: every pipeline reads the file
    # in the same order and keeps every n-th example, which makes the shards
    # disjoint and, together, the whole split.
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    # Each pipeline feeds its worker's replicas one batch each per step.
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
  ds = ds.map(_scale, num_parallel_calls=os.cpu_count() or 1).cache()
  if training:
    ds = ds.shuffle(SHUFFLE_BUFFER, seed=seed, reshuffle_each_iteration=True).repeat()
  # Training drops partial batches so every step has the same global batch,
  # which keeps the gradient the same in both backends.
  ds = ds.batch(batch_size, drop_remainder=training)
  # No autotuning: TF 2.15 does not wake the autotuning thread when a
  # distributed iterator is deleted, so the end of `fit` waited out its sleep,
  # up to 20 s (see distribute.no_autotune_on_device_datasets). Map runs once
  # per example (then the cache serves); a fixed prefetch keeps batches ready.
  options = tf.data.Options()
  options.autotune.enabled = False
  return ds.prefetch(PREFETCH_BATCHES).with_options(options)
