"""launch.bench: a short run of every entry writes a table and valid JSON (no speed limits)."""

import json
import re

import pytest

from launch.bench import measure as bench_measure
from trainers import run_record
from tests.conftest import run_module

STEPS = 12


@pytest.mark.slow
def test_cli_writes_every_row(tiny_data_dir, tmp_path):
  # Keras at 2 workers only, for CI's time: the bench runs every entry and worker
  # count the same way; the Estimator binary's runs are tested on their own, the
  # 1-worker probe in test_bare.py, the targets in test_report.py. Adam,
  # not the default, to see the optimizer flags reach every run. On a parameter server too.
  result = run_module("launch.bench", [f"--train_steps={STEPS}", "--workers=2", "--ps=1",
                                       "--backends=keras", "--optimizer=adam", "--beta2=0.99",
                                       "--log_every_steps=2", "--checkpoint_every_steps=6",
                                       f"--data_dir={tiny_data_dir}", f"--out={tmp_path}",
                                       "--timeout=240"], timeout=600)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
  with open(tmp_path / "bench.json") as f:
    report = json.load(f)
  assert (report["config"]["optimizer"], report["config"]["beta2"]) == ("adam", 0.99)
  rows = {(r["name"], r["workers"]): r for r in report["results"]}
  record = run_record.read(rows["keras", 2]["model_dir"])
  assert (record["optimizer"], record["beta2"]) == ("adam", 0.99)
  assert set(rows) == {("ceiling", 2), ("keras", 2), ("keras-ps", 2)}
  for key, row in rows.items():
    assert row["error"] is None, key
    assert row["steps"] == STEPS, key
    assert row["examples_per_second"] > 0 and row["ms_per_step"] > 0, key
    assert 0 < row["launch_to_first_step"] < row["wall_seconds"], key
    assert 0.0 <= row["final_accuracy"] <= 1.0, key
    assert row["ratio_to_ceiling"] > 0, key
    # The launcher and every task of tasks.json.
    expected = {"launcher", "chief-0", "worker-0"}
    if key != ("ceiling", 2):  # Keras runs its evaluator task; the ceiling run has none.
      expected |= {"evaluator-0"}
    if key == ("keras", 2):  # It forks its tasks (launch.zygote); a ps cluster does not.
      expected |= {"zygote"}
    if key == ("keras-ps", 2):  # Its chief coordinates two workers and a ps.
      expected |= {"worker-1", "ps-0"}
    assert set(row["peak_rss_mb"]) == expected, key
    if key == ("keras", 2):  # The chief's start-up, split at the milestones it records.
      assert all(row["breakdown"][k] > 0 for k in ("chief_strategy",
                                                   "chief_to_first_step")), key
      assert row["breakdown"]["chief_imports"] >= 0, key  # Forked: its own modules only.
    assert all(mb > 300 for name, mb in row["peak_rss_mb"].items() if name != "launcher"), key
    # The launcher starts the tasks without importing TensorFlow (~400 MB).
    assert row["peak_rss_mb"].get("launcher", 0) < 200, key
  costs = report["step_costs"]["2"]
  assert costs["workers"] == 2 and costs["per_replica_batch"] == 48, costs
  assert costs["steps_per_execution"] == 2, costs
  # The Estimator's graph in a plain Session is timed alone, at 1 worker only.
  parts = [p for p in bench_measure.STEP_PARTS if p != "session_step"]
  assert set(parts) <= set(costs) and all(costs[part]["ms"] > 0 for part in parts), costs
  assert report["ceilings"]["2"]["ms_per_step"] == min(
      [costs[loop]["ms"] for loop in parts if loop.startswith("step")]
      + [rows["ceiling", 2]["ms_per_step"]])
  assert isinstance(report["missed"], list) and isinstance(report["ceiling_bugs"], list)
  assert {t["name"] for t in report["targets"]} == {
      "input pipeline x2 ms/step: K-step loop on it - on a batch in memory",
      "keras x2 launch to first step (s)"}  # Keras's step: with --noevaluator (test_report.py).
  table = (tmp_path / "bench.md").read_text()
  assert table.startswith(f"# Benchmark: cnn with adam, {STEPS} steps")
  assert "| keras | 2 |" in table and "| ceiling | 2 |" in table
  assert "Where a step's time goes" in table and "keras - K-step" in table
  # On the terminal the table is too wide for columns in 100: a block a row.
  assert re.search(r"^ceiling\n    workers: 2; ", result.stdout, re.M), result.stdout
  # A step on the parameter server against the same step under MultiWorkerMirroredStrategy.
  (line,) = report["ps_costs"]
  assert line.startswith("keras-ps x2: ") and "for keras x2 (" in line, line
  assert "## On parameter servers" in table and "keras-ps - K-step" in table


def test_cli_refuses_a_weight_column_it_would_not_time(tmp_path):
  result = run_module("launch.bench", ["--model=dnn", "--weight_column=w",
                                       "--digit_weights=1,1,1,1,1,1,1,1,1,2",
                                       f"--out={tmp_path / 'out'}"], timeout=120)
  assert result.returncode == 2 and "the benchmark times unweighted steps" in result.stderr
  assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


def test_cli_refuses_model_options_for_several_models(tmp_path):
  result = run_module("launch.bench", ["--model=cnn,cnn_bn", "--model_options=dropout=0",
                                       f"--out={tmp_path / 'out'}"], timeout=120)
  assert result.returncode == 2 and "--model_options goes with one --model" in result.stderr
  assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


@pytest.mark.extended  # Two benches in a row (~120 CPU-s); test_report.py holds the table.
def test_cli_benches_several_models_each_into_its_folder_and_one_table(tiny_data_dir, tmp_path):
  result = run_module("launch.bench", [f"--train_steps={STEPS}", "--workers=1",
                                       "--backends=keras", "--model=linear,dnn_v1",
                                       "--log_every_steps=2", "--checkpoint_every_steps=6",
                                       f"--data_dir={tiny_data_dir}", f"--out={tmp_path}",
                                       "--timeout=240"], timeout=900)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
  report = json.loads((tmp_path / "bench.json").read_text())
  assert list(report["models"]) == ["linear", "dnn_v1"]
  for model in ("linear", "dnn_v1"):
    own = json.loads((tmp_path / model / "bench.json").read_text())
    assert own["config"]["model"] == model
    assert own["results"] == report["models"][model]["results"]
    assert "error" not in own["step_costs"]["1"], own["step_costs"]
  assert "| dnn_v1 | keras | 1 |" in (tmp_path / "bench.md").read_text()
