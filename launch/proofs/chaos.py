"""Chaos trials: the faults a run meets in the wild, made on purpose, and what each leaves.

Each trial trains a backend as a user would (`--workers=N` with its evaluator
task, under the local launcher, or on Ray Train through `launch.ray`: the
engine), makes one fault once the chief's progress records
(progress.jsonl) reach a random step, and checks the outcome the fault
table in docs/operations.md documents:

- kill_worker: SIGKILL to a random training task (chief included). The
  launcher restarts the training tasks, which resume from the last backup.
- kill_evaluator: the same to the evaluator, which is restarted alone.
- preempt: SIGTERM to a random training task, as a pod deleted or a spot VM
  reclaimed. Every training task stops at one step, which is saved; the
  launcher restarts them, counting no restart, and training goes on from that
  very step: 0 steps redone.
- drain: SIGTERM to every task at once, as a node drained; the same outcome.
- stop_chief: SIGSTOP to the chief, the coordination service's leader. Its
  peers miss its heartbeats and fail; the launcher restarts every training task.
- kill_launcher: SIGKILL to the launcher (its tasks frozen first, so the fault
  lands at the step seen). Every task dies with it; the same command, run again,
  resumes.
- truncate_checkpoint: a run finished at a random step has its newest
  checkpoint cut short; extended to `train_steps`, it sets the damaged files
  aside in `model_dir/corrupt/` and resumes from the newest that loads.
- nan_loss: one training batch made NaN at a random step (a test-only hook,
  `nan_hook_env`). Every task stops with exit 3 naming the step; nothing is
  restarted; the newest checkpoint left is finite.
- disk_full: model_dir on a tmpfs of its own (root only), filled at a random
  step. Exit 4 naming the full disk, nothing restarted, the newest checkpoint
  loads; with the space freed, the same command resumes to `train_steps`.
- early_stop_kill_evaluator: a run with early stopping (`early_stopping_config`: the
  loss must not fall, so it stops once two evaluations are a checkpoint interval apart,
  which a run of two intervals in one process leaves it) has its evaluator SIGKILLed as
  soon as the chief records the early stop's step (`early_stop.json`), before that step is
  trained; restarted alone, the evaluator evaluates the final step and ends.
- early_stop_preempt: the same, SIGTERM to a random training task instead: the
  preemption and the stop meet, and the resumed run trains nothing past the stop.

On parameter servers (`ps` > 0) nothing agrees on a step, and the tasks are of three kinds:
- kill_worker: SIGKILL to the chief or a worker. The chief: every training task restarts
  from the last checkpoint. A worker: restarted alone while the others train on, nothing
  resumed (Keras's coordinator runs the lost worker's steps again on another: the run may
  end up to an execution past `train_steps`).
- kill_ps: SIGKILL to a parameter server, whose variables are lost: every training task
  restarts from the last checkpoint.
- preempt: SIGTERM to the chief (it saves the step it stops at; 0 steps redone), a worker
  (restarted alone) or a ps (as kill_ps); drain: SIGTERM to every task, the ps tasks
  included, so the chief's save races the loss of the variables: the run goes on from it or
  from the last checkpoint. An Estimator worker's steps after the chief's save are lost
  with it.
- stop_chief and the early_stop_* faults do not apply: no coordination service to lose
  the chief, and early stopping does not run on parameter servers.
A run on parameter servers ends at `train_steps` or up to `_ps_slack` steps past it (the
Estimator's asynchronous workers each finish the step they had started).

An early-stopped trial recovers at the step `early_stop.json` names, below `train_steps`:
that step is the newest checkpoint, the summary's and evaluated, and no step after it was
trained.

Every trial also checks that no process of any attempt is left, and that nothing
is left behind in model_dir or in the tasks' temporary directory; where the run
recovers, that it ends at exactly `train_steps` with a checkpoint that loads and
was evaluated; and that the run's output names the fault.
"""

import dataclasses
import json
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Callable, Dict, List, Mapping, Optional, Set, Tuple

import tensorflow as tf

from launch import exit_codes
from launch.proofs import runs
from trainers import checkpoints
from trainers import early_stopping
from trainers import evaluation
from trainers import model_dir as layout
from trainers.config import Config

FAULTS = ("kill_worker", "kill_evaluator", "stop_chief", "kill_launcher", "truncate_checkpoint",
          "nan_loss", "disk_full", "preempt", "drain", "early_stop_kill_evaluator",
          "early_stop_preempt", "kill_ps")
# Faults of one topology only: kill_ps needs parameter servers; these do not run with them.
PS_ONLY = ("kill_ps",)
NOT_ON_PS = ("stop_chief", "early_stop_kill_evaluator", "early_stop_preempt")
# What a finished run must not leave in model_dir (Keras backup, Estimator worker
# copies, staging directories, a save cut short).
LEFTOVER_PREFIXES = (layout.BACKUP_SUBDIR, "tmp_", "workertemp", ".tmp")
LEFTOVER_SUFFIXES = ("_temp",)
# TensorFlow's autograph writes these to the temporary directory and removes them
# at exit; a killed process cannot. They are TensorFlow's, not the trainers'.
TF_TEMP_PREFIX = "__autograph_generated_file"
LAUNCHER_DEATH_SECONDS = 10  # How soon the tasks must die with a killed launcher.
TMPFS_MB = 64  # disk_full: model_dir's filesystem, filled at the fault's step.
NAN_STEP_ENV = "CHAOS_NAN_AT_STEP"
# What the run's output must say, per fault: it names the fault.
MESSAGES = {
    "kill_worker": r"Restart 1 of \d+: (chief|worker)-\d+ (was killed|exited)",
    "kill_ps": r"Restart 1 of \d+: ps-\d+ (was killed|exited)",
    "kill_evaluator": r"Restart 1 of \d+ of the evaluator alone",
    # The frozen chief's peer gives up on it: a lost peer, exit 200 (exit_codes.PEER_LOST).
    "stop_chief": r"Restart 1 of \d+: worker-\d+ exited with code 200",
    "kill_launcher": r"Training from step [1-9]\d*",
    "truncate_checkpoint": r"Set aside in \S+corrupt what does not load: \S*ckpt-\d+",
    "nan_loss": r"the training loss or the weights became NaN or Inf by step \d+",
    "disk_full": r"error: a write failed: No space left on device",
    **dict.fromkeys(("preempt", "drain", "early_stop_preempt"),
                    r"Preempted: (chief|worker|ps)-\d+ exited with code 143"),
    "early_stop_kill_evaluator": r"Restart 1 of \d+ of the evaluator alone",
}


TRIALS_FILE = "chaos_trials.jsonl"  # In the --out directory: one JSON object per trial.


@dataclasses.dataclass
class Trial:
  """One chaos trial and what it showed."""

  trial: int
  backend: str
  fault: str
  how: str = ""  # The signal, the victim, the file: what exactly was done.
  fault_step: Optional[int] = None
  exit_code: Optional[int] = None  # Of the run the fault hit.
  restarts: Optional[int] = None
  final_step: Optional[int] = None
  steps_redone: Optional[int] = None
  checkpoint_valid: bool = False
  wall_seconds: float = 0.0
  skipped: str = ""  # Why this fault cannot be made here (disk_full without root).
  problems: List[str] = dataclasses.field(default_factory=list)

  @property
  def passed(self) -> bool:
    return not self.problems and not self.skipped


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


def _pick_step(rng: random.Random, config: Config, first: int = 1) -> int:
  """A random step from `first` on at which a progress record still precedes the last step."""
  return rng.randint(first, max(first, config.train_steps - config.log_every_steps))


def poison_training_batch(step: int) -> None:
  """Test-only: the shared input_fn's training batch for `step` (from a fresh start) is NaN.

  Installed in a nan_loss trial's processes by the `sitecustomize` that
  `nan_hook_env` puts on their PYTHONPATH: no flag or code path of the
  trainers leads here.
  """
  from data import mnist  # noqa: PLC0415 -- only in the process the hook poisons.
  from data.mnist import pipeline  # noqa: PLC0415 -- the same.
  original = pipeline.input_fn

  def input_fn(mode, input_context=None, **kwargs):
    ds = original(mode, input_context, **kwargs)
    if mode != mnist.TRAIN:
      return ds

    def poison(index, batch):
      images, *rest = batch
      # Each worker's n-th batch feeds step n + 1, so every worker's loss,
      # and the all-reduced one, turns NaN at `step`.
      # tf.equal: in the Estimator's graph, `==` on tensors compares identity.
      poisoned = tf.equal(index, step - 1)
      return (tf.where(poisoned, tf.fill(tf.shape(images), float("nan")), images), *rest)

    return ds.enumerate().map(poison)

  pipeline.input_fn = input_fn


def nan_hook_env(hook_dir: str, step: int) -> Dict[str, str]:
  """Environment additions that make a trainer's training loss NaN at `step`."""
  os.makedirs(hook_dir, exist_ok=True)
  with open(os.path.join(hook_dir, "sitecustomize.py"), "w") as f:
    f.write("# Written by launch.chaos for a nan_loss trial: test-only fault injection.\n"
            "import os\nfrom launch.proofs import chaos\n"
            f"chaos.poison_training_batch(int(os.environ[{NAN_STEP_ENV!r}]))\n")
  path = os.pathsep.join(p for p in (hook_dir, os.environ.get("PYTHONPATH")) if p)
  return {"PYTHONPATH": path, NAN_STEP_ENV: str(step)}


class _Run:
  """Runs a trainer's launcher for one trial: started, watched, faulted, awaited."""

  def __init__(self, cmd: List[str], model_dir: str, log_path: str, env: Mapping[str, str],
               deadline: float):
    self.model_dir, self.log_path, self.deadline = model_dir, log_path, deadline
    with open(log_path, "ab") as log:
      self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(env),
                                   stdin=subprocess.DEVNULL)
    self.pids: Set[int] = set()

  def wait_for_step(self, step: int) -> bool:
    """Waits until the chief has recorded `step`; False if the run ended or time ran out."""
    while self.proc.poll() is None and time.monotonic() < self.deadline:
      if _progress(self.model_dir)[0] >= step:
        self.tasks()
        return True
      time.sleep(0.05)
    return False

  def tasks(self) -> List[Dict]:
    """The launcher's current tasks (their pids, and their zygote's if they were forked, are
    remembered, to check none is left)."""
    record = runs.read_tasks(runs.task_log_dir(self.model_dir))
    self.pids.update(t["pid"] for t in record["tasks"])
    if "zygote" in record:
      self.pids.add(record["zygote"])
    return record["tasks"]

  def wait(self, result: Trial) -> int:
    """Waits for the launcher to exit; returns its exit code."""
    try:
      self.proc.wait(timeout=max(1.0, self.deadline + 60 - time.monotonic()))
    except subprocess.TimeoutExpired:
      self.proc.kill()
      self.proc.wait()
      result.problems.append("the launcher hung past its own --timeout")
    try:
      self.tasks()
    except (OSError, ValueError):
      pass
    return self.proc.returncode


@dataclasses.dataclass(frozen=True)
class _Context:
  """What a fault function works with: the trial's record, how to start the run, and where
  it writes.

  Attributes:
    result: the trial's record, which the fault function fills in.
    backend: the backend trained.
    config: the run's hyperparameters.
    rng: the trial's random choices (step, signal, victim).
    launch: starts the run as a user would: `launch(train_steps=..., extra_env=...)`; with
      `run_config`, that config's run; `alone`, in one process (the cluster's, else).
    pids: every task pid seen, for the check that none is left.
    model_dir: the run's model_dir.
    log_path: the launcher's output, appended by every launch.
    ps: the run's parameter servers (0: none).
    workers: the run's training workers.
  """

  result: Trial
  backend: str
  config: Config
  rng: random.Random
  launch: Callable[..., _Run]
  pids: Set[int]
  model_dir: str
  log_path: str
  ps: int = 0
  workers: int = 2


def _ps_slack(config: Config) -> int:
  """How far past `train_steps` a run on parameter servers may end: an execution of Keras's
  (at most a progress interval: keras_trainer._fit_coordinated) run again after a lost
  worker, or the steps the Estimator's asynchronous workers had started."""
  return config.log_every_steps


def _kind(task: Dict) -> str:
  """A launcher task's kind: "chief", "worker", "ps" or "evaluator"."""
  return task["name"].rsplit("-", 1)[0]


def _check_recovered(ctx: _Context, exit_code: int) -> None:
  """The run recovered: exit 0, the exact final step (`train_steps`, or where an early stop
  ended it, below that), a checkpoint that loads, evaluated."""
  result, config, model_dir = ctx.result, ctx.config, ctx.model_dir
  if exit_code != 0:
    result.problems.append(f"exit code {exit_code}: {_tail(ctx.log_path, 5)}")
  try:
    result.final_step = runs.read_summary(model_dir)["global_step"]
  except (OSError, ValueError, KeyError):
    result.problems.append("no summary.json in model_dir")
  final = config.train_steps
  if config.early_stopping_metric:
    record = early_stopping.read_record(model_dir)
    if not record or record["step"] >= config.train_steps:
      result.problems.append(f"the run did not stop early: early_stop.json holds {record}")
    final = record["step"] if record else final
  if ctx.ps and result.final_step is not None and (
      final <= result.final_step <= final + _ps_slack(config)):
    final = result.final_step
  if result.final_step != final:
    result.problems.append(f"final step {result.final_step}, not {final}"
                           + (f" to {final + _ps_slack(config)}" if ctx.ps else ""))
  _check_checkpoint(ctx, final)
  if evaluation.read_result(os.path.join(model_dir, layout.EVAL_SUBDIR), final) is None:
    result.problems.append(f"the final step {final} was not evaluated")


def _check_checkpoint(ctx: _Context, step: Optional[int], before: Optional[int] = None) -> None:
  """model_dir's newest checkpoint is the backend's, loads whole and is finite, at `step`
  (or, given `before`, at a step before it)."""
  result, backend, model_dir = ctx.result, ctx.backend, ctx.model_dir
  path = tf.train.latest_checkpoint(model_dir)
  if path is None:
    result.problems.append(f"no checkpoint in {model_dir}")
    return
  try:
    owner, at = checkpoints.checkpoint_step(path)
    reader = tf.train.load_checkpoint(path)
    finite = all(tf.math.reduce_all(tf.math.is_finite(reader.get_tensor(name))).numpy()
                 for name, dtype in reader.get_variable_to_dtype_map().items()
                 if dtype.is_floating)
  except (tf.errors.OpError, ValueError, IndexError) as e:
    result.problems.append(f"checkpoint {path} does not load: {e}")
    return
  good_step = at == step if before is None else at < before
  result.checkpoint_valid = owner == backend and good_step and finite
  if not result.checkpoint_valid:
    result.problems.append(
        f"newest checkpoint {path}: {owner}'s at step {at}, {'' if finite else 'not '}finite; "
        f"wanted {backend}'s at step {step if before is None else f'< {before}'}, finite")


def _check_restarts(ctx: _Context, restarted: Optional[str]) -> None:
  """Only `restarted` ("restarts", "evaluator_restarts" or None) counted a restart."""
  result, model_dir = ctx.result, ctx.model_dir
  try:
    tasks_file = runs.read_tasks(runs.task_log_dir(model_dir))
  except (OSError, ValueError):
    result.problems.append("the launcher wrote no tasks.json")
    return
  result.restarts = tasks_file["restarts"]
  for key in ("restarts", "evaluator_restarts"):
    if key == restarted and not tasks_file[key]:
      result.problems.append(f"the fault caused no restart ({key} 0)")
    if key != restarted and tasks_file[key]:
      result.problems.append(f"{key} {tasks_file[key]}: a task not at fault was restarted")


def _check_clean(result: Trial, pids: Set[int], model_dir: str, tmp_dir: str,
                 finished: bool, ray_dir: Optional[str]) -> None:
  """No process of any attempt left, nor of its Ray cluster (whose session is in
  `ray_dir`); nothing left in model_dir or the tasks' temp dir.

  A run that did not finish (diverged) keeps its Keras backup: the state a run
  with better settings resumes from.
  """
  alive = sorted(p for p in pids if _alive(p))
  if alive:
    result.problems.append(f"processes left running: {alive}")
  ray_processes = _processes_naming(ray_dir) if ray_dir else []
  if ray_processes:
    result.problems.append(f"processes of the run's Ray cluster left running: {ray_processes}")
  leftovers = sorted(n for n in os.listdir(model_dir)
                     if (n.startswith(LEFTOVER_PREFIXES) or n.endswith(LEFTOVER_SUFFIXES))
                     and (finished or n != layout.BACKUP_SUBDIR))
  if leftovers:
    result.problems.append(f"left in model_dir: {leftovers}")
  temp = sorted(n for n in os.listdir(tmp_dir) if not n.startswith(TF_TEMP_PREFIX))
  if temp:
    result.problems.append(f"left in the tasks' temporary directory {tmp_dir}: {temp}")


def _processes_naming(path: str) -> List[str]:
  """Live processes whose command line names `path`: "pid name"."""
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    except OSError:
      continue  # Gone meanwhile.
    if any(path.encode() in arg for arg in argv):
      found.append(f"{pid} {os.path.basename(argv[0].decode(errors='replace'))}")
  return found


def _check_says(result: Trial, log_path: str) -> None:
  with open(log_path, errors="replace") as f:
    text = f.read()
  if not re.search(MESSAGES[result.fault], text):
    result.problems.append(f"the output does not name the fault (no /{MESSAGES[result.fault]}/)")


def _steps_redone(ctx: _Context, starts_before: int) -> None:
  """Steps trained again after the fault: the fault's step minus where the resume began."""
  starts = _progress(ctx.model_dir)[1]
  if len(starts) > starts_before and ctx.result.fault_step is not None:
    ctx.result.steps_redone = ctx.result.fault_step - starts[starts_before]
  else:
    ctx.result.problems.append("the run never resumed")


def _mount_tmpfs(path: str, megabytes: int) -> Optional[str]:
  """Mounts a tmpfs of `megabytes` at `path`; returns why not, or None."""
  if os.geteuid() != 0:
    return "needs root, to mount a small filesystem to fill"
  os.makedirs(path, exist_ok=True)
  done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", path],
                        capture_output=True, text=True, check=False)
  return None if done.returncode == 0 else f"mount failed: {done.stderr.strip()}"


def _fill(directory: str) -> str:
  """Writes `directory/filler` until its filesystem has no space left; returns its path."""
  path = os.path.join(directory, "filler")
  chunk = b"\0" * (1 << 20)
  with open(path, "wb", buffering=0) as f:
    try:
      while True:
        f.write(chunk)
    except OSError:
      pass
    try:
      while True:  # The last bytes, so not even a small write fits.
        f.write(b"\0" * 4096)
    except OSError:
      pass
  return path


def run_trial(backend: str, config: Config, workers: int, out_dir: str, trial: int,
              rng: random.Random, timeout: float, fault: str = "kill_worker",
              engine: str = "local", ps: int = 0) -> Trial:
  """Runs one trial of `fault` on `backend` at `workers` workers of `engine`
  (runs.ENGINES), on `ps` parameter servers; see the module doc."""
  if fault not in FAULTS:
    raise ValueError(f"fault must be one of {', '.join(FAULTS)}, got {fault!r}.")
  if fault in (NOT_ON_PS if ps else PS_ONLY):
    raise ValueError(f"{fault} {'does not run on' if ps else 'needs'} parameter servers.")
  result = Trial(trial, backend, fault)
  if fault.startswith("early_stop_"):
    config = early_stopping_config(config)
  name = f"{backend}-{fault}-{trial}"
  trial_dir = os.path.join(out_dir, name)
  tmp_dir = os.path.join(trial_dir, "tmp")
  os.makedirs(tmp_dir, exist_ok=True)
  model_dir = os.path.join(trial_dir, "model")
  mounted = None
  if fault == "disk_full":
    mounted = os.path.join(trial_dir, "fs")
    why = _mount_tmpfs(mounted, TMPFS_MB)
    if why:
      result.skipped = why
      return result
    model_dir = os.path.join(mounted, "model")
  os.makedirs(model_dir, exist_ok=True)
  log_path = os.path.join(trial_dir, "run.log")
  env = dict(runs.clean_env(), TMPDIR=tmp_dir)
  ray_dir = None
  if engine == "ray":  # Ray's session, apart: its sockets need a short path.
    ray_dir = env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="chaos-ray-", dir="/tmp")
  start = time.monotonic()

  def launch(train_steps: int = config.train_steps, extra_env: Optional[Dict] = None,
             run_config: Optional[Config] = None, alone: bool = False) -> _Run:
    command = runs.trainer_command(
        backend, dataclasses.replace(run_config or config, train_steps=train_steps),
        workers=1 if alone else workers, model_dir=model_dir, timeout=timeout, engine=engine,
        extra_flags=[f"--ps={ps}"] if ps else [])
    return _Run(command, model_dir, log_path, {**env, **(extra_env or {})},
                time.monotonic() + timeout)

  pids: Set[int] = set()
  try:
    _FAULTS[fault](_Context(result, backend, config, rng, launch, pids, model_dir, log_path,
                            ps, workers))
  except Exception as e:
    result.problems.append(f"the trial itself failed: {type(e).__name__}: {e}")
  finally:
    result.wall_seconds = time.monotonic() - start
    if os.path.isdir(model_dir):
      _check_clean(result, pids, model_dir, tmp_dir, fault != "nan_loss", ray_dir)
    if os.path.exists(log_path):  # Not if the trial failed before it started a run.
      _check_says(result, log_path)
    if ray_dir:
      shutil.rmtree(ray_dir, ignore_errors=True)  # Ray's logs: the tasks' are in model_dir.
    if mounted:
      # The tmpfs goes with its mount: its model_dir is kept beside, to inspect.
      shutil.copytree(model_dir, os.path.join(trial_dir, "model"), dirs_exist_ok=True)
      subprocess.run(["umount", mounted], check=False)
  return result


def _kill(ctx: _Context) -> None:
  """kill_worker, kill_ps and kill_evaluator: SIGKILL to one task; the launcher restarts it
  (on parameter servers, a worker alone: nothing resumes)."""
  kinds = {"kill_evaluator": ("evaluator",), "kill_ps": ("ps",)}.get(ctx.result.fault,
                                                                     ("chief", "worker"))
  target = _pick_step(ctx.rng, ctx.config)
  run = ctx.launch()
  victim = None
  if run.wait_for_step(target):
    victim = ctx.rng.choice([t for t in run.tasks() if _kind(t) in kinds])
    ctx.result.how = f"SIGKILL to {victim['name']}"
    ctx.result.fault_step = _progress(ctx.model_dir)[0]
    os.kill(victim["pid"], signal.SIGKILL)
  else:
    ctx.result.problems.append(f"the run never reached step {target}")
  ctx.result.exit_code = run.wait(ctx.result)
  ctx.pids.update(run.pids)
  evaluator = ctx.result.fault == "kill_evaluator"
  _check_restarts(ctx, "evaluator_restarts" if evaluator else "restarts")
  if not evaluator and not (ctx.ps and victim and _kind(victim) == "worker"):
    _steps_redone(ctx, 1)
  _check_recovered(ctx, ctx.result.exit_code)


def _preempt(ctx: _Context) -> None:
  """preempt and drain: SIGTERM to one training task, or to every task; they stop at one
  step, saved, and the launcher restarts them without counting a restart (a ps stopped:
  from the last checkpoint)."""
  drain = ctx.result.fault == "drain"
  target = _pick_step(ctx.rng, ctx.config)
  run = ctx.launch()
  victims: List[Dict] = []
  if run.wait_for_step(target):
    tasks = run.tasks()
    victims = tasks if drain else [ctx.rng.choice([t for t in tasks
                                                   if _kind(t) != "evaluator"])]
    ctx.result.how = f"SIGTERM to {'every task' if drain else victims[0]['name']}"
    ctx.result.fault_step = _progress(ctx.model_dir)[0]
    for victim in victims:
      os.kill(victim["pid"], signal.SIGTERM)
  else:
    ctx.result.problems.append(f"the run never reached step {target}")
  ctx.result.exit_code = run.wait(ctx.result)
  ctx.pids.update(run.pids)
  _check_restarts(ctx, None)
  if not runs.read_tasks(runs.task_log_dir(ctx.model_dir)).get("preemptions"):
    ctx.result.problems.append("the launcher counted no preemption")
  stopped, resumed = _stop_and_resume(ctx.model_dir)
  if any(_kind(v) == "ps" for v in victims):
    # A ps stopped takes its variables with it: the run goes on from the last checkpoint
    # (if its training had not ended meanwhile: then nothing is redone).
    ctx.result.steps_redone = ((ctx.result.fault_step or 0) - resumed
                               if len(_progress(ctx.model_dir)[1]) > 1 else 0)
  else:
    # Where the preemption stopped against where the resume began: 0 steps redone.
    ctx.result.steps_redone = None if stopped is None else stopped - resumed
    if stopped is None or stopped != resumed or stopped < (ctx.result.fault_step or 0):
      shown = "none recorded" if stopped is None else stopped
      ctx.result.problems.append(f"stopped at step {shown} (the signal came at "
                                 f"{ctx.result.fault_step}), resumed from {resumed}")
  _check_recovered(ctx, ctx.result.exit_code)


def _stop_and_resume(model_dir: str) -> Tuple[Optional[int], int]:
  """The step a preempted run stopped at, saved (None: no save recorded), and the step its
  resume began from.

  A run whose training had ended (signalled at its last step, or during its evaluation)
  records no save and trains nothing again: it stopped and resumed at its last step, which
  on a ps is up to _ps_slack past train_steps.
  """
  saved = [r["step"] for r in runs.read_progress(model_dir) if r["event"] == "preempted"]
  last, starts = _progress(model_dir)
  if len(starts) > 1:
    return (saved[0] if saved else None), starts[1]
  return (saved[0] if saved else last), last


def _stop_chief(ctx: _Context) -> None:
  """SIGSTOP to the chief: its peers give up on it, and the launcher restarts them all."""
  target = _pick_step(ctx.rng, ctx.config)
  run = ctx.launch()
  if run.wait_for_step(target):
    names = {t["name"]: t for t in run.tasks()}
    chief = names.get("chief-0") or names["worker-0"]  # Worker 0 without a chief (Ray).
    ctx.result.how = f"SIGSTOP to {chief['name']}"
    ctx.result.fault_step = _progress(ctx.model_dir)[0]
    os.kill(chief["pid"], signal.SIGSTOP)
  else:
    ctx.result.problems.append(f"the run never reached step {target}")
  ctx.result.exit_code = run.wait(ctx.result)
  ctx.pids.update(run.pids)
  _check_restarts(ctx, "restarts")
  _steps_redone(ctx, 1)
  _check_recovered(ctx, ctx.result.exit_code)


def _kill_launcher(ctx: _Context) -> None:
  """SIGKILL to the launcher: its tasks die with it, and the same command resumes."""
  # After the first backup or checkpoint, so the re-run has something to resume from.
  target = _pick_step(ctx.rng, ctx.config,
                      min(ctx.config.backup_every_steps, ctx.config.checkpoint_every_steps) + 1)
  run = ctx.launch()
  if not run.wait_for_step(target):
    ctx.result.problems.append(f"the run never reached step {target}")
    ctx.pids.update(run.pids)
    run.wait(ctx.result)
    return
  # Its tasks frozen first, so that the fault lands at the step seen: on Ray they die only
  # once Ray's own processes notice the launcher gone, seconds in which a run can end.
  for task in run.tasks():
    os.kill(task["pid"], signal.SIGSTOP)
  ctx.result.how = "SIGKILL to the launcher (its tasks frozen)"
  ctx.result.fault_step = _progress(ctx.model_dir)[0]
  run.proc.kill()
  ctx.result.exit_code = run.wait(ctx.result)
  ctx.pids.update(run.pids)
  deadline = time.monotonic() + LAUNCHER_DEATH_SECONDS
  while any(_alive(p) for p in run.pids) and time.monotonic() < deadline:
    time.sleep(0.1)
  alive = sorted(p for p in run.pids if _alive(p))
  if alive:
    ctx.result.problems.append(
        f"tasks outlived the launcher by {LAUNCHER_DEATH_SECONDS} s: {alive}")
  again = ctx.launch()
  exit_code = again.wait(ctx.result)
  ctx.pids.update(again.pids)
  _check_restarts(ctx, None)
  _steps_redone(ctx, 1)
  _check_recovered(ctx, exit_code)


def _truncate_checkpoint(ctx: _Context) -> None:
  """A finished run's newest checkpoint cut short; the extended run sets it aside."""
  every = ctx.config.checkpoint_every_steps
  # At least one earlier checkpoint to fall back to.
  stop = _pick_step(ctx.rng, ctx.config, every + 1)
  first = ctx.launch(train_steps=stop)
  exit_code = first.wait(ctx.result)
  ctx.pids.update(first.pids)
  newest = tf.train.latest_checkpoint(ctx.model_dir)
  if exit_code != 0 or newest is None:
    ctx.result.problems.append(f"the run to step {stop} failed (exit {exit_code}): "
                               f"{_tail(ctx.log_path, 5)}")
    return
  # One shard of several where the variables lived on several devices (parameter servers).
  shards = sorted(tf.io.gfile.glob(newest + ".data-*"))
  data = shards[0] if len(shards) == 1 else ctx.rng.choice(shards)
  size = os.path.getsize(data)
  keep = ctx.rng.randint(0, size - 1)
  with open(data, "r+b") as f:
    f.truncate(keep)
  ctx.result.how = f"{os.path.basename(data)} cut from {size} to {keep} bytes"
  ctx.result.fault_step = stop
  again = ctx.launch()
  ctx.result.exit_code = again.wait(ctx.result)
  ctx.pids.update(again.pids)
  aside = os.path.join(ctx.model_dir, layout.CORRUPT_SUBDIR, os.path.basename(data))
  if not os.path.exists(aside) or os.path.getsize(aside) != keep:
    ctx.result.problems.append(f"the damaged file is not in {layout.CORRUPT_SUBDIR}/ as it was")
  _check_restarts(ctx, None)
  _steps_redone(ctx, 1)
  _check_recovered(ctx, ctx.result.exit_code)


def _nan_loss(ctx: _Context) -> None:
  """The loss made NaN at a random step: exit 3, no restart, the newest checkpoint finite."""
  every = ctx.config.checkpoint_every_steps
  step = _pick_step(ctx.rng, ctx.config, every + 1)  # After a checkpoint to keep.
  hook_dir = os.path.join(os.path.dirname(ctx.log_path), "hook")
  # On parameter servers each worker's pipeline reads its share of the steps: the batch each
  # reads near global step `step` is poisoned, and which comes first is timing's.
  batch = max(1, step // ctx.workers) if ctx.ps else step
  ctx.result.how = (f"each worker's training batch {batch} (near step {step}) made NaN"
                    if ctx.ps else f"training batch of step {step} made NaN")
  ctx.result.fault_step = step
  run = ctx.launch(extra_env=nan_hook_env(hook_dir, batch))
  ctx.result.exit_code = run.wait(ctx.result)
  ctx.pids.update(run.pids)
  if ctx.result.exit_code != exit_codes.DIVERGED:
    ctx.result.problems.append(f"exit code {ctx.result.exit_code}, not {exit_codes.DIVERGED}: "
                               f"{_tail(ctx.log_path, 5)}")
  with open(ctx.log_path, errors="replace") as f:
    said = [int(s) for s in re.findall(r"NaN or Inf by step (\d+)", f.read())]
  if said and not step - (every if ctx.ps else 0) <= said[0] < step + every:
    ctx.result.problems.append(f"the error names step {said[0]}; the loss turned NaN at {step}")
  _check_restarts(ctx, None)
  _check_checkpoint(ctx, None, before=said[0] if ctx.ps and said else step)


def _disk_full(ctx: _Context) -> None:
  """ctx.model_dir's filesystem filled: exit 4, the newest checkpoint loads; freed, it resumes."""
  target = _pick_step(ctx.rng, ctx.config, ctx.config.checkpoint_every_steps + 1)
  run = ctx.launch()
  filler = None
  if run.wait_for_step(target):
    tasks = run.tasks()
    for t in tasks:  # Frozen while the disk fills, so the fault lands at the step seen.
      os.kill(t["pid"], signal.SIGSTOP)
    try:
      ctx.result.fault_step = _progress(ctx.model_dir)[0]
      filler = _fill(os.path.dirname(ctx.model_dir))
    finally:
      for t in tasks:
        os.kill(t["pid"], signal.SIGCONT)
    ctx.result.how = f"{TMPFS_MB} MB filesystem filled"
    if ctx.result.fault_step >= ctx.config.train_steps:
      ctx.result.problems.append("the disk filled only after training ended")
  else:
    ctx.result.problems.append(f"the run never reached step {target}")
  ctx.result.exit_code = run.wait(ctx.result)
  ctx.pids.update(run.pids)
  if ctx.result.exit_code != exit_codes.DISK_FULL:
    ctx.result.problems.append(f"exit code {ctx.result.exit_code}, not {exit_codes.DISK_FULL}: "
                               f"{_tail(ctx.log_path, 5)}")
  _check_restarts(ctx, None)
  _check_checkpoint(ctx, None, before=ctx.config.train_steps + 1)
  if filler:
    os.remove(filler)
  starts = len(_progress(ctx.model_dir)[1])
  again = ctx.launch()
  exit_code = again.wait(ctx.result)
  ctx.pids.update(again.pids)
  _steps_redone(ctx, starts)
  _check_recovered(ctx, exit_code)


def _early_stop(ctx: _Context) -> None:
  """early_stop_kill_evaluator and early_stop_preempt: the fault made as the chief records the
  early stop's step, before training it; the run must end there, having lost nothing."""
  every = ctx.config.checkpoint_every_steps
  # Its history first: one process, evaluating its checkpoints at `every` and 2 x `every`,
  # which the cluster's first check finds a stop in (the loss has not risen for `every`).
  plain = dataclasses.replace(ctx.config, early_stopping_metric=None, early_stopping_steps=0,
                              early_stopping_mode="min", early_stopping_check_every_steps=0)
  first = ctx.launch(train_steps=2 * every, run_config=plain, alone=True)
  if first.wait(ctx.result) != 0:
    ctx.result.problems.append(f"the run to step {2 * every} failed: {_tail(ctx.log_path, 5)}")
    return
  evaluator = ctx.result.fault == "early_stop_kill_evaluator"
  run = ctx.launch()
  stop = None
  while run.proc.poll() is None and time.monotonic() < run.deadline:
    record = early_stopping.read_record(ctx.model_dir)
    if record:
      stop = record["step"]
      break
    time.sleep(0.02)
  if stop is not None:
    victim = ctx.rng.choice([t for t in run.tasks()
                             if t["name"].startswith("evaluator") == evaluator])
    ctx.result.how = f"{'SIGKILL' if evaluator else 'SIGTERM'} to {victim['name']} at the stop"
    ctx.result.fault_step = _progress(ctx.model_dir)[0]
    os.kill(victim["pid"], signal.SIGKILL if evaluator else signal.SIGTERM)
  else:
    ctx.result.problems.append("the run ended before it recorded an early stop")
  ctx.result.exit_code = run.wait(ctx.result)
  ctx.pids.update(run.pids)
  _check_restarts(ctx, "evaluator_restarts" if evaluator else None)
  if not evaluator and not runs.read_tasks(runs.task_log_dir(ctx.model_dir)).get("preemptions"):
    ctx.result.problems.append("the launcher counted no preemption")
  trained = [r["step"] for r in runs.read_progress(ctx.model_dir) if r["event"] == "step"]
  if stop is not None and max(trained, default=0) > stop:
    ctx.result.problems.append(f"trained to step {max(trained)}, past the stop at {stop}")
  _check_recovered(ctx, ctx.result.exit_code)


def early_stopping_config(config: Config) -> Config:
  """The run of an early_stop_* trial: it stops once the loss has not risen for a checkpoint
  interval, which a training loss never does. Four intervals long at least: the stop comes
  at its first check after two (`_early_stop`)."""
  return dataclasses.replace(
      config, train_steps=max(config.train_steps, 4 * config.checkpoint_every_steps),
      early_stopping_metric="loss", early_stopping_mode="max",
      early_stopping_steps=config.checkpoint_every_steps,
      early_stopping_check_every_steps=config.log_every_steps)


_FAULTS = {"kill_worker": _kill, "kill_evaluator": _kill, "stop_chief": _stop_chief,
           "kill_launcher": _kill_launcher, "truncate_checkpoint": _truncate_checkpoint,
           "nan_loss": _nan_loss, "disk_full": _disk_full, "preempt": _preempt,
           "drain": _preempt, "early_stop_kill_evaluator": _early_stop,
           "early_stop_preempt": _early_stop, "kill_ps": _kill}


def run_chaos(backend: str, config: Config, workers: int, trials: int, out_dir: str, *,
              seed: int = 0, timeout: float = runs.TIMEOUT_SECONDS,
              faults: Tuple[str, ...] = ("kill_worker",), engine: str = "local", ps: int = 0
              ) -> List[Trial]:
  """Runs `trials` trials of each fault on one backend (on `ps` parameter servers), each in
  `out_dir/<backend>-<fault>-<i>`,
  appending each trial's outcome to `out_dir/chaos_trials.jsonl` as it ends: a run of hours
  that is stopped keeps the record of the trials it finished."""
  rng = random.Random(seed)
  os.makedirs(out_dir, exist_ok=True)
  results = []
  for fault in faults:
    for i in range(trials):
      results.append(run_trial(backend, config, workers, out_dir, i + 1, rng, timeout, fault,
                               engine, ps))
      with open(os.path.join(out_dir, TRIALS_FILE), "a") as f:
        f.write(json.dumps({"passed": results[-1].passed,
                            **dataclasses.asdict(results[-1])}) + "\n")
  return results


def overall_passed(results: List[Trial]) -> bool:
  """Every trial passed or was skipped (saying why), and at least one passed."""
  return all(t.passed or t.skipped for t in results) and any(t.passed for t in results)


def format_table(results: List[Trial]) -> str:
  """A Markdown table, one row per trial, and the overall verdict."""
  rows = ["| trial | backend | fault | what was done | at step | exit code | restarts | "
          "final step | steps redone | checkpoint valid | wall time (s) | result |",
          "| ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |"]

  def show(value) -> str:
    return "-" if value is None else str(value)

  for t in results:
    verdict = (f"SKIPPED: {t.skipped}" if t.skipped else
               "PASS" if t.passed else "FAIL: " + "; ".join(t.problems))
    rows.append(
        f"| {t.trial} | {t.backend} | {t.fault} | {t.how or '-'} | {show(t.fault_step)} | "
        f"{show(t.exit_code)} | {show(t.restarts)} | {show(t.final_step)} | "
        f"{show(t.steps_redone)} | {'yes' if t.checkpoint_valid else 'no'} | "
        f"{t.wall_seconds:.1f} | {verdict} |")
  passed = sum(t.passed for t in results)
  skipped = sum(bool(t.skipped) for t in results)
  rows.append(f"\nOverall: {'PASS' if overall_passed(results) else 'FAIL'} "
              f"({passed}/{len(results)} trials passed"
              f"{f', {skipped} skipped' if skipped else ''})")
  return "\n".join(rows)
