"""Shared fixtures: synthetic IDX files, prepared TFDS dirs, and real MNIST when present."""

import atexit
import dataclasses
import gzip
import importlib.util
import json
import os
import pathlib
import resource
import selectors
import signal
import struct
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import pytest

from data import mnist
from data.mnist import build
from data.mnist import store
from launch import supervisor
from launch import zygote
from trainers import runner

REPO = pathlib.Path(__file__).resolve().parents[1]
# What a user's shell may set that changes what TensorFlow prints or which task a
# process is: the tests assert on both, so their processes start without them.
for _name in ("TF_CONFIG", "TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL", "TF_CPP_VMODULE"):
  os.environ.pop(_name, None)

SHARED_IDX_DIR = pathlib.Path(os.environ.get("MNIST_IDX_DIR",
                                            REPO.parent / "shared/datasets/mnist"))


def write_idx(path: pathlib.Path, array: np.ndarray) -> None:
  """Writes a gzip'd unsigned-byte IDX file."""
  header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
  with gzip.open(path, "wb") as f:
    f.write(header + array.astype(np.uint8).tobytes())


def synthetic_split(n: int, seed: int):
  """Digits-like images: each label lights its own band of rows, plus noise."""
  rng = np.random.default_rng(seed)
  labels = np.arange(n) % 10
  rng.shuffle(labels)
  images = rng.integers(0, 60, size=(n, 28, 28))
  for i, label in enumerate(labels):
    images[i, 2 + 2 * label:4 + 2 * label, 4:24] = 255
  return images.astype(np.uint8), labels.astype(np.uint8)


def write_idx_dir(directory: pathlib.Path, sizes: Dict[str, int]) -> pathlib.Path:
  directory.mkdir(parents=True, exist_ok=True)
  for seed, (split, n) in enumerate(sizes.items()):
    images, labels = synthetic_split(n, seed)
    image_name, label_name = mnist.IDX_FILES[split]
    write_idx(directory / f"{image_name}.gz", images)
    write_idx(directory / f"{label_name}.gz", labels)
  return directory
# Why this install cannot run the Estimator (the newest-TF stack), or None.
ESTIMATOR_MISSING = runner.estimator_unavailable()


# Tests that train for minutes or wait on timeouts run first: two or more at a
# time (pytest-xdist), the short ones then fill the gaps, and none of the long
# ones is left to run alone at the end.
LONG_FIRST = ("real_data", "slow", "chaos", "multihost")


@pytest.hookimpl(tryfirst=True)  # Before `-m` deselects: `-m quick` sees the mark.
def pytest_collection_modifyitems(config, items):
  """Marks `quick` every test that is not long (LONG_FIRST) nor extended, and orders the
  long ones first; without tf.estimator, skips (with the reason) what runs it: tests
  marked `estimator`, and the estimator cases of parametrized tests and fixtures."""
  for item in items:
    if not any(item.get_closest_marker(mark) for mark in (*LONG_FIRST, "extended")):
      item.add_marker(pytest.mark.quick)
  items.sort(key=lambda item: next((i for i, mark in enumerate(LONG_FIRST)
                                    if item.get_closest_marker(mark)), len(LONG_FIRST)))
  if not ESTIMATOR_MISSING:
    return
  skip = pytest.mark.skip(reason=ESTIMATOR_MISSING)
  for item in items:
    params = getattr(item, "callspec", None)
    values = params.params.values() if params else ()
    if item.get_closest_marker("estimator") or any(
        v == "estimator" or (isinstance(v, tuple) and "estimator" in v) for v in values):
      item.add_marker(skip)


# TEST_CPU_LOG=PATH: each test's CPU seconds (its process's and its waited-for children's),
# a JSON line per test appended to PATH; CI's time is CPU-bound (docs/testing.md).
CPU_LOG = os.environ.get("TEST_CPU_LOG")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  if not CPU_LOG:
    yield
    return
  before = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
  started = time.monotonic()
  yield
  after = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
  cpu = sum(a.ru_utime + a.ru_stime - b.ru_utime - b.ru_stime for a, b in zip(after, before))
  cpu += _FORKED_CPU.pop(item.nodeid, 0.0)  # Reaped by a zygote, not by this process.
  with open(CPU_LOG, "a") as f:
    f.write(json.dumps({"test": item.nodeid, "cpu_s": round(cpu, 1),
                        "wall_s": round(time.monotonic() - started, 1)}) + "\n")


@pytest.fixture(scope="session")
def tiny_idx_dir(tmp_path_factory) -> pathlib.Path:
  return write_idx_dir(tmp_path_factory.mktemp("idx"), {"train": 600, "test": 200})


@pytest.fixture(scope="session")
def tiny_data_dir(tiny_idx_dir, tmp_path_factory) -> str:
  """A TFDS data dir with a small synthetic `mnist` (600 train, 200 test)."""
  data_dir = str(tmp_path_factory.mktemp("tfds"))
  build.prepare(str(tiny_idx_dir), data_dir)
  return data_dir


@pytest.fixture(scope="session")
def real_data_dir(tmp_path_factory) -> str:
  """A TFDS data dir with the real MNIST subset from ../shared (CI requires it)."""
  env_dir = os.environ.get("TFDS_DATA_DIR")
  if env_dir and store.is_prepared(env_dir):
    return env_dir
  if not (SHARED_IDX_DIR / "train-images-idx3-ubyte.gz").exists():
    message = f"real MNIST IDX files not found in {SHARED_IDX_DIR} (set MNIST_IDX_DIR)"
    if os.environ.get("REQUIRE_REAL_MNIST") == "1":
      pytest.fail(message)
    pytest.skip(message)
  data_dir = str(tmp_path_factory.mktemp("real_tfds"))
  build.prepare(str(SHARED_IDX_DIR), data_dir)
  return data_dir


# CI installs the ray extra and must run the Ray tests; elsewhere they skip, saying why.
RUN_RAY = importlib.util.find_spec("ray") is not None or bool(os.environ.get("REQUIRE_RAY"))
needs_ray = pytest.mark.skipif(not RUN_RAY,
                               reason='Ray is not installed: pip install -e ".[tf215,ray]"')


def run_module(module: str, args: List[str], timeout: float = 600,
               env: Optional[Dict[str, Optional[str]]] = None, fresh: bool = False
               ) -> subprocess.CompletedProcess:
  """Runs `python -m module args` from the repo root, as a user would.

  `env` adds to this process's environment (but TF_CONFIG); None values unset. From the
  second run in an environment on, the process is forked from a zygote that imported
  TensorFlow, as the local launcher forks its tasks (launch.zygote), sparing each run 4 to
  5 CPU-s; `fresh` (or TEST_FRESH_PROCESSES=1 for every run) starts a process of its own.
  """
  # Not pytest's name of the running test either: a zygote serves one environment.
  full_env = {k: v for k, v in os.environ.items()
              if k not in ("TF_CONFIG", "PYTEST_CURRENT_TEST")}
  for key, value in (env or {}).items():
    if value is None:
      full_env.pop(key, None)
    else:
      full_env[key] = value
  full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), full_env.get("PYTHONPATH", "")])
  cmd = [sys.executable, "-m", module, *args]
  if fresh or FRESH_PROCESSES or not _worth_a_zygote(full_env):
    return subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True,
                          timeout=timeout, check=False)
  return _run_forked(cmd, full_env, timeout)


FRESH_PROCESSES = os.environ.get("TEST_FRESH_PROCESSES") == "1"
PRELOAD = sorted({name for names in runner.PRELOAD.values() for name in names})
MAX_ZYGOTES = 2  # Per test process: most runs share its environment, or one more.
_ZYGOTES: Dict[Tuple[Tuple[str, str], ...], zygote.Zygote] = {}
_ZYGOTES_LOCK = threading.Lock()
_RUNS_SEEN: Dict[Tuple[Tuple[str, str], ...], int] = {}
FORKED_RUNS: List[int] = []  # The pids of this process's forked runs.
_FORKED_CPU: Dict[str, float] = {}  # By test: what its forked runs used (TEST_CPU_LOG).


def _env_key(env: Dict[str, str]) -> Tuple[Tuple[str, str], ...]:
  return tuple(sorted((k, v) for k, v in env.items() if k not in zygote.PER_TASK))


def _worth_a_zygote(env: Dict[str, str]) -> bool:
  """Whether runs in `env` are forked: from its second run on. A zygote's imports cost what
  one run's do, and most runs in an environment seen once (a test's own) stop before they
  import TensorFlow (a bad flag): for them, a zygote would cost more than it spares."""
  key = _env_key(env)
  with _ZYGOTES_LOCK:
    _RUNS_SEEN[key] = _RUNS_SEEN.get(key, 0) + 1
    return key in _ZYGOTES or _RUNS_SEEN[key] > 1


def _zygote_for(env: Dict[str, str]) -> zygote.Zygote:
  """This process's zygote for `env` (TF_CONFIG aside); an idle one is closed past
  MAX_ZYGOTES."""
  key = _env_key(env)
  with _ZYGOTES_LOCK:
    if key in _ZYGOTES and _ZYGOTES[key].alive():
      return _ZYGOTES[key]
    idle = [k for k, z in _ZYGOTES.items() if not z.running()]  # Oldest first.
    while idle and len(_ZYGOTES) >= MAX_ZYGOTES:
      _ZYGOTES.pop(idle.pop(0)).close()
    _ZYGOTES[key] = made = zygote.Zygote(PRELOAD, env, cwd=str(REPO))
    atexit.register(made.close)
    return made


def _run_forked(cmd: List[str], env: Dict[str, str], timeout: float
                ) -> subprocess.CompletedProcess:
  """subprocess.run(cmd, capture_output=True, text=True, timeout) for a forked run."""
  task = _zygote_for(env).spawn(cmd, env)
  FORKED_RUNS.append(task.pid)
  deadline = time.monotonic() + timeout
  said: Dict[int, List[bytes]] = {task.stdout.fileno(): [], task.stderr.fileno(): []}
  with selectors.DefaultSelector() as pipes:
    for fd in said:
      pipes.register(fd, selectors.EVENT_READ)
    while pipes.get_map() and time.monotonic() < deadline:
      for key, _ in pipes.select(deadline - time.monotonic()):
        chunk = os.read(key.fd, 1 << 16)
        if chunk:
          said[key.fd].append(chunk)
        else:
          pipes.unregister(key.fd)
  # As text=True reads them: universal newlines.
  out, err = (b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
              .replace("\r", "\n") for chunks in said.values())
  task.stdout.close()
  task.stderr.close()
  try:
    code = task.wait(max(0.0, deadline - time.monotonic()))
  except subprocess.TimeoutExpired:
    os.killpg(task.pid, signal.SIGKILL)
    task.wait()
    raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
  test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
  with _ZYGOTES_LOCK:
    _FORKED_CPU[test] = _FORKED_CPU.get(test, 0.0) + (task.cpu_seconds or 0.0)
  return subprocess.CompletedProcess(cmd, code, out, err)


def run_in_local_cluster(script: str, tmp_path: pathlib.Path, workers: int = 2,
                         timeout: float = 300) -> Tuple[int, str]:
  """Runs Python source `script` as every training task of a local cluster, importing
  this checkout's code; returns the launcher's exit code and the chief's log."""
  path = tmp_path / "cluster_script.py"
  path.write_text(f"import sys\nsys.path.insert(0, {str(REPO)!r})\n{script}")
  rc = supervisor.run_local_cluster([sys.executable, str(path)], workers,
                                    str(tmp_path / "logs"), timeout=timeout, max_restarts=0)
  return rc, (tmp_path / "logs" / "chief-0.log").read_text()


def kubeflow_tf_configs(job: str, namespace: str, replicas: Dict[str, int],
                        endpoint: Optional[Callable[[str, int], str]] = None
                        ) -> Dict[str, Optional[str]]:
  """TF_CONFIG of every replica (by pod "<type>-<i>"), as the TFJob operator writes them
  (../shared/schemas/kubeflow-tfjob/tensorflow_tf_config.go: genClusterSpec and
  genTFConfigJSONStr): lower-cased types, `<job>-<type>-<i>.<namespace>.svc:2222`
  (GenGeneralName), "environment": "cloud", every replica in every cluster.
  Go's encoding/json sorts map keys and keeps struct fields in order. A job of one
  replica gets none (None): it has nothing to connect to. `endpoint(type, index)`
  replaces the service addresses (e.g. with local ports, to run the tasks here)."""
  if sum(replicas.values()) == 1:
    return {f"{rtype.lower()}-0": None for rtype in replicas}
  endpoint = endpoint or (lambda rtype, i: f"{job}-{rtype}-{i}.{namespace}.svc:2222")
  spec = {rtype.lower(): [endpoint(rtype.lower(), i) for i in range(n)]
          for rtype, n in replicas.items()}
  return {f"{rtype.lower()}-{i}": json.dumps(
      {"cluster": dict(sorted(spec.items())), "task": {"type": rtype.lower(), "index": i},
       "environment": "cloud"}, separators=(",", ":"))
          for rtype, n in replicas.items() for i in range(n)}


def vertex_tf_configs(workers: int, evaluator: bool = True,
                      endpoint: Optional[Callable[[str, int], str]] = None
                      ) -> Dict[str, str]:
  """TF_CONFIG of every task (by "<type>-<i>") as Vertex AI (and AI Platform) writes it
  (cloud.google.com/ai-platform/training/docs/distributed-training-details): the chief's
  type "master", the evaluator outside `cluster`, and `job`, `trial`, `cloud`,
  `environment` beside; `endpoint(type, index)` gives the addresses."""
  endpoint = endpoint or (lambda rtype, i: f"cmle-training-{rtype}-abc-{i}:2222")
  spec = {"master": [endpoint("master", 0)]}
  if workers > 1:
    spec["worker"] = [endpoint("worker", i) for i in range(workers - 1)]
  tasks = [("master", 0)] + [("worker", i) for i in range(workers - 1)]
  tasks += [("evaluator", 0)] if evaluator else []
  return {f"{t}-{i}": json.dumps(
      {"cluster": spec, "environment": "cloud", "job": {"region": "us-central1"},
       "task": {"type": t, "index": i, "trial": "1", "cloud": "t-abc"}, "cloud": "c-abc"})
          for t, i in tasks}


def memory_input_fn(global_batch_size: int, eval_batch_size: int = 50, n: int = 256,
                    task: str = "multiclass", weights=None, tabular=None):
  """A tiny in-memory input_fn with the shared one's contract, for in-process trainer tests;
  its labels the `task`'s (trainers/heads.py), with `weights` (each digit's) each example's
  weight; with `tabular` (a parse spec) each image's tabular features, parsed by it."""
  import tensorflow as tf
  from data.mnist import tabular as table
  from trainers import heads
  from trainers.config import Config
  head = heads.head(Config(task=task))

  splits = {mnist.TRAIN: synthetic_split(n, seed=0), mnist.EVAL: synthetic_split(100, seed=1)}

  def input_fn(mode, input_context=None):
    images, labels = splits[mode]
    ds = tf.data.Dataset.from_tensor_slices((images[..., None].astype("float32") / 255.0,
                                             labels.astype("int64")))
    if weights:
      ds = ds.map(lambda image, digit: (image, digit, tf.gather(tf.constant(weights), digit)))
    if task != "multiclass":
      ds = ds.map(lambda image, digit, *weight: (image, head.label(image, digit), *weight))
    if tabular:
      ds = ds.map(lambda image, *rest: (table.serialize(table.features(image)), *rest))
    batch = global_batch_size if mode == mnist.TRAIN else eval_batch_size
    if input_context is not None:
      ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
      batch = input_context.get_per_replica_batch_size(batch)
    if mode == mnist.TRAIN:
      ds = ds.repeat()
    ds = ds.batch(batch, drop_remainder=mode == mnist.TRAIN)
    if tabular:
      ds = ds.map(lambda records, *rest: (tf.io.parse_example(records, tabular), *rest))
    return ds

  return input_fn


def memory_input_of(config):
  """memory_input_fn as `config` reads it: its batch, task, weights and features."""
  from trainers.models import canned
  return memory_input_fn(config.global_batch_size, task=config.task,
                         weights=config.example_weights(),
                         tabular=canned.parse_spec(config.canned_settings()))


def with_initial_weights(config, tmp_path):
  """`config` with --init_weights: a file of `config.model`'s weights from its seed."""
  from trainers import model as model_lib
  path = str(tmp_path / "init.npz")
  model_lib.save_weights_npz(path, model_lib.get_weights(model_lib.build(config)))
  return dataclasses.replace(config, init_weights=path)


def trained_weights(backend, config, model_dir):
  """Every final weight of `backend` trained in this process (one replica, memory data)."""
  import tensorflow as tf
  from launch.proofs import harness
  from trainers import loop
  summary = loop.train_and_evaluate(backend, config, str(model_dir),
                                    strategy=tf.distribute.MirroredStrategy(["/cpu:0"]),
                                    input_fn=memory_input_of(config))
  return harness.backend_weights(backend.name, summary, config)


def assert_ends_where_the_reference_ends(config, trained, atol: float = 1e-5) -> None:
  """Every weight (moving statistics too) within `atol` of the reference loop's, at one
  worker on the same memory data."""
  from launch.proofs import reference
  _, want = reference.train_reference(config, 1, memory_input_of(config))
  assert sorted(trained) == sorted(want)
  diffs = {name: float(np.max(np.abs(trained[name] - value))) for name, value in want.items()}
  assert max(diffs.values()) < atol, diffs


def checkpoint_values(path: str) -> Dict[str, np.ndarray]:
  """Every model variable of either backend's checkpoint, by the name it had."""
  import tensorflow as tf
  from trainers import warm_start
  reader = tf.train.load_checkpoint(path)
  return {name: reader.get_tensor(key) for name, key in warm_start.source_names(path).items()}


def tamper_keras_checkpoint(model_dir: str, config, change: Callable) -> None:
  """Rewrites a Keras model_dir's newest checkpoint with `change(model, config)` applied,
  at the same step (the state a negative control or a fault starts from)."""
  import tensorflow as tf
  from trainers import keras_trainer

  model = keras_trainer.compile_model(config)
  model.optimizer.build(model.trainable_variables)
  path = tf.train.latest_checkpoint(model_dir)
  tf.train.Checkpoint(model=model).restore(path).assert_existing_objects_matched()
  change(model, config)
  for name in os.listdir(model_dir):
    if name.startswith(("ckpt-", "checkpoint")):
      os.remove(os.path.join(model_dir, name))
  keras_trainer.save_checkpoint(model, model_dir, int(path.rsplit("-", 1)[1]))
