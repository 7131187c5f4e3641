"""data.mnist.pipeline: the input_fn both backends share."""

import pytest
import tensorflow as tf

from data import mnist
from data.mnist import pipeline
from data.mnist import store

def test_missing_data_names_the_prepare_command(tmp_path):
  with pytest.raises(store.MissingDataError, match="python -m data.prepare --idx_dir=DIR"):
    pipeline.input_fn(mnist.TRAIN, global_batch_size=8, data_dir=str(tmp_path))


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
        pipeline.input_fn(mnist.EVAL, ctx, global_batch_size=30, data_dir=tiny_data_dir)))
  whole = _labels_and_sums(pipeline.input_fn(mnist.EVAL, global_batch_size=30,
                                          data_dir=tiny_data_dir))
  assert len(whole) == 200
  assert sorted(sum(shards, [])) == sorted(whole)
  for i, shard in enumerate(shards):
    assert len(shard) in (200 // num_pipelines, 200 // num_pipelines + 1)
    assert shard == whole[i::num_pipelines]  # Element-wise sharding, same order.


def test_per_replica_batches(tiny_data_dir):
  ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1,
                                   num_replicas_in_sync=4)
  ds = pipeline.input_fn(mnist.TRAIN, ctx, global_batch_size=32, data_dir=tiny_data_dir, seed=5)
  images, labels = next(iter(ds))
  assert images.shape == (8, 28, 28, 1) and images.dtype == tf.float32
  assert labels.shape == (8,)
  assert float(tf.reduce_min(images)) >= 0.0 and float(tf.reduce_max(images)) <= 1.0
  # Training repeats forever with full batches: more batches than one epoch holds.
  assert sum(1 for _ in ds.take(100)) == 100


def test_training_order_is_seeded(tiny_data_dir):
  def first_labels(seed):
    tf.random.set_seed(0)
    ds = pipeline.input_fn(mnist.TRAIN, global_batch_size=50, data_dir=tiny_data_dir, seed=seed)
    return next(iter(ds))[1].numpy().tolist()

  assert first_labels(1) == first_labels(1)
  assert first_labels(1) != first_labels(2)


def test_no_autotuning_in_the_pipeline_or_the_per_device_buffers(tiny_data_dir):
  # TF 2.15 made deleting a distributed iterator wait out the autotuning
  # thread's sleep (10 to 20 s at the end of training): both places turn it off.
  from tensorflow.python.data.ops import multi_device_iterator_ops
  from trainers import distribute

  for mode in (mnist.TRAIN, mnist.EVAL):
    ds = pipeline.input_fn(mode, global_batch_size=10, data_dir=tiny_data_dir)
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


def test_a_weight_and_a_label_are_derived_from_each_example(tiny_data_dir):
  ds = pipeline.input_fn(mnist.EVAL, global_batch_size=50, data_dir=tiny_data_dir,
                         label=lambda image, digit: digit * 2,
                         weight=lambda image, digit: tf.cast(digit, tf.float32) / 10)
  digits = pipeline.input_fn(mnist.EVAL, global_batch_size=50, data_dir=tiny_data_dir)
  for (images, labels, weights), (same_images, digit) in zip(ds, digits):
    assert weights.dtype == tf.float32 and weights.shape == digit.shape
    assert labels.numpy().tolist() == (digit * 2).numpy().tolist()
    assert weights.numpy().tolist() == pytest.approx((digit.numpy() / 10).tolist())
    assert bool(tf.reduce_all(images == same_images))
