"""Running trainer binaries as users do, and reading back what a run writes.

The one place the tools (parity, chaos, bench, handoff) build a trainer's
command line, and read `tasks.json`, `summary.json` and `progress.jsonl`:
they judge runs only by these structured records, never by human log lines.
"""

import atexit
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from absl import app
from absl import logging

from data.mnist import ready
from launch import console
from launch import restarts
from launch import supervisor
from launch import zygote as zygote_lib
from trainers import flags as trainer_flags
from trainers import model_dir as layout
from trainers import runner
from trainers.config import Config

TRAINER_MODULES = runner.BINARIES
BACKENDS = tuple(TRAINER_MODULES)
# What runs a cluster's tasks: the local launcher (the trainer binary itself), or Ray
# Train (launch.ray, in place of the binary, with the same flags).
ENGINES = ("local", "ray")
PYTHON = sys.executable  # This install's interpreter; another install's can be given.
# Each trainer run a tool starts may take this long: a run that hangs is stopped and
# named, never waited on forever; a healthy run of any tool's default takes minutes.
TIMEOUT_SECONDS = 1800.0
PROGRESS_SECONDS = 15  # While a run trains, a tool says where it is this often.


class RunError(RuntimeError):
  """A trainer run failed; the message names its log."""


def trainer_command(backend: str, config: Config, *, workers: int, model_dir: str,
                    timeout: Optional[float] = None, extra_flags: Sequence[str] = (),
                    python: str = PYTHON, engine: str = "local") -> List[str]:
  """The command line a user would type to train `backend` with `config`, in `python`,
  on `engine` (ENGINES)."""
  binary = (["launch.ray", f"--backend={backend}"] if engine == "ray" else
            [TRAINER_MODULES[backend]])
  cmd = [python, "-m", *binary, f"--workers={workers}", f"--model_dir={model_dir}",
         *trainer_flags.config_to_flags(config)]
  if timeout is not None:
    cmd.append(f"--timeout={timeout}")
  return cmd + list(extra_flags)


def clean_env() -> Dict[str, str]:
  """The user's environment without TF_CONFIG: a tool's runs start their own clusters."""
  return {k: v for k, v in console.child_environ().items() if k != "TF_CONFIG"}


def run_trainer(backend: str, config: Config, *, workers: int, model_dir: str, log_path: str,
                timeout: float = TIMEOUT_SECONDS, extra_flags: Sequence[str] = (),
                python: str = PYTHON, engine: str = "local", name: Optional[str] = None
                ) -> Dict[str, Any]:
  """Trains `backend` as a user would, to the end, on `engine`; returns its summary. While
  it runs, says where it is every PROGRESS_SECONDS, as run `name` (default: the backend).

  Raises:
    RunError: the run exited non-zero or wrote no summary; names its log.
  """
  cmd = trainer_command(backend, config, workers=workers, model_dir=model_dir, timeout=timeout,
                        extra_flags=extra_flags, python=python, engine=engine)
  with open(log_path, "w") as log:
    log.write(" ".join(cmd) + "\n")
    log.flush()
    if workers == 1 and engine == "local" and python == PYTHON:  # One process: forked.
      try:
        run = _zygote(clean_env()).spawn(cmd, clean_env(), output=log.fileno())
      except zygote_lib.ZygoteDied as e:  # Out of memory, or killed.
        raise RunError(f"{backend} run could not start: {e}") from e
      returncode = _wait_saying_where(run, model_dir, name or backend)
    else:
      with subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=clean_env(),
                            stdin=subprocess.DEVNULL) as process:
        returncode = _wait_saying_where(process, model_dir, name or backend)
  if returncode != 0:
    raise RunError(f"{backend} run{' on Ray' if engine == 'ray' else ''} failed with exit "
                   f"code {returncode}; see {log_path}"
                   f"{' and ' + task_log_dir(model_dir) if workers > 1 else ''}")
  try:
    return read_summary(model_dir)
  except (OSError, ValueError) as e:
    raise RunError(f"{backend} run wrote no valid summary ({e}); see {log_path}") from e


_ZYGOTES: Dict[Tuple[Tuple[str, str], ...], zygote_lib.Zygote] = {}


def _zygote(env: Dict[str, str]) -> zygote_lib.Zygote:
  """The process this tool forks its lone runs from, which imported what they import
  once (runner.PRELOAD): each run is spared 4 to 5 CPU-s. In this tool's process group, so
  that a signal to the tool's group (a terminal's Ctrl-C, launch.migrate's stop) reaches its
  runs; it ends with this process, and gives the runs still going the time to save."""
  key = tuple(sorted(env.items()))
  if key not in _ZYGOTES or not _ZYGOTES[key].alive():
    _ZYGOTES[key] = zygote_lib.Zygote(runner.PRELOAD["estimator"], env, session=False)
    atexit.register(_ZYGOTES[key].close)
  return _ZYGOTES[key]


def _wait_saying_where(process: subprocess.Popen, model_dir: str, name: str) -> int:
  """The run's exit code, once it ends; every PROGRESS_SECONDS meanwhile, a line saying
  where it is, from its progress records: a tool is never silent for long."""
  started = time.monotonic()
  while True:
    try:
      return process.wait(timeout=PROGRESS_SECONDS)
    except subprocess.TimeoutExpired:
      logging.info("%s: %s (%.0f s).", name, where(model_dir), time.monotonic() - started)


def where(model_dir: str) -> str:
  """Where a running trainer is, as its progress records say."""
  try:
    records = read_progress(model_dir)
  except (OSError, ValueError):
    records = []
  starts = [r for r in records if r.get("event") == "start"]
  if not starts:
    return "starting its tasks"
  steps = [r for r in records[records.index(starts[-1]):] if r.get("event") == "step"]
  if not steps:
    return f"started, from step {starts[-1].get('from_step')}"
  to_step = starts[-1].get("to_step")
  if steps[-1]["step"] >= (to_step or 0):
    return f"trained to step {steps[-1]['step']}: evaluating and exporting"
  return f"step {steps[-1]['step']} of {to_step}"


def task_log_dir(model_dir: str) -> str:
  """Where a local cluster's task logs and tasks.json go by default."""
  return os.path.join(model_dir, supervisor.LOG_SUBDIR)


def read_tasks(log_dir: str) -> Dict[str, Any]:
  """The launcher's tasks.json: {"restarts": R, "tasks": [{"name", "pid"}, ...]}.

  Raises:
    OSError or ValueError: not written (yet) or unreadable.
  """
  with open(os.path.join(log_dir, restarts.TASKS_FILE)) as f:
    return json.load(f)


def read_summary(model_dir: str) -> Dict[str, Any]:
  """The chief's summary.json."""
  with open(os.path.join(model_dir, layout.SUMMARY_FILE)) as f:
    return json.load(f)


def read_progress(model_dir: str) -> List[Dict[str, Any]]:
  """The chief's progress records so far, oldest first (see layout.record_progress)."""
  return layout.read_records(os.path.join(model_dir, layout.PROGRESS_FILE))


def check_or_exit(config: Config, workers: int, idx_dir: Optional[str],
                  backends: Sequence[str] = BACKENDS) -> None:
  """For the tool binaries: exit 2 on a bad config or a backend this install cannot
  run (the Estimator on TF >= 2.16); prepare missing data, or exit 1.

  The data is prepared here, once, before any run starts (see
  data.mnist.ready.ensure_prepared; `idx_dir` None means $MNIST_IDX_DIR or a download).
  """
  if "estimator" in backends and runner.estimator_unavailable():
    raise app.UsageError(runner.estimator_unavailable(), exitcode=2)
  try:
    config.validate(workers)
  except ValueError as e:
    raise app.UsageError(str(e), exitcode=2) from e
  try:
    ready.ensure_prepared(config.data_dir, idx_dir, idx_dir_flag=runner.IDX_DIR_FLAG)
  except ready.MissingDataError as e:
    sys.exit(f"error: {e}")
