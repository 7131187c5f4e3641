"""launch.convert.canned: a canned Estimator's model_dir carried to its Keras twin and
back, through launch.convert as a user runs it."""

import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import ESTIMATOR_MISSING, run_module

if ESTIMATOR_MISSING:
  pytest.skip(ESTIMATOR_MISSING, allow_module_level=True)

STEPS = 3
TRAIN_FLAGS = ["--global_batch_size=32", "--eval_batch_size=50", "--log_every_steps=1",
               f"--checkpoint_every_steps={STEPS}"]


def _read_checkpoint(model_dir):
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
  return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


@pytest.mark.parametrize("model, flags", [
    # A binary classifier and a regressor: each task's canned class (the ten-class ones
    # are carried by launch.handoff's tests).
    ("dnn", ["--task=binary:3", "--hidden_units=16,8", "--dnn_optimizer=adam",
             "--dnn_learning_rate=0.01"]),
    # A regressor over the built-in feature columns: the linear part's weights per column,
    # the DNN part's embedding tables, and Adagrad's and Ftrl's slots of each.
    pytest.param("wide_deep", ["--task=regression", "--features=tabular", "--hidden_units=16",
                               "--dnn_learning_rate=0.002"], marks=pytest.mark.slow),
])
def test_a_canned_run_goes_across_and_back_bit_for_bit(model, flags, tiny_data_dir, tmp_path):
  source = tmp_path / "canned"
  trained = run_module("trainers.estimator_main", [f"--model={model}", *flags,
                                                   f"--model_dir={source}",
                                                   f"--data_dir={tiny_data_dir}",
                                                   f"--train_steps={STEPS}", *TRAIN_FLAGS])
  assert trained.returncode == 0, trained.stderr[-3000:]
  # The model and its canned flags come from the run's record.
  there = run_module("launch.convert", [f"--from_estimator={source}",
                                        f"--to_keras={tmp_path / 'k'}"])
  assert there.returncode == 0, there.stderr[-3000:]
  back = run_module("launch.convert", [f"--from_keras={tmp_path / 'k'}",
                                       f"--to_estimator={tmp_path / 'e'}"])
  assert back.returncode == 0, back.stderr[-3000:]
  original, returned = _read_checkpoint(source), _read_checkpoint(tmp_path / "e")
  assert sorted(returned) == sorted(original)
  assert any(name.startswith("training/") and name.endswith(("/m", "/accumulator"))
             for name in original)  # Slots, carried.
  if "--features=tabular" in flags:  # Each column's: an embedding table's, its slots too.
    assert any(name.endswith("embedding_weights/accumulator") for name in original), original
  for name, value in original.items():
    assert returned[name].dtype == value.dtype and np.array_equal(returned[name], value), name

  if model != "dnn":  # The refusals below take one path for every canned model.
    return
  # Hyperparameters kept as variables are compared, never silently replaced.
  rate = run_module("launch.convert", [f"--from_estimator={source}",
                                       f"--to_keras={tmp_path / 'k2'}", f"--model={model}",
                                       *flags[:-1], "--dnn_learning_rate=0.5"])
  assert rate.returncode == 2 and "Traceback" not in rate.stderr, rate.stderr[-3000:]
  assert "learning_rate is" in rate.stderr and "give --dnn_learning_rate=" in rate.stderr
  other = run_module("launch.convert", [f"--from_estimator={source}",
                                        f"--to_keras={tmp_path / 'k3'}", f"--model={model}",
                                        "--hidden_units=32"])
  assert other.returncode == 2 and "give the canned flags it was trained with" in other.stderr
  assert f"--inspect={tf.train.latest_checkpoint(str(source))}" in other.stderr
  assert not (tmp_path / "k2").exists() and not (tmp_path / "k3").exists()
