"""Benchmark report: the targets, the tables, and for each missed target where the time went."""

import dataclasses
import json
import os
import platform
from typing import Any, Dict, List, Mapping, Optional, Sequence

import tensorflow as tf

from launch.tools import bare
from launch.tools.bench_measure import REFERENCE, STEP_PARTS, TARGET_ACCURACY, Result, warmup_steps
from launch.tools.runs import BACKENDS
from trainers.config import Config

# Targets of the benchmark issue, checked in the report (never raised on).
THROUGHPUT_VS_REFERENCE = {"keras": 1.0, "estimator": 0.9}
TWO_WORKER_SCALING = 0.8
LAUNCH_TO_FIRST_STEP_SECONDS = 10.0
TIME_TO_ACCURACY_SECONDS = {"keras": 30.0, "estimator": 45.0}


@dataclasses.dataclass
class Target:
  """One target of the issue: what is measured against what."""

  name: str
  measured: Optional[float]
  limit: float
  higher_is_better: bool

  @property
  def met(self) -> Optional[bool]:
    if self.measured is None:
      return None
    return self.measured >= self.limit if self.higher_is_better else self.measured <= self.limit


def targets(results: Sequence[Result]) -> List[Target]:
  """The issue's targets that these results speak to."""
  by = {(r.name, r.workers): r for r in results}
  found = []
  for backend, limit in THROUGHPUT_VS_REFERENCE.items():
    if (backend, 1) in by:
      found.append(Target(f"{backend} x1 throughput / reference", by[backend, 1].ratio_to_reference,
                          limit, True))
  for (backend, n), r in by.items():
    if backend == REFERENCE or n == 1:
      continue
    one = by.get((backend, 1))
    if one and one.examples_per_second and r.examples_per_second:
      found.append(Target(f"{backend} x{n} / {backend} x1 global examples/s",
                          round(r.examples_per_second / one.examples_per_second, 3),
                          TWO_WORKER_SCALING, True))
    if n == 2:
      found.append(Target(f"{backend} x2 launch to first step (s)", r.launch_to_first_step,
                          LAUNCH_TO_FIRST_STEP_SECONDS, False))
  for backend, limit in TIME_TO_ACCURACY_SECONDS.items():
    if (backend, 1) in by:
      found.append(Target(f"{backend} x1 launch to {TARGET_ACCURACY:.0%} test accuracy (s)",
                          by[backend, 1].time_to_accuracy, limit, False))
  return found


def _fmt(value: Any, spec: str = "") -> str:
  return "-" if value is None else format(value, spec)


def format_table(results: Sequence[Result]) -> str:
  """The results as a Markdown table, then the targets."""
  rows = ["| run | workers | examples/s | ms/step | x reference | launch to 1st step (s) | "
          f"to {TARGET_ACCURACY:.0%} acc (s) | at step | final acc | peak RSS/worker (MB) | "
          "wall (s) |",
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
  for r in results:
    if r.error:
      rows.append(f"| {r.name} | {r.workers} | error: {r.error} |" + " |" * 8)
      continue
    workers_rss = [v for k, v in r.peak_rss_mb.items() if k != "launcher"]
    rss = "/".join(f"{v:.0f}" for v in workers_rss) or "-"
    spread = f" ({r.ratio_range[0]:.2f}-{r.ratio_range[1]:.2f})" if r.ratio_range else ""
    rows.append(
        f"| {r.name} | {r.workers} | {_fmt(r.examples_per_second, '.0f')} | "
        f"{_fmt(r.ms_per_step, '.2f')} | {_fmt(r.ratio_to_reference, '.2f')}{spread} | "
        f"{_fmt(r.launch_to_first_step, '.1f')} | {_fmt(r.time_to_accuracy, '.1f')} | "
        f"{_fmt(r.step_at_accuracy)} | {_fmt(r.final_accuracy, '.4f')} | {rss} | "
        f"{_fmt(r.wall_seconds, '.1f')} |")
  rows += ["", "| target | measured | limit | met |", "| --- | ---: | ---: | --- |"]
  for t in targets(results):
    met = {True: "yes", False: "NO", None: "-"}[t.met]
    rows.append(f"| {t.name} | {_fmt(t.measured, '.3g')} | {'>=' if t.higher_is_better else '<='}"
                f" {t.limit:g} | {met} |")
  return "\n".join(rows)


def format_breakdown(results: Sequence[Result]) -> str:
  """Where each run's wall time went, in seconds, and each task's CPU time."""
  keys = ["launch_to_tasks_started", "chief_imports", "chief_strategy", "chief_to_first_step",
          "launch_to_first_step", "training", "steady_steps", "training_overhead",
          "after_training"]
  rows = ["| run | " + " | ".join(keys) + " | CPU s by task | peak RSS by task (MB) |",
          "| --- |" + " ---: |" * len(keys) + " --- | --- |"]
  for r in results:
    if not r.error:
      cpu = ", ".join(f"{k} {v:.0f}" for k, v in r.cpu_seconds.items())
      rss = ", ".join(f"{k} {v:.0f}" for k, v in r.peak_rss_mb.items())
      rows.append(f"| {r.label} | " + " | ".join(_fmt(r.breakdown.get(k), ".1f") for k in keys)
                  + f" | {cpu} | {rss} |")
  return "\n".join(rows)


def _cost(costs: Mapping[str, Any], part: str) -> Optional[float]:
  return costs.get(part, {}).get("ms") if isinstance(costs.get(part), dict) else None


def format_step_costs(results: Sequence[Result], step_costs: Mapping[int, Mapping[str, Any]],
                      backends: Sequence[str] = BACKENDS) -> str:
  """Each worker count's step, part by part, beside the trainers' ms/step."""
  by = {(r.name, r.workers): r for r in results}
  rows = ["| workers | batch/worker | threads/worker | input alone | compute, no all-reduce | "
          "all-reduce alone | bare step | reference | "
          + " | ".join(f"{b} | {b} - bare step" for b in backends) + " |",
          "| ---: " * (8 + 2 * len(backends)) + "|"]
  for n, costs in sorted(step_costs.items()):
    if "error" in costs:
      rows.append(f"| {n} | error: {costs['error']} |")
      continue
    step = _cost(costs, "step")
    cells = [str(n), str(costs["per_replica_batch"]), str(costs["intra_op_threads"])]
    cells += [_fmt(_cost(costs, part), ".2f") for part in STEP_PARTS]
    cells.append(_fmt(by[REFERENCE, 1].ms_per_step if n == 1 and (REFERENCE, 1) in by else None,
                      ".2f"))
    for b in backends:
      ms = by[b, n].ms_per_step if (b, n) in by else None
      cells += [_fmt(ms, ".2f"), _fmt(None if ms is None or step is None else ms - step, "+.2f")]
    rows.append("| " + " | ".join(cells) + " |")
  return "\n".join(rows)


def explain(results: Sequence[Result], step_costs: Mapping[int, Mapping[str, Any]]) -> List[str]:
  """One line per missed target, saying from the measurements where the time went."""
  by = {(r.name, r.workers): r for r in results}
  cpus = os.cpu_count() or 1
  lines = []
  for t in targets(results):
    if t.met is not False:
      continue
    backend, n = t.name.split()[0], int(t.name.split()[1][1:])
    r, one, costs = by[backend, n], by.get((backend, 1)), step_costs.get(n, {})
    step = _cost(costs, "step")
    if "reference" in t.name and step is not None:
      ref = by[REFERENCE, 1].ms_per_step
      lines.append(
          f"{t.name}: {r.ms_per_step:.2f} ms/step against the reference's {ref:.2f}. A bare "
          f"step under MultiWorkerMirroredStrategy takes {step:.2f} ({step - ref:+.2f}: the "
          f"strategy); {backend} adds {r.ms_per_step - step:+.2f} around it.")
    elif "global examples/s" in t.name and one and step is not None:
      step_one = _cost(step_costs.get(1, {}), "step")
      lines.append(
          f"{t.name}: a step takes {r.ms_per_step:.2f} ms against {one.ms_per_step:.2f} at 1 "
          f"worker. Each of the {n} workers computes its {costs['per_replica_batch']} examples in "
          f"{_cost(costs, 'compute'):.2f} ms with {costs['intra_op_threads']} thread(s) "
          f"({n} processes on {cpus} cores; 1 worker computes the whole batch in "
          f"{_fmt(_cost(step_costs.get(1, {}), 'compute'), '.2f')} ms), and the all-reduce "
          f"alone takes {_cost(costs, 'all_reduce'):.2f} ms. A bare step takes {step:.2f} ms: "
          f"with nothing added, {n} workers would reach "
          f"{_fmt(None if step_one is None else step_one / step, '.2f')} of 1 worker's "
          f"examples/s. {backend} adds {r.ms_per_step - step:+.2f} ms.")
      evaluator = r.cpu_seconds.get("evaluator-0")
      if evaluator is not None and r.wall_seconds:
        lines[-1] += (f" The evaluator task took {evaluator:.0f} CPU-s during the run's "
                      f"{r.wall_seconds:.0f} s ({evaluator / (cpus * r.wall_seconds):.0%} of "
                      f"the {cpus} cores).")
    elif "first step" in t.name:
      parts = [_fmt(r.breakdown.get(k), ".1f") for k in ("launch_to_tasks_started",
                                                          "chief_imports", "chief_strategy",
                                                          "chief_to_first_step")]
      lines.append(
          f"{t.name}: {r.launch_to_first_step:.1f} s: {parts[0]} s before any task started "
          f"(the launcher checks flags, data and model_dir), then in the chief "
          f"{parts[1]} s of imports (Python, TensorFlow, this code; {len(r.peak_rss_mb) - 1} "
          f"processes start at once on {cpus} cores), {parts[2]} s to create the strategy "
          f"(every training task must have started and joined), and {parts[3]} s to build "
          "the model and its step and run the first one.")
    else:
      lines.append(f"{t.name}: {t.measured} (limit {t.limit}); see the tables above.")
  return lines


def machine() -> Dict[str, Any]:
  """What the numbers were measured on."""
  return {"cpus": os.cpu_count(), "platform": platform.platform(),
          "python": platform.python_version(), "tensorflow": tf.__version__,
          "load_average": [round(x, 2) for x in os.getloadavg()]}


def write_report(results: Sequence[Result], step_costs: Mapping[int, Mapping[str, Any]],
                 config: Config, out_dir: str, started: Dict[str, Any],
                 backends: Sequence[str] = BACKENDS) -> None:
  """bench.json and bench.md in out_dir."""
  report = {
      "config": dataclasses.asdict(config),
      "target_accuracy": TARGET_ACCURACY,
      "machine_at_start": started,
      "machine_at_end": machine(),
      "results": [dataclasses.asdict(r) for r in results],
      "step_costs": {str(n): costs for n, costs in step_costs.items()},
      "targets": [{**dataclasses.asdict(t), "met": t.met} for t in targets(results)],
      "missed": explain(results, step_costs),
  }
  missed = "".join(f"- {line}\n" for line in report["missed"]) or "Every target is met.\n"
  rounds = max((r.rounds for r in results), default=1)
  medians = (f"Each number is the median of {rounds} rounds run one after the other, and "
             "each ratio to the reference a ratio of medians; in parentheses, the range of "
             "that ratio taken within each round.\n\n" if rounds > 1 else "")
  markdown = (f"# Benchmark: {config.train_steps} steps, global batch {config.global_batch_size}"
              f"\n\nMachine: {json.dumps(started)}\n\n{medians}{format_table(results)}\n\n"
              f"## Missed targets\n\n{missed}\n"
              f"## Where a step's time goes (ms)\n\n{format_step_costs(results, step_costs, backends)}\n\n"
              "Measured by `python -m launch.bare --probe_out` in every task of a cluster "
              "of that size, on the same model, data and batch: fetching a batch alone; the "
              "forward, backward and update with no all-reduce (each worker alone, sharing the "
              "cores as in training); the gradients' all-reduce alone; and a bare step under "
              "MultiWorkerMirroredStrategy, all-reduce included, one step per call. Medians of "
              f"{bare.PROBE_WINDOWS} windows of {bare.PROBE_CALLS_PER_WINDOW} calls. "
              "`<backend> - bare step` is what Keras or the Estimator add around the step.\n\n"
              f"## Where the run's time goes (s)\n\n{format_breakdown(results)}\n\n"
              "Steady speed is the median over the windows between `loss` events "
              f"(every {config.log_every_steps} steps) after warm-up (the first window and the "
              f"first epoch, {warmup_steps(config)} steps). Per-window ms/step are in "
              "bench.json. `training` runs from the first step to the last `loss` event; "
              "`training_overhead` is what it spent beyond `steady_steps` (warm-up, hooks, "
              "checkpoints, evaluations); `after_training` is evaluation, export and exit; "
              "`launch_to_tasks_started` is the launcher's own start-up at N > 1 workers; "
              "`chief_imports`, `chief_strategy` and `chief_to_first_step` split the chief's "
              "start-up at the milestones of its first `start` record in progress.jsonl (imports "
              "done, strategy created). CPU "
              "seconds are user plus system time, as last polled before each task exited.\n")
  # Both built before either is written: a failure leaves no half report.
  with open(os.path.join(out_dir, "bench.json"), "w") as f:
    json.dump(report, f, indent=2)
  with open(os.path.join(out_dir, "bench.md"), "w") as f:
    f.write(markdown)
