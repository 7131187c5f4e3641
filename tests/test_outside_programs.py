"""Model_dirs of programs not written here (tests/programs/), carried into Keras as a team
would: each program trains as its own code does, as a 2-worker cluster of `launch.local`;
`launch.convert --inspect` proposes the map onto the model named; the conversion takes
that map; `keras_main` resumes the run from its step to the end.
"""

import json
import shutil
import sys

import pytest

from tests.conftest import REPO, run_module
from launch.proofs import runs

pytestmark = pytest.mark.estimator  # The programs are Estimator programs.

PROGRAMS = REPO / "tests" / "programs"
FIRST, END = 60, 160


def _train(program: str, model_dir, data_dir, tmp_path) -> None:
  """Runs tests/programs/<program> from its own directory, as a 2-worker cluster."""
  path = tmp_path / program
  shutil.copy(PROGRAMS / program, path)
  result = run_module("launch.local", [
      "--workers=2", "--max_restarts=0", "--timeout=600", f"--task_log_dir={tmp_path / 'logs'}",
      "--", sys.executable, str(path), f"--model_dir={model_dir}", f"--data_dir={data_dir}",
      f"--train_steps={FIRST}"], timeout=900)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _inspect(model_dir, model_flags):
  result = run_module("launch.convert", [f"--inspect={model_dir}", "--inspect_format=json",
                                         *model_flags])
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout)


def _carry_and_resume(model_dir, proposed, model_flags, data_dir, tmp_path):
  """Converts with the proposed map, then resumes in Keras to END; that run's summary."""
  map_path = tmp_path / "map.json"
  map_path.write_text(json.dumps(proposed))
  keras_dir = tmp_path / "keras"
  converted = run_module("launch.convert", [f"--from_estimator={model_dir}",
                                            f"--to_keras={keras_dir}",
                                            f"--assignment_map={map_path}", *model_flags])
  assert converted.returncode == 0, converted.stdout[-3000:] + converted.stderr[-3000:]
  assert f"Step: {FIRST}\n" in converted.stdout, converted.stdout
  resumed = run_module("trainers.keras_main", [f"--model_dir={keras_dir}",
                                               f"--train_steps={END}", f"--data_dir={data_dir}",
                                               "--noevaluator", *model_flags], timeout=900)
  assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
  starts = [r for r in runs.read_progress(str(keras_dir)) if r["event"] == "start"]
  assert [r["from_step"] for r in starts] == [FIRST], starts  # Went on from the step.
  return runs.read_summary(str(keras_dir))


@pytest.mark.slow
@pytest.mark.real_data
def test_an_own_model_fn_is_carried_with_the_proposed_map_and_resumed(real_data_dir,
                                                                      tmp_path):
  model_dir = tmp_path / "estimator"
  _train("own_model_fn.py", model_dir, real_data_dir, tmp_path)
  flags = ["--model=cnn", "--optimizer=sgd", "--learning_rate=0.1"]
  inspection = _inspect(model_dir, flags)
  # Keras's own layer names, matched by shape: each a guess, marked so.
  assert inspection["step"] == FIRST
  assert inspection["assignment_map"] == {
      "conv2d/kernel": "conv/kernel", "conv2d/bias": "conv/bias",
      "dense/kernel": "hidden/kernel", "dense/bias": "hidden/bias",
      "dense_1/kernel": "logits/kernel", "dense_1/bias": "logits/bias"}, inspection
  assert set(inspection["matched_by"].values()) == {"shape (guess)"}
  summary = _carry_and_resume(model_dir, inspection["assignment_map"], flags, real_data_dir,
                              tmp_path)
  assert summary["global_step"] == END, summary
  assert summary["test_accuracy"] >= 0.85, summary  # 0.899 to 0.92 in runs here.


# A canned DNN's conversion is in every run: tests/launch/convert/test_canned.py's dnn case.
@pytest.mark.extended
@pytest.mark.slow
@pytest.mark.real_data
def test_a_canned_dnn_classifier_of_its_own_settings_is_carried_and_resumed(real_data_dir,
                                                                           tmp_path):
  model_dir = tmp_path / "estimator"
  _train("canned_dnn.py", model_dir, real_data_dir, tmp_path)
  # Inspected first as a user who knows only the directory: it tells the twin's flags,
  # but for the feature's name, which a DNN keeps no variable of. Its rate is the TF2
  # class's default (tf_keras's Adagrad's), not --model=dnn's (tf.compat.v1's 0.05).
  told = _inspect(model_dir, [])["canned_flags"]
  assert told == ["--model=dnn", "--hidden_units=32,16", "--dnn_learning_rate=0.001"], told
  flags = [*told, "--feature_name=pixels"]
  inspection = _inspect(model_dir, flags)
  kinds = {v["name"]: v["kind"] for v in inspection["variables"]}
  assert kinds["training/Adagrad/dnn/hiddenlayer_1/kernel/accumulator"] == "slot"
  assert kinds["training/Adagrad/learning_rate"] == "hyperparameter"
  # The canned names are the twin's: nothing to map, nothing guessed.
  assert inspection["assignment_map"] == {} and not inspection["unfilled"], inspection
  assert set(inspection["matched_by"].values()) == {"name"}
  summary = _carry_and_resume(model_dir, inspection["assignment_map"], flags, real_data_dir,
                              tmp_path)
  assert summary["global_step"] == END, summary
  # At the TF2 class's rate the model learns slowly (0.15 at step 160 here, 0.84 after 1500:
  # docs/training.md): above chance is what 160 steps show.
  assert summary["test_accuracy"] > 0.12, summary


@pytest.mark.slow
@pytest.mark.real_data
def test_a_v1_linear_classifier_is_carried_to_its_v1_twin_and_resumed(real_data_dir,
                                                                     tmp_path):
  model_dir = tmp_path / "estimator"
  _train("v1_linear.py", model_dir, real_data_dir, tmp_path)
  flags = _inspect(model_dir, [])["canned_flags"]  # Told by the checkpoint alone.
  assert flags == ["--model=linear_v1", "--feature_name=pixels"], flags
  inspection = _inspect(model_dir, flags)
  kinds = {v["name"]: (v["kind"], v["of"]) for v in inspection["variables"]}
  # The v1 Ftrl's slots, under the scope the canned model_fn minimizes in.
  assert kinds["linear/linear/linear_model/pixels/weights/Ftrl_1"] == (
      "slot", "linear/linear_model/pixels/weights"), kinds
  assert inspection["assignment_map"] == {} and not inspection["unfilled"], inspection
  summary = _carry_and_resume(model_dir, inspection["assignment_map"], flags, real_data_dir,
                              tmp_path)
  assert summary["global_step"] == END, summary
  # At the TF2 class's rate the model learns slowly (0.15 at step 160 here, 0.84 after 1500:
  # docs/training.md): above chance is what 160 steps show.
  assert summary["test_accuracy"] > 0.12, summary
