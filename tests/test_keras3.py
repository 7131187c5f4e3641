"""Keras 3 cannot train under MultiWorkerMirroredStrategy: why this project stays on tf-keras.

Upstream: keras-team/keras issue 20585 (open). Skipped unless Keras 3 is
installed (the newest-TF stack installs it beside tf-keras). If this test
starts failing because the fit succeeds, Keras 3 has gained MWMS support:
update docs/MIGRATION.md, "Landing on TF 2.16+".
"""

import textwrap

import pytest

from tests.conftest import run_in_local_cluster

keras = pytest.importorskip("keras", reason="Keras 3 is not installed (the TF 2.15.1 stack)")
if int(keras.__version__.split(".")[0]) < 3:
  pytest.skip(f"keras {keras.__version__} is Keras 2", allow_module_level=True)

# The TensorFlow tutorial's multi-worker pattern, tiny: Keras 3's own Model.fit.
SCRIPT = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf
    import keras

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x = np.random.default_rng(0).random((64, 28, 28, 1), dtype=np.float32)
    y = (np.arange(64) % 10).astype("int64")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)
    with strategy.scope():
      model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                                keras.layers.Dense(10)])
      model.compile(optimizer="sgd",
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(dataset, epochs=1, steps_per_epoch=2, verbose=2)
    print("KERAS3 FIT DONE", flush=True)
""")


def test_keras3_fit_fails_under_multi_worker_mirrored_strategy(tmp_path):
  rc, log = run_in_local_cluster(SCRIPT, tmp_path)
  assert rc != 0 and "KERAS3 FIT DONE" not in log
  # The upstream issue's error: Keras 3's fit hands a PerReplica value to an op.
  assert "ValueError: Attempt to convert a value (PerReplica:" in log, log[-3000:]
  assert "with an unsupported type (<class 'tensorflow.python.distribute.values.PerReplica'>)" \
      " to a Tensor" in log
