"""launch.bench.report: targets, tables, and the explanation of each missed target."""

import json
import os

from launch.bench import measure as bench_measure
from launch.bench import report as bench_report
from trainers.config import Config

COSTS = {1: {"per_replica_batch": 96, "intra_op_threads": 2, "steps_per_execution": 10,
             "input": {"ms": 0.4}, "compute": {"ms": 9.1}, "all_reduce": {"ms": 0.2},
             "step": {"ms": 10.5}, "step_memory": {"ms": 10.2}, "step_k": {"ms": 9.8},
             "step_k_memory": {"ms": 9.5}, "session_step": {"ms": 11.0},
             "keras_train_function": {"ms": 10.1}, "keras_fit": {"ms": 10.4},
             "keras_fit_callbacks": {"ms": 10.7}},
         2: {"per_replica_batch": 48, "intra_op_threads": 1, "steps_per_execution": 10,
             "input": {"ms": 0.5}, "compute": {"ms": 10.2}, "all_reduce": {"ms": 5.0},
             "step": {"ms": 16.0}, "step_memory": {"ms": 15.8}, "step_k": {"ms": 15.5},
             "step_k_memory": {"ms": 15.2}, "keras_train_function": {"ms": 15.9},
             "keras_fit": {"ms": 16.5}, "keras_fit_callbacks": {"ms": 17.0}}}


def _results():
  return [bench_measure.Result("ceiling", 1, ms_per_step=9.9, examples_per_second=9697,
                               launch_to_first_step=3.0),
          bench_measure.Result("keras", 1, ms_per_step=11.0, examples_per_second=8727,
                               launch_to_first_step=6.0),
          bench_measure.Result("estimator", 1, ms_per_step=12.0, launch_to_first_step=4.0,
                               time_to_accuracy=20.0),
          bench_measure.Result("keras-noevaluator", 2, ms_per_step=17.0,
                               examples_per_second=5647),
          bench_measure.Result("keras", 2, ms_per_step=18.0, examples_per_second=5333,
                               launch_to_first_step=12.5, wall_seconds=40.0,
                               peak_rss_mb={"launcher": 1, "chief-0": 1, "worker-0": 1,
                                            "evaluator-0": 1},
                               cpu_seconds={"evaluator-0": 8.0},
                               breakdown={"launch_to_tasks_started": 2.5}),
          bench_measure.Result("estimator", 2, ms_per_step=17.5, launch_to_first_step=7.0,
                               graph_all_reduces=2)]


def test_missed_targets_are_explained_from_the_step_costs():
  results = _results()
  bench_measure.set_ratios(results, COSTS)
  targets = {t.name: t for t in bench_report.targets(results, COSTS)}
  # Like with like: each backend against the bare K-step loop on the same pipeline.
  assert targets["keras x1 examples/s / bare K-step loop on the pipeline"].measured == round(
      9.8 / 11.0, 3)
  assert targets["estimator x1 examples/s / bare K-step loop on the pipeline"].limit == 0.90
  # The pipeline against a batch in memory, at each worker count: 0.3 ms, limit 0.1.
  pipeline = targets["input pipeline x1 ms/step: K-step loop on it - on a batch in memory"]
  assert pipeline.measured == 0.3 and pipeline.met is False
  # At 2 workers Keras without its evaluator; the Estimator has only the one way.
  assert targets["keras-noevaluator x2 ms/step - bare K-step step"].measured == 1.5
  assert targets["estimator x2 ms/step - bare K-step step"].measured == 2.0
  assert "keras x2 ms/step - bare K-step step" not in targets
  assert targets["keras x1 launch to first step (s)"].limit == 5.0
  assert targets["keras x2 launch to first step (s)"].limit == 8.0
  assert not any(name.startswith("ceiling") for name in targets)  # No run of its own.
  lines = bench_report.explain(results, COSTS)
  # Pipeline x1, x2; two ratios, launch x1; Keras x2: K-step (no evaluator), scaling, launch;
  # Estimator x2: K-step.
  assert len(lines) == 9, lines
  assert ("input pipeline x2 ms/step: K-step loop on it - on a batch in memory: the K-step loop "
          "takes 15.50 ms/step on the input pipeline and 15.20 on one batch held in memory "
          "(+0.30); one step per call, 16.00 and 15.80. Fetching a batch alone takes 0.50 ms"
          in lines[1]), lines
  ratio = next(line for line in lines if line.startswith("keras x1 examples/s"))
  assert "11.00 ms/step against the bare loop's 9.80 (K=10 steps per call on the same" in ratio
  assert "keras adds +1.20 to the K-step loop (+0.50 to one step per call)" in ratio
  # Of which Keras's train function's, fit's own, the trainer's callbacks' (the probe's two
  # fits), and the run's rest.
  assert ratio.endswith(
      "Keras's train function of the same step, timed in turn with the bare loops, takes 10.10 "
      "(+0.30 to the K-step loop); fit of it takes 10.40 with none of the trainer's callbacks "
      "(+0.30) and 10.70 with them (divergence check, checkpoints, backups, progress: +0.30); "
      "the run adds +0.30 to the probe's fit with them.")
  estimator = next(line for line in lines if line.startswith("estimator x1 examples/s"))
  assert "plain Session, one run per step and no hooks, takes 11.00" in estimator
  assert "hooks add +1.00" in estimator and "Session" not in ratio
  k_step = next(line for line in lines if line.startswith("keras-noevaluator x2 ms/step"))
  assert "+1.50 over a bare K-step" in k_step and "all-reduce alone takes 5.00 ms" in k_step
  assert "takes 15.90 (+0.40 to the K-step loop); fit of it takes 16.50" in k_step
  assert "progress: +0.50); the run adds +0.00" in k_step and "evaluator task" not in k_step
  assert "train function" not in estimator and "graph.pbtxt" not in k_step
  # The evaluator's cost on its own line.
  assert bench_report.evaluator_costs(results) == [
      "keras x2: 18.00 ms/step with its evaluator task against 17.00 with --noevaluator "
      "(+1.00). The evaluator task took 8 CPU-s during the run's 40 s "
      f"({8 / (40 * (os.cpu_count() or 1)):.0%} of the {os.cpu_count() or 1} cores the "
      "workers also use)."]
  # The Estimator in a cluster: its all-reduces per step, and its Session.run per step.
  estimator_2 = next(line for line in lines if line.startswith("estimator x2 ms/step"))
  assert "training graph (graph.pbtxt) has 2 all-reduces, each run every step" in estimator_2
  assert "one step per call takes 16.00 (+0.50 over K steps per call), and the Estimator adds " \
      "+1.50 to it." in estimator_2
  assert any("12.5 s: 2.5 s before any task started" in line for line in lines)
  assert any("the ceiling run, which imports TensorFlow" in line and "took 3.0 s" in line
             for line in lines)
  table = bench_report.format_step_costs(results, COSTS, ["keras"])
  assert ("| 2 | 48 | 1 | 10 | 0.50 | 10.20 | 5.00 | 16.00 | 15.80 | 15.50 | 15.20 | - | 15.90 | "
          "16.50 | 17.00 | - | 15.20 (step_k_memory) | 18.00 | +2.50 |") in table
  assert "| 11.00 | 10.10 | 10.40 | 10.70 | 9.90 | 9.50 (step_k_memory) | 11.00 | +1.20 |" in table
  assert table.splitlines()[1].count("|") == table.splitlines()[0].count("|")
  assert bench_report.ceiling_bugs(results) == []


def test_a_run_faster_than_the_ceiling_is_reported_as_a_bug_in_the_ceiling():
  results = _results()
  results[1].ms_per_step = 9.0
  bench_measure.set_ratios(results, COSTS)
  (bug,) = bench_report.ceiling_bugs(results)
  assert bug.startswith("keras x1 ran at 1.056 of the ceiling") and "bug in the ceiling" in bug
  assert "noise" not in bug  # One round: nothing says it was ever below.
  assert not any("keras x1 examples/s" in line for line in bench_report.explain(results, COSTS))
  results[1].ratio_range = [0.97, 1.06]
  assert "ranged 0.97 to 1.06: at or below the ceiling in some" in bench_report.ceiling_bugs(
      results)[0]


def test_the_table_shows_ratios_of_medians_with_their_range():
  rounds = [bench_measure.Result("keras", 1, ms_per_step=ms, ratio_to_ceiling=ratio,
                                 examples_per_second=eps)
            for ms, ratio, eps in [(10, 1.0, 9600), (12, 0.9, 8000), (11, 1.1, 8727.3)]]
  combined = bench_measure.combine_rounds(rounds)
  ceiling = bench_measure.Result("ceiling", 1, ms_per_step=10.0, examples_per_second=9600)
  both = [bench_measure.combine_rounds([ceiling, ceiling]), combined]
  bench_measure.set_ratios(both, {1: {}})
  # The ratio of the medians, not the median of the ratios (1.0): both columns agree.
  assert "| 11.00 | 0.91 (0.90-1.10) |" in bench_report.format_table(both, {1: {}})


def test_a_step_on_parameter_servers_is_set_beside_the_same_backends_step():
  results = [bench_measure.Result("keras", 2, ms_per_step=18.0),
             bench_measure.Result("keras-ps", 2, ms_per_step=27.0),
             bench_measure.Result("estimator-ps", 2, ms_per_step=30.0)]  # No MWMS run: none.
  assert bench_report.ps_costs(results) == [
      "keras-ps x2: 27.00 ms/step against 18.00 for keras x2 (+9.00, 1.50x)."]


def test_several_models_make_one_table_of_runs_and_targets(tmp_path):
  benches = [(Config(model=model), _results(), COSTS) for model in ("cnn", "linear")]
  bench_measure.set_ratios(benches[0][1], COSTS)
  bench_report.write_models_report(benches, str(tmp_path), {"cpus": 2})
  page = (tmp_path / "bench.md").read_text()
  assert page.startswith("# Benchmark: cnn, linear; ")
  for model in ("cnn", "linear"):
    assert f"| {model} | keras | 2 | 18.00 |" in page, page
    assert f"| {model} | keras x1 examples/s / bare K-step loop on the pipeline | 0.891 | " \
           ">= 0.95 | NO |" in page, page
    assert f"- {model}: keras x1 examples/s / bare K-step loop on the pipeline: " in page
  report = json.loads((tmp_path / "bench.json").read_text())
  assert list(report["models"]) == ["cnn", "linear"]
  assert report["models"]["linear"]["config"]["model"] == "linear"
  assert report["models"]["cnn"]["missed"] == bench_report.explain(_results(), COSTS)
