"""data.mnist.store: the TensorFlow-free data check agrees with TFDS's own layout."""

import os

import tensorflow_datasets as tfds
from tensorflow_datasets.core import constants as tfds_constants
from tensorflow_datasets.image_classification import mnist as tfds_mnist

from data.mnist import store


def test_the_tensorflow_free_paths_agree_with_tfds(tiny_data_dir, tmp_path, monkeypatch):
  assert str(tfds_mnist.MNIST.VERSION) == store.VERSION
  for data_dir in (str(tiny_data_dir), str(tmp_path)):
    builder = tfds.builder(store.DATASET, data_dir=data_dir)
    assert store.dataset_path(data_dir) == os.fspath(builder.data_path)
    assert store.is_prepared(data_dir) == builder.is_prepared()
  assert store.is_prepared(str(tiny_data_dir)) and not store.is_prepared(str(tmp_path))
  # TFDS's default data_dir: $TFDS_DATA_DIR, else ~/tensorflow_datasets.
  for env in (str(tiny_data_dir), None):
    if env:
      monkeypatch.setenv("TFDS_DATA_DIR", env)
    else:
      monkeypatch.delenv("TFDS_DATA_DIR", raising=False)
    assert store.dataset_path(None) == os.path.join(tfds_constants.get_default_data_dir(),
                                                    store.DATASET, store.VERSION)


def test_missing_data_names_the_fix(tmp_path):
  try:
    store.check_prepared(str(tmp_path))
  except store.MissingDataError as e:
    assert f"--data_dir={tmp_path}" in str(e) and "python -m data.prepare" in str(e)
  else:
    raise AssertionError("no MissingDataError for an empty data_dir")


def test_each_command_is_told_the_fix_in_its_own_flags():
  trainers = store.prepare_hint("/d", "--mnist_idx_dir")
  assert "--mnist_idx_dir=DIR or $MNIST_IDX_DIR=DIR" in trainers
  assert "`python -m data.prepare --idx_dir=DIR --data_dir=/d`" in trainers
  itself = store.prepare_hint("/d", store.PREPARE_IDX_DIR_FLAG)
  assert "with --idx_dir=DIR or $MNIST_IDX_DIR=DIR" in itself and "data.prepare" not in itself
  program = store.prepare_hint(None, None)
  assert "`python -m data.prepare --idx_dir=DIR`" in program and "mnist_idx_dir" not in program
