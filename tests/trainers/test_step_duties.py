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
