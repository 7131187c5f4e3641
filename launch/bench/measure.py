"""Benchmark measurements: the numbers, read back from what a run wrote and from the OS.

A run is judged only by its structured records, so the benchmark depends on
no trainer internals:

- steady-state speed: the median over the windows between consecutive `loss`
  events (step and wall time), after warm-up, leaving out the windows next to
  a checkpoint step (checkpoints and evaluations, reported apart);
- launch to first step: `summary.json`'s `first_step_time` minus the time the
  process was started;
- the chief's start-up: the milestones in its first `start` record in
  `progress.jsonl` (imports done, strategy created);
- time to the target accuracy: the wall time of the first `eval` `accuracy`
  event at or above it, minus the launch time;
- peak RSS and CPU seconds per task: `VmHWM` and `utime + stime` of each
  task process, polled while it runs (bench_run polls).
"""

import dataclasses
import glob
import os
import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

from launch import restarts
from launch.bench import bare
from launch.proofs import runs
from trainers import model_dir as layout
from trainers.config import Config

CEILING = bare.CEILING
TARGET_ACCURACY = 0.98
STEP_PARTS = bare.PARTS  # What bare.probe_step_costs times.


@dataclasses.dataclass
class Result:
  """One benchmark row. Times in seconds; None where the run did not produce the number."""

  name: str
  workers: int
  steps: int = 0
  examples_per_second: Optional[float] = None
  ms_per_step: Optional[float] = None
  ratio_to_ceiling: Optional[float] = None
  window_ms_per_step: List[float] = dataclasses.field(default_factory=list)
  launch_to_first_step: Optional[float] = None
  time_to_accuracy: Optional[float] = None
  step_at_accuracy: Optional[int] = None
  final_accuracy: Optional[float] = None
  peak_rss_mb: Dict[str, float] = dataclasses.field(default_factory=dict)
  cpu_seconds: Dict[str, float] = dataclasses.field(default_factory=dict)
  wall_seconds: Optional[float] = None
  breakdown: Dict[str, float] = dataclasses.field(default_factory=dict)
  model_dir: str = ""
  error: Optional[str] = None
  rounds: int = 1
  ratio_range: Optional[List[float]] = None
  graph_all_reduces: Optional[int] = None

  @property
  def label(self) -> str:
    return f"{self.name} x{self.workers}"


def scalar_events(directory: str, tag: str) -> List[Tuple[int, float, float]]:
  """(step, wall_time, value) of every `tag` scalar in a directory's event files, by step.

  Reads both TF1 `simple_value` summaries (Estimator) and TF2 tensor ones
  (Keras, the ceiling run); a step logged twice keeps its last event.
  """
  by_step: Dict[int, Tuple[int, float, float]] = {}
  for path in sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*"))):
    try:
      for event in tf.compat.v1.train.summary_iterator(path):
        for value in event.summary.value:
          if value.tag != tag:
            continue
          number = (float(tf.make_ndarray(value.tensor)) if value.HasField("tensor")
                    else float(value.simple_value))
          by_step[event.step] = (int(event.step), event.wall_time, number)
    except tf.errors.DataLossError:
      pass  # A truncated last record: keep what came before it.
  return [by_step[s] for s in sorted(by_step)]


def step_windows(events: Sequence[Tuple[int, float, float]], warmup_steps: int = 0,
                 checkpoint_every: int = 0) -> List[float]:
  """Seconds per step of each window between consecutive events, after warm-up, and
  away from checkpoints.

  Warm-up is the first window and every window starting before `warmup_steps`
  (the first epoch: until the cache holds the split, the pipeline also reads
  and decodes images). A window that starts or ends at a multiple of
  `checkpoint_every`, or holds one, is left out too: a run saves and evaluates
  there, just before it logs that step or just after (Keras saves, then logs,
  then evaluates; the Estimator saves and evaluates, then logs the next step),
  and the cost of those falls outside its steady speed, on every run alike.
  Runs too short to have such windows keep what they have.
  """
  pairs = [(a, b) for a, b in list(zip(events, events[1:]))[1:] if b[0] > a[0]]
  steady = [(a, b) for a, b in pairs if a[0] >= warmup_steps] or pairs
  if checkpoint_every:
    # The last multiple of checkpoint_every up to b's step comes before a's step.
    steady = [(a, b) for a, b in steady
              if b[0] // checkpoint_every * checkpoint_every < a[0]] or steady
  return [(b[1] - a[1]) / (b[0] - a[0]) for a, b in steady]


def warmup_steps(config: Config) -> int:
  """Steps of the first epoch, after which the input pipeline serves from its cache."""
  return bare.steps_per_epoch(config)


def graph_all_reduces(model_dir: str) -> Optional[int]:
  """All-reduces in the training graph an Estimator chief writes (`graph.pbtxt`), each run
  every step; None where the run wrote no graph (Keras, the ceiling)."""
  path = os.path.join(model_dir, "graph.pbtxt")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return f.read().count('op: "CollectiveReduceV2"')


def read_result(name: str, workers: int, config: Config, model_dir: str, launched: float,
                exited: float) -> Result:
  """The numbers of a run that exited 0, read back from what it wrote to model_dir.

  Args:
    name: "ceiling" or an entry of bench_run.ENTRIES.
    workers: its worker count.
    config: the hyperparameters it ran with.
    model_dir: its model_dir.
    launched, exited: unix times its process started and ended.

  Returns:
    The Result; `error` is set if the run wrote no summary.
  """
  result = Result(name, workers, model_dir=model_dir, wall_seconds=round(exited - launched, 2))
  try:
    summary = runs.read_summary(model_dir)
  except (OSError, ValueError) as e:
    result.error = f"no summary.json ({e})"
    return result
  result.steps = int(summary["global_step"])
  result.final_accuracy = summary.get("test_accuracy")
  loss_events = scalar_events(model_dir, "loss")
  windows = step_windows(loss_events, warmup_steps(config), config.checkpoint_every_steps)
  if windows:
    seconds = statistics.median(windows)
    result.window_ms_per_step = [round(1000 * w, 3) for w in windows]
    result.ms_per_step = round(1000 * seconds, 3)
    result.examples_per_second = round(config.global_batch_size / seconds, 1)
  result.graph_all_reduces = graph_all_reduces(model_dir)
  first_step = summary.get("first_step_time")
  if first_step:
    result.launch_to_first_step = round(first_step - launched, 2)
  for step, wall, accuracy in scalar_events(os.path.join(model_dir, layout.EVAL_SUBDIR),
                                            "accuracy"):
    if accuracy >= TARGET_ACCURACY:
      result.time_to_accuracy, result.step_at_accuracy = round(wall - launched, 2), step
      break
  # Where the wall time went: start-up; from the first step to the last loss
  # event (the last step): steady steps at the median speed, and the rest
  # (warm-up, hooks, checkpoints, evaluations); then what follows training.
  breakdown = {}
  tasks_file = os.path.join(runs.task_log_dir(model_dir), restarts.TASKS_FILE)
  if os.path.exists(tasks_file):  # A cluster's launcher wrote it.
    # The launcher's own start-up (checks) before any task process exists, then
    # the chief's: imports, the strategy (all tasks must have met), the first step.
    started = os.path.getmtime(tasks_file)
    breakdown["launch_to_tasks_started"] = started - launched
    milestones = startup_milestones(model_dir)
    if "imported" in milestones:
      # tasks.json is written once every task has started: a chief forked from a zygote
      # (launch.zygote), which imports only this project's modules, may be past them.
      breakdown["chief_imports"] = max(0.0, milestones["imported"] - started)
      if "strategy" in milestones:
        breakdown["chief_strategy"] = milestones["strategy"] - milestones["imported"]
        if first_step:
          breakdown["chief_to_first_step"] = first_step - milestones["strategy"]
  if first_step and loss_events:
    last_step_time = loss_events[-1][1]
    breakdown["launch_to_first_step"] = first_step - launched
    breakdown["training"] = last_step_time - first_step
    breakdown["after_training"] = exited - last_step_time
    if result.ms_per_step is not None:
      breakdown["steady_steps"] = (result.steps - 1) * result.ms_per_step / 1000
      breakdown["training_overhead"] = breakdown["training"] - breakdown["steady_steps"]
  result.breakdown = {k: round(v, 2) for k, v in breakdown.items()}
  return result


def startup_milestones(model_dir: str) -> Dict[str, float]:
  """Unix times the chief passed its start-up milestones, from its first `start` record."""
  starts = [r for r in runs.read_progress(model_dir) if r["event"] == "start"]
  return starts[0].get("startup", {}) if starts else {}


def vm_hwm_mb(pid: int) -> Optional[float]:
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) / 1024.0
  except (OSError, ValueError):
    pass
  return None


def cpu_seconds(pid: int) -> Optional[float]:
  """User plus system CPU time of a live process so far."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
  except (OSError, ValueError, IndexError):
    return None


def ceilings(results: Sequence[Result], step_costs: Mapping[int, Mapping[str, Any]]
             ) -> Dict[int, Tuple[str, float]]:
  """By worker count, the ceiling: the fastest loop (name, ms/step).

  The candidates are the probe's loops at that worker count (bare.LOOPS) and
  the ceiling run's steady speed there.
  """
  found: Dict[int, Tuple[str, float]] = {}
  for n, costs in step_costs.items():
    candidates = [(loop, costs[loop]["ms"]) for loop in bare.CEILING_LOOPS
                  if isinstance(costs.get(loop), dict) and costs[loop].get("ms")]
    candidates += [(f"{CEILING} run", r.ms_per_step) for r in results
                   if r.name == CEILING and r.workers == n and r.ms_per_step]
    if candidates:
      found[n] = min(candidates, key=lambda c: c[1])
  return found


def set_ratios(results: Sequence[Result], step_costs: Mapping[int, Mapping[str, Any]]) -> None:
  """Each run's examples/s over the ceiling's at its worker count (ms/step inverted)."""
  ceiling = ceilings(results, step_costs)
  for r in results:
    r.ratio_to_ceiling = (round(ceiling[r.workers][1] / r.ms_per_step, 3)
                          if r.workers in ceiling and r.ms_per_step else None)


def _median(values: Sequence[Optional[float]]) -> Optional[float]:
  present = [v for v in values if v is not None]
  return round(statistics.median(present), 3) if present else None


def combine_rounds(rounds: Sequence[Result]) -> Result:
  """One entry's rounds as one Result: the median of each number, the peak of each RSS.

  `ratio_range` keeps the spread of the ratios to the ceiling taken within
  each round; run_bench sets the ratio itself from the medians.
  """
  failed = [f"round {i + 1}: {r.error}" for i, r in enumerate(rounds) if r.error]
  if failed:
    return Result(rounds[0].name, rounds[0].workers, rounds=len(rounds), error="; ".join(failed),
                  model_dir=", ".join(r.model_dir for r in rounds))
  tasks = sorted({k for r in rounds for k in r.peak_rss_mb})
  cpu_tasks = sorted({k for r in rounds for k in r.cpu_seconds})
  ratios = [r.ratio_to_ceiling for r in rounds if r.ratio_to_ceiling is not None]
  steps = [r.step_at_accuracy for r in rounds if r.step_at_accuracy is not None]
  return dataclasses.replace(
      rounds[0],
      rounds=len(rounds),
      **{name: _median([getattr(r, name) for r in rounds])
         for name in ("examples_per_second", "ms_per_step", "launch_to_first_step",
                      "time_to_accuracy", "wall_seconds")},
      ratio_range=[min(ratios), max(ratios)] if ratios else None,
      step_at_accuracy=statistics.median_low(steps) if steps else None,
      window_ms_per_step=[w for r in rounds for w in r.window_ms_per_step],
      peak_rss_mb={k: max(r.peak_rss_mb.get(k, 0.0) for r in rounds) for k in tasks},
      cpu_seconds={k: _median([r.cpu_seconds.get(k) for r in rounds]) for k in cpu_tasks},
      breakdown={k: _median([r.breakdown.get(k) for r in rounds]) for k in rounds[0].breakdown},
      model_dir=", ".join(r.model_dir for r in rounds))


def combine_step_costs(rounds: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
  """One worker count's probe rounds: the median of each part's ms."""
  failed = [f"round {i + 1}: {c['error']}" for i, c in enumerate(rounds) if "error" in c]
  if failed:
    return {"error": "; ".join(failed)}
  combined = dict(rounds[0])
  for part in (p for p in STEP_PARTS if p in rounds[0]):
    combined[part] = {**rounds[0][part], "ms": _median([c[part]["ms"] for c in rounds]),
                      "windows": [w for c in rounds for w in c[part]["windows"]]}
  return combined
