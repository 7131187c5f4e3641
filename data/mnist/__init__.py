"""MNIST, the dataset both backends train on: its facts here, and by module

  store.py     where TFDS keeps the prepared dataset, and whether it is there (no TensorFlow)
  idx.py       the IDX file reader (no TensorFlow)
  ready.py     `ensure_prepared` and `check_prepared`: the data made ready for a run, the
               builder loaded only when it is missing (no TensorFlow until then)
  build.py     the offline TFDS builder and the checked download, under one lock
  pipeline.py  the shared `input_fn(mode, input_context)` and the shards' fingerprints
  tabular.py   MNIST as a table: raw features derived from each image, as tf.Examples

A launcher checks the data before it starts any task, and it starts tasks sooner when it
has not imported TensorFlow (2 to 3 s here): importing this package, `store` or `ready`
imports none.
"""

TRAIN = "train"  # Same strings as tf.estimator.ModeKeys, without importing it:
EVAL = "eval"  # the Keras path must work on TensorFlow >= 2.16 too.
IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
# Each split's image and label files, as the IDX files are named (with or without .gz).
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
IDX_DIR_ENV = "MNIST_IDX_DIR"  # Local IDX files to prepare from, when no flag names them.
