"""trainers.early_stopping: one fixed evaluation history replayed into the Estimator's own
stop_if_no_decrease_hook and stop_if_no_increase_hook and into this project's rule, from
records each backend writes; the chief's checks, the record, the last step and the
evaluators' end."""

import dataclasses
import json
import os
import subprocess
from typing import Optional

import pytest
import tensorflow as tf

from tests.conftest import memory_input_fn, run_module
from trainers import early_stopping
from trainers import evaluation
from trainers import keras_trainer
from trainers import loop
from trainers import model_dir as layout
from trainers.config import Config

# (step, loss, accuracy): plateaus, ties (not an improvement) and late gains.
HISTORY = [(0, 2.3, 0.10), (10, 1.2, 0.60), (20, 0.9, 0.70), (30, 0.9, 0.72),
           (40, 0.95, 0.72), (50, 0.91, 0.71), (60, 0.85, 0.75), (70, 0.86, 0.75),
           (80, 0.87, 0.74), (90, 0.88, 0.76), (100, 0.84, 0.76)]
# Each rule, and the evaluation at which it first stops (None: never).
RULES = [("loss", "min", 20, 0, 40), ("loss", "min", 30, 0, 50), ("loss", "min", 10, 50, 70),
         ("accuracy", "max", 20, 0, 50), ("accuracy", "max", 15, 25, 50),
         ("accuracy", "max", 40, 0, None)]


def _write_estimator_style(writer, step: int, loss: float, accuracy: float) -> None:
  """One evaluation as the Estimator's evaluator writes it: TF1 simple_value summaries, by
  the one writer it keeps for the directory (FileWriterCache)."""
  writer.add_summary(tf.compat.v1.Summary(value=[
      tf.compat.v1.Summary.Value(tag="loss", simple_value=loss),
      tf.compat.v1.Summary.Value(tag="accuracy", simple_value=accuracy)]), step)
  writer.flush()


@pytest.mark.estimator
@pytest.mark.parametrize("metric,mode,steps,min_steps,first_stop", RULES)
def test_a_replayed_history_stops_where_the_estimators_hook_stops(metric, mode, steps,
                                                                  min_steps, first_stop,
                                                                  tmp_path):
  theirs_dir, ours_dir = str(tmp_path / "estimator_eval"), str(tmp_path / "keras")
  estimator = tf.estimator.Estimator(lambda features, labels, mode: None,
                                     model_dir=str(tmp_path / "estimator"))
  make = (tf.estimator.experimental.stop_if_no_increase_hook if mode == "max"
          else tf.estimator.experimental.stop_if_no_decrease_hook)
  hook = make(estimator, metric, steps, eval_dir=theirs_dir, min_steps=min_steps,
              run_every_secs=None, run_every_steps=1)
  rule = early_stopping.Rule(metric, mode, steps, min_steps, every=1)
  decisions = []
  with tf.Graph().as_default():
    writer = tf.compat.v1.summary.FileWriter(theirs_dir)
  for step, loss, accuracy in HISTORY:  # One evaluation more at each check.
    _write_estimator_style(writer, step, loss, accuracy)
    evaluation.write_result(ours_dir, step, {"loss": loss, "accuracy": accuracy})  # Keras's.
    theirs = bool(hook._should_stop_fn())  # pylint: disable=protected-access
    for records in (theirs_dir, f"{ours_dir}/{layout.EVAL_SUBDIR}"):
      assert (early_stopping.no_improvement(rule, evaluation.read_results(records))
              is not None) == theirs, (step, records)
    decisions.append(theirs)
  writer.close()
  stops = [step for (step, _, _), stop in zip(HISTORY, decisions) if stop]
  assert (stops[0] if stops else None) == first_stop


def test_the_rule_names_the_evaluation_that_stops_and_the_best_before_it():
  results = {step: {"loss": loss} for step, loss, _ in HISTORY}
  decision = early_stopping.no_improvement(early_stopping.Rule("loss", "min", 30, 0, 1), results)
  assert decision == early_stopping.Decision(at=50, best_step=20, best=0.9)
  with pytest.raises(evaluation.MissingMetricError, match="has no such metric; it has loss"):
    early_stopping.no_improvement(early_stopping.Rule("auc", "max", 30, 0, 1), results)


class _Agreement:
  def __init__(self):
    self.requested = []

  def request(self, step):
    self.requested.append(step)


def test_the_chiefs_checks_follow_the_hooks_timer_and_record_the_last_step(tmp_path):
  model_dir = str(tmp_path)
  config = Config(train_steps=1000, early_stopping_metric="loss", early_stopping_steps=20,
                  early_stopping_check_every_steps=5)
  agreement = _Agreement()
  checks = early_stopping.Checks(early_stopping.Rule.of(config), model_dir, agreement)
  history = iter(HISTORY)
  checked = []
  for step in range(1, 60):
    if step % 10 == 1:  # The evaluator writes an evaluation now and then.
      past, loss, accuracy = next(history)
      evaluation.write_result(model_dir, past, {"loss": loss, "accuracy": accuracy})
    before = len(evaluation.read_results(f"{model_dir}/{layout.EVAL_SUBDIR}"))
    checks.after_step(step)
    if agreement.requested:
      checked.append((step, before))
      break
  # Checked at steps 1, 6, 11, ...: the first with an evaluation 20 steps past the best
  # (step 40's, written at step 41) is step 41, and the run ends after step 42.
  assert agreement.requested == [41] and checked == [(41, 5)]
  record = early_stopping.read_record(model_dir)
  assert (record["step"], record["best_step"], record["decided_at"]) == (42, 20, 40)
  assert record["evaluated_steps"] == [0, 10, 20, 30, 40]
  assert early_stopping.final_step(config, model_dir) == 42
  resumed = early_stopping.for_run(config, model_dir)
  assert (resumed.train_steps, resumed.decay_steps) == (42, 1000)  # The schedule kept.
  assert early_stopping.final_step(dataclasses.replace(config, early_stopping_metric=None),
                                   model_dir) == 1000
  early_stopping.end_if_final(config, model_dir, 40)  # Not yet: the evaluator goes on.
  with pytest.raises(early_stopping.EvaluationDone):
    early_stopping.end_if_final(config, model_dir, 42)


def test_a_run_with_no_early_stop_ends_at_train_steps(tmp_path):
  config = Config(train_steps=30, early_stopping_metric="loss", early_stopping_steps=5)
  assert early_stopping.for_run(config, str(tmp_path)) is config
  early_stopping.end_if_final(config, str(tmp_path), 30)  # The evaluator ends on its own.
  (tmp_path / layout.EARLY_STOP_FILE).write_text(json.dumps({"step": 12}))
  assert early_stopping.final_step(config, str(tmp_path)) == 12


def _run(backend: str, data_dir: str, model_dir, *flags: str) -> subprocess.CompletedProcess:
  return run_module(f"trainers.{backend}_main", [
      f"--model_dir={model_dir}", f"--data_dir={data_dir}", "--checkpoint_every_steps=4",
      "--log_every_steps=4", "--backup_every_steps=4", "--global_batch_size=32",
      "--eval_batch_size=100", *flags], timeout=900)


# A check at the first step trained stops the run when the loss's highest evaluation is 4
# steps or more behind a later one: every evaluation of a training run's falling loss.
EARLY = ["--workers=2", "--train_steps=300", "--early_stopping_metric=loss",
         "--early_stopping_mode=max", "--early_stopping_steps=4",
         "--early_stopping_check_every_steps=2"]
# The evaluator exports each evaluation that is its best so far by accuracy, keeping one.
BEST = ["--export=best", "--export_metric=accuracy", "--export_mode=max", "--exports_to_keep=1"]


def _check_best_exports(model_dir, summary, data_dir: str) -> None:
  """The evaluator's decisions follow BestExporter's rule over its own evaluations (its first
  always; then a higher accuracy), the last export is the one kept and the summary's, and it
  serves the accuracy evaluated at its step."""
  from trainers import export  # noqa: PLC0415
  policy = export.Policy(export.BEST, 1, "accuracy", "max")
  record = export.read_record(str(model_dir), policy)
  best = None
  for entry in record:
    exported = best is None or entry["metrics"]["accuracy"] > best
    assert bool(entry["export_dir"]) == exported, record
    best = entry["metrics"]["accuracy"] if exported else best
  last = [entry for entry in record if entry["export_dir"]][-1]
  kept = [name for name in os.listdir(policy.directory(str(model_dir))) if name.isdigit()]
  assert [os.path.basename(last["export_dir"])] == kept
  assert summary["export_dir"] == last["export_dir"] and record[-1]["step"] == 14
  assert _served_accuracy(last["export_dir"], data_dir) == pytest.approx(
      last["metrics"]["accuracy"], abs=1e-6)


def _served_accuracy(export_dir: str, data_dir: Optional[str], input_fn=None) -> float:
  """The accuracy of the export's `predict` answers to the test split's tf.Examples (of
  `data_dir`, or `input_fn`'s)."""
  from data import mnist  # noqa: PLC0415
  from launch.proofs import serving_check  # noqa: PLC0415
  from trainers import inputs  # noqa: PLC0415
  predict = tf.saved_model.load(export_dir).signatures["predict"]
  right = total = 0
  input_fn = input_fn or inputs.default_input_fn(Config(data_dir=data_dir, eval_batch_size=100))
  for images, labels in input_fn(mnist.EVAL, None):
    examples = serving_check.examples(images.numpy(), "image")
    answers = predict(examples=tf.constant([e.SerializeToString() for e in examples]))
    right += int(tf.reduce_sum(tf.cast(
        answers["class_ids"][:, 0] == tf.cast(labels, tf.int64), tf.int32)))
    total += int(labels.shape[0])
  return right / total


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["keras", pytest.param("estimator",
                                                           marks=pytest.mark.estimator)])
def test_a_cluster_stops_where_its_own_eval_records_say_and_stays_stopped(backend,
                                                                          tiny_data_dir,
                                                                          tmp_path):
  from trainers import checkpoints  # noqa: PLC0415
  model_dir = tmp_path / "run"
  # Its evaluations at steps 4, 8 and 12 (one process evaluates each checkpoint); then the
  # run goes on at 2 workers with an evaluator task, checking at step 13 what they say.
  first = _run(backend, tiny_data_dir, model_dir, "--workers=1", "--train_steps=12")
  assert first.returncode == 0, first.stderr[-3000:]
  result = _run(backend, tiny_data_dir, model_dir, *EARLY, *BEST)
  assert result.returncode == 0, result.stderr[-3000:]  # The evaluator task ended too.
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  _check_best_exports(model_dir, summary, tiny_data_dir)
  record = summary["early_stop"]
  assert (record["checked_at"], record["step"], summary["global_step"]) == (13, 14, 14)
  # The decision, recomputed from the evaluations the check had read.
  results = evaluation.read_results(str(model_dir / layout.EVAL_SUBDIR))
  seen = {s: results[s] for s in record["evaluated_steps"]}
  assert {4, 8, 12} <= set(seen) and max(seen) == 12
  rule = early_stopping.Rule("loss", "max", 4, 0, 2)
  assert early_stopping.no_improvement(rule, seen).at == record["decided_at"]
  # Every training task stopped there: the step saved and evaluated, the chief says so.
  assert max(int(path.rsplit("-", 1)[-1]) for path in checkpoints.find(str(model_dir))) == 14
  assert summary["test_loss"] == pytest.approx(results[14]["loss"], abs=1e-6)
  events = [json.loads(line) for line in (model_dir / "progress.jsonl").read_text().splitlines()]
  assert any(e["event"] == "early_stopped" and e["step"] == 14 for e in events)
  assert "Every training task stops at its first step after step 13." in result.stderr
  if backend == "keras":  # The same command again trains nothing more.
    again = _run(backend, tiny_data_dir, model_dir, *EARLY, *BEST)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["global_step"] == 14
    assert "nothing to train" in again.stderr


def test_a_chief_that_evaluates_itself_stops_on_its_own_evaluations(tmp_path):
  """Keras without an evaluator task (--noevaluator, or one process): the chief's own
  evaluations, every --checkpoint_every_steps, are what its checks read."""
  config = Config(train_steps=40, global_batch_size=32, eval_batch_size=50,
                  log_every_steps=2, checkpoint_every_steps=2, backup_every_steps=2,
                  early_stopping_metric="loss", early_stopping_mode="max",
                  early_stopping_steps=4, early_stopping_check_every_steps=2,
                  export="latest", exports_to_keep=2)
  summary = loop.train_and_evaluate(
      keras_trainer.Backend, config, str(tmp_path),
      strategy=tf.distribute.MirroredStrategy(["/cpu:0"]),
      input_fn=memory_input_fn(config.global_batch_size))
  record = summary["early_stop"]
  assert summary["global_step"] == record["step"] == record["checked_at"] + 1 < 40
  results = evaluation.read_results(str(tmp_path / layout.EVAL_SUBDIR))
  seen = {s: results[s] for s in record["evaluated_steps"]}
  rule = early_stopping.Rule("loss", "max", 4, 0, 2)
  assert early_stopping.no_improvement(rule, seen).at == record["decided_at"]
  assert max(seen) <= record["checked_at"]
  # It exported each of its evaluations, inside fit's strategy scope but the last.
  from trainers import export  # noqa: PLC0415
  exports = export.read_record(str(tmp_path), export.Policy.of(config))
  assert [entry["step"] for entry in exports] == sorted(results)
  assert all(entry["export_dir"] for entry in exports)
  assert summary["export_dir"] == exports[-1]["export_dir"]
  assert _served_accuracy(summary["export_dir"], None, memory_input_fn(32)) == pytest.approx(
      results[summary["global_step"]]["accuracy"], abs=1e-6)
