"""launch.tools.bench_report: targets, tables, and the explanation of each missed target."""

from launch.tools import bench_measure
from launch.tools import bench_report


def test_missed_targets_are_explained_from_the_step_costs():
  ref = bench_measure.Result("reference", 1, ms_per_step=10.0, examples_per_second=9600)
  keras1 = bench_measure.Result("keras", 1, ms_per_step=11.0, examples_per_second=8727,
                        ratio_to_reference=0.909)
  keras2 = bench_measure.Result("keras", 2, ms_per_step=18.0, examples_per_second=5333,
                        launch_to_first_step=12.5, peak_rss_mb={"launcher": 1, "chief-0": 1,
                                                                "worker-0": 1},
                        breakdown={"launch_to_tasks_started": 2.5})
  costs = {1: {"per_replica_batch": 96, "intra_op_threads": 2, "compute": {"ms": 10.1},
               "all_reduce": {"ms": 0.2}, "input": {"ms": 0.4}, "step": {"ms": 10.5}},
           2: {"per_replica_batch": 48, "intra_op_threads": 1, "compute": {"ms": 10.2},
               "all_reduce": {"ms": 5.0}, "input": {"ms": 0.5}, "step": {"ms": 16.0}}}
  lines = bench_report.explain([ref, keras1, keras2], costs)
  assert len(lines) == 3, lines  # Throughput, scaling and launch; accuracy is not measured.
  assert "takes 10.50 (+0.50: the strategy); keras adds +0.50" in lines[0]
  assert "all-reduce alone takes 5.00 ms" in lines[1]
  assert "would reach 0.66 of 1 worker's" in lines[1] and "keras adds +2.00 ms" in lines[1]
  assert "12.5 s: 2.5 s before any task started" in lines[2]
  table = bench_report.format_step_costs([ref, keras1, keras2], costs, ["keras"])
  assert "| 2 | 48 | 1 | 0.50 | 10.20 | 5.00 | 16.00 | - | 18.00 | +2.00 |" in table


def test_the_table_shows_ratios_of_medians_with_their_range():
  rounds = [bench_measure.Result("keras", 1, ms_per_step=ms, ratio_to_reference=ratio,
                                 examples_per_second=eps)
            for ms, ratio, eps in [(10, 1.0, 9600), (12, 0.9, 8000), (11, 1.1, 8727.3)]]
  combined = bench_measure.combine_rounds(rounds)
  reference = bench_measure.Result("reference", 1, ms_per_step=10.0, examples_per_second=9600)
  both = [bench_measure.combine_rounds([reference, reference]), combined]
  bench_measure.set_ratios(both)
  # The ratio of the medians, not the median of the ratios (1.0): both columns agree.
  assert "| 11.00 | 0.91 (0.90-1.10) |" in bench_report.format_table(both)

