"""docs/examples/metrics_model.py: a spec that declares fourteen tf.compat.v1.metrics; a metric
the run cannot compute is refused before any training, as a user runs it. Parity holds each
of the fourteen at two workers in tests/launch/proofs/test_parity.py::
test_a_warm_started_run_with_declared_metrics_passes_at_two_workers (one run for both).

docs/MIGRATION.md, "Your eval_metric_ops", cites these tests.
"""

import os

import pytest

from tests.conftest import REPO, run_module

EXAMPLES = str(REPO / "docs" / "examples")


def _env(*paths: str) -> dict:
  return {"PYTHONPATH": os.pathsep.join(filter(None, [*paths, EXAMPLES,
                                                      os.environ.get("PYTHONPATH")]))}


@pytest.mark.parametrize("args, said", [
    (["--model=metrics_model:SPEC", "--task=regression"],
     "model metrics_model: metrics['auc']: tf.compat.v1.metrics.auc is fed scores "
     "(multiclass, binary tasks), and --task=regression has none: give it of="),
    (["--model=metrics_model:SPEC", "--early_stopping_metric=auc_roc",
      "--early_stopping_steps=100"],
     "--early_stopping_metric=auc_roc: the run's evaluations report accuracy, auc, auc_pr, "),
    (["--model=metrics_model:SPEC", "--export=best", "--export_metric=auc_roc"],
     "--export_metric=auc_roc: the run's evaluations report accuracy, auc, auc_pr, "),
    (["--model=bad_metrics:SPEC"],
     "importing bad_metrics failed: MetricError: tf.compat.v1.metrics.auc takes no argument "
     "'curv'; it takes num_thresholds, curve, summation_method, thresholds and of=."),
])
def test_a_metric_the_run_cannot_compute_exits_2_before_training(args, said, tmp_path):
  (tmp_path / "bad_metrics.py").write_text(
      "from trainers import v1_metrics as v1\nfrom trainers.model import ModelSpec\n"
      "from trainers.models import cnn\n\n"
      "SPEC = ModelSpec('bad', cnn.build, metrics={'auc_pr': v1.Metric('auc', curv='PR')})\n")
  result = run_module("trainers.keras_main", [*args, f"--model_dir={tmp_path / 'run'}"],
                      env=_env(str(tmp_path)))
  assert result.returncode == 2, result.stdout + result.stderr[-3000:]
  assert said in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]
  assert not (tmp_path / "run").exists()
