"""launch.bench: a short run of every entry writes a table and valid JSON (no speed limits)."""

import dataclasses
import datetime
import json

from trainers import bench
from tests.conftest import run_module

STEPS = 12


def test_cli_writes_every_row(tiny_data_dir, tmp_path):
  result = run_module("launch.bench", [f"--steps={STEPS}", "--workers=1,2",
                                       "--log_every_steps=2", "--checkpoint_every_steps=6",
                                       f"--data_dir={tiny_data_dir}", f"--out={tmp_path}",
                                       "--timeout=240"], timeout=600)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
  with open(tmp_path / "bench.json") as f:
    report = json.load(f)
  rows = {(r["name"], r["workers"]): r for r in report["results"]}
  assert set(rows) == {("reference", 1), ("keras", 1), ("estimator", 1), ("keras", 2),
                       ("estimator", 2)}
  for key, row in rows.items():
    assert row["error"] is None, key
    assert row["steps"] == STEPS, key
    assert row["examples_per_second"] > 0 and row["ms_per_step"] > 0, key
    assert 0 < row["launch_to_first_step"] < row["wall_seconds"], key
    assert 0.0 <= row["final_accuracy"] <= 1.0, key
    if key[0] != "reference":
      assert row["ratio_to_reference"] > 0, key
    # One process trains at 1 worker; at 2, the launcher and every task of tasks.json.
    expected = {"main"} if key[1] == 1 else {"launcher", "chief-0", "worker-0"}
    if key == ("estimator", 2):
      expected.add("evaluator-0")
    assert set(row["peak_rss_mb"]) == expected, key
    if key[1] == 2:  # The chief's start-up, split at the lines it logs.
      assert all(row["breakdown"][k] > 0 for k in ("chief_imports", "chief_strategy",
                                                   "chief_to_first_step")), key
    assert all(mb > 300 for name, mb in row["peak_rss_mb"].items() if name != "launcher"), key
    # The launcher starts the tasks without importing TensorFlow (~400 MB).
    assert row["peak_rss_mb"].get("launcher", 0) < 200, key
  for n in ("1", "2"):
    costs = report["step_costs"][n]
    assert costs["workers"] == int(n) and costs["per_replica_batch"] == 96 // int(n), costs
    assert all(costs[part]["ms"] > 0 for part in bench.STEP_PARTS), costs
  assert isinstance(report["missed"], list)
  assert {t["name"] for t in report["targets"]} >= {"keras x1 throughput / reference",
                                                    "estimator x2 launch to first step (s)"}
  table = (tmp_path / "bench.md").read_text()
  assert "| keras | 2 |" in table and "Where a step's time goes" in table
  assert "| estimator | 1 |" in result.stdout


def test_step_windows_skip_warm_up():
  events = [(10, 100.0, 0.0), (20, 101.0, 0.0), (30, 101.5, 0.0), (40, 102.0, 0.0)]
  assert bench.step_windows(events) == [0.05, 0.05]
  assert bench.step_windows(events, warmup_steps=30) == [0.05]
  assert bench.step_windows(events, warmup_steps=1000) == [0.05, 0.05]


def test_missed_targets_are_explained_from_the_step_costs():
  ref = bench.Result("reference", 1, ms_per_step=10.0, examples_per_second=9600)
  keras1 = bench.Result("keras", 1, ms_per_step=11.0, examples_per_second=8727,
                        ratio_to_reference=0.909)
  keras2 = bench.Result("keras", 2, ms_per_step=18.0, examples_per_second=5333,
                        launch_to_first_step=12.5, peak_rss_mb={"launcher": 1, "chief-0": 1,
                                                                "worker-0": 1},
                        breakdown={"launch_to_tasks_started": 2.5})
  costs = {1: {"per_replica_batch": 96, "intra_op_threads": 2, "compute": {"ms": 10.1},
               "all_reduce": {"ms": 0.2}, "input": {"ms": 0.4}, "step": {"ms": 10.5}},
           2: {"per_replica_batch": 48, "intra_op_threads": 1, "compute": {"ms": 10.2},
               "all_reduce": {"ms": 5.0}, "input": {"ms": 0.5}, "step": {"ms": 16.0}}}
  lines = bench.explain([ref, keras1, keras2], costs)
  assert len(lines) == 3, lines  # Throughput, scaling and launch; accuracy is not measured.
  assert "takes 10.50 (+0.50: the strategy); keras adds +0.50" in lines[0]
  assert "all-reduce alone takes 5.00 ms" in lines[1]
  assert "would reach 0.66 of 1 worker's" in lines[1] and "keras adds +2.00 ms" in lines[1]
  assert "12.5 s: 2.5 s before any task started" in lines[2]
  table = bench.format_step_costs([ref, keras1, keras2], costs, ["keras"])
  assert "| 2 | 48 | 1 | 0.50 | 10.20 | 5.00 | 16.00 | - | 18.00 | +2.00 |" in table


def test_rounds_combine_to_medians_with_ratios_taken_within_each_round():
  rounds = [bench.Result("keras", 1, ms_per_step=ms, ratio_to_reference=ratio,
                         launch_to_first_step=launch, peak_rss_mb={"main": rss},
                         cpu_seconds={"main": cpu}, breakdown={"training": training},
                         window_ms_per_step=[ms], step_at_accuracy=step)
            for ms, ratio, launch, rss, cpu, training, step in [(10, 1.0, 5, 800, 60, 20, 900),
                                                                (12, 0.9, 4, 900, 70, 30, 1000),
                                                                (11, 1.1, 6, 850, 50, 25, 1000)]]
  combined = bench.combine_rounds(rounds)
  assert (combined.rounds, combined.ms_per_step) == (3, 11)
  assert combined.ratio_range == [0.9, 1.1] and combined.launch_to_first_step == 5
  assert combined.peak_rss_mb == {"main": 900} and combined.cpu_seconds == {"main": 60}
  assert combined.breakdown == {"training": 25} and combined.step_at_accuracy == 1000
  assert combined.window_ms_per_step == [10, 12, 11]
  failed = bench.combine_rounds([rounds[0], dataclasses.replace(rounds[1], error="exit code 1")])
  assert failed.error == "round 2: exit code 1" and failed.rounds == 2
  assert failed.ms_per_step is None  # No round's numbers stand for a failed entry.
  costs = [{"workers": 2, **{part: {"ms": ms + i, "windows": [ms + i]}
                             for i, part in enumerate(bench.STEP_PARTS)}} for ms in (3, 1, 2)]
  combined_costs = bench.combine_step_costs(costs)
  assert combined_costs["workers"] == 2 and combined_costs["step"]["ms"] == 5
  assert combined_costs["input"] == {"ms": 2, "windows": [3, 1, 2]}
  assert "round 2" in bench.combine_step_costs([costs[0], {"error": "exit code 1"}])["error"]
  reference = bench.Result("reference", 1, ms_per_step=10.0, examples_per_second=9600)
  combined.examples_per_second = 8727.3
  both = [bench.combine_rounds([reference, reference]), combined]
  bench._set_ratios(both)  # pylint: disable=protected-access
  # The ratio of the medians, not the median of the ratios (1.0): both columns agree.
  assert "| 11.00 | 0.91 (0.90-1.10) |" in bench.format_table(both)


def test_chief_milestones_are_read_from_its_log(tmp_path):
  launched = datetime.datetime(2026, 3, 4, 5, 6, 0).timestamp()
  log = tmp_path / "chief-0.log"
  log.write_text(
      "2026-03-04 05:06:01.000000: I tensorflow/core/platform/cpu_feature_guard.cc:182] ...\n"
      "[chief:0] I0304 05:06:04.250000 1401 distribute.py:68] Task chief:0 of 2 workers; 1 "
      "intra-op threads.\n"
      "[chief:0] I0304 05:06:06.500000 1401 collective_all_reduce_strategy.py:576] "
      "MultiWorkerMirroredStrategy with cluster_spec = {...}\n"
      "[chief:0] I0304 05:06:09.000000 1401 distribute.py:68] Task chief:0 of 2 workers\n")
  found = bench.chief_milestones(str(log), launched)
  assert found == {"imported": launched + 4.25, "strategy": launched + 6.5}
  assert bench.chief_milestones(str(tmp_path / "missing.log"), launched) == {}
