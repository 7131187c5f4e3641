"""A team's own Estimator program (docs/examples/team_estimator.py, named by team_program.py)
trained by the project as it is, and its Keras port (team_port.py) held to it by
launch.parity, run as a user runs them; each bad input exits 2 naming the fix.

docs/MIGRATION.md, "Prove your port", cites these tests.
"""

import json
import os
import pathlib

import pytest

from tests.conftest import REPO, run_module

EXAMPLES = REPO / "docs" / "examples"
PORT_FLAGS = ["--estimator_program=team_program:PROGRAM", "--model=team_port:SPEC",
              f"--assignment_map={EXAMPLES / 'team_map.json'}", "--optimizer=adam",
              "--learning_rate=1e-4", "--learning_rate_schedule=constant"]

pytestmark = [pytest.mark.estimator, pytest.mark.real_data]


def _env(data_dir: str, *paths: pathlib.Path) -> dict:
  """The team's input_fn reads TFDS's default directory, $TFDS_DATA_DIR."""
  return {"TFDS_DATA_DIR": data_dir,
          "PYTHONPATH": os.pathsep.join(map(str, (EXAMPLES, *paths)))}


def _error(result) -> str:
  """What a refused run said: one line, no traceback."""
  assert result.returncode == 2, result.stdout + result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  return result.stderr


def test_the_estimator_trains_the_teams_program_as_it_is(real_data_dir, tmp_path):
  model_dir = tmp_path / "team"
  args = ["--estimator_program=team_program:PROGRAM", f"--model_dir={model_dir}",
          "--train_steps=20", "--checkpoint_every_steps=10", "--log_every_steps=10",
          f"--data_dir={real_data_dir}"]
  result = run_module("trainers.estimator_main", args, env=_env(real_data_dir))
  assert result.returncode == 0, result.stderr[-3000:]
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  # Their eval_metric_ops, every one, and their export through their receiver.
  assert sorted(summary["test_metrics"]) == ["accuracy", "loss", "mean_true_probability"]
  assert summary["test_accuracy"] == summary["test_metrics"]["accuracy"] > 0.2
  assert (pathlib.Path(summary["export_dir"]) / "saved_model.pb").exists()
  record = json.loads((model_dir / "run.json").read_text())
  assert (record["estimator_program"], record["optimizer"]) == ("team_program:PROGRAM",
                                                                "program")
  # Their run config's retention, and a resume of their checkpoint by name.
  resumed = run_module("trainers.estimator_main", [*args[:2], "--train_steps=30", *args[3:]],
                       env=_env(real_data_dir))
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert json.loads(resumed.stdout.strip().splitlines()[-1])["global_step"] == 30
  assert "Training from step 20 to 30" in resumed.stderr


@pytest.mark.slow
def test_parity_passes_for_the_example_at_one_worker(real_data_dir, tmp_path):
  result = run_module("launch.parity", ["--workers=1", *PORT_FLAGS, "--long_steps=20",
                                        f"--data_dir={real_data_dir}", f"--out={tmp_path}"],
                      env=_env(real_data_dir))
  assert result.returncode == 0, result.stdout + result.stderr[-3000:]
  report = json.loads((tmp_path / "parity_report.json").read_text())
  checks = {c["name"]: c for c in report["checks"]}
  assert checks["max |weight diff| keras vs estimator"]["measured"] <= 1e-6
  assert checks["names: every program variable mapped, every port weight given one"][
      "where"].startswith("sequential/conv2d/bias -> conv/bias")
  assert "adam (beta1=0.9, beta2=0.999, epsilon=1e-08); rate 1e-04" in checks[
      "recipe: optimizer, hyperparameters and rate, program vs port"]["where"]
  assert any("mean_true_probability" in note for note in report["notes"])


@pytest.mark.slow
def test_a_port_with_another_activation_fails_the_weight_checks(real_data_dir, tmp_path):
  (tmp_path / "tanh_port.py").write_text(
      "import tf_keras\nimport team_port\nfrom trainers.model import ModelSpec\n\n"
      "def build(seed, init, dropout=0.3):\n"
      "  model = team_port.build(seed, init, dropout)\n"
      "  model.get_layer('hidden').activation = tf_keras.activations.tanh\n"
      "  return model\n\n"
      "SPEC = ModelSpec('tanh_port', build, {'dropout': 0.3}, "
      "deterministic_options={'dropout': 0.0})\n")
  flags = [f if not f.startswith("--model=") else "--model=tanh_port:SPEC" for f in PORT_FLAGS]
  result = run_module("launch.parity", ["--workers=1", *flags, "--long_steps=0",
                                        f"--data_dir={real_data_dir}",
                                        f"--out={tmp_path / 'out'}"],
                      env=_env(real_data_dir, tmp_path))
  assert result.returncode == 1, result.stdout + result.stderr[-3000:]
  report = json.loads((tmp_path / "out" / "parity_report.json").read_text())
  failed = {c["name"] for c in report["checks"] if not c["passed"]}
  assert {"max |weight diff| keras vs estimator", "max |weight diff| reference vs estimator",
          "per-step loss rel diff keras vs estimator"} <= failed, failed
  assert "max |weight diff| reference vs keras" not in failed  # The port is what differs.


BROKEN_PROGRAM = '''
import team_estimator
from trainers.program import EstimatorProgram


def model_fn(features, labels, mode, params):
  return team_estimator.model_fn({"pixels": features["pixel"]}, labels, mode, params)


PROGRAM = EstimatorProgram(model_fn, team_estimator.PARAMS, team_estimator.input_fn)
'''


def test_each_bad_input_exits_2_naming_the_fix_and_writes_nothing(real_data_dir, tmp_path):
  (tmp_path / "broken_program.py").write_text(BROKEN_PROGRAM)
  env = _env(real_data_dir, tmp_path)
  model_dir, out = tmp_path / "model", tmp_path / "out"
  data = f"--data_dir={real_data_dir}"
  said = _error(run_module("trainers.estimator_main", [
      "--estimator_program=team_programs:PROGRAM", f"--model_dir={model_dir}", data], env=env))
  assert "estimator program 'team_programs:PROGRAM': no module team_programs" in said
  said = _error(run_module("trainers.estimator_main", [
      "--estimator_program=broken_program:PROGRAM", f"--model_dir={model_dir}", data], env=env))
  assert ("--estimator_program=broken_program:PROGRAM: its model_fn built the train graph and "
          "failed: KeyError: 'pixel' (at " + str(tmp_path / "broken_program.py") + ":7, in "
          "model_fn). Fix it there") in said
  said = _error(run_module("trainers.keras_main", [
      "--estimator_program=team_program:PROGRAM", "--model=cnn", f"--model_dir={model_dir}",
      data], env=env))
  assert ("its input_fn gives features {'pixels': (100, 28, 28, 1)}, which --model=cnn does "
          "not take: its inputs are {'image': (None, 28, 28, 1)}") in said
  parity = ["--workers=1", f"--out={out}", data]
  said = _error(run_module("launch.parity", [
      *parity, *[f for f in PORT_FLAGS if not f.startswith("--assignment_map")]], env=env))
  assert "6 variable(s) map to no model weight" in said and '"sequential/conv2d/kernel": ' \
      '"conv/kernel"' in said
  said = _error(run_module("launch.parity", [
      *parity, *[f if f != "--learning_rate=1e-4" else "--learning_rate=1e-3"
                 for f in PORT_FLAGS]], env=env))
  assert ("trains step 1 at the rate 1e-04, the port at 0.001 (--learning_rate_schedule="
          "constant, --learning_rate=0.001)") in said
  assert not model_dir.exists() and not out.exists()


@pytest.mark.extended  # The same proof for a tf.compat.v1.layers program that reads params.
@pytest.mark.slow
def test_parity_passes_for_a_v1_layers_program_reading_params(real_data_dir, tmp_path):
  result = run_module("launch.parity", [
      "--workers=1", "--estimator_program=legacy_program:PROGRAM", "--model=my_model:SPEC",
      "--optimizer=momentum", "--learning_rate=0.05", "--decay_steps=2000", "--long_steps=20",
      f"--data_dir={real_data_dir}", f"--out={tmp_path}"], env=_env(real_data_dir))
  assert result.returncode == 0, result.stdout + result.stderr[-3000:]
