"""trainers.model: fixed names, seeded or given initial weights, the export's outputs."""

import numpy as np
import tensorflow as tf

from trainers import model as model_lib

NAMES = ["conv/kernel", "conv/bias", "hidden/kernel", "hidden/bias", "logits/kernel",
         "logits/bias"]


def test_names_are_fixed_and_the_seed_fixes_the_weights():
  a, b, c = (model_lib.get_weights(model_lib.build_model(seed)) for seed in (1, 1, 2))
  assert list(a) == NAMES
  assert all(np.array_equal(a[n], b[n]) for n in NAMES)
  assert not np.array_equal(a["conv/kernel"], c["conv/kernel"])
  # Built again in a graph (as the Estimator does), the names are the same.
  with tf.Graph().as_default():
    assert [model_lib.weight_name(w) for w in model_lib.build_model(1).weights] == NAMES


def test_initial_weights_round_trip_through_npz(tmp_path):
  weights = model_lib.get_weights(model_lib.build_model(3))
  path = str(tmp_path / "init.npz")
  model_lib.save_weights_npz(path, weights)
  rebuilt = model_lib.get_weights(model_lib.build_model(0, model_lib.load_weights_npz(path)))
  assert all(np.array_equal(rebuilt[n], weights[n]) for n in NAMES)


def test_serving_outputs_and_eval_sums():
  model = model_lib.build_model(1)
  images = tf.random.stateless_uniform((5, 28, 28, 1), seed=(1, 2))
  labels = tf.constant([0, 1, 2, 3, 4], tf.int64)
  outputs = model_lib.serving_outputs(model(images))
  assert set(outputs) == {"classes", "probabilities", "logits"}
  np.testing.assert_allclose(tf.reduce_sum(outputs["probabilities"], -1), np.ones(5), rtol=1e-6)
  loss_sum, correct, count = model_lib.eval_sums(model, images, labels).numpy()
  logits = model(images)
  want = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
  np.testing.assert_allclose(loss_sum, float(tf.reduce_sum(want)), rtol=1e-5)
  assert count == 5 and correct == int(tf.reduce_sum(tf.cast(
      tf.argmax(logits, -1) == labels, tf.int32)))
