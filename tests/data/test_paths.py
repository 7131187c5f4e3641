"""data.paths: the TensorFlow-free data check agrees with TFDS's own layout."""

import os

import tensorflow_datasets as tfds
from tensorflow_datasets.core import constants as tfds_constants
from tensorflow_datasets.image_classification import mnist as tfds_mnist

from data import paths


def test_the_tensorflow_free_paths_agree_with_tfds(tiny_data_dir, tmp_path, monkeypatch):
  assert str(tfds_mnist.MNIST.VERSION) == paths.VERSION
  for data_dir in (str(tiny_data_dir), str(tmp_path)):
    builder = tfds.builder(paths.DATASET, data_dir=data_dir)
    assert paths.dataset_path(data_dir) == os.fspath(builder.data_path)
    assert paths.is_prepared(data_dir) == builder.is_prepared()
  assert paths.is_prepared(str(tiny_data_dir)) and not paths.is_prepared(str(tmp_path))
  # TFDS's default data_dir: $TFDS_DATA_DIR, else ~/tensorflow_datasets.
  for env in (str(tiny_data_dir), None):
    if env:
      monkeypatch.setenv("TFDS_DATA_DIR", env)
    else:
      monkeypatch.delenv("TFDS_DATA_DIR", raising=False)
    assert paths.dataset_path(None) == os.path.join(tfds_constants.get_default_data_dir(),
                                                    paths.DATASET, paths.VERSION)


def test_missing_data_names_the_fix(tmp_path):
  try:
    paths.check_prepared(str(tmp_path))
  except paths.MissingDataError as e:
    assert f"--data_dir={tmp_path}" in str(e) and "python -m data.prepare" in str(e)
  else:
    raise AssertionError("no MissingDataError for an empty data_dir")
