"""The serving contract (trainers/serving.py) and its proof (launch/tools/serving_check.py):
both backends' exports answer the Estimator's tf.Example signatures alike."""

import dataclasses
import json
import shutil

import numpy as np
import pytest
import tensorflow as tf

from data import mnist
from launch.tools import harness
from launch.tools import serving_check
from tests.conftest import ESTIMATOR_MISSING, memory_input_fn, run_module
from trainers import keras_trainer
from trainers import loop
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
needs_estimator = pytest.mark.skipif(bool(ESTIMATOR_MISSING), reason=str(ESTIMATOR_MISSING))


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
  got = serving_check.answers(export_dir, [images], "pixels")
  logits = model(images, training=False).numpy()
  np.testing.assert_allclose(got["predict/logits"], logits, atol=1e-5)
  np.testing.assert_allclose(got["image:predict/logits"], logits, atol=1e-5)
  np.testing.assert_array_equal(got["predict/class_ids"][:, 0], logits.argmax(-1))
  np.testing.assert_array_equal(got["serving_default/labels"][0], [str(i) for i in range(10)])
  np.testing.assert_allclose(got["classification/scores"], tf.nn.softmax(logits), atol=1e-6)
  errors = serving_check.bad_request_errors(export_dir, "pixels")
  assert len(errors) == 6 and all(e.startswith("InvalidArgumentError") for e in errors.values())


@needs_estimator
@pytest.mark.parametrize("model", ["cnn", "dnn"])
def test_both_backends_serve_the_same_contract_and_answers(model, tmp_path):
  from trainers import estimator_trainer  # noqa: PLC0415 -- absent after TF 2.15.
  # A canned model's feature named otherwise: the contract's feature is --feature_name.
  config = dataclasses.replace(CONFIG, model=model,
                               **({"feature_name": "pixels"} if model == "dnn" else {}))
  config = harness.prepare(config, str(tmp_path))
  summary = loop.train_and_evaluate(estimator_trainer.Backend, config, str(tmp_path / "est"),
                                    strategy=tf.distribute.MirroredStrategy(["/cpu:0"]),
                                    input_fn=memory_input_fn(config.global_batch_size))
  weights = harness.backend_weights("estimator", summary, config)
  keras_dir = _keras_export(config, weights, tmp_path / "keras")
  assert serving_check.signatures(summary["export_dir"]) == CONTRACT
  checks = serving_check.compare(summary["export_dir"], keras_dir, _batches,
                                 serving.feature_name(config), atol=1e-5, names=NAMES)
  assert all(c.passed for c in checks), harness.format_checks("serving", checks)
  names = " ".join(c.name for c in checks)
  for key in ("serving_default/labels", "predict/class_ids", "image:predict/logits",
              "missing feature", "wrong dtype", "malformed proto"):
    assert key in names

  # The checks can fail: another weight, and an export without the Classify method.
  moved = {k: v + (0.01 if k.endswith("bias") else 0.0) for k, v in weights.items()}
  checks = serving_check.compare(summary["export_dir"], _keras_export(config, moved,
                                                                     tmp_path / "moved"),
                                 _batches, serving.feature_name(config), atol=1e-5)
  failed = {c.name.split(",")[0] for c in checks if not c.passed}
  assert "max |diff|" in failed and not any(c.name.startswith("signature ") for c in checks
                                            if not c.passed)
  unmarked = str(tmp_path / "unmarked")
  shutil.copytree(keras_dir, unmarked)
  model_ = model_lib.build(config, weights)
  tf.saved_model.save(model_, unmarked, signatures=serving.keras_signatures(
      model_, serving.feature_name(config)))
  bad = serving_check.compare_signatures(serving_check.signatures(summary["export_dir"]),
                                         serving_check.signatures(unmarked), NAMES)
  assert {c.name.split(":")[0] for c in bad if not c.passed} == {
      "signature serving_default", "signature classification"}


def test_cli_passes_exports_of_one_model_and_fails_another(tiny_data_dir, tmp_path):
  config = Config(seed=1)
  weights = model_lib.get_weights(model_lib.build(config))
  one, again = (_keras_export(config, weights, tmp_path / name) for name in ("one", "again"))
  other = _keras_export(Config(seed=2), None, tmp_path / "other")
  flags = [f"--data_dir={tiny_data_dir}", f"--out={tmp_path / 'report'}"]

  result = run_module("launch.serving_check", [f"--first={one}", f"--second={again}", *flags])
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  report = json.loads((tmp_path / "report" / "serving_check_report.json").read_text())
  assert report["passed"] and len(report["checks"]) == 27
  assert "Overall: PASS (27/27 checks)" in result.stdout

  result = run_module("launch.serving_check", [f"--first={one}", f"--second={other}", *flags])
  assert result.returncode == 1 and "| max |diff|, answers predict/logits, first vs second " \
      "| FAIL |" in result.stdout

  result = run_module("launch.serving_check", [f"--first={tmp_path}", f"--second={one}", *flags])
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert f"--first={tmp_path} holds no SavedModel (saved_model.pb)" in result.stderr
