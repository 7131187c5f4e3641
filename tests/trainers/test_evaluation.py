"""trainers.evaluation: results written as the Estimator's evaluator writes them, read back."""

import pytest

from trainers import evaluation
from trainers import model_dir as layout


def test_results_are_read_back_by_step_with_every_metric_of_the_head(tmp_path):
  binary = {"loss": 2.0, "accuracy": 0.5, "label/mean": 0.25, "auc": 0.875}
  evaluation.write_result(str(tmp_path), 3, binary)
  evaluation.write_result(str(tmp_path), 6, {"accuracy": 0.75, "loss": 1.0})
  eval_dir = str(tmp_path / layout.EVAL_SUBDIR)
  assert evaluation.read_results(eval_dir) == {3: binary, 6: {"accuracy": 0.75, "loss": 1.0}}
  assert evaluation.read_result(eval_dir, 4) is None
  assert evaluation.wait_for_result(str(tmp_path), 6, timeout=1) == {"accuracy": 0.75,
                                                                      "loss": 1.0}


def test_waiting_for_a_result_that_never_comes_names_the_evaluator(tmp_path):
  with pytest.raises(TimeoutError, match="No evaluation of step 9 .* is the evaluator task"):
    evaluation.wait_for_result(str(tmp_path), 9, timeout=0.1)
