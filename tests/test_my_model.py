"""docs/examples/my_model.py: a tf.compat.v1.layers model_fn's layers, reused as a spec.

Its names are the model_fn's in both backends, both train it as the reference loop does,
and parity passes for it run as a user runs it (`--model=my_model:SPEC`).
"""

import json
import os

import pytest

from tests.conftest import (REPO, assert_ends_where_the_reference_ends, run_module,
                            trained_weights, with_initial_weights)
from trainers import keras_trainer
from trainers import model as model_lib
from trainers.config import Config

EXAMPLES = str(REPO / "docs" / "examples")
NAMES = sorted(f"legacy/{layer}/{weight}" for layer in ("conv", "hidden", "logits")
               for weight in ("kernel", "bias"))


@pytest.fixture(autouse=True)
def on_the_path(monkeypatch):
  monkeypatch.syspath_prepend(EXAMPLES)


def _config(tmp_path) -> Config:
  return with_initial_weights(Config(
      model="my_model:SPEC", model_options="dropout=0", train_steps=6, global_batch_size=32,
      eval_batch_size=50, log_every_steps=2, checkpoint_every_steps=3, backup_every_steps=2,
      deterministic=True), tmp_path)


def test_the_weights_keep_the_model_fns_names_in_both_backends():
  config = Config(model="my_model:SPEC")
  assert sorted(model_lib.get_weights(model_lib.build(config))) == NAMES  # Keras, eager.
  assert sorted(model_lib.graph_model(config).shapes) == NAMES  # The Estimator's graph.


def test_keras_trains_it_as_the_reference_does(tmp_path):
  config = _config(tmp_path)
  assert_ends_where_the_reference_ends(
      config, trained_weights(keras_trainer.Backend, config, tmp_path / "k"))


@pytest.mark.estimator
def test_the_estimator_trains_it_as_the_reference_does(tmp_path):
  from trainers import estimator_trainer  # noqa: PLC0415 -- needs tf.estimator.
  config = _config(tmp_path)
  assert_ends_where_the_reference_ends(
      config, trained_weights(estimator_trainer.Backend, config, tmp_path / "e"))


@pytest.mark.extended  # Both backends train it as the reference does: the tests above.
@pytest.mark.slow
@pytest.mark.real_data
@pytest.mark.estimator
def test_parity_passes_for_it_at_one_worker(real_data_dir, tmp_path):
  env = {"PYTHONPATH": os.pathsep.join(filter(None, [EXAMPLES, os.environ.get("PYTHONPATH")]))}
  result = run_module("launch.parity", ["--workers=1", "--model=my_model:SPEC",
                                        "--long_steps=0",
                                        f"--data_dir={real_data_dir}", f"--out={tmp_path}"],
                      env=env)
  assert result.returncode == 0, result.stdout + result.stderr[-3000:]
  report = json.loads((tmp_path / "parity_report.json").read_text())
  mapping = next(c for c in report["checks"] if c["name"] == "variable mapping")
  assert mapping["where"].startswith("legacy/conv/bias[16], legacy/conv/kernel[5, 5, 1, 16]")
