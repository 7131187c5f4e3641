"""Per-process set-up: the one place a tf.distribute strategy is created."""

import contextlib
import faulthandler
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Iterator, List, Optional, Tuple

import tensorflow as tf
from absl import logging
# No public API in TF 2.15 for the coordination service's settings, barrier and
# key-value store.
from tensorflow.python.data.ops import multi_device_iterator_ops
from tensorflow.python.distribute import collective_all_reduce_strategy
from tensorflow.python.distribute import multi_worker_util
from tensorflow.python.eager import context
from tensorflow.python.training import session_manager

from launch import cluster
from launch import console
from launch import exit_codes
from launch import rendezvous
from trainers import failures
from trainers import preemption
from trainers import progress

# TF waits an hour for every task to register by default. Every peer listened
# before this (launch.rendezvous), so one that does not join within this long
# never will.
REGISTER_TIMEOUT_SECONDS = 40
# A peer that stops answering is declared dead after this long without a heartbeat.
HEARTBEAT_TIMEOUT_SECONDS = 15
PEER_CHECK_SECONDS = 5  # How often (and how long) lost_peers_end_the_process asks each peer.
# The coordination-service protos moved (tensorflow.tsl in TF 2.15,
# tensorflow.compiler.xla.tsl in 2.21): taken from the module MWMS itself uses.
_COORDINATION_CONFIG = collective_all_reduce_strategy.coordination_config_pb2


class _TaskFormatter(logging.PythonFormatter):
  """Prefixes every absl log line with the task, e.g. `[worker:1]`."""

  def __init__(self, task_name: str):
    super().__init__()
    self._prefix = f"[{task_name}] "

  def format(self, record):
    if console.is_own(record.pathname):
      # The project's own lines carry their path, so a launcher can show them.
      record.filename = os.path.relpath(record.pathname, console.REPO)
    return self._prefix + super().format(record)


def setup_process(task: Optional[cluster.Task],
                  grace_seconds: float = preemption.DEFAULT_GRACE_SECONDS) -> None:
  """Handles SIGTERM (trainers.preemption), tags logs with the task and splits the cores
  among the local tasks.

  Must run in the main thread before TensorFlow's runtime starts (before any op or strategy).

  Args:
    task: this process's task from TF_CONFIG, or None for one local process.
    grace_seconds: how long after SIGTERM this process may take to save and exit.
  """
  preemption.install(grace_seconds)
  # TF's logger has its own stderr handler besides absl's: keep one copy of each line.
  for handler in list(tf.get_logger().handlers):
    tf.get_logger().removeHandler(handler)
  # The launcher asks a hung task for its stacks before killing it.
  faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
  no_autotune_on_device_datasets()
  progress.mark_startup("imported")
  if task is None:
    return
  logging.get_absl_handler().setFormatter(_TaskFormatter(task.name))
  threads = intra_op_threads(task.num_workers)
  tf.config.threading.set_intra_op_parallelism_threads(threads)
  logging.info("Task %s of %d workers; %d intra-op threads.", task.name, task.num_workers, threads)


def intra_op_threads(num_workers: int) -> int:
  """The intra-op threads each task of a `num_workers`-worker cluster computes with.

  launch.local puts every worker on this machine: without a cap each would start a
  thread per core, and N workers would fight over the same cores. (One process alone
  has TF's default, a thread per core: the same number.)
  """
  return max(1, (os.cpu_count() or 1) // num_workers)


def _configure_coordination_service(resolver: tf.distribute.cluster_resolver.ClusterResolver):
  """The settings MultiWorkerMirroredStrategy would choose, with timeouts that end hangs."""
  cluster_spec = multi_worker_util.normalize_cluster_spec(resolver.cluster_spec())
  context.context().configure_coordination_service(
      service_type="standalone",
      service_leader=multi_worker_util.coordination_leader(cluster_spec),
      cluster_register_timeout_in_ms=REGISTER_TIMEOUT_SECONDS * 1000,
      heartbeat_timeout_in_ms=HEARTBEAT_TIMEOUT_SECONDS * 1000,
      coordinated_jobs=[
          _COORDINATION_CONFIG.CoordinatedJob(name=job, num_tasks=cluster_spec.num_tasks(job))
          for job in (cluster.CHIEF, cluster.WORKER) if job in cluster_spec.jobs
      ])


def no_autotune_on_device_datasets() -> None:
  """Turns tf.data autotuning off in the per-device buffers of distributed datasets.

  Both backends read through a MultiDeviceIterator, which iterates a
  one-element prefetch per device, with autotuning on by default (nothing
  there to tune). In TF 2.15, deleting an iterator this way (at the end of
  `fit`, or of an Estimator session) waits out its autotuning thread's sleep
  instead of waking it (docs/MIGRATION.md, item 12).
  `data.mnist.pipeline.input_fn` turns autotuning off in the pipeline itself; both are needed.
  """
  create = multi_device_iterator_ops._create_device_dataset
  if getattr(create, "_no_autotune", False):
    return

  def create_without_autotune(*args, **kwargs) -> tf.data.Dataset:
    options = tf.data.Options()
    options.autotune.enabled = False
    return create(*args, **kwargs).with_options(options)

  create_without_autotune._no_autotune = True
  multi_device_iterator_ops._create_device_dataset = create_without_autotune


def create_strategy() -> tf.distribute.MultiWorkerMirroredStrategy:
  """MultiWorkerMirroredStrategy for this process's TF_CONFIG (local if unset).

  Both backends use it: Keras builds its model in its scope; the Estimator
  gets it as `RunConfig(train_distribute=...)`. In a cluster, every peer must
  register within REGISTER_TIMEOUT_SECONDS and keep answering heartbeats, and
  every task must have been started with the same cluster; otherwise this, or
  the first step, fails instead of waiting.

  Raises:
    rendezvous.ClusterMismatchError: a peer's TF_CONFIG describes another cluster.
  """
  task = cluster.parse_tf_config()
  if task is None or task.type == cluster.EVALUATOR:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    progress.mark_startup("strategy")
    return strategy
  # The training tasks only: the evaluator (listed in every task's cluster
  # when Kubeflow writes TF_CONFIG) serves nothing and joins no collective.
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(task.training_cluster), task_type=task.type, task_id=task.index,
      rpc_layer="grpc")
  _configure_coordination_service(resolver)
  # TF 2.15 waits forever, holding the GIL, for a peer that never joins (its
  # registration timeout does not cover the eager context's set-up), so the
  # watchdog is a process of its own; it is stopped once the cluster is up.
  # Its SIGALRM ends this task with exit_codes.STARTUP_TIMEOUT (128 + 14).
  watchdog = subprocess.Popen(
      [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(REGISTER_TIMEOUT_SECONDS),
       task.name, *[f"{job}:{i}={address}" for job, addresses in task.training_cluster.items()
                    for i, address in enumerate(addresses)]],
      stdin=subprocess.DEVNULL)
  try:
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    if threading.current_thread() is threading.main_thread():
      # The coordination service's agent has just set a SIGTERM handler of its own
      # (it only logs): SIGTERM must reach trainers.preemption.
      preemption.reinstall()
    _check_same_cluster(task)
  finally:
    watchdog.kill()
    watchdog.wait()
  progress.mark_startup("strategy")
  return strategy


def create_parameter_server_strategy(task: cluster.Task) -> tf.distribute.ParameterServerStrategy:
  """ParameterServerStrategy for `task`, the chief of a Keras run on parameter servers: it
  coordinates (ClusterCoordinator, inside `Model.fit`), each `worker` task steps on its own,
  the `ps` tasks hold the variables. The evaluator's task is outside the cluster. The
  workers and ps tasks listen already (launch.rendezvous)."""
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(task.servers), task_type=task.type, task_id=task.index,
      rpc_layer="grpc")
  strategy = tf.distribute.ParameterServerStrategy(resolver)
  if threading.current_thread() is threading.main_thread():
    preemption.reinstall()  # Connecting to the cluster may have set handlers of its own.
  progress.mark_startup("strategy")
  return strategy


# argv: parent pid, seconds, this task's name, then job:index=host:port per task.
_WATCHDOG = """
import os, signal, socket, sys, time
parent, seconds, name, tasks = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4:]
time.sleep(seconds)
missing = []
for task in tasks:
  peer, address = task.split("=")
  host, _, port = address.rpartition(":")
  try:
    socket.create_connection((host, int(port)), timeout=2).close()
  except OSError:
    missing.append(f"{peer} ({address})")
print(f"[{name}] error: the cluster did not come up within {seconds:.0f} s of every task "
      "listening: " + (f"no task listens at {', '.join(missing)} any more." if missing else
                       "not all joined.")
      + " Start every task with the same TF_CONFIG cluster (python -m launch.local does). "
      "Stopping this task (SIGALRM: exit 142, retried).", file=sys.stderr, flush=True)
os.kill(parent, signal.SIGALRM)
"""


def _check_same_cluster(task: cluster.Task) -> None:
  """Compares this task's cluster with every peer's, through the coordination service
  (launch.rendezvous compared them before, with every peer it found still waiting)."""
  mine = rendezvous.cluster_json(task)
  ctx = context.context()
  ctx.set_config_key_value(f"mnist_cluster/{task.name}", mine)
  for job in (cluster.CHIEF, cluster.WORKER):
    for index in range(len(task.cluster.get(job, []))):
      peer = f"{job}:{index}"
      theirs = ctx.get_config_key_value(f"mnist_cluster/{peer}",
                                        timeout_in_ms=REGISTER_TIMEOUT_SECONDS * 1000)
      if theirs != mine:
        raise rendezvous.mismatch(peer, theirs, task)


def serve(task: cluster.Task) -> int:
  """Runs this process as the server `task`: a parameter server holding the variables the
  chief and workers place on it, or a worker that a coordinating chief steps
  (ParameterServerStrategy); its server in the cluster of every server (`task.servers`), until
  SIGTERM or SIGINT; returns 128 + that signal's number (exit_codes.PREEMPTED for
  SIGTERM: what it held is in the chief's checkpoints, and a restart serves again).

  Unlike the Estimator's own ps task (`server.join()`, which no signal ends but SIGKILL),
  this waits for a signal, which every thread of the server blocks so that this one
  takes it."""
  signals = {signal.SIGTERM, signal.SIGINT}
  signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # Before the server's threads start.
  server = tf.distribute.Server(tf.train.ClusterSpec(task.servers), job_name=task.type,
                                task_index=task.index, protocol="grpc", start=True)
  logging.info("Serving as %s at %s for %s.", task.name, server.target, ", ".join(
      f"{job}:{i}" for job, addresses in task.training_cluster.items()
      for i in range(len(addresses))))
  signum = signal.sigwait(signals)
  logging.info("Stopped by %s.", signal.Signals(signum).name)
  return 128 + signum


# How often an Estimator worker on parameter servers asks whether the chief has initialized
# the variables (SessionManager's default, which MonitoredTrainingSession does not expose,
# is 30 s: the chief of a short run ended before its workers began).
WORKER_READY_POLL_SECONDS = 1.0


def poll_for_the_chiefs_variables_often() -> None:
  """Makes each graph session a worker waits on ask every WORKER_READY_POLL_SECONDS
  whether the chief has initialized the model's variables, not every 30 s."""
  init = session_manager.SessionManager.__init__
  if getattr(init, "_polls_often", False):
    return

  def polls_often(self, *args, **kwargs):
    if len(args) < 5:  # recovery_wait_secs is the fifth; given, it stands.
      kwargs.setdefault("recovery_wait_secs", WORKER_READY_POLL_SECONDS)
    init(self, *args, **kwargs)

  polls_often._polls_often = True
  session_manager.SessionManager.__init__ = polls_often


def num_workers(strategy: tf.distribute.Strategy) -> int:
  """Number of training worker processes behind the strategy."""
  resolver = getattr(strategy, "cluster_resolver", None)
  jobs = resolver.cluster_spec().as_dict() if resolver else {}
  return max(1, len(jobs.get("worker", [])) + len(jobs.get("chief", [])))


def is_chief(strategy: tf.distribute.Strategy) -> bool:
  """True for the one process that writes to model_dir: `chief:0` (or, in a cluster with
  no chief job, `worker:0`), or a local run."""
  resolver = getattr(strategy, "cluster_resolver", None)
  jobs = resolver.cluster_spec().as_dict() if resolver else {}
  if not jobs:
    return True
  # The rule itself lives with the rest of TF_CONFIG handling, in launch.cluster.
  return cluster.Task(resolver.task_type, resolver.task_id, num_workers(strategy),
                      has_chief_job=cluster.CHIEF in jobs).is_chief


class _CoordinationStore:
  """The coordination service's key-value store, as trainers.preemption uses it."""

  def put(self, key: str, value: str) -> bool:
    try:
      context.context().set_config_key_value(key, value)
      return True
    except tf.errors.AlreadyExistsError:
      return False

  def get(self, key: str, timeout_seconds: float) -> Optional[str]:
    try:
      return context.context().get_config_key_value(key,
                                                     timeout_in_ms=int(timeout_seconds * 1000))
    except tf.errors.DeadlineExceededError:
      return None


def _training_tasks(strategy: Optional[tf.distribute.Strategy]
                    ) -> Tuple[Optional[Tuple[str, int]], List[Tuple[str, int]]]:
  """This task, and every training task (chief and workers) of its cluster, as (job,
  index); (None, []) without a cluster."""
  resolver = getattr(strategy, "cluster_resolver", None)
  if resolver is None:
    return None, []
  jobs = resolver.cluster_spec().as_dict()
  return (resolver.task_type, resolver.task_id), [
      (job, i) for job in (cluster.CHIEF, cluster.WORKER) for i in range(len(jobs.get(job, [])))]


def preemption_agreement(strategy: tf.distribute.Strategy, prefix: str = preemption.PREFIX,
                         alone_at_once: bool = True) -> preemption.Agreement:
  """This task's agreement with the other training tasks on where a preemption (or the stop
  whose keys `prefix` names: preemption.Agreement) stops them."""
  me, tasks = _training_tasks(strategy)
  if len(tasks) < 2:
    return preemption.Agreement(None, "local", [], prefix, alone_at_once)
  return preemption.Agreement(_CoordinationStore(), "%s:%d" % me,
                              ["%s:%d" % t for t in tasks if t != me], prefix, alone_at_once)


# How long a training task that is done waits for the others at the end (leave_together): the
# chief's evaluation of the final step and its export.
LEAVE_TIMEOUT_SECONDS = 24 * 3600


def leave_together(strategy: tf.distribute.Strategy) -> None:
  """Waits, at the end of a multi-worker run, until every training task is done; no-op
  otherwise.

  The chief hosts the coordination service, which logs a worker whose process ended
  before it as failed once its heartbeats stop ("E ... has been set to ERROR ... heartbeat
  timeout"), 15 s later: on a good run's terminal, while the chief still evaluates and
  exports. So a worker done first waits for the chief here. A task that cannot wait (a
  peer gone: the barrier fails) says so and ends as it would have.
  """
  if num_workers(strategy) < 2:
    return
  try:
    context.context().wait_at_barrier("mnist_run_end", LEAVE_TIMEOUT_SECONDS * 1000)
  except tf.errors.OpError as e:
    logging.info("Not waiting for the other training tasks to end: %s",
                 str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)


def barrier(strategy: tf.distribute.Strategy, name: str, timeout_seconds: float = 300) -> None:
  """Waits until every worker of a multi-worker strategy reaches `name`; no-op otherwise."""
  if num_workers(strategy) > 1:
    context.context().wait_at_barrier(name, int(timeout_seconds * 1000))
    logging.info("All %d workers reached %s.", num_workers(strategy), name)


# How a collective fails once MultiWorkerMirroredStrategy's health check, or
# gRPC, finds a peer gone: the collectives are aborted (UNAVAILABLE), or time
# out, or are cancelled.
_PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                tf.errors.CancelledError, tf.errors.AbortedError)


def lost_peer(error: BaseException) -> Optional[BaseException]:
  """The error in `error`'s chain that says a training peer was lost, or None."""
  return failures.in_chain(error, lambda e: isinstance(e, _PEER_ERRORS))


@contextlib.contextmanager
def lost_peers_end_the_process(strategy: Optional[tf.distribute.Strategy]) -> Iterator[None]:
  """While in the block, a training peer that stops answering ends this process.

  MultiWorkerMirroredStrategy's own health check aborts the eager context's
  collectives when a peer stops answering (a frozen process, a host cut
  off), which ends Keras's `fit`. A graph Session's collectives (the
  Estimator's) are not aborted and wait forever: seen with an Estimator
  worker beside a SIGSTOPped chief. So a daemon thread asks each peer every
  PEER_CHECK_SECONDS, and once one has not answered for
  HEARTBEAT_TIMEOUT_SECONDS it names it and exits with exit_codes.PEER_LOST, which
  the launcher (or an orchestrator) restarts. A no-op without peers.
  """
  me, tasks = _training_tasks(strategy)
  peers = [f"/job:{job}/replica:0/task:{i}" for job, i in tasks if (job, i) != me]
  done = threading.Event()

  def watch() -> None:
    answered = {peer: time.monotonic() for peer in peers}
    while not done.wait(PEER_CHECK_SECONDS):
      for peer in peers:
        try:
          context.context().check_collective_ops_peer_health(
              peer, timeout_in_ms=PEER_CHECK_SECONDS * 1000)
          answered[peer] = time.monotonic()
        except tf.errors.OpError as e:
          silent = time.monotonic() - answered[peer]
          if silent >= HEARTBEAT_TIMEOUT_SECONDS and not done.is_set():
            # As runner reports errors: the launcher quotes this line.
            print(f"error: {peer} has not answered for {silent:.0f} s "
                  f"({str(e).strip().splitlines()[0]}): ending this task, so that the cluster "
                  "is restarted from its last checkpoint.", file=sys.stderr, flush=True)
            os._exit(exit_codes.PEER_LOST)

  if peers:
    threading.Thread(target=watch, name="peer-watch", daemon=True).start()
  try:
    yield
  finally:
    done.set()
