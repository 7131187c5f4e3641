"""data.mnist: IDX reading, offline preparation, and the shared input_fn."""

import gzip
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from tensorflow_datasets.image_classification import mnist as tfds_mnist

from data import mnist
from data import paths
from tests.conftest import run_module, synthetic_split, write_idx, write_idx_dir


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
