"""data.mnist.build: the dataset written as TFDS's own, one process at a time."""

import fcntl
import os
import subprocess
import sys
import tempfile
import threading
import time
from unittest import mock

import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.image_classification import mnist as tfds_mnist

from data import mnist
from data.mnist import build
from data.mnist import pipeline
from data.mnist import store
from tests.conftest import REPO, synthetic_split

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


def _leftovers(data_dir):
  """What a preparation left in data_dir: the dataset, if it succeeded, and no lock file."""
  return sorted(os.listdir(data_dir))


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
  lock_path = os.path.join(tmp_path, build.LOCK_NAME)
  old = _hold_lock_file(lock_path)
  waiting, inside = threading.Event(), threading.Event()
  real_logging = build.logging

  class SignalOnWait:
    def info(self, message, *args):
      if message.startswith("Waiting"):
        waiting.set()
      real_logging.info(message, *args)

  def waiter():
    with build.prepare_lock(str(tmp_path)):
      inside.set()

  with mock.patch.object(build, "logging", SignalOnWait()):
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
      with build.prepare_lock(data_dir):
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
  with pytest.raises(RuntimeError, match="boom"), build.prepare_lock(str(tmp_path)):
    assert os.path.exists(os.path.join(tmp_path, build.LOCK_NAME))
    raise RuntimeError("boom")
  assert os.listdir(tmp_path) == []
  # A killed holder's file (left behind, unlocked) is taken over and deleted too.
  os.close(os.open(os.path.join(tmp_path, build.LOCK_NAME), os.O_CREAT | os.O_RDWR))
  with build.prepare_lock(str(tmp_path)):
    pass
  assert os.listdir(tmp_path) == []


def _prepare_process(idx_dir, data_dir):
  env = {k: v for k, v in os.environ.items() if k != mnist.IDX_DIR_ENV}
  env["PYTHONPATH"] = str(REPO)
  return subprocess.Popen([sys.executable, "-m", "data.prepare", f"--idx_dir={idx_dir}",
                           f"--data_dir={data_dir}"], cwd=REPO, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_a_prepare_waits_for_the_one_in_progress_and_finds_it_done(tiny_idx_dir, tmp_path,
                                                                   tmp_path_factory,
                                                                   monkeypatch):
  data_dir = str(tmp_path)
  temp = tmp_path_factory.mktemp("temp")  # This process's temporary directory.
  monkeypatch.setattr(tempfile, "tempdir", str(temp))
  with build.prepare_lock(data_dir):
    waiting = _prepare_process(tiny_idx_dir, data_dir)
    seen = ""
    while "Waiting for another process" not in seen:
      line = waiting.stderr.readline()
      assert line, f"the second prepare did not wait for the lock: {seen}"
      seen += line
    build.prepare(str(tiny_idx_dir), data_dir)
    built = os.stat(os.path.join(store.dataset_path(data_dir), "dataset_info.json")).st_mtime_ns
  out, err = waiting.communicate(timeout=120)
  assert waiting.returncode == 0, err
  assert "already prepared" in out and "by another process" in err
  assert os.stat(os.path.join(store.dataset_path(data_dir),
                              "dataset_info.json")).st_mtime_ns == built  # Not rebuilt.
  assert _leftovers(tmp_path) == ["mnist"]  # Both let go of the lock and deleted its file.
  # Nothing in the temporary directory: TFDS's builder makes one there, now in staging.
  assert os.listdir(temp) == [] and tempfile.gettempdir() == str(temp)


def test_two_prepares_at_once_build_one_dataset(tiny_idx_dir, tmp_path):
  data_dir = str(tmp_path)
  procs = [_prepare_process(tiny_idx_dir, data_dir) for _ in range(2)]
  outs = [p.communicate(timeout=180) for p in procs]
  assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
  said = sorted("Prepared MNIST" in out for out, _ in outs)
  assert said == [False, True], outs  # One built it, the other found it built.
  assert _leftovers(tmp_path) == ["mnist"]
  assert pipeline.num_examples("train", data_dir) == 600
  assert sum(len(labels) for _, labels in pipeline.input_fn(
      mnist.EVAL, global_batch_size=50, data_dir=data_dir)) == 200
