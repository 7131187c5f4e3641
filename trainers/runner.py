"""Runs one backend as a single process, as one TF_CONFIG task, or as a local cluster."""

import importlib
import importlib.metadata
import json
import os
import sys
import tempfile
from typing import Any, Callable, Dict, Optional, Tuple

from absl import logging

from data.mnist import ready
from launch import cluster
from launch import console
from launch import exit_codes
from launch import rendezvous
from launch import supervisor
from trainers import model_registry
from trainers import preemption
from trainers import run_lock
from trainers import run_options
from trainers import run_record
from trainers.config import Config
from trainers.run_options import RunOptions

# TensorFlow is imported only where needed (trainers.checkpoints, trainers.distribute
# and the trainers import it): a launcher checks its flags, the data and a new
# model_dir, and starts the tasks, without it. Only missing data (prepared
# here, once) and a model_dir holding files (a resumed run) need TensorFlow.

BACKENDS = {"keras": "trainers.keras_trainer", "estimator": "trainers.estimator_trainer"}
BINARIES = {"keras": "trainers.keras_main", "estimator": "trainers.estimator_main"}
# What each backend's tasks import, whatever the model: the local launcher imports it once
# and forks the tasks from there (launch.zygote), sparing each 4 to 5 CPU-s.
PRELOAD = {"keras": ("tensorflow", "tf_keras", "tensorflow_datasets"),
           "estimator": ("tensorflow", "tf_keras", "tensorflow_datasets",
                         "tensorflow_estimator")}
IDX_DIR_FLAG = run_options.flag("mnist_idx_dir")  # Named in the data's messages.


class ModelDirError(ValueError):
  """model_dir cannot be used: missing parent, unwritable, or another run's checkpoint."""


def estimator_unavailable() -> Optional[str]:
  """Why this install cannot run the Estimator backend (with the fix), or None.

  Read from the installed package's metadata, without importing TensorFlow,
  so a launcher refuses at once: tf.estimator was removed in TensorFlow 2.16.
  """
  try:
    version = importlib.metadata.version("tensorflow")
  except importlib.metadata.PackageNotFoundError:
    version = None
  if version and tuple(int(p) for p in version.split(".")[:2]) < (2, 16):
    return None
  return (f"The Estimator backend needs TensorFlow 2.15 (tf.estimator was removed in 2.16); "
          f"this environment has {'TensorFlow ' + version if version else 'no TensorFlow'}. "
          "Install the TF 2.15.1 stack in a Python 3.9 to 3.11 virtualenv: "
          "pip install -e \".[tf215]\". The Keras backend (python -m trainers.keras_main) "
          "runs on either stack.")


def _error(message: str, code: int) -> int:
  print(f"error: {message}", file=sys.stderr)
  return code


def _prepare_model_dir(backend: str, config: Config, options: RunOptions, writer: bool,
                       workers: int, in_task: bool = False) -> Optional[run_lock.RunLock]:
  """Checks model_dir before anything is written to it. The writer also creates it (and its
  missing parents), takes
  its run lock (unless its launcher holds it), repairs what a crash left (the
  `checkpoint` index, and checkpoints that do not load) and checks this start's
  settings against the run it resumes (trainers.run_record).

  Returns:
    The run lock this process took, or None.

  Raises:
    ModelDirError: naming the problem and the fix; nothing in model_dir was changed.
  """
  model_dir = options.model_dir
  path = os.path.abspath(model_dir)  # Its path checked with the flags: _check_run.
  lock = None
  if writer:
    try:
      os.makedirs(path, exist_ok=True)
      fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=path)
      os.close(fd)
      os.remove(probe)
    except OSError as e:
      raise ModelDirError(f"--model_dir={model_dir} is not writable ({e.strerror}); "
                          "choose a directory you can write to.") from e
    if not run_lock.held_by_launcher(path):
      lock = run_lock.acquire(path)  # Before anything here is read or moved.
  try:
    resumed = bool(set(os.listdir(path) if os.path.isdir(path) else ()) - _NOT_A_RUN)
    if resumed:
      _check_resumable(backend, path, config, writer=writer, in_task=in_task)
    if writer:  # Every refusal before any write.
      current = run_record.settings(backend, config, workers)
      changed = run_record.changes(path, current, config,
                                   has_checkpoint=resumed and _has_checkpoint(path),
                                   allow_change=options.allow_config_change)
      if resumed:
        _repair(path)  # Before any task reads the checkpoints.
      run_record.record(path, current, changed)
      for change in changed:
        logging.warning("Resuming with a change: %s.", change)
  except BaseException:
    if lock:
      lock.release()
    raise
  return lock


def _check_model_dir_path(model_dir: str, writer: bool) -> None:
  """What the path alone says against --model_dir, checked before TensorFlow loads: a
  file in its place or its parents', a parent a non-writer cannot make, a directory
  this user cannot write in. Nothing is created.

  Raises:
    ModelDirError: naming the problem and the fix.
  """
  path = os.path.abspath(model_dir)
  parent = os.path.dirname(path)
  if not writer and not os.path.isdir(parent):  # The writer makes it, as `mkdir -p` does.
    raise ModelDirError(
        f"--model_dir={model_dir}: its parent directory {parent} does not exist. Start the "
        "chief first (it makes it), or choose another --model_dir.")
  existing = path
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise ModelDirError(f"--model_dir={model_dir}: {existing} is a file, not a directory; "
                        "choose another --model_dir.")
  if writer and not os.access(existing, os.W_OK | os.X_OK):
    raise ModelDirError(f"--model_dir={model_dir} is not writable ({existing} is not "
                        "writable by this user); choose a directory you can write to.")


# What a model_dir holds before any run wrote to it: a launcher's logs, the run lock
# and the run record.
_NOT_A_RUN = {supervisor.LOG_SUBDIR, run_lock.LOCK_FILE, run_record.RECORD_FILE}


def _has_checkpoint(path: str) -> bool:
  """Whether model_dir holds a checkpoint or a Keras backup a run resumes from."""
  from trainers import checkpoints  # noqa: PLC0415 -- imports TensorFlow.
  from trainers import model_dir as layout  # noqa: PLC0415 -- imports TensorFlow.
  return bool(checkpoints.find(path)) or os.path.isdir(os.path.join(path, layout.BACKUP_SUBDIR))


def _check_resumable(backend: str, path: str, config: Config, writer: bool,
                     in_task: bool = False) -> None:
  """Refuses a model_dir `backend` cannot resume `config.model` in to `config.train_steps`.
  A cluster's task leaves a team's program's variables to its backend (`in_task`), which
  checks them once its strategy is made (runner._check_code says why).

  Raises:
    ModelDirError: naming the problem and the fix, before anything is changed.
  """
  from trainers import checkpoints  # noqa: PLC0415 -- imports TensorFlow.
  problem = checkpoints.resume_problem(backend, path, config, program_variables=not in_task)
  if problem:
    raise ModelDirError(problem)
  # The writer's check: a task beside a running chief would race its backups.
  reached = checkpoints.keras_backup_step(path) if backend == "keras" and writer else None
  if reached is not None and reached >= config.train_steps:
    raise ModelDirError(
        f"--model_dir={path} holds an interrupted run at step {reached} (its Keras backup); "
        f"--train_steps={config.train_steps} is at or below it, so there is nothing to train. Give "
        f"--train_steps above {reached} to finish that run. Nothing was changed.")


def _repair(path: str) -> None:
  """Rewrites a wrong `checkpoint` index and sets aside checkpoints that do not load, so
  the run resumes from the newest that does (the writer only).

  Raises:
    ModelDirError: a set-aside that could not be done.
  """
  from trainers import checkpoints  # noqa: PLC0415 -- imports TensorFlow.
  checkpoints.repair_index(path)
  try:
    checkpoints.set_aside_damaged(path)
  except ValueError as e:
    raise ModelDirError(str(e)) from e


def _check_run(backend: str, config: Config, options: RunOptions
               ) -> Tuple[Optional[cluster.Task], int, int]:
  """Checks everything a run is given before any task starts: this task, its workers and
  its parameter servers.

  Raises:
    ValueError: naming the bad flag or TF_CONFIG and the fix.
  """
  workers = options.workers
  if backend == "estimator" and estimator_unavailable():
    raise ValueError(estimator_unavailable())
  if workers is not None and workers < 1:
    raise ValueError(f"--workers must be at least 1, got {workers}.")
  for name in ("timeout", "stall_timeout", "startup_timeout", "grace_seconds"):
    if getattr(options, name) is not None and getattr(options, name) <= 0:
      raise ValueError(f"--{name} must be positive, got {getattr(options, name)}.")
  if options.max_restarts < 0:
    raise ValueError(f"--max_restarts must be at least 0, got {options.max_restarts}.")
  if options.ps is not None and options.ps < 0:
    raise ValueError(f"--ps must be at least 0, got {options.ps}.")
  task = cluster.parse_tf_config()
  if task and options.ps is not None and options.ps != task.num_ps:
    raise ValueError(
        f"--ps={options.ps} but TF_CONFIG describes {task.num_ps} ps task(s): start every "
        "task with the same --ps, or leave it out.")
  num_ps = task.num_ps if task else (options.ps or 0)
  # A coordinating chief computes no gradients.
  in_cluster = task.num_workers - coordinated(backend, num_ps) if task else None
  if task and workers is not None and workers != in_cluster:
    raise ValueError(
        f"--workers={workers} but TF_CONFIG describes {in_cluster} training tasks: "
        "start every task with the same --workers, or leave it out."
    )
  if task and in_cluster < 1:
    raise ValueError("TF_CONFIG lists ps tasks and a chief but no worker: Keras's chief "
                     "coordinates on parameter servers, its workers compute. Add a 'worker' "
                     "job to the cluster.")
  num_workers = in_cluster if task else (workers or 1)
  check_parameter_servers(backend, config, num_ps,
                          task.has_evaluator if task else options.evaluator, num_workers)
  config.validate(num_replicas=num_workers)  # One CPU replica per worker.
  if backend == "estimator" and not options.evaluator and num_workers > 1 and not task:
    raise ValueError("--noevaluator is for Keras: a multi-worker Estimator evaluates only in "
                     "its evaluator task.")
  if backend == "estimator" and config.estimator_program and config.log_tensors:
    raise ValueError("--log_tensors is for the Keras port and the project's model_fn: an "
                     "--estimator_program's own training_hooks (a LoggingTensorHook) log "
                     "what it logs. Leave --log_tensors out.")
  if (backend == "estimator" and config.early_stopping_metric and num_workers > 1 and task
      and not task.has_evaluator):
    raise ValueError("--early_stopping_metric reads the evaluator's results, and a multi-worker "
                     "Estimator evaluates only in its evaluator task: add an evaluator task to "
                     "TF_CONFIG's cluster, or leave --early_stopping_metric out.")
  if task and options.model_dir is None:
    raise ValueError("--model_dir is required when TF_CONFIG is set: every task must share it.")
  if task:
    cluster.check_port_free(task)
  if options.model_dir is not None:
    _check_model_dir_path(options.model_dir, writer=task is None or task.is_chief)
  _check_files(config, options)
  return task, num_workers, num_ps


def coordinated(backend: str, num_ps: int) -> bool:
  """Whether the chief coordinates and the `worker` tasks only serve, stepped by it: Keras on
  parameter servers (ParameterServerStrategy). The Estimator's chief and workers each step
  alone there."""
  return backend == "keras" and num_ps > 0


def check_parameter_servers(backend: str, config: Config, num_ps: int, evaluator: bool,
                            workers: int) -> None:
  """Refuses what does not run on `num_ps` parameter servers (none: nothing), with an
  evaluator task or not, `workers` computing gradients.

  Raises:
    ValueError: naming the fix.
  """
  if coordinated(backend, num_ps) and not evaluator:
    raise ValueError("--noevaluator (or a TF_CONFIG with no evaluator task): on parameter "
                     "servers Keras's chief coordinates the workers and evaluates only the "
                     "final step; the evaluator task evaluates each checkpoint. Leave "
                     "--noevaluator out, or add an evaluator task.")
  if coordinated(backend, num_ps) and config.logged_tensors():
    raise ValueError("--log_tensors is not logged on parameter servers yet: Keras's chief "
                     "sees only each epoch's end, not each step's values. Leave it out.")
  if num_ps and config.early_stopping_metric:
    raise ValueError(
        "--early_stopping_metric is not run on parameter servers yet: the stop every task "
        "agrees on needs the tasks to step together. Leave it out, or train without ps tasks.")
  if num_ps and config.record_dir and workers > 1:
    raise ValueError(
        f"--record_dir on parameter servers needs --workers=1: at {workers} workers the "
        "steps are asynchronous, and no step's loss is the cluster's. Give --workers=1, or "
        "leave --record_dir out.")


def _check_files(config: Config, options: RunOptions) -> None:
  """The files and directories the flags name, checked before any task starts (a task
  that found them bad would fail, and be retried, in every task).

  Raises:
    ValueError: naming the flag and the fix.
  """
  if config.init_weights:
    import numpy as np  # noqa: PLC0415 -- only for this flag: a launcher starts at once.
    try:
      with np.load(config.init_weights) as weights:
        weights.files  # noqa: B018 -- reads the archive's directory.
    except FileNotFoundError:
      raise ValueError(f"--init_weights={config.init_weights}: no such file. Give the .npz "
                       "of weights by name that launch.parity writes (init_weights.npz), or "
                       "leave the flag out to initialize from --seed.") from None
    except (OSError, ValueError) as e:
      raise ValueError(f"--init_weights={config.init_weights} is not a .npz of weights "
                       f"({e}); give one that numpy.savez wrote, as launch.parity does.") from e
  log_dir = options.task_log_dir
  if log_dir and not os.path.isdir(log_dir) and not os.path.isdir(
      os.path.dirname(os.path.abspath(log_dir))):
    raise ValueError(f"--task_log_dir={log_dir}: neither it nor its parent directory exists. "
                     "Create the parent first, or choose another --task_log_dir.")


def _check_code(backend: str, config: Config, task: Optional[cluster.Task]) -> None:
  """Builds what a run trains from a user's code, each in a graph of its own: the spec
  (--model), and a team's program (--estimator_program): the Estimator its model_fn's
  train and eval graphs, Keras its input_fn's features against the port's inputs (each
  backend checks a program itself in a cluster's task, once its strategy is made: an
  input_fn such as tfds.load's starts TensorFlow's runtime, which the strategy must
  configure first).

  Raises:
    model_registry.SpecError (program.ProgramError): naming the fix.
  """
  from trainers import model as model_lib  # noqa: PLC0415 -- imports TensorFlow.
  if not config.estimator_program:
    model_lib.check(config)
    named = {flag: getattr(config, flag) for flag in ("early_stopping_metric", "export_metric")
             if getattr(config, flag)}
    keys = model_lib.metric_keys(config) if named else ()
    for flag, metric in named.items():
      if metric not in keys:
        raise model_registry.SpecError(
            f"--{flag}={metric}: the run's evaluations report {', '.join(keys)}; name one "
            "of them.")
  elif task is None:
    _check_program(backend, config)


def _check_program(backend: str, config: Config) -> None:
  """The checks of config.estimator_program `_check_code` names, for `backend`."""
  from trainers import inputs  # noqa: PLC0415 -- imports TensorFlow.
  from trainers import model as model_lib  # noqa: PLC0415 -- imports TensorFlow.
  if backend == "estimator":
    from trainers import estimator_program  # noqa: PLC0415 -- imports tf.estimator.
    from trainers import estimator_trainer  # noqa: PLC0415 -- imports tf.estimator.
    from trainers import export  # noqa: PLC0415 -- imports TensorFlow.
    estimator_program.check(config)
    policy = export.Policy.of(config)
    if policy:
      estimator_trainer.make_exporter(config, policy)  # Needs the program's receiver.
  else:
    inputs.check_fits(config, model_lib.input_shapes(config))
    model_lib.check_log_tensors(config)


def _check_warm_start(backend: str, config: Config, model_dir: Optional[str]) -> None:
  """What --warm_start_from starts, checked before any task starts (a cluster's tasks
  check it again, in warm_start.for_run); nothing when model_dir resumes instead.

  Raises:
    warm_start.WarmStartError: naming the flag and the fix.
  """
  from trainers import warm_start  # noqa: PLC0415 -- imports TensorFlow.
  if not (model_dir and warm_start.resumes(model_dir)):
    warm_start.plan(backend, config)


def run(backend: str, config: Config, options: RunOptions,
        start_cluster: Callable[..., int] = supervisor.run_local_cluster) -> int:
  """Trains `backend` and returns the process exit code (launch.exit_codes).

  SIGTERM (or SIGINT) stops a task at a step its cluster agrees on and saves
  (trainers.preemption), and this returns PREEMPTED (INTERRUPTED); to a local
  cluster's launcher, it does so to every task.

  With TF_CONFIG set, this process runs as that task. Otherwise, with more
  than one worker it starts a localhost cluster whose tasks each run
  `options.relaunch` (this same command) with their own TF_CONFIG, and
  streams the chief's output; with one worker it trains here.

  Args:
    backend: "keras" or "estimator".
    config: hyperparameters.
    options: workers, directories, timeout.
    start_cluster: what runs the tasks of a cluster of more than one worker, given the
      command and `launch.supervisor.run_local_cluster`'s arguments, returning the exit
      code: that function, or another engine's (launch/ray/engine.py).

  Returns:
    0 on success; USAGE for bad flags, TF_CONFIG, ports or model_dir; 1 for
    data that is missing and could not be prepared; PREEMPTED or INTERRUPTED;
    else what `_train_here` returns, or for a local cluster the exit code of the
    task that ended it.
  """
  try:
    return _run(backend, config, options, start_cluster)
  except preemption.Preempted as e:
    where = (f"after step {e.step}, which is saved" if e.step is not None else
             "outside training, with nothing unsaved")
    logging.warning("Stopped by %s%s %s: exiting %d%s. Run the same command again to go on "
                    "from there.", e.name, " to another training task" if e.by_peer else "",
                    where, e.exit_code,
                    ", which orchestrators retry" if e.exit_code == exit_codes.PREEMPTED else "")
    return e.exit_code


def _run(backend: str, config: Config, options: RunOptions,
         start_cluster: Callable[..., int]) -> int:
  """run(), with a signal raising preemption.Preempted."""
  lock = None
  try:
    task, num_workers, num_ps = _check_run(backend, config, options)
    cluster.write_master_as_chief()  # Before TensorFlow reads TF_CONFIG.
    launcher = task is None and (num_workers > 1 or num_ps > 0)
    # The tasks' environment, before this process quiets its own TensorFlow (a
    # launcher imports it to inspect a non-empty model_dir): their logs keep all.
    task_env = dict(os.environ)
    if task is None:
      console.quiet_lone_process(options.verbosity)  # Before TensorFlow is imported.
    if not launcher:
      # Before any TensorFlow op: the model_dir check below builds the model.
      from trainers import distribute  # noqa: PLC0415 -- imports TensorFlow.
      distribute.setup_process(task, options.grace_seconds)
    if task is not None and task.type == cluster.PS:
      return _serve(task)
    # Before any task starts: the tasks find the data there and never race
    # to build it, nor need the network. (A worker that a coordinating chief steps reads it
    # too, on its own machine.)
    ready.ensure_prepared(config.data_dir, options.mnist_idx_dir, idx_dir_flag=IDX_DIR_FLAG)
    if task is not None and coordinated(backend, num_ps) and task.type == cluster.WORKER:
      return _serve(task)
    if not launcher:
      _check_code(backend, config, task)  # A user's: its errors exit 2 before peers wait.
    if task is None and config.warm_start_from:
      _check_warm_start(backend, config, options.model_dir)
    if options.model_dir is not None:
      # Only the chief (or the launcher, or a lone process) writes to model_dir; the
      # lock is held until this process exits.
      lock = _prepare_model_dir(backend, config, options, writer=task is None or task.is_chief,
                                workers=num_workers, in_task=task is not None)
  except ready.MissingDataError as e:
    return _error(str(e), 1)
  except ValueError as e:  # TFConfigError, ModelDirError, ConfigChangeError, SpecError.
    return _error(str(e), exit_codes.USAGE)

  finished = _finished_summary(options.model_dir, config) if task is None else None
  if finished:  # Nothing to train: its stored result, without starting anything.
    logging.info("%s holds a run finished at step %d: its result as it was stored (give "
                 "--train_steps above %d to train on).", options.model_dir,
                 finished["global_step"], finished["global_step"])
    print(json.dumps(finished), flush=True)
    if lock:
      lock.release()
    return 0
  model_dir = options.model_dir or tempfile.mkdtemp(prefix=f"mnist_{backend}_")
  # The tasks write under this process's lock (a new temporary model_dir needs none).
  task_env[run_lock.HELD_FOR_ENV] = os.path.abspath(model_dir)
  if launcher:
    log_dir = options.task_log_dir or os.path.join(model_dir, supervisor.LOG_SUBDIR)
    logging.info("Starting %d %s workers%s; model_dir=%s, logs in %s", num_workers, backend,
                 f" and {num_ps} parameter server(s)" if num_ps else "", model_dir, log_dir)
    return start_cluster(
        [*options.relaunch, f"--model_dir={model_dir}"],
        num_workers + coordinated(backend, num_ps), log_dir,
        evaluator=options.evaluator, timeout=options.timeout,
        stall_timeout=options.stall_timeout, max_restarts=options.max_restarts,
        env=task_env, verbose=options.verbosity >= 1,
        grace=options.grace_seconds + supervisor.GRACE_MARGIN_SECONDS,
        # Not on parameter servers: a restarted Estimator worker that finds the run
        # finished leaves before its chief's rendezvous can find it, which forking made
        # likely enough to hang a chaos trial (the chief waits out --startup_timeout).
        preload=PRELOAD[backend] if options.fork_tasks and not num_ps else (),
        **({"ps": num_ps, "workers_serve": coordinated(backend, num_ps)} if num_ps else {}))
  try:
    if task is not None and task.type != cluster.EVALUATOR:
      rendezvous.wait_for_peers(task, options.startup_timeout)
    return _train_here(backend, config, model_dir, task)
  except rendezvous.StartupTimeout as e:
    return _error(str(e), exit_codes.STARTUP_TIMEOUT)
  except rendezvous.ClusterMismatchError as e:  # Found here, or in TensorFlow's start-up.
    return _error(str(e), exit_codes.USAGE)
  finally:
    if lock:
      lock.release()


def _finished_summary(model_dir: Optional[str], config: Config) -> Optional[Dict[str, Any]]:
  """The summary of the run model_dir holds if it finished at or past `config.train_steps`:
  its newest checkpoint is the summary's step and the summary's export is still there."""
  # (trainers.model_dir.SUMMARY_FILE: a launcher imports TensorFlow only if it is there.)
  if model_dir is None or not os.path.exists(os.path.join(model_dir, "summary.json")):
    return None
  from trainers import checkpoints  # noqa: PLC0415 -- imports TensorFlow.
  from trainers import model_dir as layout  # noqa: PLC0415 -- imports TensorFlow.
  newest = checkpoints.newest(model_dir)
  step = checkpoints.checkpoint_step(newest)[1] if newest else None
  return (layout.finished_summary(model_dir, step)
          if step is not None and step >= config.train_steps else None)


def _serve(task: cluster.Task) -> int:
  """A parameter server's run, or a worker's that a coordinating chief steps: served until a
  signal (distribute.serve), at once: the training tasks wait for its server to listen
  (launch.rendezvous), and their sessions take any other listener on its port for a broken
  one. It writes nothing to model_dir (a worker reads the data the chief's steps read)."""
  from trainers import distribute  # noqa: PLC0415 -- imports TensorFlow.
  return distribute.serve(task)


def _train_here(backend: str, config: Config, model_dir: str,
                task: Optional[cluster.Task]) -> int:
  """Runs `backend` as this process's task; maps how it ended to an exit code.

  Returns:
    0 on success; DIVERGED when the training loss or the weights became NaN
    or Inf; DISK_FULL when a write found no space left on its device;
    PEER_LOST when a training peer was lost, which a restart of the cluster
    resumes. Any other error is raised (rendezvous.ClusterMismatchError too).
  """
  # Imported by name, so the Keras path never loads tf.estimator (gone in TF 2.16).
  try:
    trainer = importlib.import_module(BACKENDS[backend])
  except ImportError as e:  # tf.estimator on TensorFlow >= 2.16: the message says what to do.
    return _error(str(e), exit_codes.USAGE)
  # They import TensorFlow.
  from trainers import distribute, evaluation, failures, loop, warm_start  # noqa: PLC0415
  try:
    loop.train_and_evaluate(trainer.Backend, config, model_dir)
  except failures.DivergedError as e:
    return _error(str(e), exit_codes.DIVERGED)
  except (model_registry.SpecError, warm_start.WarmStartError,
          evaluation.MissingMetricError) as e:
    # A program's code, or a warm start, checked in a cluster's task once its strategy is
    # made; a program's metric, once it is evaluated.
    return _error(str(e), exit_codes.USAGE)
  except Exception as e:
    full = failures.no_space_left(e)
    if full is not None:
      return _error(failures.disk_full_message(model_dir, full), exit_codes.DISK_FULL)
    lost = distribute.lost_peer(e) if task and task.type != cluster.EVALUATOR else None
    if lost is None:
      raise
    first_line = str(lost).strip().splitlines()[0] if str(lost).strip() else type(lost).__name__
    return _error(f"lost a training peer ({type(lost).__name__}: {first_line}): ending this "
                  f"task with exit code {exit_codes.PEER_LOST}, so that the cluster is "
                  "restarted from its last checkpoint.", exit_codes.PEER_LOST)
  return 0
