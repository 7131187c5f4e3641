"""The input pipeline both backends share: `input_fn(mode, input_context)`.

Keras calls it through `strategy.distribute_datasets_from_function`, the Estimator through
`train_and_evaluate`. Each call builds one input pipeline; with an `InputContext` it reads
only its shard and batches per replica.
"""

import hashlib
import json
import os
from typing import Callable, List, Mapping, Optional, Tuple

import tensorflow as tf
import tensorflow_datasets as tfds

from data.mnist import EVAL, TRAIN, tabular as table
from data.mnist.store import DATASET, check_prepared

SPLIT_FOR_MODE = {TRAIN: "train", EVAL: "test"}
SHUFFLE_BUFFER = 10_000
PREFETCH_BATCHES = 2


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


def record_shard(record_dir: str, split: str, data_dir: Optional[str],
                 input_context: Optional[tf.distribute.InputContext]) -> None:
  """Writes `<record_dir>/shard-<id>-of-<n>.json`: the fingerprints of the examples the
  pipeline of `input_context` reads from `split`, in order."""
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


def _labelled(image: tf.Tensor, digit: tf.Tensor, label, weight) -> Tuple[tf.Tensor, ...]:
  labelled = (image, digit if label is None else label(image, digit))
  return labelled if weight is None else (*labelled, weight(image, digit))


def input_fn(
    mode: str,
    input_context: Optional[tf.distribute.InputContext] = None,
    *,
    global_batch_size: int,
    data_dir: Optional[str] = None,
    seed: int = 0,
    record_dir: Optional[str] = None,
    label: Optional[Callable[[tf.Tensor, tf.Tensor], tf.Tensor]] = None,
    weight: Optional[Callable[[tf.Tensor, tf.Tensor], tf.Tensor]] = None,
    tabular: Optional[Mapping[str, object]] = None,
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
      fingerprints to `<record_dir>/shard-<id>-of-<n>.json` (parity checks; `record_shard`).
    label: `label(image, digit)` -> one example's label (a task's: trainers/heads.py),
      from its scaled image and its digit; None: the digit.
    weight: `weight(image, digit)` -> one example's weight (a canned model's
      --weight_column), likewise; None: no weights.
    tabular: a parse_example spec of the tabular features (data/mnist/tabular.py): each
      image becomes a serialized tf.Example of its features, and each batch is parsed
      with this spec, as a team's input_fn parses its records; None: the images.

  Returns:
    A `tf.data.Dataset` of (float32 images in [0, 1] of shape (B, 28, 28, 1), or with
    `tabular` the dict of parsed features, labels of shape (B,): int64 digits, or what
    `label` gives), and with `weight` each batch's float32 weights (B,) third, as Keras's
    `fit` takes sample weights.
  """
  if mode not in SPLIT_FOR_MODE:
    raise ValueError(f"mode must be one of {sorted(SPLIT_FOR_MODE)}, got {mode!r}")
  check_prepared(data_dir)
  training = mode == TRAIN
  # A pipeline id known only on the worker (a tensor: ParameterServerStrategy traces this on
  # its coordinator, which records each worker's shard itself) is recorded there.
  if record_dir and training and not tf.is_tensor(getattr(input_context, "input_pipeline_id",
                                                          None)):
    record_shard(record_dir, SPLIT_FOR_MODE[mode], data_dir, input_context)
  ds = _load(SPLIT_FOR_MODE[mode], data_dir)
  batch_size = global_batch_size
  if input_context is not None:
    # MNIST is one file, so shard by element: every pipeline reads the file
    # in the same order and keeps every n-th example, which makes the shards
    # disjoint and, together, the whole split.
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    # Each pipeline feeds its worker's replicas one batch each per step.
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
  if tabular is not None:
    table.check_spec(tabular)

  def example(image, digit):
    labelled = (_scale(image, digit) if label is None and weight is None else
                _labelled(*_scale(image, digit), label, weight))
    if tabular is None:
      return labelled
    return (table.serialize(table.features(labelled[0])), *labelled[1:])

  ds = ds.map(example, num_parallel_calls=os.cpu_count() or 1).cache()
  if training:
    ds = ds.shuffle(SHUFFLE_BUFFER, seed=seed, reshuffle_each_iteration=True).repeat()
  # Training drops partial batches so every step has the same global batch,
  # which keeps the gradient the same in both backends.
  ds = ds.batch(batch_size, drop_remainder=training)
  if tabular is not None:
    ds = ds.map(lambda records, *rest: (tf.io.parse_example(records, tabular), *rest))
  # No autotuning: TF 2.15 does not wake the autotuning thread when a
  # distributed iterator is deleted, so the end of `fit` waited out its sleep,
  # up to 20 s (see distribute.no_autotune_on_device_datasets). Map runs once
  # per example (then the cache serves); a fixed prefetch keeps batches ready.
  options = tf.data.Options()
  options.autotune.enabled = False
  return ds.prefetch(PREFETCH_BATCHES).with_options(options)
