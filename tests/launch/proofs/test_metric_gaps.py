"""launch.metric_gaps: every function of trainers/v1_metrics.py measured against the v1
function itself and Keras's stock metric of its name, on batches, and run as a user runs it."""

import json

import numpy as np
import pytest

from launch.proofs import metric_gaps
from tests.conftest import run_module
from trainers import v1_metrics


def _batches():
  rng = np.random.default_rng(5)
  return [(rng.integers(0, 10, size).astype(np.int64),
           (rng.normal(size=(size, 10)) * 3).astype(np.float32)) for size in (100, 100, 57)]


def test_every_function_is_a_row_and_each_of_ours_is_v1s():
  table = metric_gaps.rows()
  assert {row.metric.function for row in table} == set(v1_metrics.FUNCTIONS) - {
      "true_negatives", "false_positives"}  # Their twins are measured in tests/trainers.
  measured = {m.key: m for m in metric_gaps.measure(_batches(), table)}
  assert all(m.passed(1e-6) for m in measured.values()), measured
  # What a team that swapped names would see move: v1 casts a score to bool.
  seven = measured["precision, 7 vs rest"]
  assert seven.stock_name == "Precision" and abs(seven.stock - seven.v1) > 0.01
  assert measured["mean_per_class_accuracy"].stock is None
  assert "| none | - | - |" in metric_gaps.format_table(list(measured.values()), 1e-6)


@pytest.mark.real_data
def test_the_tool_measures_the_trained_cnn_and_writes_its_report(real_data_dir, tmp_path):
  result = run_module("launch.metric_gaps", ["--train_steps=20", f"--data_dir={real_data_dir}",
                                             f"--out={tmp_path}"])
  assert result.returncode == 0, result.stdout + result.stderr[-3000:]
  assert "the CNN after 20 steps: PASS" in result.stdout
  report = json.loads((tmp_path / "metric_gaps.json").read_text())
  assert report["passed"] and len(report["rows"]) == len(metric_gaps.rows())
  assert (tmp_path / "metric_gaps.md").read_text().count("(PASS,") == len(report["rows"])


def test_a_bad_flag_exits_2(tmp_path):
  result = run_module("launch.metric_gaps", ["--train_steps=-1", f"--out={tmp_path}"])
  assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
