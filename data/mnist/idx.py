"""The MNIST IDX files (http://yann.lecun.com/exdb/mnist/), gzip'd or plain, of any length,
read and checked: a missing, truncated or mismatched file is an `IdxFormatError` naming it.
"""

import gzip
import os
from typing import Tuple

import numpy as np

from data.mnist import IDX_FILES, IMAGE_SHAPE, NUM_CLASSES

_IDX_DTYPES = {0x08: np.uint8}


class IdxFormatError(ValueError):
  """An IDX file is missing, truncated, or not an MNIST image or label file."""


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
