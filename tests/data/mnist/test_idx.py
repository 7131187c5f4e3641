"""data.mnist.idx: IDX files read and checked."""

import gzip

import numpy as np
import pytest

from data.mnist import idx
from tests.conftest import synthetic_split, write_idx, write_idx_dir

def test_read_idx_round_trips_gzip_and_plain(tmp_path):
  images, _ = synthetic_split(7, seed=3)
  write_idx(tmp_path / "a.gz", images)
  with gzip.open(tmp_path / "a.gz") as f:
    (tmp_path / "a").write_bytes(f.read())
  np.testing.assert_array_equal(idx.read_idx(str(tmp_path / "a.gz")), images)
  np.testing.assert_array_equal(idx.read_idx(str(tmp_path / "a")), images)


@pytest.mark.parametrize("content, message", [
    (b"", "bad magic"),
    (b"\x00\x00\x0d\x03" + b"\x00" * 12, "bad magic"),
    (b"\x00\x00\x08\x03\x00\x00", "truncated inside its IDX header"),
    (b"\x00\x00\x08\x01\x00\x00\x00\x05\x01\x02", "truncated or corrupt"),
])
def test_read_idx_rejects_malformed_files(tmp_path, content, message):
  path = tmp_path / "bad"
  path.write_bytes(content)
  with pytest.raises(idx.IdxFormatError, match=message):
    idx.read_idx(str(path))


def test_read_idx_split_rejects_mismatched_labels(tmp_path):
  write_idx_dir(tmp_path, {"train": 20})
  write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.zeros(19, np.uint8))
  with pytest.raises(idx.IdxFormatError, match="does not match"):
    idx.read_idx_split(str(tmp_path), "train")
