"""docs/examples/metrics_model.py: a spec that declares fourteen tf.compat.v1.metrics; parity
holds each, by both backends, at two workers, and a metric the run cannot compute is refused
before any training, as a user runs them.

docs/MIGRATION.md, "Your eval_metric_ops", cites these tests.
"""

import json
import os

import pytest

from tests.conftest import REPO, run_module

EXAMPLES = str(REPO / "docs" / "examples")


def _env(*paths: str) -> dict:
  return {"PYTHONPATH": os.pathsep.join(filter(None, [*paths, EXAMPLES,
                                                      os.environ.get("PYTHONPATH")]))}


@pytest.fixture
def on_the_path(monkeypatch):
  monkeypatch.syspath_prepend(EXAMPLES)


@pytest.mark.slow
@pytest.mark.real_data
@pytest.mark.estimator
def test_parity_holds_every_declared_metric_at_two_workers(real_data_dir, tmp_path,
                                                           on_the_path):
  import metrics_model  # noqa: PLC0415 -- docs/examples, on the path.
  result = run_module("launch.parity", ["--workers=2", "--model=metrics_model:SPEC",
                                        "--train_steps=6", "--long_steps=0",
                                        f"--data_dir={real_data_dir}", f"--out={tmp_path}"],
                      env=_env(), timeout=1200)
  assert result.returncode == 0, result.stdout + result.stderr[-3000:]
  report = json.loads((tmp_path / "parity_report.json").read_text())
  checks = {c["name"]: c for c in report["checks"]}
  declared = sorted(metrics_model.METRICS)
  assert len(declared) == 14
  for key in declared:  # The Estimator's evaluator (the v1 function) vs Keras evaluate.
    check = checks[f"eval {key}, Estimator evaluator vs Keras evaluate"]
    assert check["passed"] and check["limit"] == 1e-6, check
  # Each evaluator task's records, every checkpoint, every key.
  where = checks["eval per checkpoint, keras vs estimator"]["where"]
  assert where.startswith("17 metrics (") and all(key in where for key in declared), where
  summary = json.loads((tmp_path / "short" / "keras" / "model" / "summary.json").read_text())
  assert set(declared) < set(summary["test_metrics"])


@pytest.mark.parametrize("args, said", [
    (["--model=metrics_model:SPEC", "--task=regression"],
     "model metrics_model: metrics['auc']: tf.compat.v1.metrics.auc is fed scores "
     "(multiclass, binary tasks), and --task=regression has none: give it of="),
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
