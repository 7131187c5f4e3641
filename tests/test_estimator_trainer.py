"""trainers.estimator_trainer in this process: an injected strategy and input_fn."""

import os

import pytest
import tensorflow as tf

from launch.tools import runs
from tests.conftest import ESTIMATOR_MISSING, memory_input_fn
from trainers import common
from trainers.config import Config

if ESTIMATOR_MISSING:
  pytest.skip(ESTIMATOR_MISSING, allow_module_level=True)
from trainers import estimator_trainer  # pylint: disable=wrong-import-position

CONFIG = Config(train_steps=6, global_batch_size=32, eval_batch_size=50, log_every_steps=2,
                checkpoint_every_steps=3)


def test_trains_evaluates_exports_and_resumes_with_injected_seams(tmp_path):
  strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
  input_fn = memory_input_fn(CONFIG.global_batch_size)
  summary = estimator_trainer.train_and_evaluate(CONFIG, str(tmp_path), strategy=strategy,
                                                 input_fn=input_fn)
  assert summary["global_step"] == 6 and summary["workers"] == 1
  assert os.path.exists(os.path.join(summary["export_dir"], "saved_model.pb"))
  # One process evaluates every checkpoint itself, under the evaluator's tags.
  assert common.read_eval_result(str(tmp_path / "eval"), 3) is not None
  records = runs.read_progress(str(tmp_path))
  assert [r.get("step") for r in records] == [None, 2, 4, 6]
  assert all(r["loss"] > 0 for r in records[1:])
  longer = estimator_trainer.train_and_evaluate(
      Config(**{**CONFIG.__dict__, "train_steps": 8}), str(tmp_path), strategy=strategy,
      input_fn=input_fn)
  assert longer["global_step"] == 8
  starts = [r for r in runs.read_progress(str(tmp_path)) if r["event"] == "start"]
  assert [r["from_step"] for r in starts] == [0, 6]
