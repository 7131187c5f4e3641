"""The built-in feature columns of the tabular features (data/mnist/tabular.py), of the
kinds a census model has: bucketized numbers, a vocabulary and a hashed open set, a
crossed pair and weighted multivalent strings in the wide (linear) part; numbers,
an indicator and embeddings in the deep (dnn) part.

    python -m trainers.keras_main --model=wide_deep --features=tabular
    python -m trainers.estimator_main --model=linear --features=tabular

A team's own columns take their place with `--feature_columns=package.module:NAME`, a list
(every part reads it) or a dict of lists by part, as `COLUMNS` here.
"""

import tensorflow as tf

from data.mnist import tabular

fc = tf.feature_column
_CELLS = [f"r{row}c{col}" for row in range(tabular.GRID) for col in range(tabular.GRID)]


def _scaled(key: str):
  """A length in pixels, as a fraction of the image's side."""
  return fc.numeric_column(key, normalizer_fn=lambda pixels: pixels / 28.0)


_ink = fc.numeric_column("ink")
_quadrant = fc.categorical_column_with_vocabulary_list("quadrant", tabular.QUADRANTS,
                                                       num_oov_buckets=1)
_strokes = fc.categorical_column_with_vocabulary_list("strokes", _CELLS)
_grid = fc.categorical_column_with_hash_bucket("grid", 1000)

COLUMNS = {
    "linear": [
        fc.bucketized_column(_ink, [0.06, 0.09, 0.12, 0.15, 0.18, 0.21]),
        fc.bucketized_column(fc.numeric_column("height"), [12.0, 16.0, 18.0, 20.0]),
        fc.bucketized_column(fc.numeric_column("width"), [6.0, 10.0, 14.0, 18.0]),
        _quadrant,
        _grid,
        fc.crossed_column(
            ["quadrant", fc.bucketized_column(fc.numeric_column("center_row"),
                                              [11.0, 13.0, 15.0, 17.0])], 100),
        fc.weighted_categorical_column(_strokes, "stroke_ink"),
    ],
    "dnn": [
        _ink,
        _scaled("height"), _scaled("width"), _scaled("center_row"), _scaled("center_col"),
        fc.indicator_column(_quadrant),
        fc.embedding_column(_strokes, 8, combiner="mean"),
        fc.embedding_column(_grid, 8, combiner="sqrtn"),
        fc.embedding_column(fc.categorical_column_with_identity(
            "pixels", tabular.MAX_PIXEL_ID + 1), 4),
    ],
}
