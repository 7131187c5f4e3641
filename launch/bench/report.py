"""Benchmark report: the targets, the tables, and for each missed target where the time went."""

import dataclasses
import json
import os
import platform
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

from launch.bench import bare
from launch.bench.measure import (CEILING, STEP_PARTS, TARGET_ACCURACY, Result, ceilings,
                                  warmup_steps)
from launch.proofs.runs import BACKENDS
from trainers.config import Config

# Targets of the benchmark issues, checked in the report (never raised on). Each compares
# like with like: a backend against the bare K-step loop on the same input pipeline.
RATIO_TO_PIPELINE_LOOP = {"keras": 0.95, "estimator": 0.90}  # examples/s, at 1 worker.
# At 2 workers, ms/step over the bare K-step step: Keras with --noevaluator (its evaluator's
# cost is reported on its own), the Estimator with its evaluator task (it has no other way).
OVER_BARE_K_STEP_MS = 1.0
OVER_K_STEP_ENTRIES = ("keras-noevaluator", "estimator")
PIPELINE_OVER_MEMORY_MS = 0.1  # The K-step loop on the pipeline over it on a batch in memory.
LAUNCH_TO_FIRST_STEP_SECONDS = {1: 5.0, 2: 8.0}
TWO_WORKER_SCALING = 0.8
TIME_TO_ACCURACY_SECONDS = {"keras": 30.0, "estimator": 45.0}
LOOP_NAMES = {"step": "one step per call", "step_memory": "one step per call, batch in memory",
              "step_k": "K steps per call", "step_k_memory": "K steps per call, batch in memory",
              bare.SESSION_STEP: "v1 graph, one Session.run per step",
              bare.KERAS_TRAIN_FUNCTION: "Keras's train function, K steps per call",
              bare.KERAS_FIT: "Keras fit of the step, no callbacks",
              bare.KERAS_FIT_CALLBACKS: "Keras fit, the trainer's callbacks"}


@dataclasses.dataclass
class Target:
  """One target: what is measured against what, of which kind, for which run."""

  name: str
  measured: Optional[float]
  limit: float
  higher_is_better: bool
  kind: str  # One of KINDS: what the target compares, and so how a miss is explained.
  backend: str
  workers: int

  @property
  def met(self) -> Optional[bool]:
    if self.measured is None:
      return None
    return self.measured >= self.limit if self.higher_is_better else self.measured <= self.limit


def _cost(costs: Mapping[str, Any], part: str) -> Optional[float]:
  return costs.get(part, {}).get("ms") if isinstance(costs.get(part), dict) else None


# The kinds of target.
TO_PIPELINE_LOOP = "ratio to the bare K-step loop on the pipeline"
OVER_K_STEP = "ms/step over the bare K-step step"
PIPELINE = "the input pipeline over a batch in memory"
SCALING = "examples/s against 1 worker"
FIRST_STEP = "launch to first step"
TO_ACCURACY = "launch to the target accuracy"
KINDS = (TO_PIPELINE_LOOP, OVER_K_STEP, PIPELINE, SCALING, FIRST_STEP, TO_ACCURACY)
PIPELINE_ROW = "input pipeline"  # The backend of a PIPELINE target: no run, the probe's loops.


def targets(results: Sequence[Result], step_costs: Mapping[int, Mapping[str, Any]]
            ) -> List[Target]:
  """The targets that these results and step costs speak to: the backends' (not the other
  entries', but for Keras with --noevaluator at 2 workers), and the pipeline's."""
  by = {(r.name, r.workers): r for r in results}
  found = []
  for n, costs in sorted(step_costs.items()):
    on_pipeline, in_memory = _cost(costs, "step_k"), _cost(costs, "step_k_memory")
    if on_pipeline is not None and in_memory is not None:
      found.append(Target(f"{PIPELINE_ROW} x{n} ms/step: K-step loop on it - on a batch in "
                          "memory", round(on_pipeline - in_memory, 3), PIPELINE_OVER_MEMORY_MS,
                          False, PIPELINE, PIPELINE_ROW, n))
  for (name, n), r in by.items():
    k_step = _cost(step_costs.get(n, {}), "step_k")
    if n == 2 and name in OVER_K_STEP_ENTRIES:
      found.append(Target(f"{name} x2 ms/step - bare K-step step",
                          None if k_step is None or r.ms_per_step is None
                          else round(r.ms_per_step - k_step, 3), OVER_BARE_K_STEP_MS, False,
                          OVER_K_STEP, name, n))
    if name not in BACKENDS:
      continue
    if n == 1:
      found.append(Target(f"{name} x1 examples/s / bare K-step loop on the pipeline",
                          None if k_step is None or not r.ms_per_step
                          else round(k_step / r.ms_per_step, 3), RATIO_TO_PIPELINE_LOOP[name],
                          True, TO_PIPELINE_LOOP, name, n))
    one = by.get((name, 1))
    if n > 1 and one and one.examples_per_second and r.examples_per_second:
      found.append(Target(f"{name} x{n} / {name} x1 global examples/s",
                          round(r.examples_per_second / one.examples_per_second, 3),
                          TWO_WORKER_SCALING, True, SCALING, name, n))
    if n in LAUNCH_TO_FIRST_STEP_SECONDS:
      found.append(Target(f"{name} x{n} launch to first step (s)", r.launch_to_first_step,
                          LAUNCH_TO_FIRST_STEP_SECONDS[n], False, FIRST_STEP, name, n))
    if n == 1 and name in TIME_TO_ACCURACY_SECONDS:
      found.append(Target(f"{name} x1 launch to {TARGET_ACCURACY:.0%} test accuracy (s)",
                          r.time_to_accuracy, TIME_TO_ACCURACY_SECONDS[name], False,
                          TO_ACCURACY, name, n))
  return found


def evaluator_costs(results: Sequence[Result]) -> List[str]:
  """A line for each worker count with Keras run both ways: what its evaluator task adds to a
  step (Keras against Keras with --noevaluator), and the CPU time that task took."""
  by = {(r.name, r.workers): r for r in results}
  lines = []
  for (name, n), r in by.items():
    alone = by.get(("keras-noevaluator", n))
    if name != "keras" or alone is None or r.ms_per_step is None or alone.ms_per_step is None:
      continue
    lines.append(f"keras x{n}: {r.ms_per_step:.2f} ms/step with its evaluator task against "
                 f"{alone.ms_per_step:.2f} with --noevaluator "
                 f"({r.ms_per_step - alone.ms_per_step:+.2f})." + _evaluator_share(r))
  return lines


def ceiling_bugs(results: Sequence[Result]) -> List[str]:
  """A line for each run faster than the ceiling: the ceiling is then not one."""
  lines = []
  for r in results:
    if r.ratio_to_ceiling is None or r.ratio_to_ceiling <= 1.0:
      continue
    line = (f"{r.label} ran at {r.ratio_to_ceiling:.3f} of the ceiling's examples/s: a bug in "
            "the ceiling (a loop of its own should be at least as fast), not a result.")
    if r.ratio_range and r.ratio_range[0] <= 1.0:
      line += (f" Within single rounds its ratio ranged {r.ratio_range[0]:.2f} to "
               f"{r.ratio_range[1]:.2f}: at or below the ceiling in some, so the gap may be "
               "this machine's noise; more --repeats tell.")
    lines.append(line)
  return lines


def ps_costs(results: Sequence[Result]) -> List[str]:
  """A line for each `<backend>-ps` run: its steady ms/step against the backend's own under
  MultiWorkerMirroredStrategy at the same worker count."""
  by = {(r.name, r.workers): r for r in results}
  lines = []
  for (name, n), r in by.items():
    base = by.get((name[:-len("-ps")], n)) if name.endswith("-ps") else None
    if base is None or r.ms_per_step is None or base.ms_per_step is None:
      continue
    lines.append(f"{r.label}: {r.ms_per_step:.2f} ms/step against {base.ms_per_step:.2f} for "
                 f"{base.label} ({r.ms_per_step - base.ms_per_step:+.2f}, "
                 f"{r.ms_per_step / base.ms_per_step:.2f}x).")
  return lines


def _fmt(value: Any, spec: str = "") -> str:
  return "-" if value is None else format(value, spec)


def _ratio(r: Result) -> str:
  """A run's ratio to the ceiling, with its range within single rounds if it has one."""
  spread = f" ({r.ratio_range[0]:.2f}-{r.ratio_range[1]:.2f})" if r.ratio_range else ""
  return f"{_fmt(r.ratio_to_ceiling, '.2f')}{spread}"


def _target_row(t: Target) -> str:
  """A target's measured, limit and met cells."""
  met = {True: "yes", False: "NO", None: "-"}[t.met]
  return (f"{_fmt(t.measured, '.3g')} | {'>=' if t.higher_is_better else '<='} {t.limit:g} | "
          f"{met} |")


def format_table(results: Sequence[Result], step_costs: Mapping[int, Mapping[str, Any]]) -> str:
  """The results as a Markdown table, then the targets."""
  rows = ["| run | workers | examples/s | ms/step | x ceiling | launch to 1st step (s) | "
          f"to {TARGET_ACCURACY:.0%} acc (s) | at step | final acc | peak RSS/worker (MB) | "
          "wall (s) |",
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
  for r in results:
    if r.error:
      rows.append(f"| {r.name} | {r.workers} | error: {r.error} |" + " |" * 8)
      continue
    workers_rss = [v for k, v in r.peak_rss_mb.items() if k not in ("launcher", "zygote")]
    rss = "/".join(f"{v:.0f}" for v in workers_rss) or "-"
    rows.append(
        f"| {r.name} | {r.workers} | {_fmt(r.examples_per_second, '.0f')} | "
        f"{_fmt(r.ms_per_step, '.2f')} | {_ratio(r)} | "
        f"{_fmt(r.launch_to_first_step, '.1f')} | {_fmt(r.time_to_accuracy, '.1f')} | "
        f"{_fmt(r.step_at_accuracy)} | {_fmt(r.final_accuracy, '.4f')} | {rss} | "
        f"{_fmt(r.wall_seconds, '.1f')} |")
  rows += ["", "| target | measured | limit | met |", "| --- | ---: | ---: | --- |"]
  for t in targets(results, step_costs):
    rows.append(f"| {t.name} | {_target_row(t)}")
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


def format_step_costs(results: Sequence[Result], step_costs: Mapping[int, Mapping[str, Any]],
                      backends: Sequence[str] = BACKENDS) -> str:
  """Each worker count's step, part by part, the ceiling's loops, and the trainers' ms/step."""
  by = {(r.name, r.workers): r for r in results}
  ceiling = ceilings(results, step_costs)
  rows = ["| workers | batch/worker | threads/worker | K | input alone | compute, no all-reduce | "
          "all-reduce alone | " + " | ".join(LOOP_NAMES.values()) + " | ceiling run | ceiling | "
          + " | ".join(f"{b} | {b} - K-step" for b in backends) + " |",
          "| ---: " * (6 + len(STEP_PARTS) + 2 * len(backends)) + "|"]
  for n, costs in sorted(step_costs.items()):
    if "error" in costs:
      rows.append(f"| {n} | error: {costs['error']} |")
      continue
    k_step = _cost(costs, "step_k")
    cells = [str(n), str(costs["per_replica_batch"]), str(costs["intra_op_threads"]),
             str(costs.get("steps_per_execution", "-"))]
    cells += [_fmt(_cost(costs, part), ".2f") for part in STEP_PARTS]
    run = by.get((CEILING, n))
    cells.append(_fmt(run.ms_per_step if run else None, ".2f"))
    cells.append(f"{ceiling[n][1]:.2f} ({ceiling[n][0]})" if n in ceiling else "-")
    for b in backends:
      ms = by[b, n].ms_per_step if (b, n) in by else None
      over = None if ms is None or k_step is None else ms - k_step
      cells += [_fmt(ms, ".2f"), _fmt(over, "+.2f")]
    rows.append("| " + " | ".join(cells) + " |")
  return "\n".join(rows)


def _keras_fit_split(backend: str, r: Result, costs: Mapping[str, Any]) -> str:
  """For Keras: how much of what it adds to the bare K-step loop is its train function's
  (timed in turn with the loop), fit's, the trainer's callbacks' (the probe's two fits,
  one after the other), and the rest."""
  parts = [_cost(costs, part) for part in ("step_k", bare.KERAS_TRAIN_FUNCTION, bare.KERAS_FIT,
                                           bare.KERAS_FIT_CALLBACKS)]
  if backend not in ("keras", "keras-noevaluator") or None in parts:
    return ""
  k_step, train_function, fit, with_callbacks = parts
  return (f" Keras's train function of the same step, timed in turn with the bare loops, "
          f"takes {train_function:.2f} ({train_function - k_step:+.2f} to the K-step loop); "
          f"fit of it takes {fit:.2f} with none of the trainer's callbacks "
          f"({fit - train_function:+.2f}) and {with_callbacks:.2f} with them (divergence "
          f"check, checkpoints, backups, progress: {with_callbacks - fit:+.2f}); the run "
          f"adds {r.ms_per_step - with_callbacks:+.2f} to the probe's fit with them.")


def _estimator_split(r: Result, loops: Mapping[str, Optional[float]]) -> str:
  """For the Estimator in a cluster: its all-reduces per step (from its graph.pbtxt) and
  its one Session.run per step, against the bare loops."""
  if r.graph_all_reduces is None:
    return ""
  return (f" The Estimator's training graph (graph.pbtxt) has {r.graph_all_reduces} "
          f"all-reduces, each run every step, where the bare step and Keras have one (the "
          f"gradients'): tf.estimator also reduces the loss over the workers itself. It "
          f"runs one Session.run per step: the bare loop with one step per call takes "
          f"{loops['step']:.2f} ({loops['step'] - loops['step_k']:+.2f} over K steps per call), "
          f"and the Estimator adds {r.ms_per_step - loops['step']:+.2f} to it.")


def _explain_to_pipeline_loop(t: Target, r: Result, costs: Mapping[str, Any],
                              loops: Mapping[str, float]) -> str:
  line = (f"{t.name}: {r.ms_per_step:.2f} ms/step against the bare loop's {loops['step_k']:.2f} "
          f"(K={costs.get('steps_per_execution')} steps per call on the same input pipeline; "
          f"one step per call {loops['step']:.2f}). {t.backend} adds "
          f"{r.ms_per_step - loops['step_k']:+.2f} to the K-step loop "
          f"({r.ms_per_step - loops['step']:+.2f} to one step per call)."
          + _keras_fit_split(t.backend, r, costs))
  session = _cost(costs, bare.SESSION_STEP)
  if t.backend == "estimator" and session is not None:
    line += (f" The Estimator's own v1 graph run by a plain Session, one run per "
             f"step and no hooks, takes {session:.2f}: MonitoredSession and its hooks "
             f"add {r.ms_per_step - session:+.2f}.")
  return line


def _explain_pipeline(t: Target, costs: Mapping[str, Any], loops: Mapping[str, float]) -> str:
  return (f"{t.name}: the K-step loop takes {loops['step_k']:.2f} ms/step on the input pipeline "
          f"and {loops['step_k_memory']:.2f} on one batch held in memory "
          f"({loops['step_k'] - loops['step_k_memory']:+.2f}); one step per call, "
          f"{loops['step']:.2f} and {loops['step_memory']:.2f}. Fetching a batch alone takes "
          f"{_cost(costs, 'input'):.2f} ms: what the loop does not overlap with its step.")


def _explain_over_k_step(t: Target, r: Result, costs: Mapping[str, Any],
                         loops: Mapping[str, float]) -> str:
  line = (f"{t.name}: {r.ms_per_step:.2f} ms/step, {r.ms_per_step - loops['step_k']:+.2f} over "
          f"a bare K-step MultiWorkerMirroredStrategy step ({loops['step_k']:.2f}; one step per "
          f"call {loops['step']:.2f}). Inside the bare step, each worker computes its "
          f"{costs['per_replica_batch']} examples in {_cost(costs, 'compute'):.2f} ms and the "
          f"all-reduce alone takes {_cost(costs, 'all_reduce'):.2f} ms."
          + _keras_fit_split(t.backend, r, costs) + _estimator_split(r, loops))
  return line + _evaluator_share(r)


def _evaluator_share(r: Result) -> str:
  """The CPU time a run's evaluator task took, as a share of the cores ("" without one)."""
  evaluator, cpus = r.cpu_seconds.get("evaluator-0"), os.cpu_count() or 1
  if evaluator is None or not r.wall_seconds:
    return ""
  return (f" The evaluator task took {evaluator:.0f} CPU-s during the run's "
          f"{r.wall_seconds:.0f} s ({evaluator / (cpus * r.wall_seconds):.0%} of the {cpus} "
          "cores the workers also use).")


def _explain_scaling(t: Target, r: Result, one: Result,
                     step_costs: Mapping[int, Mapping[str, Any]], loops: Mapping[str, float]
                     ) -> str:
  n, costs, cpus = t.workers, step_costs.get(t.workers, {}), os.cpu_count() or 1
  step_one = _cost(step_costs.get(1, {}), "step_k")
  return (f"{t.name}: a step takes {r.ms_per_step:.2f} ms against {one.ms_per_step:.2f} at 1 "
          f"worker. Each of the {n} workers computes its {costs['per_replica_batch']} examples "
          f"in {_cost(costs, 'compute'):.2f} ms with {costs['intra_op_threads']} thread(s) "
          f"({n} processes on {cpus} cores; 1 worker computes the whole batch in "
          f"{_fmt(_cost(step_costs.get(1, {}), 'compute'), '.2f')} ms), and the all-reduce "
          f"alone takes {_cost(costs, 'all_reduce'):.2f} ms. A bare K-step step takes "
          f"{loops['step_k']:.2f} ms: with nothing added, {n} workers would reach "
          f"{_fmt(None if step_one is None else step_one / loops['step_k'], '.2f')} of 1 "
          f"worker's examples/s. {t.backend} adds {r.ms_per_step - loops['step_k']:+.2f} ms.")


def _explain_first_step(t: Target, r: Result, ceiling_run: Optional[Result]) -> str:
  if t.workers == 1:
    return (f"{t.name}: {r.launch_to_first_step:.1f} s, one process: imports, data checks, the "
            f"model and the first trace of its step; the ceiling run, which imports TensorFlow "
            f"and traces its loop too, took "
            f"{_fmt(ceiling_run.launch_to_first_step if ceiling_run else None, '.1f')} s.")
  parts = [_fmt(r.breakdown.get(k), ".1f") for k in ("launch_to_tasks_started", "chief_imports",
                                                      "chief_strategy", "chief_to_first_step")]
  tasks = len([k for k in r.peak_rss_mb if k not in ("launcher", "zygote")])
  forked = ("; the tasks are forked from a process that imported TensorFlow for them first"
            if "zygote" in r.peak_rss_mb else "")
  return (f"{t.name}: {r.launch_to_first_step:.1f} s: {parts[0]} s before any task started "
          f"(the launcher checks flags, data and model_dir{forked}), then in the chief "
          f"{parts[1]} s of imports (Python, TensorFlow, this code; {tasks} "
          f"processes start at once on {os.cpu_count() or 1} cores), {parts[2]} s to create the "
          f"strategy (every training task must have started and joined), and {parts[3]} s to "
          "build the model and its step and run the first one.")


def explain(results: Sequence[Result], step_costs: Mapping[int, Mapping[str, Any]]) -> List[str]:
  """One line per missed target, saying from the measurements where the time went."""
  by = {(r.name, r.workers): r for r in results}
  lines = []
  for t in targets(results, step_costs):
    if t.met is not False:
      continue
    r, one, costs = by.get((t.backend, t.workers)), by.get((t.backend, 1)), step_costs.get(
        t.workers, {})
    loops = {loop: _cost(costs, loop) for loop in bare.LOOPS}
    measured_loops = None not in loops.values()
    if t.kind == PIPELINE and measured_loops:
      lines.append(_explain_pipeline(t, costs, loops))
    elif t.kind == TO_PIPELINE_LOOP and measured_loops:
      lines.append(_explain_to_pipeline_loop(t, r, costs, loops))
    elif t.kind == OVER_K_STEP and measured_loops:
      lines.append(_explain_over_k_step(t, r, costs, loops))
    elif t.kind == SCALING and one and loops["step_k"] is not None:
      lines.append(_explain_scaling(t, r, one, step_costs, loops))
    elif t.kind == FIRST_STEP:
      lines.append(_explain_first_step(t, r, by.get((CEILING, 1))))
    else:
      lines.append(f"{t.name}: {t.measured} (limit {t.limit}); see the tables above.")
  return lines


def machine() -> Dict[str, Any]:
  """What the numbers were measured on."""
  return {"cpus": os.cpu_count(), "platform": platform.platform(),
          "python": platform.python_version(), "tensorflow": tf.__version__,
          "load_average": [round(x, 2) for x in os.getloadavg()]}


def _report(results: Sequence[Result], step_costs: Mapping[int, Mapping[str, Any]],
            config: Config, started: Dict[str, Any]) -> Dict[str, Any]:
  """bench.json's content for one model."""
  return {
      "config": dataclasses.asdict(config),
      "target_accuracy": TARGET_ACCURACY,
      "machine_at_start": started,
      "machine_at_end": machine(),
      "results": [dataclasses.asdict(r) for r in results],
      "step_costs": {str(n): costs for n, costs in step_costs.items()},
      "ceilings": {str(n): {"loop": c[0], "ms_per_step": c[1]}
                   for n, c in ceilings(results, step_costs).items()},
      "ceiling_bugs": ceiling_bugs(results),
      "targets": [{**dataclasses.asdict(t), "met": t.met} for t in targets(results, step_costs)],
      "missed": explain(results, step_costs),
      "evaluator_costs": evaluator_costs(results),
      "ps_costs": ps_costs(results),
  }


def write_report(results: Sequence[Result], step_costs: Mapping[int, Mapping[str, Any]],
                 config: Config, out_dir: str, started: Dict[str, Any],
                 backends: Sequence[str] = BACKENDS) -> None:
  """bench.json and bench.md in out_dir."""
  # The report's sections in their order, read whole as the page they write.
  report = _report(results, step_costs, config, started)
  missed = "".join(f"- {line}\n" for line in report["missed"]) or "Every target is met.\n"
  bugs = "".join(f"- {line}\n" for line in report["ceiling_bugs"])
  on_ps = "".join(f"- {line}\n" for line in report["ps_costs"])
  on_ps = f"## On parameter servers\n\n{on_ps}\n" if on_ps else ""
  evaluator = "".join(f"- {line}\n" for line in report["evaluator_costs"])
  evaluator = f"## The evaluator task's cost\n\n{evaluator}\n" if evaluator else ""
  rounds = max((r.rounds for r in results), default=1)
  medians = (f"Each number is the median of {rounds} rounds run one after the other, and "
             "each ratio to the ceiling a ratio of medians; in parentheses, the range of "
             "that ratio taken within each round.\n\n" if rounds > 1 else "")
  markdown = (f"# Benchmark: {config.model} with {config.optimizer_label()}, {config.train_steps} "
              f"steps, global batch {config.global_batch_size}"
              f"\n\nMachine: {json.dumps(started)}\n\n{medians}"
              f"{format_table(results, step_costs)}\n\n"
              "`x ceiling` is a run's examples/s over the ceiling's at its worker count: the "
              "fastest of the bare loops below and the ceiling run (`python -m launch.bare`: K "
              "steps per call on the input pipeline, trained to the end).\n\n"
              + (f"## Faster than the ceiling\n\n{bugs}\n" if bugs else "")
              + f"## Missed targets\n\n{missed}\n{evaluator}{on_ps}"
              "## Where a step's time goes (ms)\n\n"
              f"{format_step_costs(results, step_costs, backends)}\n\n"
              "Measured by `python -m launch.bare --probe_out` in every task of a cluster "
              "of that size (alone and without a strategy at 1 worker), on the same model, "
              "data and batch: fetching a batch alone; the forward, backward and update with no "
              "all-reduce (each worker alone, sharing the cores as in training); the gradients' "
              "all-reduce alone; and the bare step, all-reduce included, in four loops: one "
              "step or K (Keras's steps per execution) per `tf.function` call, each on the "
              "input pipeline or on one batch held in memory, and Keras's train function "
              "of the trainer's model, their windows taken in turn; then Keras's fit of the "
              "step without and with the trainer's callbacks. Medians "
              f"of {bare.PROBE_WINDOWS} windows of about {bare.PROBE_STEPS_PER_WINDOW} steps "
              f"(of {config.log_every_steps} for the fits, one loss event each). "
              "`<backend> - K-step` is what Keras or the Estimator add around the bare K-step "
              "loop on the pipeline.\n\n"
              f"## Where the run's time goes (s)\n\n{format_breakdown(results)}\n\n"
              "Steady speed is the median over the windows between `loss` events "
              f"(every {config.log_every_steps} steps) after warm-up (the first window and the "
              f"first epoch, {warmup_steps(config)} steps), leaving out the windows that start "
              f"or end at a multiple of {config.checkpoint_every_steps} steps or hold one (each "
              "run saves and evaluates there, just before or just after it logs that step). "
              "Per-window ms/step are in "
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


Bench = Tuple[Config, List[Result], Dict[int, Dict[str, Any]]]  # One model's run_bench.


def format_models(benches: Sequence[Bench]) -> str:
  """Several models' benches as one Markdown table of runs and one of targets, each row
  naming its model."""
  rows = ["| model | run | workers | ms/step | x ceiling | final acc |",
          "| --- | --- | ---: | ---: | ---: | ---: |"]
  for config, results, _ in benches:
    for r in results:
      rows.append(f"| {config.model} | {r.name} | {r.workers} | "
                  + (f"error: {r.error} | | |" if r.error else
                     f"{_fmt(r.ms_per_step, '.2f')} | {_ratio(r)} | "
                     f"{_fmt(r.final_accuracy, '.4f')} |"))
  rows += ["", "| model | target | measured | limit | met |", "| --- | --- | ---: | ---: | --- |"]
  for config, results, step_costs in benches:
    for t in targets(results, step_costs):
      rows.append(f"| {config.model} | {t.name} | {_target_row(t)}")
  return "\n".join(rows)


def write_models_report(benches: Sequence[Bench], out_dir: str, started: Dict[str, Any]) -> None:
  """bench.json (each model's report, by model) and bench.md (`format_models`, then each
  missed target's reason, by model) in out_dir; each model's own pages are in
  `<out_dir>/<model>/`."""
  report = {"machine_at_start": started, "machine_at_end": machine(),
            "models": {config.model: _report(results, step_costs, config, started)
                       for config, results, step_costs in benches}}
  missed = "".join(f"- {model}: {line}\n" for model, one in report["models"].items()
                   for line in one["missed"]) or "Every target is met.\n"
  first = benches[0][0]
  markdown = (f"# Benchmark: {', '.join(report['models'])}; {first.train_steps} steps, global "
              f"batch {first.global_batch_size}\n\nMachine: {json.dumps(started)}\n\n"
              f"{format_models(benches)}\n\n`x ceiling` is a run's examples/s over the "
              "ceiling's of its model at its worker count. Each model's tables, its step's "
              "parts and its runs' time are in its own bench.md, in the folder named for it.\n\n"
              f"## Missed targets\n\n{missed}")
  with open(os.path.join(out_dir, "bench.json"), "w") as f:
    json.dump(report, f, indent=2)
  with open(os.path.join(out_dir, "bench.md"), "w") as f:
    f.write(markdown)
