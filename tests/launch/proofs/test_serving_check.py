"""The serving check (launch/proofs/serving_check.py and its binary): both backends' exports
answer the Estimator's tf.Example signatures alike, and the check fails when they do not."""

import dataclasses
import json
import shutil

import numpy as np
import pytest
import tensorflow as tf

from data import mnist
from launch.proofs import harness
from launch.proofs import serving_check
from tests.conftest import ESTIMATOR_MISSING, memory_input_fn, run_module
from tests.trainers.test_serving import CONFIG, CONTRACT, NAMES, _batches, _keras_export
from trainers import keras_trainer
from trainers import loop
from trainers import model as model_lib
from trainers import serving
from trainers.config import Config

needs_estimator = pytest.mark.skipif(bool(ESTIMATOR_MISSING), reason=str(ESTIMATOR_MISSING))


@pytest.mark.slow
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


@pytest.mark.slow
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
  # Its own lines only: TFDS's and the SavedModel loader's INFO lines are for -v 1.
  assert "Serving: loading" in result.stderr and "dataset_info.py" not in result.stderr
  bad_requests = [c["name"] for c in report["checks"] if c["name"].startswith("bad request, ")]
  assert "Overall: PASS (27/27 checks)" in result.stdout

  result = run_module("launch.serving_check", [f"--first={one}", f"--second={other}", *flags])
  assert result.returncode == 1 and "FAIL  max |diff|, answers predict/logits, first vs " \
      "second: " in result.stdout
  # Another model's export keeps the contract: a client could switch to it unchanged.
  result = run_module("launch.serving_check", [f"--first={one}", f"--second={other}",
                                               "--contract_only", *flags])
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  checks = json.loads((tmp_path / "report" / "serving_check_report.json").read_text())["checks"]
  names = [c["name"] for c in checks]
  assert not any("diff" in n or "answered differently" in n for n in names), names
  structure = next(c for c in checks if c["name"].startswith("answers' outputs, dtypes"))
  assert structure["where"] == "16 outputs, 200 test images" and structure["measured"] == 0
  assert [n for n in names if n.startswith("bad request, ")] == bad_requests
  assert result.stdout.startswith(f"Serving contract: {one} (first)")

  result = run_module("launch.serving_check", [f"--first={tmp_path}", f"--second={one}", *flags])
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert f"--first={tmp_path} holds no SavedModel (saved_model.pb)" in result.stderr


def test_exports_of_a_ports_own_signatures_are_held_output_by_output(tmp_path):
  config = Config(model="tests.signed_port:SPEC")
  built = model_lib.build(config)
  exports = {}
  for name, scale in (("one", 1.0), ("same", 1.0), ("other", 1.01)):
    model = model_lib.build(config, {k: v * scale for k, v in model_lib.get_weights(built).items()})
    exports[name] = keras_trainer.export_model(config, model, str(tmp_path / name))
  images = next(iter(memory_input_fn(32)(mnist.EVAL)))[0].numpy()

  def batches():
    return [{"pixels": images[:20]}, {"pixels": images[20:]}]

  same = serving_check.compare_exports(exports["one"], exports["same"], batches, 1e-5,
                                       ("one", "same"))
  assert all(c.passed for c in same), [c for c in same if not c.passed]
  # Every signature fed: the string inputs the batch as serialized tf.Examples of `pixels`.
  fed = next(c for c in same if c.name.startswith("signatures fed"))
  assert fed.where == f"predict, regression, serving_default: {len(images)} examples"
  other = {c.name: c for c in serving_check.compare_exports(
      exports["one"], exports["other"], batches, 1e-5, ("one", "other"))}
  assert other["signature serving_default: method, inputs and outputs, one vs other"].passed
  assert not other["max |diff|, answers predict/logits, one vs other"].passed
  assert not other["max |diff|, answers serving_default/scores, one vs other"].passed
  # Their contract alike, and a contract that differs: an output of another shape.
  contract = serving_check.compare_exports(exports["one"], exports["other"], batches, 1e-5,
                                           ("one", "other"), values=False)
  assert all(c.passed for c in contract), [c for c in contract if not c.passed]
  answers = serving_check.export_answers(tf.saved_model.load(exports["one"]), batches())[0]
  cut = {**answers, "predict/logits": answers["predict/logits"][:, :5]}
  (check,) = serving_check.compare_structure(answers, cut, ("one", "cut"), "here")
  assert not check.passed and check.measured == 1
  assert check.where == f"predict/logits: float32 [{len(images)}, 10] vs float32 [{len(images)}, 5]"


def test_tabular_requests_are_sent_again_without_lists_out_of_vocabulary_and_empty():
  from data.mnist import tabular  # noqa: PLC0415
  images = np.zeros((3, 28, 28, 1), np.float32)
  images[:, :14, :14] = 1.0  # Inked: strokes r0c0, r0c1, r1c0, r1c1.
  spec = tabular.parse_spec()
  batch = (images, serving_check.examples(images, "image", spec))
  edges = serving_check._tabular_edges(batch, spec)
  assert sorted(edges) == ["lists empty", "lists missing", "strings out of vocabulary"]
  for case, (_, examples) in edges.items():
    parsed = tf.io.parse_example([e.SerializeToString() for e in examples], spec)
    strokes = parsed["strokes"].values.numpy().tolist()
    if case == "strings out of vocabulary":
      assert strokes[:4] == [b"unseen-r0c0", b"unseen-r0c1", b"unseen-r1c0", b"unseen-r1c1"]
      assert parsed["quadrant"].numpy()[0, 0] == b"unseen-top_left"
    else:  # Missing or empty, a VarLenFeature parses to no values.
      assert strokes == [] and parsed["stroke_ink"].values.numpy().size == 0
      assert "strokes" in examples[0].features.feature or case == "lists missing"
    assert parsed["ink"].numpy()[0, 0] == pytest.approx(0.25)  # Scalars untouched.


@pytest.mark.slow
def test_cli_sends_tabular_examples_to_exports_over_feature_columns(tiny_data_dir, tmp_path):
  config = Config(model="wide_deep", features="tabular", hidden_units="8", seed=1)
  weights = model_lib.get_weights(model_lib.build(config))
  one, again = (_keras_export(config, weights, tmp_path / name) for name in ("one", "again"))
  other = _keras_export(dataclasses.replace(config, seed=2), None, tmp_path / "other")
  flags = [f"--data_dir={tiny_data_dir}", "--features=tabular"]

  result = run_module("launch.serving_check", [f"--first={one}", f"--second={again}", *flags,
                                               f"--out={tmp_path / 'report'}"])
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  names = [c["name"] for c in json.loads(
      (tmp_path / "report" / "serving_check_report.json").read_text())["checks"]]
  for case in ("lists missing", "strings out of vocabulary", "lists empty"):
    assert any(case in n for n in names), (case, names)
  result = run_module("launch.serving_check", [f"--first={one}", f"--second={other}", *flags])
  assert result.returncode == 1 and "\nFAIL  " in result.stdout

  for bad, said in ((["--feature_columns=nowhere:COLUMNS"], "nowhere"),
                    (["--features=image", "--feature_columns=x:Y"], "only with --features")):
    result = run_module("launch.serving_check", [f"--first={one}", f"--second={again}",
                                                 *flags, *bad])
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert said in result.stderr, result.stderr[-3000:]
