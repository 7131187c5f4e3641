"""data.mnist: IDX reading, offline preparation, and the shared input_fn."""

import functools
import gzip
import hashlib
import http.server
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from tensorflow_datasets.core.download import checksums as tfds_checksums
from tensorflow_datasets.image_classification import mnist as tfds_mnist

from data import mnist
from data import paths
from tests.conftest import (REPO, SHARED_IDX_DIR, run_module, synthetic_split, write_idx,
                            write_idx_dir)


def test_read_idx_round_trips_gzip_and_plain(tmp_path):
  images, _ = synthetic_split(7, seed=3)
  write_idx(tmp_path / "a.gz", images)
  with gzip.open(tmp_path / "a.gz") as f:
    (tmp_path / "a").write_bytes(f.read())
  np.testing.assert_array_equal(mnist.read_idx(str(tmp_path / "a.gz")), images)
  np.testing.assert_array_equal(mnist.read_idx(str(tmp_path / "a")), images)


@pytest.mark.parametrize("content, message", [
    (b"", "bad magic"),
    (b"\x00\x00\x0d\x03" + b"\x00" * 12, "bad magic"),
    (b"\x00\x00\x08\x03\x00\x00", "truncated inside its IDX header"),
    (b"\x00\x00\x08\x01\x00\x00\x00\x05\x01\x02", "truncated or corrupt"),
])
def test_read_idx_rejects_malformed_files(tmp_path, content, message):
  path = tmp_path / "bad"
  path.write_bytes(content)
  with pytest.raises(mnist.IdxFormatError, match=message):
    mnist.read_idx(str(path))


def test_read_idx_split_rejects_mismatched_labels(tmp_path):
  write_idx_dir(tmp_path, {"train": 20})
  write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.zeros(19, np.uint8))
  with pytest.raises(mnist.IdxFormatError, match="does not match"):
    mnist.read_idx_split(str(tmp_path), "train")


def test_prepare_writes_tfds_mnist_with_official_features_and_splits(tiny_data_dir):
  builder = tfds.builder("mnist", data_dir=tiny_data_dir)
  official = tfds_mnist.MNIST(data_dir=tiny_data_dir)
  assert builder.is_prepared()
  assert builder.info.version == official.info.version
  assert repr(builder.info.features) == repr(official.info.features)
  assert {s: builder.info.splits[s].num_examples for s in ("train", "test")} == {
      "train": 600, "test": 200}
  # Written examples are the IDX contents (TFDS reorders them by key).
  ds = tfds.load("mnist", split="test", data_dir=tiny_data_dir, download=False)
  got = sorted(int(ex["label"]) * 10**6 + int(ex["image"].numpy().sum()) for ex in ds)
  images, labels = synthetic_split(200, seed=1)
  want = sorted(int(l) * 10**6 + int(im.sum()) for im, l in zip(images, labels))
  assert got == want


def test_prepare_cli_refuses_to_clobber_and_rejects_corrupt_files(tiny_idx_dir, tiny_data_dir,
                                                                   tmp_path):
  before = sorted(os.listdir(paths.dataset_path(tiny_data_dir)))
  again = run_module("data.prepare", [f"--idx_dir={tiny_idx_dir}", f"--data_dir={tiny_data_dir}"])
  assert again.returncode == 0, again.stderr
  assert "--overwrite" in again.stdout
  bad_dir = write_idx_dir(tmp_path / "bad", {"train": 30, "test": 10})
  raw = (bad_dir / "t10k-images-idx3-ubyte.gz").read_bytes()
  (bad_dir / "t10k-images-idx3-ubyte.gz").write_bytes(raw[: len(raw) // 2])
  corrupt = run_module("data.prepare", [f"--idx_dir={bad_dir}", f"--data_dir={tiny_data_dir}",
                                        "--overwrite"])
  assert corrupt.returncode != 0
  assert "t10k-images-idx3-ubyte.gz" in corrupt.stderr and "Nothing was written" in corrupt.stderr
  assert sorted(os.listdir(paths.dataset_path(tiny_data_dir))) == before
  assert mnist.num_examples("train", tiny_data_dir) == 600


def test_missing_data_names_the_prepare_command(tmp_path):
  with pytest.raises(paths.MissingDataError, match="python -m data.prepare --idx_dir=DIR"):
    mnist.input_fn(mnist.TRAIN, global_batch_size=8, data_dir=str(tmp_path))


# The download path, run for real on a local mirror: TFDS's official builder,
# downloader and checksum checks, with its URL pointed at a local HTTP server
# that serves ../shared. The shared test files are the official ones, so their
# official checksums apply. The shared training files are a re-headered subset
# (22,699 of 60,000 examples): for them, and only in these tests, the checksums
# are the subset's own and the builder's example count is the subset's.
_OFFICIAL_URL = tfds_mnist.MNIST.URL
_FILES = [name + ".gz" for pair in mnist.IDX_FILES.values() for name in pair]
_SUBSET = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")


@pytest.fixture(scope="module")
def mirror():
  """The URL of a local HTTP server serving the shared IDX files."""
  if not (SHARED_IDX_DIR / _SUBSET[0]).exists():
    pytest.skip(f"real MNIST IDX files not found in {SHARED_IDX_DIR}")

  class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # pylint: disable=arguments-differ
      pass

  server = http.server.ThreadingHTTPServer(
      ("127.0.0.1", 0), functools.partial(Quiet, directory=str(SHARED_IDX_DIR)))
  threading.Thread(target=server.serve_forever, daemon=True).start()
  yield f"http://127.0.0.1:{server.server_address[1]}/"
  server.shutdown()


def _mirror_builder(url, subset_checksums):
  """TFDS's MNIST builder reading `url`, with the official checksums, re-keyed to it.

  With `subset_checksums`, the two training files' checksums are the shared
  subset's own (test-only); without, all four are the official ones.
  """
  official = tfds_mnist.MNIST.url_infos
  infos = {url + name: official[_OFFICIAL_URL + name] for name in _FILES}
  if subset_checksums:
    for name in _SUBSET:
      raw = (SHARED_IDX_DIR / name).read_bytes()
      infos[url + name] = tfds_checksums.UrlInfo(
          size=len(raw), checksum=hashlib.sha256(raw).hexdigest(), filename=name)

  class Mirror(tfds_mnist.MNIST, skip_registration=True):
    name = paths.DATASET
    URL = url
    url_infos = infos

  return Mirror


def _leftovers(data_dir):
  """What a failed preparation left in data_dir, but for the lock file."""
  return sorted(set(os.listdir(data_dir)) - {".mnist-prepare.lock"})


def test_download_runs_tfds_with_its_checksum_checks(mirror, tmp_path, monkeypatch):
  monkeypatch.delenv(paths.IDX_DIR_ENV, raising=False)
  monkeypatch.setattr(tfds_mnist, "_TRAIN_EXAMPLES", 22_699)  # The subset's count.
  data_dir = str(tmp_path / "tfds")
  counts = mnist.ensure_prepared(data_dir, builder_cls=_mirror_builder(mirror, True))
  assert counts == {"train": 22_699, "test": 10_000}
  assert paths.is_prepared(data_dir) and _leftovers(data_dir) == ["mnist"]  # No downloads.
  # The official test set, exactly: TFDS's examples are the IDX file's.
  images, labels = mnist.read_idx_split(str(SHARED_IDX_DIR), "test")
  got = tfds.load("mnist", split="test", data_dir=data_dir, download=False, batch_size=-1,
                  as_supervised=True)
  want = sorted(zip(labels.tolist(), images.sum(axis=(1, 2)).tolist()))
  assert sorted(zip(got[1].numpy().tolist(), got[0].numpy().sum(axis=(1, 2, 3)).tolist())) \
      == want
  assert mnist.ensure_prepared(data_dir, builder_cls=_mirror_builder(mirror, True)) is None


def test_a_checksum_mismatch_fails_and_leaves_nothing(mirror, tmp_path, monkeypatch):
  # The official checksums do not match the shared training subset: the product
  # must refuse it, as it would a corrupted download.
  monkeypatch.delenv(paths.IDX_DIR_ENV, raising=False)
  with pytest.raises(paths.MissingDataError, match="(?i)checksum") as e:
    mnist.ensure_prepared(str(tmp_path), builder_cls=_mirror_builder(mirror, False))
  assert "--mnist_idx_dir=DIR" in str(e.value)
  assert _leftovers(tmp_path) == []


def test_no_network_and_no_idx_files_fail_fast_naming_both_fixes(tmp_path, monkeypatch):
  monkeypatch.delenv(paths.IDX_DIR_ENV, raising=False)
  with socket.socket() as s:  # A port nobody listens on: a refused connection.
    s.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{s.getsockname()[1]}/"
  start = time.monotonic()
  with pytest.raises(paths.MissingDataError) as e:
    mnist.ensure_prepared(str(tmp_path), builder_cls=_mirror_builder(url, False))
  assert time.monotonic() - start < 20  # TFDS's own retries take minutes.
  message = str(e.value)
  for part in ("Tried: cannot reach", "Connection refused", "Not tried: local IDX files",
               "--mnist_idx_dir=DIR", "$MNIST_IDX_DIR=DIR", "python -m data.prepare",
               f"--data_dir={tmp_path}", url):
    assert part in message, message
  assert _leftovers(tmp_path) == []


def test_idx_files_from_the_environment(tiny_idx_dir, tmp_path, monkeypatch):
  monkeypatch.setenv(paths.IDX_DIR_ENV, str(tiny_idx_dir))
  assert mnist.ensure_prepared(str(tmp_path)) == {"train": 600, "test": 200}
  assert _leftovers(tmp_path) == ["mnist"]


def _prepare_process(idx_dir, data_dir):
  env = {k: v for k, v in os.environ.items() if k != paths.IDX_DIR_ENV}
  env["PYTHONPATH"] = str(REPO)
  return subprocess.Popen([sys.executable, "-m", "data.prepare", f"--idx_dir={idx_dir}",
                           f"--data_dir={data_dir}"], cwd=REPO, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_a_prepare_waits_for_the_one_in_progress_and_finds_it_done(tiny_idx_dir, tmp_path):
  data_dir = str(tmp_path)
  with mnist.prepare_lock(data_dir):
    waiting = _prepare_process(tiny_idx_dir, data_dir)
    seen = ""
    while "Waiting for another process" not in seen:
      line = waiting.stderr.readline()
      assert line, f"the second prepare did not wait for the lock: {seen}"
      seen += line
    mnist.prepare(str(tiny_idx_dir), data_dir)
    built = os.stat(os.path.join(paths.dataset_path(data_dir), "dataset_info.json")).st_mtime_ns
  out, err = waiting.communicate(timeout=120)
  assert waiting.returncode == 0, err
  assert "already prepared" in out and "by another process" in err
  assert os.stat(os.path.join(paths.dataset_path(data_dir),
                              "dataset_info.json")).st_mtime_ns == built  # Not rebuilt.


def test_two_prepares_at_once_build_one_dataset(tiny_idx_dir, tmp_path):
  data_dir = str(tmp_path)
  procs = [_prepare_process(tiny_idx_dir, data_dir) for _ in range(2)]
  outs = [p.communicate(timeout=180) for p in procs]
  assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
  said = sorted("Prepared MNIST" in out for out, _ in outs)
  assert said == [False, True], outs  # One built it, the other found it built.
  assert _leftovers(tmp_path) == ["mnist"]
  assert mnist.num_examples("train", data_dir) == 600
  assert len(_labels_and_sums(mnist.input_fn(mnist.EVAL, global_batch_size=50,
                                             data_dir=data_dir))) == 200


def _labels_and_sums(ds):
  return [(int(l), float(tf.reduce_sum(im))) for images, labels in ds
          for im, l in zip(images, labels)]


@pytest.mark.parametrize("num_pipelines", [2, 3])
def test_shards_are_disjoint_and_cover_the_split(tiny_data_dir, num_pipelines):
  shards = []
  for i in range(num_pipelines):
    ctx = tf.distribute.InputContext(num_input_pipelines=num_pipelines, input_pipeline_id=i,
                                     num_replicas_in_sync=num_pipelines)
    shards.append(_labels_and_sums(
        mnist.input_fn(mnist.EVAL, ctx, global_batch_size=30, data_dir=tiny_data_dir)))
  whole = _labels_and_sums(mnist.input_fn(mnist.EVAL, global_batch_size=30,
                                          data_dir=tiny_data_dir))
  assert len(whole) == 200
  assert sorted(sum(shards, [])) == sorted(whole)
  for i, shard in enumerate(shards):
    assert len(shard) in (200 // num_pipelines, 200 // num_pipelines + 1)
    assert shard == whole[i::num_pipelines]  # Element-wise sharding, same order.


def test_per_replica_batches(tiny_data_dir):
  ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1,
                                   num_replicas_in_sync=4)
  ds = mnist.input_fn(mnist.TRAIN, ctx, global_batch_size=32, data_dir=tiny_data_dir, seed=5)
  images, labels = next(iter(ds))
  assert images.shape == (8, 28, 28, 1) and images.dtype == tf.float32
  assert labels.shape == (8,)
  assert 0.0 <= float(tf.reduce_min(images)) and float(tf.reduce_max(images)) <= 1.0
  # Training repeats forever with full batches: more batches than one epoch holds.
  assert sum(1 for _ in ds.take(100)) == 100


def test_training_order_is_seeded(tiny_data_dir):
  def first_labels(seed):
    tf.random.set_seed(0)
    ds = mnist.input_fn(mnist.TRAIN, global_batch_size=50, data_dir=tiny_data_dir, seed=seed)
    return next(iter(ds))[1].numpy().tolist()

  assert first_labels(1) == first_labels(1)
  assert first_labels(1) != first_labels(2)


def test_no_autotuning_in_the_pipeline_or_the_per_device_buffers(tiny_data_dir):
  # TF 2.15 made deleting a distributed iterator wait out the autotuning
  # thread's sleep (10 to 20 s at the end of training): both places turn it off.
  from tensorflow.python.data.ops import multi_device_iterator_ops  # pylint: disable=g-import-not-at-top
  from trainers import distribute  # pylint: disable=g-import-not-at-top

  for mode in (mnist.TRAIN, mnist.EVAL):
    ds = mnist.input_fn(mode, global_batch_size=10, data_dir=tiny_data_dir)
    assert ds.options().autotune.enabled is False
  distribute.no_autotune_on_device_datasets()
  wrapped = multi_device_iterator_ops._create_device_dataset  # pylint: disable=protected-access
  distribute.no_autotune_on_device_datasets()  # Idempotent: wraps once.
  assert multi_device_iterator_ops._create_device_dataset is wrapped  # pylint: disable=protected-access
  iterator = multi_device_iterator_ops.OwnedMultiDeviceIterator(tf.data.Dataset.range(3),
                                                                ["/cpu:0"])
  per_device = iterator._device_iterators[0]._dataset  # pylint: disable=protected-access
  assert per_device.options().autotune.enabled is False
  assert [int(x[0]) for x in iterator] == [0, 1, 2]
