"""trainers.step_duties: what both backends do as steps end, with no backend at all."""

import json
import math

import pytest

from trainers import failures
from trainers import model_dir as layout
from trainers import preemption
from trainers.step_duties import StepDuties


def _records(model_dir):
  with open(model_dir / layout.PROGRESS_FILE) as f:
    return [json.loads(line) for line in f]


def test_reports_each_window_mean_and_the_last_step_and_keeps_every_loss(tmp_path):
  duties = StepDuties(every=4, total=10, model_dir=str(tmp_path))
  duties.start(2)  # Resumed at step 2.
  said = []
  for step, loss_sum in [*((s, float(s)) for s in range(3, 9)), (10, 9.0 + 10.0)]:
    duties.stepped(step, loss_sum)  # The last: an execution of two steps.
    said.append(duties.report_due())
  assert duties.report_due() is None  # Said once.
  assert [s is not None for s in said] == [False, True, False, False, False, True, True]
  assert duties.step_losses == [3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 19.0]
  records = [r for r in _records(tmp_path) if r["event"] == "step"]
  assert [(r["step"], r["loss"]) for r in records] == [(4, 3.5), (8, 6.5), (10, 9.5)]
  assert said[-1].loss == 9.5 and said[-1].steps_per_sec > 0
  duties.end()
  assert duties.report.trained_steps == 8


@pytest.mark.parametrize("loss, weights_finite", [(math.nan, True), (math.inf, True),
                                                  (1.0, False)])
def test_a_nan_or_inf_loss_or_weights_stop_the_run_at_that_step(loss, weights_finite):
  duties = StepDuties(every=100, total=1000, model_dir=None)
  duties.start(0)
  duties.stepped(1, 0.5)
  with pytest.raises(failures.DivergedError, match="by step 2:"):
    duties.stepped(2, loss, weights_finite)


def test_stops_at_the_agreed_step_and_not_before():
  agreement = preemption.Agreement(None, "chief:0", [])  # A lone process: its own step.
  duties = StepDuties(every=100, total=1000, model_dir=None, agreement=agreement)
  duties.start(0)
  duties.stepped(1, 0.5)
  assert not duties.should_stop()
  agreement.notice()  # SIGTERM.
  duties.stepped(2, 0.5)
  assert duties.should_stop() and agreement.stopped_at == 2
  assert not StepDuties(every=1, total=1, model_dir=None).should_stop()  # No agreement.


def test_both_backends_log_the_same_tensors_at_the_same_steps(tmp_path, monkeypatch):
  """--log_tensors, as a LoggingTensorHook in a model_fn's training_hooks logs them: this
  worker's batch loss, the step's rate and step, a layer's output on the batch. One worker,
  the same data and initial weights: the same values, at the progress lines' steps."""
  import numpy as np  # noqa: PLC0415
  import tensorflow as tf  # noqa: PLC0415
  from tests.conftest import ESTIMATOR_MISSING, memory_input_fn  # noqa: PLC0415
  from trainers import keras_trainer, loop, step_duties  # noqa: PLC0415
  from trainers.config import Config  # noqa: PLC0415
  if ESTIMATOR_MISSING:
    pytest.skip(ESTIMATOR_MISSING)
  from trainers import estimator_trainer  # noqa: PLC0415
  logged = {}

  def log(self, step, values):
    logged.setdefault(backend, []).append(
        (step, {name: np.asarray(values[name]) for name in self.names}))

  monkeypatch.setattr(step_duties.TensorLog, "log", log)
  config = Config(train_steps=6, global_batch_size=32, eval_batch_size=50, log_every_steps=3,
                  checkpoint_every_steps=6, learning_rate_schedule="cosine",
                  log_tensors="loss,learning_rate,global_step,hidden")
  for backend, module in (("keras", keras_trainer), ("estimator", estimator_trainer)):
    loop.train_and_evaluate(module.Backend, config, str(tmp_path / backend),
                            strategy=tf.distribute.MirroredStrategy(["/cpu:0"]),
                            input_fn=memory_input_fn(config.global_batch_size))
  assert [step for step, _ in logged["keras"]] == [step for step, _ in logged["estimator"]] \
      == [3, 6]
  for (step, ours), (_, theirs) in zip(logged["keras"], logged["estimator"]):
    assert ours["global_step"] == theirs["global_step"] == step
    assert ours["learning_rate"] == theirs["learning_rate"] < config.initial_learning_rate()
    assert ours["hidden"].shape == theirs["hidden"].shape == (32, 64)
    np.testing.assert_allclose(ours["hidden"], theirs["hidden"], atol=1e-5, err_msg=step)
    np.testing.assert_allclose(ours["loss"], theirs["loss"], rtol=1e-5, err_msg=step)
  # The rate summary too, at each backend's own summary steps: the step's rate.
  from launch.proofs import reference  # noqa: PLC0415
  from trainers import evaluation, schedules  # noqa: PLC0415
  for backend in logged:
    rates = {step: values[schedules.SUMMARY_TAG] for step, values in
             evaluation.read_scalars(str(tmp_path / backend)).items()
             if schedules.SUMMARY_TAG in values}
    assert rates and rates == {step: pytest.approx(reference.rate(config, step - 1), rel=1e-6)
                               for step in rates}, backend


def test_a_tensor_log_logs_at_the_progress_steps_as_the_hook_words_it(caplog):
  from trainers import step_duties  # noqa: PLC0415
  log = step_duties.TensorLog(["loss", "hidden"], 5)
  assert [step for step in range(1, 16) if log.due(step)] == [5, 10, 15]
  assert not step_duties.TensorLog([], 5).due(5)
  caplog.set_level("INFO", logger="absl")  # Whatever an earlier test set absl's verbosity to.
  with caplog.at_level("INFO"):
    log.log(5, {"loss": 0.25, "hidden": [[1e-9, 2.0]], "unasked": 1})
  assert "Tensors at step 5: loss = 0.25, hidden = [[0. 2.]]" in caplog.text
