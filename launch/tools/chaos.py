"""Chaos trials: kill a random worker (or the evaluator) at a random step, and check the
run still ends right.

Each trial runs a trainer binary as a user would (`--workers=N` with its evaluator
task, the launcher restarting the training tasks after a training task fails, and
the evaluator alone after it fails), waits for the chief's progress records
(progress.jsonl) to reach a random step, sends SIGKILL or SIGTERM to a random
training task (`kill="worker"`) or to the evaluator (`kill="evaluator"`), and then
checks what users rely on: the run ends at exactly `train_steps`, the final
checkpoint loads and was evaluated, the right tasks were restarted, no process of
any attempt is left, and no backup or worker temp directory is left in model_dir.
"""

import dataclasses
import os
import random
import signal
import subprocess
import time
from typing import List, Optional, Tuple

import tensorflow as tf

from launch.tools import runs
from trainers import common
from trainers.config import Config

SIGNALS = (signal.SIGKILL, signal.SIGTERM)
KILLS = ("worker", "evaluator")  # A random training task (chief included), or the evaluator.
# What a finished run must not leave in model_dir (Keras backup, Estimator worker copies).
LEFTOVER_PREFIXES = (common.BACKUP_SUBDIR, "tmp_", "workertemp", ".tmp")


@dataclasses.dataclass
class Trial:
  """One chaos trial and what it showed."""

  trial: int
  backend: str
  signal: str = ""
  victim: str = ""
  step_killed: Optional[int] = None
  restarts: Optional[int] = None
  final_step: Optional[int] = None
  steps_redone: Optional[int] = None
  checkpoint_valid: bool = False
  wall_seconds: float = 0.0
  exit_code: Optional[int] = None
  problems: List[str] = dataclasses.field(default_factory=list)

  @property
  def passed(self) -> bool:
    return not self.problems


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return True


def _progress(model_dir: str) -> Tuple[int, List[int]]:
  """The chief's latest recorded step, and the step each start began from."""
  records = runs.read_progress(model_dir)
  steps = [r["step"] for r in records if r["event"] == "step"]
  return (steps[-1] if steps else 0), [r["from_step"] for r in records if r["event"] == "start"]


def _tail(path: str, lines: int) -> str:
  with open(path, errors="replace") as f:
    return "".join(f.readlines()[-lines:]).strip()


def run_trial(backend: str, config: Config, workers: int, out_dir: str, trial: int,
              rng: random.Random, timeout: float, kill: str = "worker") -> Trial:
  """Runs one trial of `backend` on `workers` local workers; see the module docstring."""
  result = Trial(trial, backend)
  model_dir = os.path.join(out_dir, f"{backend}-{trial}")
  log_dir = runs.task_log_dir(model_dir)
  target = rng.randint(1, config.train_steps - 1)
  sig = rng.choice(SIGNALS)
  result.signal = sig.name
  cmd = runs.trainer_command(backend, config, workers=workers, model_dir=model_dir,
                             timeout=timeout)
  os.makedirs(model_dir, exist_ok=True)
  run_log = os.path.join(out_dir, f"{backend}-{trial}.log")
  start = time.monotonic()
  with open(run_log, "wb") as log:
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=runs.clean_env(),
                            stdin=subprocess.DEVNULL)
  pids = set()
  step = 0
  while step < target and proc.poll() is None and time.monotonic() - start < timeout:
    time.sleep(0.05)
    step = _progress(model_dir)[0]
  if proc.poll() is None and step >= target:
    tasks = runs.read_tasks(log_dir)["tasks"]
    pids.update(t["pid"] for t in tasks)
    victim = rng.choice([t for t in tasks if t["name"].startswith("evaluator") ==
                         (kill == "evaluator")])
    result.victim, result.step_killed = victim["name"], step
    os.kill(victim["pid"], sig)
  else:
    result.problems.append(f"the run never reached step {target} to kill a worker")
  try:
    proc.wait(timeout=max(0.0, timeout + 60 - (time.monotonic() - start)))
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()
    result.problems.append("the launcher hung past its own --timeout")
  result.wall_seconds = time.monotonic() - start
  result.exit_code = proc.returncode
  if proc.returncode != 0:
    result.problems.append(f"exit code {proc.returncode}: {_tail(run_log, 5)}")
  try:
    tasks_file = runs.read_tasks(log_dir)
  except (OSError, ValueError):
    result.problems.append(f"the launcher started no tasks: {_tail(run_log, 3)}")
    return result
  result.restarts = tasks_file["restarts"]
  pids.update(t["pid"] for t in tasks_file["tasks"])
  if result.step_killed is not None:
    # The evaluator is restarted alone; a training task's death restarts the
    # training tasks only.
    restarted, spared = (("evaluator_restarts", "restarts") if kill == "evaluator" else
                         ("restarts", "evaluator_restarts"))
    if not tasks_file[restarted]:
      result.problems.append(f"the kill caused no restart ({restarted} 0)")
    if tasks_file[spared]:
      result.problems.append(f"{spared} {tasks_file[spared]}: a task not killed was restarted")
  resumed_from = _progress(model_dir)[1]
  if len(resumed_from) > 1 and result.step_killed is not None:
    # The first start record is the run's start; the next, the first resume.
    result.steps_redone = result.step_killed - resumed_from[1]
  try:
    result.final_step = runs.read_summary(model_dir)["global_step"]
  except (OSError, ValueError, KeyError):
    result.problems.append("no summary.json in model_dir")
  if result.final_step != config.train_steps:
    result.problems.append(f"final step {result.final_step}, not {config.train_steps}")
  path = tf.train.latest_checkpoint(model_dir)
  try:
    owner, step = common.checkpoint_step(path) if path else (None, None)
    result.checkpoint_valid = owner == backend and step == config.train_steps
  except (tf.errors.OpError, ValueError) as e:
    result.problems.append(f"checkpoint {path} does not load: {e}")
  if not result.checkpoint_valid:
    result.problems.append(f"no {backend} checkpoint at step {config.train_steps} in {model_dir}")
  if common.read_eval_result(os.path.join(model_dir, common.EVAL_SUBDIR),
                             config.train_steps) is None:
    result.problems.append(f"the final step {config.train_steps} was not evaluated")
  alive = sorted(p for p in pids if _alive(p))
  if alive:
    result.problems.append(f"processes left running: {alive}")
  leftovers = sorted(n for n in os.listdir(model_dir) if n.startswith(LEFTOVER_PREFIXES))
  if leftovers:
    result.problems.append(f"left in model_dir: {leftovers}")
  return result


def run_chaos(backend: str, config: Config, workers: int, trials: int, out_dir: str, *,
              seed: int = 0, timeout: float = 600, kill: str = "worker") -> List[Trial]:
  """Runs `trials` chaos trials of one backend, each in `out_dir/<backend>-<i>`."""
  rng = random.Random(seed)
  os.makedirs(out_dir, exist_ok=True)
  return [run_trial(backend, config, workers, out_dir, i + 1, rng, timeout, kill)
          for i in range(trials)]


def format_table(results: List[Trial]) -> str:
  """A Markdown table, one row per trial, and the overall verdict."""
  rows = ["| trial | backend | signal | victim | step killed | restarts | final step | "
          "steps redone | checkpoint valid | wall time (s) | result |",
          "| ---: | --- | --- | --- | ---: | ---: | ---: | ---: | --- | ---: | --- |"]
  for t in results:
    rows.append(
        f"| {t.trial} | {t.backend} | {t.signal} | {t.victim or '-'} | "
        f"{'-' if t.step_killed is None else t.step_killed} | "
        f"{'-' if t.restarts is None else t.restarts} | "
        f"{'-' if t.final_step is None else t.final_step} | "
        f"{'-' if t.steps_redone is None else t.steps_redone} | "
        f"{'yes' if t.checkpoint_valid else 'no'} | {t.wall_seconds:.1f} | "
        f"{'PASS' if t.passed else 'FAIL: ' + '; '.join(t.problems)} |")
  passed = sum(t.passed for t in results)
  rows.append(f"\nOverall: {'PASS' if passed == len(results) else 'FAIL'} "
              f"({passed}/{len(results)} trials)")
  return "\n".join(rows)
