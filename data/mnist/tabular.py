"""MNIST as a table: raw features of the kinds teams describe with feature columns, derived
from each image alone (never its label), served as `tf.Example`s and parsed as a team's
input_fn parses them.

    spec = tf.feature_column.make_parse_example_spec(columns)
    ds = pipeline.input_fn(mode, ctx, global_batch_size=64, tabular=spec)

Each example's features (`FEATURES`; the image scaled to [0, 1], its 28 x 28 pixels cut
into a 4 x 4 grid of 7 x 7 cells, a cell "inked" when its mean is above `CELL_INK`):

- `ink` (float): the mean pixel. Numeric, bucketized.
- `height`, `width` (float): the rows, the columns, holding a pixel above 0.5.
- `center_row`, `center_col` (float): the ink's centroid (13.5 for a blank image).
- `quadrant` (string): the quadrant with the most ink, of `QUADRANTS` (`top_left`,
  `top_right`, `bottom_left`, `bottom_right`): a small vocabulary.
- `grid` (string): the inked cells as 16 characters of `0` and `1`: an open set, for a
  hash bucket or a cross.
- `strokes` (0 to 16 strings): the inked cells' names, `r<row>c<col>`: multivalent.
- `stroke_ink` (as many floats): each inked cell's mean: the weight of `strokes`.
- `pixels` (int): the pixels above 0.5, in tens, at most 29: an id for an identity column.

A scalar is one value per example (`tf.io.FixedLenFeature([1], ...)` parses it; a
`VarLenFeature` as a categorical column's spec asks gives a SparseTensor of one value per
row); `strokes` and `stroke_ink` are lists (`VarLenFeature`).
"""

from typing import Dict, Mapping, Tuple

import tensorflow as tf

GRID = 4  # Cells per side.
CELL = 28 // GRID
CELL_INK = 0.2
QUADRANTS = ("top_left", "top_right", "bottom_left", "bottom_right")
MAX_PIXEL_ID = 29

# Each feature's tf.train.Example list and whether it holds one value (else a list).
FEATURES: Dict[str, Tuple[tf.dtypes.DType, bool]] = {
    "ink": (tf.float32, True), "height": (tf.float32, True), "width": (tf.float32, True),
    "center_row": (tf.float32, True), "center_col": (tf.float32, True),
    "quadrant": (tf.string, True), "grid": (tf.string, True),
    "strokes": (tf.string, False), "stroke_ink": (tf.float32, False),
    "pixels": (tf.int64, True),
}
_LISTS = {tf.float32: ("FloatList", "float_list"), tf.string: ("BytesList", "bytes_list"),
          tf.int64: ("Int64List", "int64_list")}


def parse_spec() -> Dict[str, object]:
  """Every feature as parse_example takes it: scalars FixedLen([1]), lists VarLen."""
  return {name: tf.io.FixedLenFeature([1], dtype) if one else tf.io.VarLenFeature(dtype)
          for name, (dtype, one) in FEATURES.items()}


def features(image: tf.Tensor) -> Dict[str, tf.Tensor]:
  """One example's features (each a rank-1 tensor) from its image, float32 in [0, 1] of
  shape (28, 28, 1)."""
  pixels = image[..., 0]
  inked = pixels > 0.5
  rows = tf.reduce_any(inked, axis=1)
  cols = tf.reduce_any(inked, axis=0)
  total = tf.reduce_sum(pixels)
  index = tf.range(28, dtype=tf.float32)

  def centre(along: tf.Tensor) -> tf.Tensor:
    return tf.math.divide_no_nan(tf.reduce_sum(along * index), total) + tf.cast(
        total == 0, tf.float32) * 13.5

  cells = tf.reduce_mean(tf.reshape(pixels, [GRID, CELL, GRID, CELL]), axis=[1, 3])
  quadrants = tf.reshape(tf.reduce_sum(tf.reshape(pixels, [2, 14, 2, 14]), axis=[1, 3]), [4])
  flat = tf.reshape(cells, [-1])
  on = flat > CELL_INK
  names = tf.constant([f"r{r}c{c}" for r in range(GRID) for c in range(GRID)])
  return {
      "ink": tf.reshape(tf.reduce_mean(pixels), [1]),
      "height": tf.reshape(tf.reduce_sum(tf.cast(rows, tf.float32)), [1]),
      "width": tf.reshape(tf.reduce_sum(tf.cast(cols, tf.float32)), [1]),
      "center_row": tf.reshape(centre(tf.reduce_sum(pixels, axis=1)), [1]),
      "center_col": tf.reshape(centre(tf.reduce_sum(pixels, axis=0)), [1]),
      "quadrant": tf.gather(tf.constant(QUADRANTS), tf.reshape(tf.argmax(quadrants), [1])),
      "grid": tf.reshape(tf.strings.reduce_join(tf.where(on, "1", "0")), [1]),
      "strokes": tf.boolean_mask(names, on),
      "stroke_ink": tf.boolean_mask(flat, on),
      "pixels": tf.reshape(tf.minimum(
          tf.reduce_sum(tf.cast(inked, tf.int64)) // 10, MAX_PIXEL_ID), [1]),
  }


def _encode(message: str, fields, sizes, values) -> tf.Tensor:
  """One protocol buffer `message` with `fields` of `values` (`sizes` each), serialized."""
  sizes = tf.reshape(tf.stack([tf.cast(size, tf.int32) for size in sizes]), [1, -1])
  return tf.io.encode_proto(sizes, [v[tf.newaxis] for v in values], fields, message)[0]


def serialize(example: Mapping[str, tf.Tensor]) -> tf.Tensor:
  """One example's features as a serialized tf.train.Example, in TensorFlow ops (so in a
  tf.data map): each feature's list, its Feature, the Features map, the Example."""
  entries = []
  for name in sorted(example):
    values = tf.reshape(example[name], [-1])
    kind, field = _LISTS[values.dtype]
    listed = _encode(f"tensorflow.{kind}", ["value"], [tf.size(values)], [values])
    feature = _encode("tensorflow.Feature", [field], [1], [tf.reshape(listed, [1])])
    entries.append(_encode("tensorflow.Features.FeatureEntry", ["key", "value"], [1, 1],
                           [tf.constant([name]), tf.reshape(feature, [1])]))
  table = _encode("tensorflow.Features", ["feature"], [len(entries)], [tf.stack(entries)])
  return _encode("tensorflow.Example", ["features"], [1], [tf.reshape(table, [1])])


def check_spec(spec: Mapping[str, object]) -> None:
  """Raises ValueError naming each feature `spec` asks for that the table does not have,
  or asks for as another type."""
  for name, wanted in spec.items():
    if name not in FEATURES:
      raise ValueError(f"the tabular MNIST features have no {name!r}; they are "
                       f"{', '.join(FEATURES)} (data/mnist/tabular.py)")
    dtype, _ = FEATURES[name]
    if wanted.dtype != dtype:
      raise ValueError(f"the tabular feature {name!r} is {dtype.name}; the columns parse "
                       f"it as {wanted.dtype.name}")
