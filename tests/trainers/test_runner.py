"""Both binaries as users run them: 1 and 2 local workers, loss scaling, bad input."""

import concurrent.futures
import dataclasses
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from data.mnist import store
from launch import cluster
from launch import exit_codes
from trainers import checkpoints
from trainers import distribute
from trainers import evaluation
from trainers import flags as trainer_flags
from trainers import keras_trainer
from trainers import model as model_lib
from trainers import run_lock
from trainers import run_record
from trainers import runner
from trainers import serving
from launch.proofs import harness
from launch.proofs import reference
from launch.proofs import runs
from launch.proofs import serving_check
from trainers.config import Config
from tests.conftest import (ESTIMATOR_MISSING, REPO, SHARED_IDX_DIR, kubeflow_tf_configs,
                            vertex_tf_configs,
                            run_module)

BACKENDS = ("keras", "estimator")
STEPS = 3
TINY = Config(train_steps=STEPS, global_batch_size=32, learning_rate=0.1, momentum=0.9,
              eval_batch_size=50, log_every_steps=1, checkpoint_every_steps=STEPS)
SUMMARY_KEYS = {"backend", "workers", "global_step", "test_accuracy", "test_loss",
                "test_metrics", "train_seconds", "examples_per_second", "model_dir", "export_dir",
                "first_step_time"}


def _flags(config: Config, data_dir: str):
  return trainer_flags.config_to_flags(dataclasses.replace(config, data_dir=data_dir))


def _train(backend, workers, tiny_data_dir, tmp_path_factory, extra=()):
  model_dir = str(tmp_path_factory.mktemp(f"{backend}{workers}"))
  result = run_module(f"trainers.{backend}_main",
                      [f"--workers={workers}", f"--model_dir={model_dir}",
                       "--timeout=300", *_flags(TINY, tiny_data_dir), *extra])
  assert result.returncode == 0, result.stderr[-5000:]
  return model_dir, result


# (backend, workers, evaluator task): a cluster runs an evaluator unless Keras's
# --noevaluator makes its chief evaluate.
RUNS = [(b, w, w > 1) for w in (1, 2) for b in BACKENDS] + [("keras", 2, False)]


# The tests of these runs go to one pytest-xdist worker (--dist loadgroup), so
# each run is trained once, not once per worker.
RUNS_GROUP = pytest.mark.xdist_group("test_runner_runs")


@pytest.fixture(scope="module", params=RUNS,
                ids=lambda p: f"{p[0]}-{p[1]}w" + ("" if p[2] or p[1] == 1 else "-noevaluator"))
def run(request, tiny_data_dir, tmp_path_factory):
  backend, workers, evaluator = request.param
  extra = [] if evaluator or workers == 1 else ["--noevaluator"]
  model_dir, result = _train(backend, workers, tiny_data_dir, tmp_path_factory, extra)
  return backend, workers, model_dir, result, evaluator


@pytest.mark.slow
@RUNS_GROUP
def test_run_writes_a_valid_summary(run):
  backend, workers, model_dir, result, _ = run
  with open(os.path.join(model_dir, "summary.json")) as f:
    summary = json.load(f)
  assert set(summary) == SUMMARY_KEYS
  assert (summary["backend"], summary["workers"], summary["global_step"]) == (
      backend, workers, STEPS)
  assert 0.0 <= summary["test_accuracy"] <= 1.0 and summary["test_loss"] > 0
  # The multiclass head's metrics; the loss its average_loss.
  assert summary["test_metrics"] == {"accuracy": summary["test_accuracy"],
                                     "average_loss": summary["test_loss"],
                                     "loss": summary["test_loss"]}
  assert summary["train_seconds"] > 0 and summary["examples_per_second"] > 0
  assert json.loads(result.stdout.strip().splitlines()[-1]) == summary
  assert os.path.exists(os.path.join(summary["export_dir"], "saved_model.pb"))
  assert os.listdir(os.path.join(model_dir, "eval"))  # Evaluation events.


@pytest.mark.slow
@RUNS_GROUP
def test_only_the_chief_writes_to_model_dir(run):
  backend, workers, model_dir, _, evaluator = run
  leftovers = [n for n in os.listdir(model_dir) if n.startswith(("tmp", ".tmp"))]
  assert not leftovers
  if workers > 1:
    logs = sorted(os.listdir(os.path.join(model_dir, "logs")))
    expected = ["chief-0.log", "worker-0.log", "tasks.json"] + (
        ["evaluator-0.log"] if evaluator else [])
    assert logs == sorted(expected)


@pytest.mark.slow
@RUNS_GROUP
def test_a_finished_run_run_again_says_its_stored_result_and_starts_nothing(run,
                                                                          tiny_data_dir):
  backend, workers, model_dir, result, evaluator = run
  if (backend, workers, evaluator) not in (("keras", 2, True), ("estimator", 1, False)):
    pytest.skip("a launcher and a lone process")
  before = {p: os.stat(os.path.join(model_dir, p)).st_mtime for p in os.listdir(model_dir)}
  again = run_module(f"trainers.{backend}_main", [f"--workers={workers}",
                                                  f"--model_dir={model_dir}",
                                                  *_flags(TINY, tiny_data_dir)])
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stdout.strip().splitlines()[-1] == result.stdout.strip().splitlines()[-1]
  assert f"holds a run finished at step {STEPS}: its result as it was stored" in again.stderr
  assert "Starting" not in again.stderr and "Training from" not in again.stderr
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  assert os.listdir(os.path.join(model_dir, "export")) == [
      os.path.basename(summary["export_dir"])]
  umask = os.umask(0)
  os.umask(umask)
  assert os.stat(summary["export_dir"]).st_mode & 0o777 == 0o777 & ~umask
  assert {p: os.stat(os.path.join(model_dir, p)).st_mtime
          for p in os.listdir(model_dir)} == before  # Nothing written.


@pytest.mark.slow
@RUNS_GROUP
def test_estimator_workers_meet_before_any_exits(run):
  # Else a worker exiting while the chief closes its session stalls the chief
  # (docs/MIGRATION.md, "Shutdown").
  backend, workers, model_dir, _, _ = run
  if backend != "estimator" or workers == 1:
    pytest.skip("Estimator clusters only")
  for task in ("chief-0", "worker-0"):
    with open(os.path.join(model_dir, "logs", f"{task}.log")) as f:
      assert "All 2 workers reached estimator_training_done." in f.read(), task


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["keras", pytest.param("estimator",
                                                           marks=pytest.mark.estimator)])
def test_two_workers_train_on_a_parameter_server_each_stepping_alone(backend, tiny_data_dir,
                                                                     tmp_path):
  model_dir = tmp_path / "model"
  # Long enough for the Estimator's worker, which starts once the chief has set the
  # variables, to step.
  config = dataclasses.replace(TINY, train_steps=200, checkpoint_every_steps=100,
                               log_every_steps=20)
  result = run_module(f"trainers.{backend}_main", [
      "--workers=2", "--ps=1", f"--model_dir={model_dir}", "--timeout=300",
      *_flags(config, tiny_data_dir)])
  assert result.returncode == 0, result.stderr[-5000:]
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  # The Estimator's last steps may pass the total (its tasks step alone), the run ends where
  # its chief saved; Keras's chief ends each epoch once every step scheduled in it has.
  assert summary["workers"] == 2 and summary["global_step"] >= 200, summary
  assert "accuracy" in summary["test_metrics"]
  logs = model_dir / "logs"
  # Keras's chief coordinates: --workers=2 are two worker tasks, which serve it.
  workers = ["worker-0", "worker-1"] if backend == "keras" else ["worker-0"]
  assert [t["name"] for t in json.loads((logs / "tasks.json").read_text())["tasks"]] == [
      "chief-0", *workers, "ps-0", "evaluator-0"]
  assert "Serving as ps:0" in (logs / "ps-0.log").read_text()
  chief = (logs / "chief-0.log").read_text()
  if backend == "keras":
    assert summary["global_step"] == 200
    assert re.findall(r"Saved \S+/ckpt-(\d+)", chief) == ["0", "100", "200"]
    for i, worker in enumerate(workers):
      log = (logs / f"{worker}.log").read_text()
      assert f"Serving as worker:{i}" in log and f"Reading shard {i} of 2 " in log, worker
    assert re.search(r"step 200/200: loss", chief)
  else:
    # The variables live on the ps task; both training tasks stepped on them.
    assert 'device: "/job:ps/task:0"' in (model_dir / "graph.pbtxt").read_text()
    for task in ("chief-0", "worker-0"):
      assert re.search(r"step \d+/200: loss", (logs / f"{task}.log").read_text()), task
  # Only the chief writes model_dir: no worker's copies, no process left.
  assert not list(model_dir.glob("tmp_*"))
  for t in json.loads((logs / "tasks.json").read_text())["tasks"]:
    assert not os.path.exists(f"/proc/{t['pid']}"), t


@pytest.mark.extended  # Two cluster runs of 600 steps with a loss in each.
@pytest.mark.parametrize("lost", ["ps-0", "worker-1"])
def test_keras_on_a_parameter_server_survives_a_lost_task_to_its_final_step(lost,
                                                                            tiny_data_dir,
                                                                            tmp_path):
  """A lost ps task takes the variables with it: every training task restarts from the last
  checkpoint. A lost worker is restarted alone: the chief's coordinator schedules its steps
  on the other one meanwhile, and the run goes on without a restart; the steps of its
  execution it had applied are run again with the whole execution on the other worker
  (ClusterCoordinator runs a function at least once), so the run may end up to one
  execution (steps_per_execution steps) past --train_steps (601 to 604 of 600, measured)."""
  model_dir = tmp_path / "model"
  config = dataclasses.replace(TINY, train_steps=600, checkpoint_every_steps=100,
                               log_every_steps=50, data_dir=tiny_data_dir)
  command = runs.trainer_command("keras", config, workers=2, model_dir=str(model_dir),
                                 extra_flags=["--ps=1", "--max_restarts=1", "--timeout=300"])
  proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=runs.clean_env(), cwd=REPO)
  deadline = time.monotonic() + 240
  while not any(r.get("step", 0) >= 200 for r in runs.read_progress(str(model_dir))):
    assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
    time.sleep(0.2)
  tasks = runs.read_tasks(runs.task_log_dir(str(model_dir)))["tasks"]
  os.kill(next(t["pid"] for t in tasks if t["name"] == lost), signal.SIGKILL)
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err[-5000:]
  step = json.loads(out.strip().splitlines()[-1])["global_step"]
  redone = 0 if lost == "ps-0" else config.keras_steps_per_execution()
  assert 600 <= step <= 600 + redone, step
  assert runs.read_tasks(runs.task_log_dir(str(model_dir)))["restarts"] == 1
  starts = [r["from_step"] for r in runs.read_progress(str(model_dir)) if r["event"] == "start"]
  if lost == "ps-0":
    assert len(starts) == 2 and starts[1] >= 200 and starts[1] % 100 == 0, starts
  else:
    assert starts == [0] and "restarting it alone while the others train on." in err


@pytest.mark.slow
@RUNS_GROUP
def test_the_terminal_shows_progress_and_the_logs_keep_everything(run):
  backend, workers, model_dir, result, _ = run
  assert f"step {STEPS}/{STEPS}: loss " in result.stderr and "ETA" in result.stderr
  assert "Unable to register cuDNN factory" not in result.stderr
  assert "cpu_feature_guard" not in result.stderr
  # Saving an uncompiled model warned of it; every export is compiled now.
  assert "compiled metrics have yet to be built" not in result.stderr
  if workers > 1:
    with open(os.path.join(model_dir, "logs", "chief-0.log")) as f:
      log = f.read()
    assert "cpu_feature_guard" in log and "all_reduce" in log
    assert "cross_device_ops.py" not in result.stderr


@pytest.mark.slow
def test_verbosity_shows_tensorflows_own_logs_in_a_lone_process(tiny_data_dir, tmp_path):
  # Fresh: TensorFlow reads its log level as it loads, before the binary sets it from -v.
  runs = {v: run_module("trainers.keras_main", [f"--model_dir={tmp_path / str(v)}", f"-v={v}",
                                                *_flags(TINY, tiny_data_dir)], fresh=True)
          for v in (0, 1)}
  for result in runs.values():
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Training from step 0 to 3." in result.stderr
  assert "cpu_feature_guard" in runs[1].stderr and "cpu_feature_guard" not in runs[0].stderr


@pytest.mark.slow
@RUNS_GROUP
def test_the_evaluator_task_evaluates_the_final_checkpoint_for_the_chief(run):
  backend, workers, model_dir, _, evaluator = run
  results = evaluation.read_results(os.path.join(model_dir, "eval"))
  with open(os.path.join(model_dir, "summary.json")) as f:
    summary = json.load(f)
  # The summary's metrics are those of the final step's evaluation, wherever it ran.
  assert results[STEPS] == pytest.approx(summary["test_metrics"], abs=1e-6)
  if workers == 1:
    return
  chief_log = (pathlib.Path(model_dir) / "logs" / "chief-0.log").read_text()
  assert ("Waiting for the evaluator's result" in chief_log) == evaluator
  if not evaluator:
    return
  log = (pathlib.Path(model_dir) / "logs" / "evaluator-0.log").read_text()
  if backend == "estimator":
    assert f"Saving dict for global step {STEPS}:" in log
    assert "throttle_secs is set as 0" not in log  # Polling (TF warns on each spin at 0).
  else:
    assert "Last checkpoint evaluated. SidecarEvaluator stops." in log
  assert "Training from step" not in log  # It never joined the training.


def _trained_weights(backend: str, model_dir: str, names):
  if backend == "estimator":
    reader = tf.train.load_checkpoint(model_dir)
    return {name: reader.get_tensor(name) for name in names}
  with open(os.path.join(model_dir, "summary.json")) as f:
    export_dir = json.load(f)["export_dir"]
  return {model_lib.weight_name(v): v.numpy()
          for v in tf.saved_model.load(export_dir).trainable_variables}


@pytest.mark.slow  # It reads the module's trained runs: the quick tier would train them.
@RUNS_GROUP
def test_loss_scaling_gives_the_gradient_of_the_global_batch_mean(run, tiny_data_dir):
  """Each backend's weights equal a plain GradientTape loop over the global batches.

  Keras divides by the global batch; under train_distribute the Estimator's v1
  optimizer divides the per-replica mean by the number of replicas. A model_fn
  dividing by the global batch would step half as far at 2 workers: the
  `half` weights show the test tells the two apart. launch.proofs.reference is the
  same loop launch.parity uses; its own test is here.
  """
  backend, workers, model_dir, _, _ = run
  config = dataclasses.replace(TINY, data_dir=tiny_data_dir)
  _, want = reference.train_reference(config, workers)
  # v1 momentum is linear in the gradient: half the rate = half the gradient.
  _, half = reference.train_reference(
      dataclasses.replace(config, learning_rate=config.learning_rate / 2), workers)
  initial = model_lib.get_weights(model_lib.build(config))
  got = _trained_weights(backend, model_dir, want)
  assert sorted(got) == sorted(want)
  for name in want:
    assert np.abs(want[name] - initial[name]).max() > 1e-3, f"{name} did not move"
    assert np.abs(half[name] - want[name]).max() > 1e-4, f"{name}: no power to detect 1/2"
    np.testing.assert_allclose(got[name], want[name], atol=1e-6, err_msg=f"{backend} {name}")


@pytest.mark.slow
@pytest.mark.estimator
def test_both_backends_binaries_export_the_same_serving_contract(tiny_data_dir, tmp_path_factory):
  export_dirs = {}
  for backend in BACKENDS:
    model_dir = str(tmp_path_factory.mktemp(f"sig-{backend}"))
    result = run_module(f"trainers.{backend}_main",
                        [f"--model_dir={model_dir}", *_flags(TINY, tiny_data_dir)])
    assert result.returncode == 0, result.stderr[-3000:]
    export_dirs[backend] = json.loads(result.stdout.strip().splitlines()[-1])["export_dir"]
  assert set(serving_check.signatures(export_dirs["keras"])) == set(serving.SIGNATURES)
  # Trained apart from the same seed: the same weights to about 1e-7.
  config = dataclasses.replace(TINY, data_dir=tiny_data_dir)
  checks = serving_check.compare(export_dirs["estimator"], export_dirs["keras"],
                                 lambda: serving_check.test_images(config), serving.IMAGE, 1e-5)
  assert all(c.passed for c in checks), harness.format_checks("serving", checks)


# Usage errors are reported before any task waits for its peers: well within the
# 40 s a cluster gets to come up (measured: 4 to 6 s each, mostly the import, and
# up to 29 s on a machine loaded by two test processes and a chaos run).
REJECT_SECONDS = 40


def _tf_config(task_type="chief", index=0, ports=(1, 2), **cluster):
  cluster = cluster or {"chief": [f"localhost:{ports[0]}"], "worker": [f"localhost:{ports[1]}"]}
  return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task_type,
                                                                 "index": index}})}


def _snapshot(directory):
  """Every file under `directory` with its size and modification time."""
  return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
          for p in sorted(directory.rglob("*"))} if directory.exists() else None


def _rejected(backend, args, env, code, message, data_dir, model_dir, fresh=False):
  before = _snapshot(model_dir)
  start = time.monotonic()
  result = run_module(f"trainers.{backend}_main",
                      [f"--data_dir={data_dir}", f"--model_dir={model_dir}", *args],
                      env=env, timeout=120, fresh=fresh)
  elapsed = time.monotonic() - start
  assert result.returncode == code, result.stderr[-3000:]
  assert message in result.stderr
  assert elapsed < REJECT_SECONDS
  assert _snapshot(model_dir) == before  # Nothing created, changed or removed.
  return result


# Both binaries validate through trainers.runner: each case runs on one of them, in turn.
@pytest.mark.parametrize("backend, args, env, message", [(BACKENDS[i % 2], *case) for i, case in enumerate([  # noqa: E501 -- the table reads better unwrapped.
    (["--workers=0"], {}, "--workers must be at least 1"),
    (["--workers=2", "--global_batch_size=33"], {}, "not divisible by the 2 replicas"),
    (["--train_steps=0"], {}, "--train_steps must be positive"),
    (["--global_batch_size=-96"], {}, "--global_batch_size must be positive"),
    (["--backup_every_steps=0"], {}, "--backup_every_steps must be positive"),
    (["--workers=2", "--optimizer=adam", "--momentum=0.5"], {},
     "--momentum is not a setting of --optimizer=adam"),
    (["--optimizer=rmsprop", "--rho=1"], {}, "--rho must be in [0, 1), got 1.0"),
    (["--workers=2", "--hidden_units=64"], {}, "--hidden_units is not a setting of --model=cnn; "
     "it is one of --model=dnn, wide_deep, dnn_v1, wide_deep_v1."),
    (["--model=dnn", "--optimizer=adam"], {}, "--optimizer is not a setting of --model=dnn"),
    (["--workers=2", "--max_restarts=-1"], {}, "--max_restarts must be at least 0"),
    (["--workers=2", "--learning_rate_schedule=piecewise", "--boundaries=20,10",
      "--values=0.1,0.01,0.001"], {}, "--boundaries=20,10 must be steps >= 0, increasing."),
    (["--staircase"], {}, "--staircase is not a setting of --learning_rate_schedule=cosine"),
    (["extra"], {}, "Unexpected arguments: extra"),
    # Under MultiWorkerMirroredStrategy the Estimator's hooks take steps only.
    (["--early_stopping_check_every_secs=60"], {},
     "Did you mean: early_stopping_check_every_steps"),
    ([], {"TF_CONFIG": "{oops"}, "TF_CONFIG is not valid JSON"),
    ([], _tf_config("worker", 3), "task.index 3 is out of range"),
    ([], _tf_config("ps", 0), "task.type 'ps' has no job in the cluster"),
    ([], _tf_config("chief", ps1=["localhost:1"], chief=["localhost:2"]), "job(s) ['ps1']"),
    (["--workers=3"], _tf_config("worker", 0), "TF_CONFIG describes 2 training tasks"),
    # Files the flags name are checked before any task starts: nothing is retried.
    (["--workers=2", "--init_weights=/nonexistent.npz"], {}, "--init_weights=/nonexistent.npz"),
    (["--workers=2", f"--init_weights={__file__}"], {}, "is not a .npz of weights"),
    (["--workers=2", "--task_log_dir=/nonexistent/logs"], {}, "--task_log_dir=/nonexistent/logs"),
    (["--workers=2", "--warm_start_from=/nonexistent"], {},
     "--warm_start_from=/nonexistent: no such directory or checkpoint"),
    (["--workers=2", "--warm_start_from=/"], {}, "--warm_start_from=/ holds no checkpoint"),
    (["--warm_start_vars=conv"], {}, "--warm_start_vars says what --warm_start_from starts"),
    (["--workers=2", "--keep_checkpoint_max=-1"], {}, "--keep_checkpoint_max must be >= 0"),
    (["--workers=2", "--task=binary:12"], {}, "--task=binary:12 is not one of multiclass"),
    (["--model=dnn", "--weight_column=w", "--digit_weights=1,1,1,1,1,1,1,1,1,-2"], {},
     "--digit_weights=1,1,1,1,1,1,1,1,1,-2: give ten numbers >= 0"),
])])
def test_bad_input_is_rejected_with_the_fix(backend, args, env, message, tiny_data_dir,
                                            tmp_path):
  _rejected(backend, args, env, 2, message, tiny_data_dir, tmp_path / "model")


PS_CLUSTER = {"chief": ["localhost:2"], "ps": ["localhost:1"]}


@pytest.mark.parametrize("backend, args, env, message", [
    ("keras", ["--ps=1", "--noevaluator"], {},
     "--noevaluator (or a TF_CONFIG with no evaluator task)"),
    ("keras", [], _tf_config("chief", **PS_CLUSTER), "TF_CONFIG lists ps tasks and a chief but "
     "no worker"),
    ("keras", ["--workers=2"], _tf_config("chief", worker=["localhost:3"], **PS_CLUSTER),
     "--workers=2 but TF_CONFIG describes 1 training tasks"),
    ("keras", ["--workers=2", "--ps=1", "--record_dir=/tmp/x"], {},
     "--record_dir on parameter servers needs --workers=1"),
    ("keras", ["--ps=1", "--log_tensors=loss"], {},
     "--log_tensors is not logged on parameter servers yet"),
    ("keras", [], _tf_config("chief", worker=["localhost:3"], **PS_CLUSTER),
     "or a TF_CONFIG with no evaluator task"),
    ("estimator", ["--ps=-1"], {}, "--ps must be at least 0, got -1"),
    ("estimator", ["--ps=2"], _tf_config("chief", **PS_CLUSTER),
     "--ps=2 but TF_CONFIG describes 1 ps task(s)"),
    ("estimator", [], _tf_config("worker", worker=["localhost:2"], ps=["localhost:1"]),
     "'ps' tasks but no 'chief' job"),
    ("estimator", ["--ps=1", "--early_stopping_metric=accuracy"], {},
     "--early_stopping_metric is not run on parameter servers yet"),
])
def test_parameter_servers_are_refused_where_they_are_not_run(backend, args, env, message,
                                                              tiny_data_dir, tmp_path):
  _rejected(backend, args, env, 2, message, tiny_data_dir, tmp_path / "model")


@pytest.mark.estimator
def test_a_multi_worker_estimator_needs_its_evaluator(tiny_data_dir, tmp_path):
  _rejected("estimator", ["--workers=2", "--noevaluator"], {}, 2, "--noevaluator is for Keras",
            tiny_data_dir, tmp_path / "model")
  # A cluster of its own without one: an early stop would wait for evaluations forever.
  _rejected("estimator", ["--early_stopping_metric=loss", "--early_stopping_steps=10"],
            _tf_config(), 2, "add an evaluator task to TF_CONFIG's cluster",
            tiny_data_dir, tmp_path / "model")


@pytest.mark.estimator
def test_an_estimator_programs_own_hooks_log_what_it_logs(tiny_data_dir, tmp_path):
  _rejected("estimator", ["--estimator_program=team_program:PROGRAM", "--log_tensors=loss"],
            {"PYTHONPATH": str(REPO / "docs" / "examples")}, 2,
            "an --estimator_program's own training_hooks (a LoggingTensorHook) log what it "
            "logs", tiny_data_dir, tmp_path / "model")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_busy_port_is_rejected(backend, tiny_data_dir, tmp_path):
  with socket.socket() as busy:
    busy.bind(("localhost", 0))
    busy.listen()
    port = busy.getsockname()[1]
    _rejected(backend, [], _tf_config("chief", 0, ports=(port, 1)), 2,
              f"Port {port} of chief:0 (localhost:{port} in TF_CONFIG) cannot be bound",
              tiny_data_dir, tmp_path / "model")


@pytest.mark.slow
def test_a_model_dirs_missing_parents_are_made_as_mkdir_p_makes_them(tiny_data_dir, tmp_path):
  model_dir = tmp_path / "runs" / "keras"
  result = run_module("trainers.keras_main", [f"--model_dir={model_dir}",
                                              *_flags(TINY, tiny_data_dir)])
  assert result.returncode == 0, result.stderr[-3000:]
  assert (model_dir / "summary.json").exists()


def test_a_worker_whose_model_dir_has_no_parent_is_rejected(tiny_data_dir, tmp_path):
  # Only the writer makes model_dir; a worker started before its chief says so.
  _rejected("keras", [], _tf_config("worker", 0), 2, "its parent directory", tiny_data_dir,
            tmp_path / "missing" / "model")
  assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_unwritable_model_dir_is_rejected(backend, tiny_data_dir, tmp_path):
  if os.geteuid() == 0:  # root writes anywhere but on a read-only file system.
    model_dir = pathlib.Path("/sys/mnist-model-dir")
    if model_dir.exists() or not pathlib.Path("/sys").is_dir():
      pytest.skip("needs /sys, read-only for root, to find an unwritable directory")
  else:
    (tmp_path / "ro").mkdir(mode=0o500)
    model_dir = tmp_path / "ro" / "model"
  _rejected(backend, [], {}, 2, "is not writable", tiny_data_dir, model_dir)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_file_in_the_model_dirs_place_is_refused_before_tensorflow_loads(backend,
                                                                           tiny_data_dir,
                                                                           tmp_path):
  (tmp_path / "file").write_text("kept")
  for model_dir in (tmp_path / "file", tmp_path / "file" / "model"):
    result = _rejected(backend, [], {"PYTHONPROFILEIMPORTTIME": "1"}, 2,
                       f"{tmp_path / 'file'} is a file, not a directory", tiny_data_dir,
                       model_dir, fresh=True)  # What it imports: not forked.
    imported = re.findall(r"^import time:.*\| +(\S+)$", result.stderr, re.M)
    assert "numpy" in imported and "tensorflow" not in imported, imported[-5:]
  assert (tmp_path / "file").read_text() == "kept"


def _save_checkpoint(model_dir, owner: str, same_model: bool = True) -> None:
  """A checkpoint as `owner`'s backend writes it: object-based (Keras) or name-based."""
  model_dir.mkdir()
  if owner == "keras":
    model = (model_lib.build(Config(seed=0)) if same_model else
             tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(3)]))
    tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(model_dir), 1,
                               checkpoint_name="ckpt").save(checkpoint_number=7)
    return
  with tf.Graph().as_default():
    if same_model:
      model_lib.build(Config(seed=0))
    else:
      tf.compat.v1.get_variable("conv/kernel", shape=[5, 5, 1, 8],
                                initializer=tf.compat.v1.zeros_initializer())
    tf.compat.v1.train.get_or_create_global_step()
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      tf.compat.v1.train.Saver().save(session, str(model_dir / "model.ckpt"), global_step=7)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_checkpoint_of_the_other_backend_is_left_alone(backend, tiny_data_dir, tmp_path):
  other = "estimator" if backend == "keras" else "keras"
  _save_checkpoint(tmp_path / "model", other)
  result = _rejected(backend, [], {}, 2, f"holds a checkpoint of the {other} backend",
                     tiny_data_dir, tmp_path / "model")
  assert f"python -m trainers.{other}_main" in result.stderr
  assert f"python -m launch.convert --from_{other}=" in result.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_checkpoint_of_another_model_is_left_alone(backend, tiny_data_dir, tmp_path):
  _save_checkpoint(tmp_path / "model", backend, same_model=False)
  _rejected(backend, ["--workers=2"], {}, 2, "holds a checkpoint of a different model",
            tiny_data_dir, tmp_path / "model")


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="network namespaces: Linux")
def test_no_task_of_a_local_cluster_can_be_reached_from_outside(tiny_data_dir, tmp_path):
  """A --workers=2 run's TensorFlow servers listen in a namespace with only loopback: from
  this machine's own namespace (and so from any other host) their ports are closed."""
  model_dir = tmp_path / "model"
  config = dataclasses.replace(TINY, train_steps=100000, log_every_steps=10)
  with subprocess.Popen([sys.executable, "-m", "trainers.keras_main", "--workers=2",
                         f"--model_dir={model_dir}", *_flags(config, tiny_data_dir)],
                        cwd=REPO, env=runs.clean_env(), stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL) as launcher:
    try:
      deadline = time.monotonic() + 120
      while not runs.read_progress(str(model_dir))[1:]:  # Training: every server is up.
        assert time.monotonic() < deadline and launcher.poll() is None
        time.sleep(0.5)
      record = runs.read_tasks(runs.task_log_dir(str(model_dir)))
      tasks = record["tasks"]
      # Forked from one process that imported TensorFlow for them (launch.zygote).
      assert {int(pathlib.Path(f"/proc/{t['pid']}/stat").read_text().rsplit(")", 1)[1]
                  .split()[1]) for t in tasks} == {record["zygote"]}
      namespaces = {os.readlink(f"/proc/{t['pid']}/ns/net") for t in tasks}
      assert len(namespaces) == 1 and namespaces != {os.readlink("/proc/self/ns/net")}
      with open(f"/proc/{tasks[0]['pid']}/net/dev") as f:
        assert [line.split(":")[0].strip() for line in f.readlines()[2:]] == ["lo"]
      spec = tasks[0]["tf_config"]["cluster"]  # Each task's TF_CONFIG, as it was given.
      for address in spec["chief"] + spec["worker"]:
        with pytest.raises(ConnectionRefusedError):
          socket.create_connection(("localhost", int(address.rsplit(":", 1)[1])),
                                   timeout=5).close()
    finally:
      launcher.terminate()
      launcher.wait(60)


@pytest.mark.slow
def test_tasks_started_with_different_clusters_both_stop(tiny_data_dir, tmp_path):
  """A chief told of 2 training tasks and a worker told of 3: each names the other's cluster."""
  ports = cluster.pick_free_ports(3)
  chief_env = _tf_config("chief", 0, ports=ports)
  worker_env = _tf_config("worker", 0, chief=[f"localhost:{ports[0]}"],
                          worker=[f"localhost:{ports[1]}", f"localhost:{ports[2]}"])
  args = [f"--data_dir={tiny_data_dir}", f"--model_dir={tmp_path / 'model'}", "--train_steps=3"]
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    results = list(pool.map(lambda env: run_module("trainers.keras_main", args, env=env,
                                                    timeout=120), (chief_env, worker_env)))
  for result, peer in zip(results, ("worker:0", "chief:0")):
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"Task {peer} was started with TF_CONFIG cluster" in result.stderr


def _run_platform_tasks(backend, configs, tasks, data_dir, model_dir):
  """Runs each of `tasks` (names in `configs`, the chief's first) as a trainer with its
  TF_CONFIG, all at once, as a platform starts them; returns the chief's log."""
  args = [f"--model_dir={model_dir}", "--timeout=300", *_flags(TINY, data_dir)]

  def run(task):
    try:
      return run_module(f"trainers.{backend}_main", args, env={"TF_CONFIG": configs[task]},
                        timeout=300)
    except subprocess.TimeoutExpired as e:  # Each task's own words say where it hung.
      return subprocess.CompletedProcess(e.cmd, None, e.stdout or b"", e.stderr or b"")

  with concurrent.futures.ThreadPoolExecutor(len(tasks)) as pool:
    results = list(pool.map(run, tasks))
  for task, result in zip(tasks, results):
    said = {t: str(r.stderr)[-1500:] for t, r in zip(tasks, results)}
    assert result.returncode == 0, (task, said)
  summary = json.loads(results[0].stdout.strip().splitlines()[-1])
  assert (summary["workers"], summary["global_step"]) == (2, STEPS)
  assert evaluation.read_result(str(model_dir / "eval"), STEPS) == pytest.approx(
      summary["test_metrics"], abs=1e-5)
  return results[0].stderr


def _local_endpoints(tasks):
  ports = dict(zip(tasks, cluster.pick_free_ports(len(tasks))))
  return lambda rtype, i: f"localhost:{ports[f'{rtype}-{i}']}"


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_worker_only_cluster_with_an_evaluator_as_kubeflow_writes_it(backend, tiny_data_dir,
                                                                       tmp_path):
  """A TFJob of 2 Worker and 1 Evaluator replicas, no Chief: worker 0 is the chief, every
  task's cluster lists the evaluator, "environment": "cloud" (tensorflow_tf_config.go)."""
  tasks = ("worker-0", "worker-1", "evaluator-0")
  configs = kubeflow_tf_configs("mnist", "default", {"Worker": 2, "Evaluator": 1},
                                endpoint=_local_endpoints(tasks))
  chief_log = _run_platform_tasks(backend, configs, tasks, tiny_data_dir, tmp_path / "model")
  assert "Waiting for the evaluator's result" in chief_log


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_master_and_an_evaluator_outside_the_cluster_as_vertex_ai_writes_them(
    backend, tiny_data_dir, tmp_path):
  """Vertex AI's shape: the chief's type "master" (which MultiWorkerMirroredStrategy
  rejects), the evaluator outside `cluster` (so the chief evaluates too), extra keys."""
  tasks = ("master-0", "worker-0", "evaluator-0")
  configs = vertex_tf_configs(2, endpoint=_local_endpoints(tasks))
  chief_log = _run_platform_tasks(backend, configs, tasks, tiny_data_dir, tmp_path / "model")
  assert "Task chief:0 of 2 workers" in chief_log


@pytest.mark.slow
@pytest.mark.parametrize("backend, workers", [("keras", 1), ("estimator", 1), ("keras", 2)])
def test_a_diverging_run_stops_with_exit_3_and_saves_nothing_diverged(backend, workers,
                                                                     tiny_data_dir, tmp_path):
  """Both backends stop at the first NaN or Inf loss, the same way: exit 3, not retried
  by the launcher, and every checkpoint left is finite (the last good one is kept)."""
  model_dir = tmp_path / "model"
  config = dataclasses.replace(TINY, train_steps=30, checkpoint_every_steps=1,
                               learning_rate=1e30, data_dir=tiny_data_dir)
  result = run_module(f"trainers.{backend}_main",
                      [f"--workers={workers}", f"--model_dir={model_dir}", "--max_restarts=2",
                       "--timeout=300", *trainer_flags.config_to_flags(config)], timeout=400)
  assert result.returncode == 3, result.stderr[-3000:]
  assert "the training loss or the weights became NaN or Inf by step" in result.stderr
  # Both stop before saving the diverged step; anything saved with NaN is moved aside.
  assert "newest finite checkpoint" in result.stderr and "is kept" in result.stderr
  if workers > 1:
    assert "a diverged run is not retried" in result.stderr
  assert not (model_dir / "summary.json").exists()
  state = tf.train.get_checkpoint_state(str(model_dir))
  assert state and state.all_model_checkpoint_paths, "no checkpoint from before the divergence"
  for path in state.all_model_checkpoint_paths:
    reader = tf.train.load_checkpoint(path)
    for name, dtype in reader.get_variable_to_dtype_map().items():
      if dtype.is_floating:
        assert np.isfinite(reader.get_tensor(name)).all(), f"{path}: {name} is not finite"


def _truncate(checkpoint_path):
  for data in pathlib.Path(checkpoint_path).parent.glob(pathlib.Path(checkpoint_path).name +
                                                         ".data-*"):
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])


def _finished_six_steps(backend, tiny_data_dir, tmp_path):
  """A lone process's run of 6 steps (checkpoints at 3 and 6); its model_dir and command."""
  model_dir = tmp_path / "model"
  config = dataclasses.replace(TINY, train_steps=6, data_dir=tiny_data_dir)
  args = [f"--model_dir={model_dir}", *trainer_flags.config_to_flags(config)]
  assert run_module(f"trainers.{backend}_main", args).returncode == 0
  return model_dir, args


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_truncated_checkpoint_is_set_aside_and_the_run_resumes_from_one_that_loads(
    backend, tiny_data_dir, tmp_path):
  model_dir, args = _finished_six_steps(backend, tiny_data_dir, tmp_path)
  newest = tf.train.latest_checkpoint(str(model_dir))
  assert newest.endswith("-6")
  _truncate(newest)  # A crash or a full disk mid-save.
  # A later save cut short leaves its staging directory.
  staging = pathlib.Path(f"{newest[:-2]}-7_temp")
  staging.mkdir()
  (staging / "part-00000-of-00001.data-00000-of-00001.tempstate1").write_bytes(b"\0" * 100)
  longer = run_module(f"trainers.{backend}_main", [*args, "--train_steps=8"])
  assert longer.returncode == 0, longer.stderr[-3000:]
  assert "Set aside in" in longer.stderr and os.path.basename(newest) in longer.stderr
  assert f"{staging.name}/: a save cut short" in longer.stderr
  moved = sorted(p.name for p in (model_dir / "corrupt").iterdir())
  assert staging.name in moved and not staging.exists()
  moved.remove(staging.name)
  assert moved and all(name.startswith(os.path.basename(newest) + ".") for name in moved)
  starts = [r["from_step"] for r in runs.read_progress(str(model_dir)) if r["event"] == "start"]
  assert starts == [0, 3]  # Resumed from ckpt 3, the newest that loads.
  assert json.loads(longer.stdout.strip().splitlines()[-1])["global_step"] == 8
  # When no checkpoint loads: exit 2, naming them, and nothing moved or deleted.
  for path in checkpoints.find(str(model_dir)):  # Every one on disk, indexed or not.
    _truncate(path)
  before = _snapshot(model_dir)
  broken = run_module(f"trainers.{backend}_main", [*args, "--train_steps=10"])
  assert broken.returncode == 2, broken.stderr[-3000:]
  assert "no checkpoint in --model_dir" in broken.stderr and "Nothing was moved" in broken.stderr
  assert _snapshot(model_dir) == before


def test_a_peer_that_never_starts_is_waited_for_then_named_with_a_retried_exit(tiny_data_dir,
                                                                              tmp_path):
  ports = cluster.pick_free_ports(2)
  result = run_module("trainers.keras_main",
                      [f"--data_dir={tiny_data_dir}", f"--model_dir={tmp_path / 'model'}",
                       "--startup_timeout=3"], env=_tf_config("chief", 0, ports=ports),
                      timeout=120)
  assert result.returncode == exit_codes.STARTUP_TIMEOUT == 142, result.stderr[-3000:]
  assert exit_codes.retried(result.returncode)
  assert ("the cluster did not come up within 3 s (--startup_timeout): no task listens at "
          f"worker:0 (localhost:{ports[1]})") in result.stderr
  assert "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.estimator
def test_a_peer_that_listens_but_never_joins_is_stopped_with_the_same_exit(tiny_data_dir,
                                                                           tmp_path):
  ports = cluster.pick_free_ports(2)
  start = time.monotonic()
  # Something answers at the worker's address, but no TensorFlow task.
  with socket.create_server(("localhost", ports[1])):
    result = run_module("trainers.estimator_main",
                        [f"--data_dir={tiny_data_dir}", f"--model_dir={tmp_path / 'model'}"],
                        env=_tf_config("chief", 0, ports=ports), timeout=120)
  assert result.returncode == -signal.SIGALRM, result.stderr[-3000:]
  assert 128 + signal.SIGALRM == exit_codes.STARTUP_TIMEOUT
  assert time.monotonic() - start < 60
  assert (f"the cluster did not come up within {distribute.REGISTER_TIMEOUT_SECONDS} s of every "
          "task listening: not all joined.") in result.stderr


@pytest.mark.parametrize("backend, fork, ps", [("keras", True, 0), ("estimator", False, 0),
                                              ("estimator", True, 1)])
def test_the_launcher_starts_the_tasks_without_tensorflow(backend, fork, ps, tiny_data_dir,
                                                          tmp_path):
  # Importing TensorFlow takes the launcher 2 to 3 s before any task starts. Its tasks are
  # forked from a process that imports their modules once (--fork_tasks, the default), but
  # on parameter servers (docs/training.md, "The local cluster").
  code = f"""if True:
    import sys
    from trainers import runner
    from trainers.config import Config
    from trainers.run_options import RunOptions
    def start(*args, **kwargs):
      print("tensorflow imported:", "tensorflow" in sys.modules, kwargs["preload"])
      return 0
    sys.exit(runner.run({backend!r}, Config(data_dir={str(tiny_data_dir)!r}), RunOptions(
        workers=2, ps={ps}, model_dir={str(tmp_path / "model")!r}, relaunch=["true"],
        fork_tasks={fork!r}), start_cluster=start))"""
  result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  preload = runner.PRELOAD[backend] if fork and not ps else ()
  assert result.stdout.strip() == f"tensorflow imported: False {preload}"


@pytest.mark.parametrize("version, missing", [("2.15.1", False), ("2.15.0.post1", False),
                                              ("2.16.1", True), ("2.21.0", True)])
def test_the_estimator_needs_tensorflow_2_15(version, missing, monkeypatch):
  monkeypatch.setattr(runner.importlib.metadata, "version", lambda name: version)
  message = runner.estimator_unavailable()
  assert (message is not None) == missing
  if missing:
    assert f"this environment has TensorFlow {version}" in message
    assert 'pip install -e ".[tf215]"' in message


@pytest.mark.skipif(not ESTIMATOR_MISSING, reason="this install has tf.estimator (TF 2.15)")
@pytest.mark.parametrize("env", [{}, "tf_config"])
def test_the_estimator_on_the_newest_tensorflow_is_a_usage_error(env, tiny_data_dir, tmp_path):
  # Exit 2 at once, before any task starts or anything is written: the launcher
  # never retries it, and neither does an orchestrator (README, exit codes).
  env = _tf_config("chief", 0) if env == "tf_config" else {}
  result = _rejected("estimator", ["--workers=2"] if not env else [], env, 2,
                     "The Estimator backend needs TensorFlow 2.15", tiny_data_dir,
                     tmp_path / "model")
  assert 'pip install -e ".[tf215]"' in result.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_data_that_cannot_be_prepared_names_both_fixes(backend, tmp_path):
  # No IDX files given, and no network: every request goes to a proxy that
  # refuses connections, so the real download fails here as it would offline.
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    proxy = f"http://127.0.0.1:{s.getsockname()[1]}"
  offline = {"MNIST_IDX_DIR": None, "HTTPS_PROXY": proxy, "HTTP_PROXY": proxy,
             "https_proxy": proxy, "http_proxy": proxy, "NO_PROXY": None, "no_proxy": None}
  result = run_module(f"trainers.{backend}_main", [f"--data_dir={tmp_path}", "--workers=2",
                                                   f"--model_dir={tmp_path / 'model'}"],
                      timeout=120, env=offline)
  assert result.returncode == 1, result.stderr[-3000:]
  for part in ("error: MNIST is not prepared", "Tried: cannot reach",
               "https://storage.googleapis.com/cvdf-datasets/mnist/", "--mnist_idx_dir=DIR",
               "$MNIST_IDX_DIR=DIR", "python -m data.prepare --idx_dir=DIR"):
    assert part in result.stderr, result.stderr[-3000:]
  assert os.listdir(tmp_path) == []  # No task ever started, and the lock is gone.


@pytest.mark.real_data
@pytest.mark.parametrize("backend", BACKENDS)
def test_real_mnist_two_workers_reach_98_percent(backend, real_data_dir, tmp_path):
  """The README's quick start for Keras: no data step; the launcher prepares MNIST from
  $MNIST_IDX_DIR into an empty TFDS directory before any task starts."""
  if backend == "keras":
    data_dir, env = tmp_path / "tfds", {"TFDS_DATA_DIR": str(tmp_path / "tfds"),
                                        "MNIST_IDX_DIR": str(SHARED_IDX_DIR)}
  else:
    data_dir, env = pathlib.Path(real_data_dir), {"TFDS_DATA_DIR": real_data_dir}
  model_dir = tmp_path / "model"
  result = run_module(f"trainers.{backend}_main",
                      ["--workers=2", f"--model_dir={model_dir}", "--timeout=900"],
                      timeout=1000, env=env)
  assert result.returncode == 0, result.stderr[-5000:]
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  print(json.dumps(summary))
  # A good run looks good: no warning or error on the terminal (the task logs keep
  # TensorFlow's), no task's heartbeat lost at the end, and the summary the last line.
  alarming = [line for line in result.stderr.splitlines() if re.match(
      r"(\[\w+:\d+\] )?[WE]\d{4} |\d{4}-\d\d-\d\d [\d:.]+: [WE] |\S+\.py:\d+: \w*Warning",
      line)]
  assert not alarming, alarming
  assert summary["global_step"] == Config().train_steps
  assert summary["test_accuracy"] >= 0.98
  assert store.is_prepared(str(data_dir))
  if backend == "keras":  # Prepared once, by the launcher: no task logs a preparation.
    assert result.stderr.count("Preparing MNIST") == 1, result.stderr[-5000:]
    for log in (model_dir / "logs").glob("*.log"):
      assert "Preparing MNIST" not in log.read_text(), log


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_second_run_on_a_busy_model_dir_is_refused_naming_the_first(backend, tiny_data_dir,
                                                                       tmp_path):
  model_dir = tmp_path / "model"
  model_dir.mkdir()
  lock = run_lock.acquire(str(model_dir))  # This process: the first run.
  try:
    result = _rejected(backend, ["--workers=2"], {}, 2, f"is in use by the run of pid "
                       f"{os.getpid()}", tiny_data_dir, model_dir)
  finally:
    lock.release()
  assert "Nothing was changed" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_missing_checkpoint_index_resumes_from_the_newest_checkpoint_on_disk(
    backend, tiny_data_dir, tmp_path):
  model_dir, args = _finished_six_steps(backend, tiny_data_dir, tmp_path)
  (model_dir / "checkpoint").unlink()
  longer = run_module(f"trainers.{backend}_main", [*args, "--train_steps=8"])
  assert longer.returncode == 0, longer.stderr[-3000:]
  assert "was missing; rewritten from the checkpoints on disk" in longer.stderr
  starts = [r["from_step"] for r in runs.read_progress(str(model_dir)) if r["event"] == "start"]
  assert starts == [0, 6]  # Not 0: nothing of the first run was overwritten.
  assert json.loads(longer.stdout.strip().splitlines()[-1])["global_step"] == 8


@pytest.mark.slow
def test_a_resume_with_other_settings_is_refused_unless_the_change_is_allowed(tiny_data_dir,
                                                                              tmp_path):
  model_dir, args = _finished_six_steps("keras", tiny_data_dir, tmp_path)
  changed = [*args, "--train_steps=8", "--learning_rate=0.05", "--seed=2"]
  result = _rejected("keras", changed[1:], {}, 2, "holds a run trained with other settings",
                     tiny_data_dir, model_dir)
  assert "--learning_rate: 0.1 in the run, 0.05 now" in result.stderr
  assert "--seed: 1 in the run, 2 now" in result.stderr and "Traceback" not in result.stderr

  allowed = run_module("trainers.keras_main", [*changed, "--allow_config_change"])
  assert allowed.returncode == 0, allowed.stderr[-3000:]
  assert "Resuming with a change: --learning_rate: 0.1 in the run, 0.05 now." in allowed.stderr
  [change] = [r for r in runs.read_progress(str(model_dir)) if r["event"] == "config_change"]
  assert "--seed: 1 in the run, 2 now" in change["changes"]
  assert json.loads(allowed.stdout.strip().splitlines()[-1])["global_step"] == 8
  # A resume needs no flags: those left out are the record's, the new rate and seed too.
  again = run_module("trainers.keras_main", [f"--model_dir={model_dir}", "--train_steps=10",
                                             f"--data_dir={tiny_data_dir}"])
  assert again.returncode == 0, again.stderr[-3000:]
  said = next(line for line in again.stderr.splitlines() if "Resuming with the settings" in line)
  assert "--global_batch_size=32 --learning_rate=0.05" in said and "--seed=2" in said, said
  assert json.loads(again.stdout.strip().splitlines()[-1])["global_step"] == 10
  assert run_record.read(str(model_dir))["learning_rate"] == 0.05


def test_a_resume_at_or_below_the_interrupted_runs_backup_step_is_refused(tiny_data_dir,
                                                                          tmp_path):
  model_dir = tmp_path / "model"
  model = keras_trainer.compile_model(TINY)
  model.optimizer.iterations.assign(8)  # An interrupted run's backup at step 8.
  tf.train.CheckpointManager(tf.train.Checkpoint(model=model),
                             str(model_dir / "backup" / "chief"), 1).save()
  _rejected("keras", ["--train_steps=6"], {}, 2, "holds an interrupted run at step 8",
            tiny_data_dir, model_dir)
