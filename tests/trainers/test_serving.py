"""The serving contract (trainers/serving.py): the canned head's predictions, and the Keras
export's signatures and answers."""

import dataclasses

import numpy as np
import tensorflow as tf

from data import mnist
from launch.proofs import serving_check
from tests.conftest import memory_input_fn
from trainers import keras_trainer
from trainers import model as model_lib
from trainers import serving
from trainers.config import Config

CONFIG = Config(train_steps=4, global_batch_size=32, eval_batch_size=50, log_every_steps=2,
                checkpoint_every_steps=2, deterministic=True)
NAMES = ("estimator", "keras")
_S, _F, _I32, _I64 = "string", "float32", "int32", "int64"
PREDICT_OUTPUTS = (("all_class_ids", _I32, (-1, 10)), ("all_classes", _S, (-1, 10)),
                   ("class_ids", _I64, (-1, 1)), ("classes", _S, (-1, 1)),
                   ("logits", _F, (-1, 10)), ("probabilities", _F, (-1, 10)))
CLASSIFY = serving_check.Signature(tf.saved_model.CLASSIFY_METHOD_NAME,
                                   (("inputs", _S, (-1,)),),
                                   (("classes", _S, (-1, 10)), ("scores", _F, (-1, 10))))
# The canned DNNClassifier's export, as read here (TF 2.15.1), and the image alternative.
CONTRACT = {
    "serving_default": CLASSIFY,
    "classification": CLASSIFY,
    "predict": serving_check.Signature(tf.saved_model.PREDICT_METHOD_NAME,
                                       (("examples", _S, (-1,)),), PREDICT_OUTPUTS),
    "image:predict": serving_check.Signature(tf.saved_model.PREDICT_METHOD_NAME,
                                             (("image", _F, (-1, 28, 28, 1)),), PREDICT_OUTPUTS),
}


def _batches():
  images, _ = next(iter(memory_input_fn(CONFIG.global_batch_size)(mnist.EVAL)))
  return [images.numpy()[:30], images.numpy()[30:]]


def _keras_export(config, weights, directory):
  model = model_lib.build(config, weights)
  return keras_trainer.export_model(config, model, str(directory))


def test_predictions_are_the_canned_heads():
  logits = tf.constant([[0.1, 2.0] + [0.0] * 8, [3.0] + [0.0] * 9])
  got = serving.predictions(logits)
  np.testing.assert_array_equal(got["class_ids"], [[1], [0]])
  np.testing.assert_array_equal(got["classes"], [[b"1"], [b"0"]])
  np.testing.assert_array_equal(got["all_class_ids"], [list(range(10))] * 2)
  np.testing.assert_array_equal(got["all_classes"], [[str(i).encode() for i in range(10)]] * 2)
  np.testing.assert_allclose(got["probabilities"], tf.nn.softmax(logits))
  assert serving.classify_outputs(got).keys() == {"classes", "scores"}


def test_the_keras_export_has_the_contract_and_answers_requests(tmp_path):
  config = dataclasses.replace(CONFIG, model="dnn", hidden_units="16", feature_name="pixels")
  model = model_lib.build(config)
  export_dir = keras_trainer.export_model(config, model, str(tmp_path))
  assert serving_check.signatures(export_dir) == CONTRACT
  images = _batches()[0]
  loaded = tf.saved_model.load(export_dir)
  got = serving_check.answers(loaded, [images], "pixels")
  logits = model(images, training=False).numpy()
  np.testing.assert_allclose(got["predict/logits"], logits, atol=1e-5)
  np.testing.assert_allclose(got["image:predict/logits"], logits, atol=1e-5)
  np.testing.assert_array_equal(got["predict/class_ids"][:, 0], logits.argmax(-1))
  np.testing.assert_array_equal(got["serving_default/labels"][0], [str(i) for i in range(10)])
  np.testing.assert_allclose(got["classification/scores"], tf.nn.softmax(logits), atol=1e-6)
  errors = serving_check.bad_request_errors(loaded, "pixels")
  assert len(errors) == 6 and all(e.startswith("InvalidArgumentError") for e in errors.values())


def test_a_ports_own_signatures_get_the_methods_the_estimator_gives_them(tmp_path):
  config = dataclasses.replace(CONFIG, model="tests.signed_port:SPEC")
  found = serving_check.signatures(_keras_export(config, None, tmp_path))
  assert {name: s.method for name, s in found.items()} == {
      "serving_default": tf.saved_model.CLASSIFY_METHOD_NAME,
      "regression": tf.saved_model.REGRESS_METHOD_NAME,
      "predict": tf.saved_model.PREDICT_METHOD_NAME}
  assert str(found["serving_default"]) == ("classify: inputs string [-1] -> classes string "
                                           "[-1, 10], scores float32 [-1, 10]")
