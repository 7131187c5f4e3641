"""data.mnist: IDX reading, offline preparation, and the shared input_fn."""

import fcntl
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
from unittest import mock

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
  want = sorted(int(label) * 10**6 + int(im.sum()) for im, label in zip(images, labels))
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
  assert not os.path.exists(os.path.join(tiny_data_dir, mnist.LOCK_NAME))  # Failed: none left.
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
    def log_message(self, *args):
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
  """What a preparation left in data_dir: the dataset, if it succeeded, and no lock file."""
  return sorted(os.listdir(data_dir))


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
               "no --mnist_idx_dir given", "--mnist_idx_dir=DIR", "$MNIST_IDX_DIR=DIR",
               "python -m data.prepare --idx_dir=DIR", f"--data_dir={tmp_path}", url):
    assert part in message, message
  assert _leftovers(tmp_path) == []


def _offline_env():
  """Every request goes to a proxy that refuses connections: TFDS's real download fails fast."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    proxy = f"http://127.0.0.1:{s.getsockname()[1]}"
  return {paths.IDX_DIR_ENV: None, "HTTPS_PROXY": proxy, "HTTP_PROXY": proxy,
          "https_proxy": proxy, "http_proxy": proxy, "NO_PROXY": None, "no_proxy": None}


def test_the_prepare_cli_names_its_own_idx_dir_flag(tmp_path):
  # data.prepare takes --idx_dir, not the trainers' --mnist_idx_dir: its message
  # names the flag it takes, and does not send the user to itself.
  result = run_module("data.prepare", [f"--data_dir={tmp_path}"], timeout=120,
                      env=_offline_env())
  assert result.returncode == 1, result.stderr[-3000:]
  for part in ("error: MNIST is not prepared", "Tried: cannot reach", "no --idx_dir given",
               "with --idx_dir=DIR or $MNIST_IDX_DIR=DIR."):
    assert part in result.stderr, result.stderr[-3000:]
  assert "mnist_idx_dir" not in result.stderr and "python -m data.prepare" not in result.stderr
  assert _leftovers(tmp_path) == []  # Nor its lock file.
  # The flag it names is one it takes: the same command with it prepares.
  idx_dir = write_idx_dir(tmp_path / "idx", {"train": 30, "test": 10})
  ok = run_module("data.prepare", [f"--idx_dir={idx_dir}", f"--data_dir={tmp_path / 'tfds'}"],
                  timeout=120, env=_offline_env())
  assert ok.returncode == 0 and "Prepared MNIST" in ok.stdout, ok.stderr[-3000:]
  assert _leftovers(tmp_path / "tfds") == ["mnist"]


def test_bad_idx_files_leave_no_lock_file(tmp_path):
  with pytest.raises(paths.MissingDataError, match="is missing from"):
    mnist.ensure_prepared(str(tmp_path / "tfds"), idx_dir=str(tmp_path))
  assert _leftovers(tmp_path / "tfds") == []


def _hold_lock_file(path):
  """Opens (creating) and locks `path` as another preparer's prepare_lock does: the fd."""
  fd = os.open(path, os.O_RDWR | os.O_CREAT)
  fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  return fd


def test_a_waiter_whose_lock_file_was_deleted_locks_the_new_one(tmp_path):
  # The race that deleting a lock file opens: a waiter blocks on the old file;
  # its holder deletes it and lets go, and meanwhile a newcomer has created a
  # new file at the path and locked it. The waiter then holds the old file's
  # lock, which locks out no one: it must wait for the new file's instead.
  lock_path = os.path.join(tmp_path, mnist.LOCK_NAME)
  old = _hold_lock_file(lock_path)
  waiting, inside = threading.Event(), threading.Event()
  real_logging = mnist.logging

  class SignalOnWait:
    def info(self, message, *args):
      if message.startswith("Waiting"):
        waiting.set()
      real_logging.info(message, *args)

  def waiter():
    with mnist.prepare_lock(str(tmp_path)):
      inside.set()

  with mock.patch.object(mnist, "logging", SignalOnWait()):
    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    assert waiting.wait(30), "the waiter did not wait for the held lock"
    os.unlink(lock_path)  # The holder deletes the file...
    new = _hold_lock_file(lock_path)  # ... a newcomer locks a new one ...
    os.close(old)  # ... and the holder lets go of the old one.
    assert not inside.wait(1), "the waiter took the deleted file's lock as its own"
    os.close(new)  # The newcomer lets go (its file stays: the waiter must take it).
    assert inside.wait(30), "the waiter did not take the new file's lock"
    thread.join(30)
  assert os.listdir(tmp_path) == []  # The waiter deleted the new file when done.


def test_the_lock_excludes_under_contention_and_is_gone_after(tmp_path):
  # Threads hold separate open files, so flock excludes them as it does processes.
  data_dir, holders, overlaps = str(tmp_path), [], []
  guard = threading.Lock()

  def contend():
    for _ in range(40):
      with mnist.prepare_lock(data_dir):
        with guard:
          holders.append(1)
          if len(holders) > 1:
            overlaps.append(len(holders))
        time.sleep(0.0005)
        with guard:
          holders.pop()

  threads = [threading.Thread(target=contend) for _ in range(6)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(120)
  assert not any(t.is_alive() for t in threads)
  assert overlaps == [], f"{len(overlaps)} times two threads held the lock at once"
  assert os.listdir(tmp_path) == []


def test_a_failure_under_the_lock_deletes_the_lock_file(tmp_path):
  with pytest.raises(RuntimeError, match="boom"), mnist.prepare_lock(str(tmp_path)):
    assert os.path.exists(os.path.join(tmp_path, mnist.LOCK_NAME))
    raise RuntimeError("boom")
  assert os.listdir(tmp_path) == []
  # A killed holder's file (left behind, unlocked) is taken over and deleted too.
  os.close(os.open(os.path.join(tmp_path, mnist.LOCK_NAME), os.O_CREAT | os.O_RDWR))
  with mnist.prepare_lock(str(tmp_path)):
    pass
  assert os.listdir(tmp_path) == []


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
  assert _leftovers(tmp_path) == ["mnist"]  # Both let go of the lock and deleted its file.


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
  return [(int(label), float(tf.reduce_sum(im))) for images, labels in ds
          for im, label in zip(images, labels)]


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
  assert float(tf.reduce_min(images)) >= 0.0 and float(tf.reduce_max(images)) <= 1.0
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
  from tensorflow.python.data.ops import multi_device_iterator_ops
  from trainers import distribute

  for mode in (mnist.TRAIN, mnist.EVAL):
    ds = mnist.input_fn(mode, global_batch_size=10, data_dir=tiny_data_dir)
    assert ds.options().autotune.enabled is False
  distribute.no_autotune_on_device_datasets()
  wrapped = multi_device_iterator_ops._create_device_dataset
  distribute.no_autotune_on_device_datasets()  # Idempotent: wraps once.
  assert multi_device_iterator_ops._create_device_dataset is wrapped
  iterator = multi_device_iterator_ops.OwnedMultiDeviceIterator(tf.data.Dataset.range(3),
                                                                ["/cpu:0"])
  per_device = iterator._device_iterators[0]._dataset
  assert per_device.options().autotune.enabled is False
  assert [int(x[0]) for x in iterator] == [0, 1, 2]
