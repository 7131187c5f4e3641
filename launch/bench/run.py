"""Benchmark runs: each entry started as a user would, its processes polled while it runs.

`run_bench` runs, one after the other and each a fresh `python -m ...`
process (a local cluster of them at N > 1 workers), at each worker count: the
ceiling run (`launch.bare`: K steps per `tf.function` call on the input
pipeline, no strategy alone, the bare MultiWorkerMirroredStrategy step in a
cluster), the step-cost probe (`launch.bare --probe_out`, see
`bare.probe_step_costs`: the parts of a step and the ceiling's loops) and the
entries: both trainer binaries as users run them (in a cluster, with their
evaluator task) and, beside Keras, Keras with `--noevaluator` (its chief
evaluates while the workers wait), and with `ps` each backend on that many
parameter servers (`<backend>-ps`, a cluster at every worker count). bench_measure
reads the numbers back and
takes each run's ratio to the ceiling; bench_report judges and reports them.
"""

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Sequence, Tuple

from absl import logging

from launch.bench import measure as bench_measure
from launch.proofs import runs
from launch.bench.measure import CEILING, Result
from trainers import flags as trainer_flags
from trainers.config import Config

BACKENDS = runs.BACKENDS
# Entry name -> (backend, extra flags). "keras-noevaluator" runs only in a
# cluster: a lone process has no evaluator task to leave out. "<backend>-ps" runs on
# run_bench's `ps` parameter servers (--ps=N), off by default.
ENTRIES = {"keras": ("keras", ()), "estimator": ("estimator", ()),
           "keras-noevaluator": ("keras", ("--noevaluator",)),
           "keras-ps": ("keras", ()), "estimator-ps": ("estimator", ())}
PS_SUFFIX = "-ps"
DEFAULT_ENTRIES = [name for name in ENTRIES if not name.endswith(PS_SUFFIX)]
BARE_MODULE = "launch.bare"
POLL_SECONDS = 0.25


def _task_pids(model_dir: str) -> Dict[str, int]:
  try:
    record = runs.read_tasks(runs.task_log_dir(model_dir))
    # The process the tasks are forked from (launch.zygote) imported for them all.
    zygote = {"zygote": int(record["zygote"])} if "zygote" in record else {}
    return {**{t["name"]: int(t["pid"]) for t in record["tasks"]}, **zygote}
  except (OSError, ValueError, KeyError):
    return {}


def _run_process(cmd: Sequence[str], model_dir: str, log_path: str, in_cluster: bool,
                 timeout: float) -> Tuple[int, float, float, Dict[str, float], Dict[str, float]]:
  """Runs cmd and polls the peak RSS and the CPU time of its task processes.

  Returns:
    Exit code, launch time and exit time (unix s), and by task, peak RSS in
    MB and CPU seconds (as last polled): "main" for a lone process (it trains
    in the process started), "launcher" and the names in logs/tasks.json for
    a local cluster (`in_cluster`), with "zygote" if its tasks were forked.
  """
  peaks: Dict[str, float] = {}
  cpu: Dict[str, float] = {}
  with open(log_path, "wb") as log:
    launched = time.time()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=runs.clean_env(), start_new_session=True)
    try:
      while proc.poll() is None:
        pids = {"launcher" if in_cluster else "main": proc.pid}
        if in_cluster:
          pids.update(_task_pids(model_dir))
        for name, pid in pids.items():
          mb = bench_measure.vm_hwm_mb(pid)
          if mb is not None:
            peaks[name] = max(peaks.get(name, 0.0), mb)
          seconds = bench_measure.cpu_seconds(pid)
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


def _bare_command(workers: int, config: Config, run_dir: str, timeout: float,
                  *flags: str) -> List[str]:
  """launch.bare with `flags`, alone or in a local cluster of `workers` tasks."""
  cmd = [sys.executable, "-m", BARE_MODULE, *flags, *trainer_flags.config_to_flags(config)]
  if workers == 1:
    return cmd
  return [sys.executable, "-m", "launch.local", f"--workers={workers}", "--max_restarts=0",
          f"--task_log_dir={runs.task_log_dir(run_dir)}", f"--timeout={timeout}", "--", *cmd]


def run_entry(name: str, workers: int, config: Config, run_dir: str, timeout: float,
              ps: int = 0) -> Result:
  """Runs one entry (or the ceiling run) as a user would, a `-ps` one on `ps` parameter
  servers; reads its numbers back."""
  model_dir = os.path.join(run_dir, "model")
  os.makedirs(model_dir, exist_ok=True)
  if name == CEILING:
    cmd = _bare_command(workers, config, model_dir, timeout, f"--model_dir={model_dir}")
  else:
    backend, extra_flags = ENTRIES[name]
    if name.endswith(PS_SUFFIX):
      extra_flags = (*extra_flags, f"--ps={ps}")
    cmd = runs.trainer_command(backend, config, workers=workers, model_dir=model_dir,
                               timeout=timeout, extra_flags=extra_flags)
  log_path = os.path.join(run_dir, "run.log")
  logging.info("Running %s", " ".join(cmd))
  returncode, launched, exited, peaks, cpu = _run_process(
      cmd, model_dir, log_path, workers > 1 or name.endswith(PS_SUFFIX), timeout)
  if returncode != 0:
    result = Result(name, workers, model_dir=model_dir, wall_seconds=round(exited - launched, 2),
                    error=f"exit code {returncode}")
  else:
    result = bench_measure.read_result(name, workers, config, model_dir, launched, exited)
  if result.error:
    result.error += f"; see {log_path}"
  result.peak_rss_mb = {k: round(v, 1) for k, v in peaks.items()}
  result.cpu_seconds = {k: round(v, 1) for k, v in cpu.items()}
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
  cmd = _bare_command(workers, config, run_dir, timeout, f"--probe_out={out}")
  log_path = os.path.join(run_dir, "run.log")
  logging.info("Running %s", " ".join(cmd))
  returncode = _run_process(cmd, run_dir, log_path, workers > 1, timeout)[0]
  if returncode != 0:
    return {"error": f"exit code {returncode}; see {log_path}"}
  try:
    with open(out) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    return {"error": f"no valid {out} ({e}); see {log_path}"}


def _run_round(config: Config, workers: Sequence[int], backends: Sequence[str], runs_dir: str,
               timeout: float, ps: int) -> Tuple[List[Result], Dict[int, Dict[str, Any]]]:
  """Every entry once: at each worker count the ceiling run, the probe and each backend."""
  results, step_costs = [], {}
  for n in workers:
    results.append(run_entry(CEILING, n, config, os.path.join(runs_dir, f"{CEILING}-{n}w"),
                             timeout))
    step_costs[n] = probe(n, config, os.path.join(runs_dir, f"probe-{n}w"), timeout)
    logging.info("step costs x%d: %s", n, step_costs[n])
    for name in backends:
      if n == 1 and ENTRIES[name][1]:
        continue
      results.append(run_entry(name, n, config, os.path.join(runs_dir, f"{name}-{n}w"), timeout,
                               ps))
  for r in results:
    logging.info("%s: %s", r.label, r.error or f"{r.examples_per_second} ex/s")
  bench_measure.set_ratios(results, step_costs)
  return results, step_costs


def run_bench(config: Config, workers: Sequence[int], out_dir: str, *,
              backends: Sequence[str] = tuple(DEFAULT_ENTRIES),
              timeout: float = runs.TIMEOUT_SECONDS, repeats: int = 1, ps: int = 0
              ) -> Tuple[List[Result], Dict[int, Dict[str, Any]]]:
  """At each worker count the ceiling run, the step-cost probe and each backend.

  One run at a time, each as a user would start it. With `repeats` > 1 every
  entry runs once per round, rounds one after the other, and each number is
  the median over the rounds (see combine_rounds).

  Args:
    config: hyperparameters every run uses (train_steps, data_dir, ...).
    workers: worker counts to run everything at.
    out_dir: each run's model_dir and log go under
      `<out_dir>/runs[-<round>]/<name>-<workers>w`.
    backends: which entries to run (keys of ENTRIES).
    timeout: seconds allowed for each run.
    repeats: rounds.
    ps: parameter servers of the `-ps` entries.

  Returns:
    One Result per run, each worker count's ceiling run first (a failed run sets `error`),
    and the step costs by worker count.
  """
  rounds = [_run_round(config, workers, backends,
                       os.path.join(out_dir, "runs" if repeats == 1 else f"runs-{k + 1}"), timeout,
                       ps)
            for k in range(repeats)]
  if repeats == 1:
    return rounds[0]
  results = [bench_measure.combine_rounds([r[0][i] for r in rounds])
             for i in range(len(rounds[0][0]))]
  step_costs = {n: bench_measure.combine_step_costs([r[1][n] for r in rounds]) for n in workers}
  bench_measure.set_ratios(results, step_costs)
  return results, step_costs


