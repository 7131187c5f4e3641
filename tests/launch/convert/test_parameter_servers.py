"""A parameter-server model_dir carried across by python -m launch.convert: an Estimator's to
Keras on parameter servers and on MultiWorkerMirroredStrategy, and each back."""

import json

import pytest

from tests.conftest import ESTIMATOR_MISSING, run_module

if ESTIMATOR_MISSING:
  pytest.skip(ESTIMATOR_MISSING, allow_module_level=True)

STEPS = 3
TRAIN_FLAGS = ["--global_batch_size=32", "--eval_batch_size=50", "--log_every_steps=1",
               f"--checkpoint_every_steps={STEPS}"]


def _train(module: str, model_dir, data_dir: str, steps: int, *extra: str) -> dict:
  """The run's summary; it went on from where the model_dir stood (STEPS below `steps`)."""
  result = run_module(module, [f"--model_dir={model_dir}", f"--data_dir={data_dir}",
                               f"--train_steps={steps}", *TRAIN_FLAGS, *extra], timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"Training from step {steps - STEPS} to {steps}." in result.stderr, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


def _convert(source_flag: str, source, target_flag: str, target) -> None:
  result = run_module("launch.convert", [f"{source_flag}={source}", f"{target_flag}={target}"])
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"Output directory: {target}" in result.stdout


def test_a_parameter_server_run_goes_on_in_the_other_backend_on_either_strategy(
    tiny_data_dir, tmp_path):
  # The variables on a ps task are the same variables by name: what is carried does not
  # depend on where they lived. Each leg resumes the step the other side saved.
  estimator_ps = tmp_path / "estimator-ps"
  _train("trainers.estimator_main", estimator_ps, tiny_data_dir, STEPS, "--ps=1")
  assert (estimator_ps / "logs" / "ps-0.log").exists()
  resumed = {}
  for name, extra in (("keras-ps", ["--ps=1"]), ("keras", [])):
    _convert("--from_estimator", estimator_ps, "--to_keras", tmp_path / name)
    resumed[name] = _train("trainers.keras_main", tmp_path / name, tiny_data_dir, 2 * STEPS,
                           *extra)
    assert resumed[name]["global_step"] == 2 * STEPS, name
  # And back: Keras's parameter-server run to an Estimator on MWMS, its MWMS run to an
  # Estimator on parameter servers.
  for source, name, extra in (("keras-ps", "estimator", []),
                              ("keras", "estimator-ps-again", ["--ps=1"])):
    _convert("--from_keras", tmp_path / source, "--to_estimator", tmp_path / name)
    summary = _train("trainers.estimator_main", tmp_path / name, tiny_data_dir, 3 * STEPS,
                     *extra)
    assert summary["global_step"] >= 3 * STEPS, name
  assert (tmp_path / "estimator-ps-again" / "logs" / "ps-0.log").exists()
