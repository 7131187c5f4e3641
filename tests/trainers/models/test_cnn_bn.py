"""trainers.models.cnn_bn: BatchNorm's moving statistics are trained, saved and compared.

Both backends train it in this process from one initial-weights file, with dropout at 0,
and each must end where the reference loop ends: every weight, the moving mean and
variance included. The negative control is the classic migration bug, a model_fn whose
train op leaves out the layers' updates: its moving statistics never move.
"""

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import (REPO, assert_ends_where_the_reference_ends, run_module,
                            trained_weights, with_initial_weights)
from trainers import keras_trainer
from trainers import model as model_lib
from trainers.config import Config

MOVING = [f"{bn}/{stat}" for bn in ("bn1", "bn2", "bn_hidden")
          for stat in ("moving_mean", "moving_variance")]


def _config(tmp_path) -> Config:
  return with_initial_weights(Config(
      model="cnn_bn", model_options="dropout=0", train_steps=6, global_batch_size=32,
      eval_batch_size=50, log_every_steps=2, checkpoint_every_steps=3, backup_every_steps=2,
      deterministic=True), tmp_path)


def _check_against_the_reference(config: Config, trained: model_lib.Weights) -> None:
  assert_ends_where_the_reference_ends(config, trained)
  initial = model_lib.load_weights_npz(config.init_weights)
  for name in MOVING:
    assert not np.allclose(trained[name], initial[name]), f"{name} never moved"


def test_names_include_the_moving_statistics_and_dropout_is_an_option():
  weights = model_lib.get_weights(model_lib.build(Config(model="cnn_bn")))
  assert set(MOVING) <= set(weights) and "conv1/kernel" in weights
  assert not any(name.startswith("dropout") for name in weights)
  rates = {model_lib.build(Config(model="cnn_bn", model_options=o)).get_layer("dropout").rate
           for o in ("", "dropout=0")}
  assert rates == {0.25, 0.0}


def test_checking_it_before_the_strategy_leaves_tensorflows_runtime_unstarted():
  # The runner and the resume check build the model before the strategy exists; a
  # started runtime would refuse the per-process settings (and the strategy's own).
  code = ("import tensorflow as tf\n"
          "from trainers import model\nfrom trainers.config import Config\n"
          "model.check(Config(model='cnn_bn'))\n"
          "tf.config.threading.set_intra_op_parallelism_threads(1)\nprint('configurable')")
  result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)
  assert result.stdout.strip() == "configurable", result.stderr[-2000:]


def test_keras_updates_the_moving_statistics_as_the_reference_does(tmp_path):
  config = _config(tmp_path)
  _check_against_the_reference(config, trained_weights(keras_trainer.Backend, config,
                                                      tmp_path / "k"))


@pytest.mark.slow
@pytest.mark.estimator
def test_the_estimator_runs_update_ops_and_ends_as_the_reference_does(tmp_path):
  from trainers import estimator_trainer  # noqa: PLC0415 -- needs tf.estimator.
  config = _config(tmp_path)
  _check_against_the_reference(config, trained_weights(estimator_trainer.Backend, config,
                                                      tmp_path / "e"))


@pytest.mark.estimator
def test_without_update_ops_the_moving_statistics_never_move(tmp_path, monkeypatch):
  # What a model_fn that leaves the layers' updates out of its train op trains:
  # evaluation and serving then normalize with the initial statistics.
  from trainers import estimator_trainer  # noqa: PLC0415 -- needs tf.estimator.
  monkeypatch.setattr(estimator_trainer, "update_ops", lambda model, features: [])
  config = _config(tmp_path)
  trained = trained_weights(estimator_trainer.Backend, config, tmp_path / "e")
  initial = model_lib.load_weights_npz(config.init_weights)
  for name in MOVING:
    np.testing.assert_array_equal(trained[name], initial[name], err_msg=name)
  assert not np.allclose(trained["conv1/kernel"], initial["conv1/kernel"])  # It trained.


@pytest.mark.slow
@pytest.mark.real_data
@pytest.mark.estimator
@pytest.mark.parametrize("measure", [
    False, pytest.param(True, marks=pytest.mark.extended)], ids=["checked", "measured"])
def test_parity_passes_at_one_worker_and_measures_dropout_on(measure, real_data_dir, tmp_path):
  # No --model_options: parity takes dropout=0 from the spec's deterministic_options.
  measuring = ["--measure_seeds=1", "--measure_steps=60", "--measure_model_options="]
  # Checked, it also proves a schedule rate for rate (one run for both claims, CI's time):
  # piecewise, two boundaries inside the run, after a warm-up of 3 steps.
  schedule = ["--train_steps=12", "--learning_rate_schedule=piecewise", "--boundaries=5,8",
              "--values=0.1,0.05,0.025", "--warmup_steps=3"]
  result = run_module("launch.parity", ["--workers=1", "--model=cnn_bn", "--long_steps=0",
                                        *(measuring if measure else schedule),
                                        f"--data_dir={real_data_dir}", f"--out={tmp_path}"])
  assert result.returncode == 0, result.stdout + result.stderr[-3000:]
  report = json.loads((tmp_path / "parity_report.json").read_text())
  mapping = next(c for c in report["checks"] if c["name"] == "variable mapping")
  assert all(f"{name}[" in mapping["where"] for name in MOVING), mapping
  if not measure:
    assert report["passed"] and report["measured"] == {}, report
    checks = {c["name"]: c for c in report["checks"]}
    for pair in ("reference vs keras", "reference vs estimator", "keras vs estimator"):
      check = checks[f"per-step learning rate rel diff, short run {pair}"]
      assert check["passed"] and check["measured"] == 0.0, check
    rates = json.loads((tmp_path / "short" / "keras" / "losses.json").read_text())
    assert rates["learning_rates"] == pytest.approx(
        [0.0, 0.1 / 3, 0.2 / 3, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025], rel=1e-6)
    return
  # Dropout on (the spec's 0.25), 60 steps: reported, not checked.
  assert set(report["measured"]) == {"seed 1, keras", "seed 1, estimator"}
  assert all(0.8 < accuracy <= 1.0 for accuracy in report["measured"].values()), report
  assert "Test accuracy by seed (measured, not checked" in result.stdout
