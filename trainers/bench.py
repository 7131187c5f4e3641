"""Benchmark: both backends against a bare tf.function loop on the same model and data.

`run_bench` runs, one after the other and each as a user would (a fresh
`python -m ...` process): the reference (`trainers.bare_main`: a bare
`tf.function` step in a plain Python loop, one process, no strategy), then at
each worker count the step-cost probe (`trainers.bare_main --probe_out`, see
`bare.probe_step_costs`), `trainers.keras_main` and `trainers.estimator_main`.
It reads back only what every run writes (TensorBoard events, `summary.json`,
`logs/tasks.json`) and what the OS reports (peak RSS, CPU time), so it
depends on no trainer internals:

- steady-state speed: the median over the windows between consecutive `loss`
  events (step and wall time), after the first window (warm-up);
- launch to first step: `summary.json`'s `first_step_time` minus the time the
  process was started;
- time to the target accuracy: the wall time of the first `eval` `accuracy`
  event at or above it, minus the launch time;
- peak RSS and CPU seconds per task: `VmHWM` and `utime + stime` of each
  task process, polled while it runs.

The report says, for each missed target, where the time went.
"""

import dataclasses
import datetime
import glob
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf
from absl import logging

from launch import supervisor
from trainers import bare
from trainers import common
from trainers import flags as trainer_flags
from trainers.config import Config

REFERENCE = bare.REFERENCE
BACKENDS = ("keras", "estimator")
MODULES = {REFERENCE: "trainers.bare_main", "keras": "trainers.keras_main",
           "estimator": "trainers.estimator_main"}
TARGET_ACCURACY = 0.98
TASKS_FILE = os.path.join("logs", supervisor.TASKS_FILE)
POLL_SECONDS = 0.25
STEP_PARTS = ("input", "compute", "all_reduce", "step")  # What bare.probe_step_costs times.
# Targets of the benchmark issue, checked in the report (never raised on).
THROUGHPUT_VS_REFERENCE = {"keras": 1.0, "estimator": 0.9}
TWO_WORKER_SCALING = 0.8
LAUNCH_TO_FIRST_STEP_SECONDS = 10.0
TIME_TO_ACCURACY_SECONDS = {"keras": 30.0, "estimator": 45.0}


# --- Running one benchmark entry --------------------------------------------------------------

@dataclasses.dataclass
class Result:
  """One benchmark row. Times in seconds; None where the run did not produce the number."""

  name: str
  workers: int
  steps: int = 0
  examples_per_second: Optional[float] = None
  ms_per_step: Optional[float] = None
  ratio_to_reference: Optional[float] = None
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

  @property
  def label(self) -> str:
    return self.name if self.name == REFERENCE else f"{self.name} x{self.workers}"


def _scalar_events(directory: str, tag: str) -> List[Tuple[int, float, float]]:
  """(step, wall_time, value) of every `tag` scalar in a directory's event files, by step.

  Reads both TF1 `simple_value` summaries (Estimator) and TF2 tensor ones
  (Keras, reference); a step logged twice keeps its last event.
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


def step_windows(events: Sequence[Tuple[int, float, float]], warmup_steps: int = 0
                 ) -> List[float]:
  """Seconds per step of each window between consecutive events, after warm-up.

  Warm-up is the first window and every window starting before `warmup_steps`
  (the first epoch: until the cache holds the split, the pipeline also reads
  and decodes images). Runs too short to have steady windows keep all but the first.
  """
  pairs = [(a, b) for a, b in list(zip(events, events[1:]))[1:] if b[0] > a[0]]
  steady = [(a, b) for a, b in pairs if a[0] >= warmup_steps] or pairs
  return [(b[1] - a[1]) / (b[0] - a[0]) for a, b in steady]


def warmup_steps(config: Config) -> int:
  """Steps of the first epoch, after which the input pipeline serves from its cache."""
  return bare.steps_per_epoch(config)


# Lines the chief logs as it starts: once its imports are done (distribute.setup_process),
# and once TF has created the strategy (the cluster has met).
_CHIEF_MILESTONES = {"imported": "] Task chief:0 of ",
                     "strategy": "MultiWorkerMirroredStrategy with cluster_spec"}
_ABSL_TIME = re.compile(r"\] [IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d\.\d+) ")


def chief_milestones(log_path: str, launched: float) -> Dict[str, float]:
  """Unix times of the chief's start-up milestones, read from its absl log lines."""
  found: Dict[str, float] = {}
  year = datetime.datetime.fromtimestamp(launched).year  # absl logs local time, no year.
  try:
    with open(log_path, errors="replace") as f:
      for line in f:
        for name, text in _CHIEF_MILESTONES.items():
          match = _ABSL_TIME.search(line) if name not in found and text in line else None
          if match:
            month, day, hour, minute, second = match.groups()
            found[name] = datetime.datetime(year, int(month), int(day), int(hour), int(minute),
                                            0).timestamp() + float(second)
  except OSError:
    pass
  return found


def _vm_hwm_mb(pid: int) -> Optional[float]:
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) / 1024.0
  except (OSError, ValueError):
    pass
  return None


def _cpu_seconds(pid: int) -> Optional[float]:
  """User plus system CPU time of a live process so far."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
  except (OSError, ValueError, IndexError):
    return None


def _task_pids(model_dir: str) -> Dict[str, int]:
  try:
    with open(os.path.join(model_dir, TASKS_FILE)) as f:
      return {t["name"]: int(t["pid"]) for t in json.load(f)["tasks"]}
  except (OSError, ValueError, KeyError):
    return {}


def _run_process(cmd: Sequence[str], model_dir: str, log_path: str, workers: int,
                 timeout: float) -> Tuple[int, float, float, Dict[str, float], Dict[str, float]]:
  """Runs cmd and polls the peak RSS and the CPU time of its task processes.

  Returns:
    Exit code, launch time and exit time (unix s), and by task, peak RSS in
    MB and CPU seconds (as last polled): "main" for a 1-worker run (it trains
    in the process started), "launcher" and the names in logs/tasks.json for
    a local cluster.
  """
  peaks: Dict[str, float] = {}
  cpu: Dict[str, float] = {}
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  with open(log_path, "wb") as log:
    launched = time.time()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, start_new_session=True)
    try:
      while proc.poll() is None:
        pids = {"main" if workers == 1 else "launcher": proc.pid}
        if workers > 1:
          pids.update(_task_pids(model_dir))
        for name, pid in pids.items():
          mb = _vm_hwm_mb(pid)
          if mb is not None:
            peaks[name] = max(peaks.get(name, 0.0), mb)
          seconds = _cpu_seconds(pid)
          if seconds is not None:
            cpu[name] = seconds
        if time.time() - launched > timeout:
          logging.error("%s timed out after %.0f s; stopping it.", cmd[2], timeout)
          os.killpg(proc.pid, signal.SIGTERM)
          try:
            proc.wait(30)
          except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
          break
        time.sleep(POLL_SECONDS)
    finally:
      if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
      returncode = proc.wait()
  return returncode, launched, time.time(), peaks, cpu


def measure(name: str, workers: int, config: Config, run_dir: str, timeout: float) -> Result:
  """Runs one entry as a user would and reads its numbers back from what it wrote."""
  model_dir = os.path.join(run_dir, "model")
  os.makedirs(model_dir, exist_ok=True)
  cmd = [sys.executable, "-m", MODULES[name], f"--model_dir={model_dir}",
         *trainer_flags.config_to_flags(config)]
  if name != REFERENCE:
    cmd += [f"--workers={workers}", f"--timeout={timeout}"]
  log_path = os.path.join(run_dir, "run.log")
  logging.info("Running %s", " ".join(cmd))
  returncode, launched, exited, peaks, cpu = _run_process(cmd, model_dir, log_path, workers,
                                                         timeout)
  result = Result(name, workers, model_dir=model_dir,
                  peak_rss_mb={k: round(v, 1) for k, v in peaks.items()},
                  cpu_seconds={k: round(v, 1) for k, v in cpu.items()},
                  wall_seconds=round(exited - launched, 2))
  if returncode != 0:
    result.error = f"exit code {returncode}; see {log_path}"
    return result
  try:
    with open(os.path.join(model_dir, common.SUMMARY_FILE)) as f:
      summary = json.load(f)
  except (OSError, ValueError) as e:
    result.error = f"no summary.json ({e}); see {log_path}"
    return result
  result.steps = int(summary["global_step"])
  result.final_accuracy = summary.get("test_accuracy")
  loss_events = _scalar_events(model_dir, "loss")
  windows = step_windows(loss_events, warmup_steps(config))
  if windows:
    seconds = statistics.median(windows)
    result.window_ms_per_step = [round(1000 * w, 3) for w in windows]
    result.ms_per_step = round(1000 * seconds, 3)
    result.examples_per_second = round(config.global_batch_size / seconds, 1)
  first_step = summary.get("first_step_time")
  if first_step:
    result.launch_to_first_step = round(first_step - launched, 2)
  for step, wall, accuracy in _scalar_events(os.path.join(model_dir, common.EVAL_SUBDIR),
                                             "accuracy"):
    if accuracy >= TARGET_ACCURACY:
      result.time_to_accuracy, result.step_at_accuracy = round(wall - launched, 2), step
      break
  # Where the wall time went: start-up; from the first step to the last loss
  # event (the last step): steady steps at the median speed, and the rest
  # (warm-up, hooks, checkpoints, evaluations); then what follows training.
  breakdown = {}
  tasks_file = os.path.join(model_dir, TASKS_FILE)
  if workers > 1 and os.path.exists(tasks_file):
    # The launcher's own start-up (checks) before any task process exists, then
    # the chief's: imports, the strategy (all tasks must have met), the first step.
    started = os.path.getmtime(tasks_file)
    breakdown["launch_to_tasks_started"] = started - launched
    milestones = chief_milestones(os.path.join(model_dir, "logs", "chief-0.log"), launched)
    if "imported" in milestones:
      breakdown["chief_imports"] = milestones["imported"] - started
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


def probe(workers: int, config: Config, run_dir: str, timeout: float) -> Dict[str, Any]:
  """Times the parts of a step (bare.probe_step_costs) in a cluster of `workers` tasks.

  Returns:
    The chief's numbers, or {"error": ...} if the probe failed.
  """
  os.makedirs(run_dir, exist_ok=True)
  out = os.path.join(run_dir, "step_costs.json")
  if os.path.exists(out):
    os.remove(out)  # Never report an earlier run's numbers.
  cmd = [sys.executable, "-m", MODULES[REFERENCE], f"--probe_out={out}",
         *trainer_flags.config_to_flags(config)]
  if workers > 1:
    cmd = [sys.executable, "-m", "launch.local", f"--workers={workers}", "--max_restarts=0",
           f"--task_log_dir={os.path.join(run_dir, 'logs')}", f"--timeout={timeout}", "--", *cmd]
  log_path = os.path.join(run_dir, "run.log")
  logging.info("Running %s", " ".join(cmd))
  returncode = _run_process(cmd, run_dir, log_path, workers, timeout)[0]
  if returncode != 0:
    return {"error": f"exit code {returncode}; see {log_path}"}
  try:
    with open(out) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    return {"error": f"no valid {out} ({e}); see {log_path}"}


def _run_round(config: Config, workers: Sequence[int], backends: Sequence[str], runs_dir: str,
               timeout: float) -> Tuple[List[Result], Dict[int, Dict[str, Any]]]:
  """Every entry once: the reference, then at each worker count the probe and each backend."""
  results = [measure(REFERENCE, 1, config, os.path.join(runs_dir, "reference-1w"), timeout)]
  step_costs = {}
  for n in workers:
    step_costs[n] = probe(n, config, os.path.join(runs_dir, f"probe-{n}w"), timeout)
    logging.info("step costs x%d: %s", n, step_costs[n])
    for name in backends:
      results.append(measure(name, n, config, os.path.join(runs_dir, f"{name}-{n}w"), timeout))
  for r in results:
    logging.info("%s: %s", r.label, r.error or f"{r.examples_per_second} ex/s")
  _set_ratios(results)
  return results, step_costs


def _set_ratios(results: Sequence[Result]) -> None:
  """Each backend's examples/s over the reference's (the first result)."""
  reference = results[0].examples_per_second
  for r in results[1:]:
    r.ratio_to_reference = (round(r.examples_per_second / reference, 3)
                            if reference and r.examples_per_second else None)


def _median(values: Sequence[Optional[float]]) -> Optional[float]:
  present = [v for v in values if v is not None]
  return round(statistics.median(present), 3) if present else None


def combine_rounds(rounds: Sequence[Result]) -> Result:
  """One entry's rounds as one Result: the median of each number, the peak of each RSS.

  `ratio_range` keeps the spread of the ratios to the reference taken within
  each round; run_bench sets the ratio itself from the medians.
  """
  failed = [f"round {i + 1}: {r.error}" for i, r in enumerate(rounds) if r.error]
  if failed:
    return Result(rounds[0].name, rounds[0].workers, rounds=len(rounds), error="; ".join(failed),
                  model_dir=", ".join(r.model_dir for r in rounds))
  tasks = sorted({k for r in rounds for k in r.peak_rss_mb})
  cpu_tasks = sorted({k for r in rounds for k in r.cpu_seconds})
  ratios = [r.ratio_to_reference for r in rounds if r.ratio_to_reference is not None]
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
  for part in STEP_PARTS:
    combined[part] = {"ms": _median([c[part]["ms"] for c in rounds]),
                      "windows": [w for c in rounds for w in c[part]["windows"]]}
  return combined


def run_bench(config: Config, workers: Sequence[int], out_dir: str, *,
              backends: Sequence[str] = BACKENDS, timeout: float = 900, repeats: int = 1
              ) -> Tuple[List[Result], Dict[int, Dict[str, Any]]]:
  """The reference, then at each worker count the step-cost probe and each backend.

  One run at a time, each as a user would start it. With `repeats` > 1 every
  entry runs once per round, rounds one after the other, and each number is
  the median over the rounds (see combine_rounds).

  Args:
    config: hyperparameters every run uses (train_steps, data_dir, ...).
    workers: worker counts for the backends; the reference always has one.
    out_dir: each run's model_dir and log go under
      `<out_dir>/runs[-<round>]/<name>-<workers>w`.
    backends: which backends to run.
    timeout: seconds allowed for each run.
    repeats: rounds.

  Returns:
    One Result per entry, the reference first (a failed run sets `error`),
    and the step costs by worker count.
  """
  rounds = [_run_round(config, workers, backends,
                       os.path.join(out_dir, "runs" if repeats == 1 else f"runs-{k + 1}"), timeout)
            for k in range(repeats)]
  if repeats == 1:
    return rounds[0]
  results = [combine_rounds([r[0][i] for r in rounds]) for i in range(len(rounds[0][0]))]
  _set_ratios(results)
  return results, {n: combine_step_costs([r[1][n] for r in rounds]) for n in workers}


# --- Report -----------------------------------------------------------------------------------

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
              "Measured by `python -m trainers.bare_main --probe_out` in every task of a cluster "
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
              "start-up at the lines it logs once imported and once the strategy exists. CPU "
              "seconds are user plus system time, as last polled before each task exited.\n")
  # Both built before either is written: a failure leaves no half report.
  with open(os.path.join(out_dir, "bench.json"), "w") as f:
    json.dump(report, f, indent=2)
  with open(os.path.join(out_dir, "bench.md"), "w") as f:
    f.write(markdown)
