"""launch.version_parity: Keras on the newest TF against the Estimator on TF 2.15.1.

Needs both installs: this one (TF 2.15.1) and the newest-TF one's interpreter
in $NEWEST_TF_PYTHON (CI sets it; README, "Install").
"""

import json
import os
import subprocess

import pytest

from launch.proofs import runs
from launch.proofs import version_parity
from trainers.config import Config
from tests.conftest import ESTIMATOR_MISSING, run_module

NEWEST_TF_PYTHON = os.environ.get("NEWEST_TF_PYTHON")
needs_both_installs = pytest.mark.skipif(
    not NEWEST_TF_PYTHON or bool(ESTIMATOR_MISSING),
    reason="needs this TF 2.15.1 install and $NEWEST_TF_PYTHON, the python of a "
           "`pip install -e \".[tf221]\"` virtualenv")


@needs_both_installs
@pytest.mark.slow
def test_cli_trains_the_same_on_both_versions_and_each_serves_the_others_export(
    tiny_data_dir, tmp_path):
  out = tmp_path / "out"
  result = run_module("launch.version_parity", [
      # One worker: CI's time budget. The 2-worker table is in docs/parity.md (and the
      # newest stack's own suite trains 2 workers to 98%).
      f"--keras_python={NEWEST_TF_PYTHON}", "--workers=1", "--train_steps=3",
      f"--data_dir={tiny_data_dir}", f"--out={out}", "--timeout=300"], timeout=900)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  with open(out / "version_parity_report.json") as f:
    report = json.load(f)
  assert report["versions"]["new"] != report["versions"]["2.15"]
  names = [c["name"] for c in report["checks"]]
  assert all(c["passed"] for c in report["checks"])
  assert f"Overall: PASS ({len(names)}/{len(names)} checks)" in result.stdout
  # Each version serves both exports every request, bad ones too.
  for version in ("TF 2.15.1", "the newest TF"):
    for key in ("serving_default/labels", "predict/class_ids", "image:predict/logits",
                "malformed proto to predict"):
      assert any(key in n and n.endswith(f"served by {version}") for n in names), (key, version)
  assert "signature classification: method, inputs and outputs, estimator@2.15 vs keras@new" \
      in names

  # Negative control: exports of differently trained models are told apart,
  # in both versions (here: the Keras export against the run's initial weights).
  summaries = {version_parity.NEW_KERAS: runs.read_summary(
                   str(out / "1w" / version_parity.NEW_KERAS / "model")),
               version_parity.OLD_ESTIMATOR: runs.read_summary(
                   str(out / "1w" / version_parity.OLD_ESTIMATOR / "model"))}
  summaries[version_parity.OLD_ESTIMATOR]["export_dir"] = _untrained_export(tmp_path)
  checks = version_parity._cross_load(
      NEWEST_TF_PYTHON, runs.PYTHON, summaries,
      version_parity.Requests(str(out / "test_images.npy"), "image"), str(tmp_path),
      version_parity.LOGITS_ATOL)
  failed = {c.name for c in checks if not c.passed}
  for version in ("TF 2.15.1", "the newest TF"):
    assert (f"max |diff|, answers image:predict/logits, estimator@2.15 vs keras@new, served by "
            f"{version}") in failed


@pytest.mark.slow
@needs_both_installs
def test_an_estimator_model_dir_from_2_15_converts_and_resumes_on_the_newest_tf(
    tiny_data_dir, tmp_path):
  # The migration in one move: the Estimator's model_dir, written by TF 2.15.1,
  # carried across and trained on by Keras on the newest TF.
  estimator_dir, keras_dir = tmp_path / "estimator", tmp_path / "keras"
  flags = [f"--data_dir={tiny_data_dir}", "--global_batch_size=32", "--eval_batch_size=50",
           "--log_every_steps=1", "--checkpoint_every_steps=3"]
  trained = run_module("trainers.estimator_main",
                       [f"--model_dir={estimator_dir}", "--train_steps=3", *flags])
  assert trained.returncode == 0, trained.stderr[-3000:]
  for args in ([f"--from_estimator={estimator_dir}", f"--to_keras={keras_dir}"],
               [f"--model_dir={keras_dir}", "--train_steps=5", *flags]):
    module = "launch.convert" if "--from_estimator" in args[0] else "trainers.keras_main"
    result = subprocess.run([NEWEST_TF_PYTHON, "-m", module, *args], capture_output=True,
                            text=True, check=False, env=runs.clean_env(),
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
  summary = runs.read_summary(str(keras_dir))
  assert summary["global_step"] == 5
  starts = [r for r in runs.read_progress(str(keras_dir)) if r["event"] == "start"]
  assert [r["from_step"] for r in starts] == [3]


def _untrained_export(tmp_path) -> str:
  """A SavedModel with the serving signature, of the model before training."""
  from trainers import keras_trainer
  from trainers import model as model_lib
  model_dir = tmp_path / "untrained"
  model_dir.mkdir()
  config = Config(seed=7)
  return keras_trainer.export_model(config, model_lib.build(config), str(model_dir))


def test_a_keras_python_that_is_not_a_tf_install_is_a_usage_error(tmp_path):
  result = run_module("launch.version_parity", [f"--keras_python={tmp_path / 'nope'}",
                                                f"--out={tmp_path / 'out'}"], timeout=120)
  assert result.returncode == 2, result.stderr[-3000:]
  assert "--keras_python:" in result.stderr and "[tf221]" in result.stderr
  assert not (tmp_path / "out").exists()


def test_the_probe_reads_every_weight_of_a_keras_export_moving_statistics_too(tmp_path):
  import numpy as np  # noqa: PLC0415 -- as light as the rest of this file until here.
  from trainers import keras_trainer  # noqa: PLC0415
  from trainers import model as model_lib  # noqa: PLC0415

  config = Config(model="cnn_bn")
  model = model_lib.build(config)
  export_dir = keras_trainer.export_model(config, model, str(tmp_path / "model"))
  np.save(tmp_path / "images.npy", np.zeros((3, 28, 28, 1), np.float32))
  version_parity.probe_export(export_dir, str(tmp_path / "images.npy"), "image",
                              str(tmp_path / "p.npz"))
  with np.load(tmp_path / "p.npz") as probe:
    assert probe["answer:image:predict/logits"].shape == (3, 10)
    assert probe["answer:serving_default/labels"].shape == (3, 10)
    assert str(probe["error:malformed proto to predict"]).startswith("InvalidArgumentError")
    weights = {k[len("weight:"):] for k in probe.files if k.startswith("weight:")}
  assert weights == set(model_lib.get_weights(model))
  assert "bn1/moving_variance" in weights
