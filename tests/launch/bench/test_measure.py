"""launch.bench.measure: numbers read back from what runs wrote, and rounds combined."""

import dataclasses
import json

import pytest

from launch.bench import measure as bench_measure


def test_step_windows_skip_warm_up():
  events = [(10, 100.0, 0.0), (20, 101.0, 0.0), (30, 101.5, 0.0), (40, 102.0, 0.0)]
  assert bench_measure.step_windows(events) == [0.05, 0.05]
  assert bench_measure.step_windows(events, warmup_steps=30) == [0.05]
  assert bench_measure.step_windows(events, warmup_steps=1000) == [0.05, 0.05]


def test_step_windows_leave_out_the_windows_next_to_a_checkpoint_step():
  # A loss event every 100 steps at 0.01 s/step, and a 3 s save at step 400: Keras
  # saves, then logs step 400; the Estimator saves at 400 and logs step 401.
  for offset, kept in ((0, 4), (1, 5)):
    events = [(s + offset, s / 100 + (3.0 if s >= 400 else 0.0), 0.0) for s in range(0, 900, 100)]
    windows = bench_measure.step_windows(events)
    assert windows == pytest.approx([0.01, 0.01, 0.04] + [0.01] * 4)
    # Out: (300, 400], (400, 500], (700, 800]; the Estimator's (301, 401], (701, 801].
    assert bench_measure.step_windows(events, checkpoint_every=400) == pytest.approx(
        [0.01] * kept), offset
  few = [(0, 0.0, 0.0), (100, 1.0, 0.0), (200, 2.0, 0.0)]
  assert bench_measure.step_windows(few, checkpoint_every=200) == [0.01]  # None away: keep.


def test_the_estimators_all_reduces_are_counted_in_its_graph(tmp_path):
  assert bench_measure.graph_all_reduces(str(tmp_path)) is None  # Keras writes no graph.
  (tmp_path / "graph.pbtxt").write_text(
      'node { name: "w/Initializer/CollectiveBcastSend" op: "CollectiveBcastSend" }\n'
      'node { name: "CollectiveReduceV2" op: "CollectiveReduceV2" }\n'
      'node { name: "CollectiveReduceV2_1" op: "CollectiveReduceV2" }\n')
  assert bench_measure.graph_all_reduces(str(tmp_path)) == 2


def test_rounds_combine_to_medians_with_ratios_taken_within_each_round():
  rounds = [bench_measure.Result("keras", 1, ms_per_step=ms, ratio_to_ceiling=ratio,
                         launch_to_first_step=launch, peak_rss_mb={"main": rss},
                         cpu_seconds={"main": cpu}, breakdown={"training": training},
                         window_ms_per_step=[ms], step_at_accuracy=step)
            for ms, ratio, launch, rss, cpu, training, step in [(10, 1.0, 5, 800, 60, 20, 900),
                                                                (12, 0.9, 4, 900, 70, 30, 1000),
                                                                (11, 1.1, 6, 850, 50, 25, 1000)]]
  combined = bench_measure.combine_rounds(rounds)
  assert (combined.rounds, combined.ms_per_step) == (3, 11)
  assert combined.ratio_range == [0.9, 1.1] and combined.launch_to_first_step == 5
  assert combined.peak_rss_mb == {"main": 900} and combined.cpu_seconds == {"main": 60}
  assert combined.breakdown == {"training": 25} and combined.step_at_accuracy == 1000
  assert combined.window_ms_per_step == [10, 12, 11]
  failed = bench_measure.combine_rounds(
      [rounds[0], dataclasses.replace(rounds[1], error="exit code 1")])
  assert failed.error == "round 2: exit code 1" and failed.rounds == 2
  assert failed.ms_per_step is None  # No round's numbers stand for a failed entry.
  costs = [{"workers": 2, **{part: {"ms": ms + i, "windows": [ms + i], "steps_per_call": 1}
                             for i, part in enumerate(bench_measure.STEP_PARTS)}}
           for ms in (3, 1, 2)]
  combined_costs = bench_measure.combine_step_costs(costs)
  assert combined_costs["workers"] == 2 and combined_costs["step"]["ms"] == 5
  assert combined_costs["input"] == {"ms": 2, "windows": [3, 1, 2], "steps_per_call": 1}
  combined = bench_measure.combine_step_costs([costs[0], {"error": "exit code 1"}])
  assert "round 2" in combined["error"]


def test_startup_milestones_come_from_the_first_start_record(tmp_path):
  assert bench_measure.startup_milestones(str(tmp_path)) == {}
  (tmp_path / "progress.jsonl").write_text(
      json.dumps({"event": "start", "time": 9.0, "from_step": 0, "to_step": 4,
                  "startup": {"imported": 4.25, "strategy": 6.5}}) + "\n" +
      json.dumps({"event": "step", "time": 10.0, "step": 2, "loss": 1.0}) + "\n" +
      json.dumps({"event": "start", "time": 20.0, "from_step": 2, "to_step": 4,
                  "startup": {"imported": 14.0, "strategy": 16.0}}) + "\n" +
      '{"event": "step", "ti')  # A record still being written is not read.
  assert bench_measure.startup_milestones(str(tmp_path)) == {"imported": 4.25, "strategy": 6.5}


def test_the_ceiling_is_the_fastest_loop_and_every_ratio_is_taken_to_it():
  costs = {1: {"step": {"ms": 12.0}, "step_memory": {"ms": 11.5}, "step_k": {"ms": 10.2},
               "step_k_memory": {"ms": 10.0}},
           2: {"step": {"ms": 20.0}, "step_memory": {"ms": 19.0}, "step_k": {"ms": 18.0},
               "step_k_memory": {"ms": 17.9}}}
  ceiling_1 = bench_measure.Result("ceiling", 1, ms_per_step=10.5)
  ceiling_2 = bench_measure.Result("ceiling", 2, ms_per_step=17.0)  # Faster than its loops.
  keras_1 = bench_measure.Result("keras", 1, ms_per_step=11.0)
  keras_2 = bench_measure.Result("keras", 2, ms_per_step=17.0 / 1.02)
  failed = bench_measure.Result("estimator", 2, error="exit code 1")
  results = [ceiling_1, keras_1, ceiling_2, keras_2, failed]
  assert bench_measure.ceilings(results, costs) == {1: ("step_k_memory", 10.0),
                                                    2: ("ceiling run", 17.0)}
  bench_measure.set_ratios(results, costs)
  assert (ceiling_1.ratio_to_ceiling, keras_1.ratio_to_ceiling) == (0.952, 0.909)
  assert (ceiling_2.ratio_to_ceiling, keras_2.ratio_to_ceiling) == (1.0, 1.02)
  assert failed.ratio_to_ceiling is None
  # Without the probe (it failed), the ceiling run alone is the ceiling.
  assert bench_measure.ceilings(results, {1: {"error": "exit code 1"}}) == {
      1: ("ceiling run", 10.5)}
