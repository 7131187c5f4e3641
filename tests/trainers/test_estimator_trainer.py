"""trainers.estimator_trainer in this process: an injected strategy and input_fn."""

import os

import numpy as np
import pytest
import tensorflow as tf

from data import mnist
from launch.proofs import runs
from launch.proofs import serving_check
from tests.conftest import ESTIMATOR_MISSING, memory_input_fn
from trainers import evaluation
from trainers import distribute
from trainers import failures
from trainers import serving
from trainers.config import Config

if ESTIMATOR_MISSING:
  pytest.skip(ESTIMATOR_MISSING, allow_module_level=True)
from trainers import estimator_trainer
from trainers import loop

CONFIG = Config(train_steps=6, global_batch_size=32, eval_batch_size=50, log_every_steps=2,
                checkpoint_every_steps=3)


def test_trains_evaluates_exports_and_resumes_with_injected_seams(tmp_path):
  strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
  input_fn = memory_input_fn(CONFIG.global_batch_size)
  summary = loop.train_and_evaluate(estimator_trainer.Backend, CONFIG, str(tmp_path),
                                    strategy=strategy, input_fn=input_fn)
  assert summary["global_step"] == 6 and summary["workers"] == 1
  assert os.path.exists(os.path.join(summary["export_dir"], "saved_model.pb"))
  # One process evaluates every checkpoint itself, under the evaluator's tags.
  assert evaluation.read_result(str(tmp_path / "eval"), 3) is not None
  records = runs.read_progress(str(tmp_path))
  assert [r.get("step") for r in records] == [None, 2, 4, 6]
  assert all(r["loss"] > 0 for r in records[1:])
  longer = loop.train_and_evaluate(
      estimator_trainer.Backend, Config(**{**CONFIG.__dict__, "train_steps": 8}), str(tmp_path),
      strategy=strategy, input_fn=input_fn)
  assert longer["global_step"] == 8
  starts = [r for r in runs.read_progress(str(tmp_path)) if r["event"] == "start"]
  assert [r["from_step"] for r in starts] == [0, 6]


def test_a_checkpoint_exports_as_the_run_exported_it_and_its_model_dir_is_only_read(
    tmp_path):
  model_dir = tmp_path / "model"
  summary = loop.train_and_evaluate(estimator_trainer.Backend, CONFIG, str(model_dir),
                                    strategy=tf.distribute.MirroredStrategy(["/cpu:0"]),
                                    input_fn=memory_input_fn(CONFIG.global_batch_size))
  before = sorted((p.relative_to(model_dir), p.stat().st_mtime_ns)
                  for p in model_dir.rglob("*"))
  exported = estimator_trainer.export_checkpoint(str(model_dir), CONFIG, str(tmp_path / "out"))
  assert os.path.dirname(exported) == str(tmp_path / "out" / "export")
  assert sorted((p.relative_to(model_dir), p.stat().st_mtime_ns)
                for p in model_dir.rglob("*")) == before
  images = memory_input_fn(8)(mnist.EVAL, None).take(1).get_single_element()[0]
  answers = [serving_check.answers(tf.saved_model.load(d), [images.numpy()], serving.IMAGE)
             for d in (summary["export_dir"], exported)]
  assert answers[0].keys() == answers[1].keys() and "predict/logits" in answers[0]
  for key, value in answers[0].items():
    np.testing.assert_array_equal(value, answers[1][key], err_msg=key)


def test_weights_gone_nan_under_a_finite_loss_stop_the_run_at_that_step(tmp_path):
  # As in test_keras_trainer: a NaN momentum slot, so step 4's loss is finite
  # and its update makes the weights NaN; the run stops at step 4.
  config = Config(**{**CONFIG.__dict__, "train_steps": 3, "decay_steps": 6})
  strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
  input_fn = memory_input_fn(config.global_batch_size)
  loop.train_and_evaluate(estimator_trainer.Backend, config, str(tmp_path), strategy=strategy,
                          input_fn=input_fn)
  path = tf.train.latest_checkpoint(str(tmp_path))
  reader = tf.train.load_checkpoint(path)
  names = sorted(reader.get_variable_to_dtype_map())
  tensors = [reader.get_tensor(name) for name in names]
  slot = names.index("conv/kernel/Momentum")
  tensors[slot] = np.full_like(tensors[slot], np.nan)
  tf.raw_ops.SaveV2(prefix=path, tensor_names=names, shape_and_slices=[""] * len(names),
                    tensors=tensors)
  with pytest.raises(failures.DivergedError, match="weights became NaN or Inf by step 4:"):
    loop.train_and_evaluate(estimator_trainer.Backend,
                            Config(**{**config.__dict__, "train_steps": 6}),
                            str(tmp_path), strategy=strategy, input_fn=input_fn)


def test_a_session_created_again_ends_a_cluster_task_as_a_lost_peer():
  # TensorFlow's recovery restores the last checkpoint on one worker alone: out of step.
  hook = estimator_trainer._OneSessionPerRun()
  hook.after_create_session(None, None)
  with pytest.raises(RuntimeError) as raised:
    hook.after_create_session(None, None)
  lost = distribute.lost_peer(raised.value)
  assert isinstance(lost, tf.errors.AbortedError) and "out of step" in lost.message


def test_latest_exports_each_evaluation_and_a_chief_alone_exports_its_final_one(tmp_path):
  """One process: train_and_evaluate runs the LatestExporter after each evaluation. A chief
  with no evaluator task evaluates only the final step, and exports that (here through the
  BestExporter, its first): the same answers as the latest export of that checkpoint."""
  from trainers import export  # noqa: PLC0415
  config = Config(**{**CONFIG.__dict__, "export": "latest", "exports_to_keep": 1})
  input_fn = memory_input_fn(CONFIG.global_batch_size)
  strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
  summary = loop.train_and_evaluate(estimator_trainer.Backend, config, str(tmp_path),
                                    strategy=strategy, input_fn=input_fn)
  latest = export.Policy.of(config)
  assert [e["step"] for e in export.read_record(str(tmp_path), latest)] == [3, 6]
  assert summary["export_dir"] == export.current(str(tmp_path), latest)
  assert len([n for n in os.listdir(latest.directory(str(tmp_path))) if n.isdigit()]) == 1

  best = Config(**{**CONFIG.__dict__, "export": "best", "export_metric": "loss"})
  backend = estimator_trainer.Backend(loop.Run(best, str(tmp_path), input_fn, None, strategy,
                                               chief=True, chief_evaluates=True))
  exported = backend.export_evaluation(6, summary["test_metrics"])
  assert exported and os.path.dirname(exported) == export.Policy.of(best).directory(
      str(tmp_path))
  images = input_fn(mnist.EVAL, None).take(1).get_single_element()[0].numpy()
  answers = [serving_check.answers(tf.saved_model.load(d), [images], serving.IMAGE)
             for d in (summary["export_dir"], exported)]
  for key, value in answers[0].items():
    np.testing.assert_array_equal(value, answers[1][key], err_msg=key)
  assert backend.export_evaluation(6, summary["test_metrics"]) == exported  # Once a step.
