"""data.mnist.tabular: each image's raw features, as tf.Examples, parsed as a team's
input_fn parses them."""

import numpy as np
import pytest
import tensorflow as tf

from data import mnist
from data.mnist import pipeline
from data.mnist import tabular


def _image(cells):
  """An image inked (1.0) in the given grid cells, else blank."""
  image = np.zeros((28, 28, 1), np.float32)
  for row, col in cells:
    image[row * 7:(row + 1) * 7, col * 7:(col + 1) * 7] = 1.0
  return tf.constant(image)


def test_each_feature_is_derived_from_the_image():
  got = {k: v.numpy() for k, v in tabular.features(_image([(0, 0), (0, 1), (3, 3)])).items()}
  assert got["ink"] == pytest.approx([3 * 49 / 784])
  assert list(got["height"]) == [14] and list(got["width"]) == [21]  # Rows 0-6, 21-27.
  assert got["center_row"] == pytest.approx([(2 * 49 * 3 + 49 * 24) / 147])
  assert list(got["quadrant"]) == [b"top_left"]
  assert list(got["grid"]) == [b"1100000000000001"]
  assert list(got["strokes"]) == [b"r0c0", b"r0c1", b"r3c3"]
  assert list(got["stroke_ink"]) == [1.0, 1.0, 1.0]
  assert list(got["pixels"]) == [14]  # 147 inked pixels, in tens.
  blank = {k: v.numpy() for k, v in tabular.features(_image([])).items()}
  assert list(blank["center_col"]) == [13.5] and blank["strokes"].size == 0
  assert list(blank["pixels"]) == [0] and list(blank["grid"]) == [b"0" * 16]


def test_an_example_parses_back_into_its_features():
  features = tabular.features(_image([(1, 2), (2, 2)]))
  record = tabular.serialize(features)
  example = tf.train.Example.FromString(record.numpy())
  assert sorted(example.features.feature) == sorted(tabular.FEATURES)
  assert list(example.features.feature["strokes"].bytes_list.value) == [b"r1c2", b"r2c2"]
  parsed = tf.io.parse_example(tf.stack([record]), tabular.parse_spec())
  for name, value in features.items():
    back = parsed[name]
    back = back.values if isinstance(back, tf.SparseTensor) else tf.reshape(back, [-1])
    np.testing.assert_array_equal(back.numpy(), value.numpy(), err_msg=name)


def test_the_input_gives_each_images_features_parsed_by_the_spec(tiny_data_dir):
  spec = {"ink": tf.io.FixedLenFeature([1], tf.float32),
          "quadrant": tf.io.VarLenFeature(tf.string),
          "strokes": tf.io.VarLenFeature(tf.string)}
  table = pipeline.input_fn(mnist.EVAL, global_batch_size=50, data_dir=tiny_data_dir,
                            tabular=spec)
  images = pipeline.input_fn(mnist.EVAL, global_batch_size=50, data_dir=tiny_data_dir)
  for (features, labels), (image_batch, image_labels) in zip(table, images):
    assert sorted(features) == sorted(spec)
    assert isinstance(features["quadrant"], tf.SparseTensor)
    np.testing.assert_array_equal(labels.numpy(), image_labels.numpy())
    for i, image in enumerate(image_batch):
      want = tabular.features(image)
      assert features["ink"][i, 0].numpy() == want["ink"].numpy()[0]
      row = tf.sparse.slice(features["strokes"], [i, 0], [1, 16]).values
      assert list(row.numpy()) == list(want["strokes"].numpy())


def test_a_spec_asking_for_what_the_table_lacks_is_named(tiny_data_dir):
  with pytest.raises(ValueError, match="no 'age'.*ink, height"):
    pipeline.input_fn(mnist.EVAL, global_batch_size=8, data_dir=tiny_data_dir,
                      tabular={"age": tf.io.FixedLenFeature([1], tf.float32)})
  with pytest.raises(ValueError, match="'pixels' is int64; the columns parse it as string"):
    pipeline.input_fn(mnist.EVAL, global_batch_size=8, data_dir=tiny_data_dir,
                      tabular={"pixels": tf.io.VarLenFeature(tf.string)})
