"""A team's own Estimator program (docs/examples/team_estimator.py, named by team_program.py)
trained by the project as it is, and its Keras port (team_port.py) held to it by
launch.parity, run as a user runs them; each bad input exits 2 naming the fix.

docs/MIGRATION.md, "Prove your port", cites these tests.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO, checkpoint_values, run_module

EXAMPLES = REPO / "docs" / "examples"
PORT_FLAGS = ["--estimator_program=team_program:PROGRAM", "--model=team_port:SPEC",
              f"--assignment_map={EXAMPLES / 'team_map.json'}", "--optimizer=adam",
              "--learning_rate=1e-4", "--learning_rate_schedule=constant"]

pytestmark = [pytest.mark.estimator, pytest.mark.real_data]


def _env(data_dir: str, *paths: pathlib.Path) -> dict:
  """The team's input_fn reads TFDS's default directory, $TFDS_DATA_DIR."""
  return {"TFDS_DATA_DIR": data_dir,
          "PYTHONPATH": os.pathsep.join(map(str, (EXAMPLES, *paths)))}


def _error(result) -> str:
  """What a refused run said: one line, no traceback."""
  assert result.returncode == 2, result.stdout + result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  return result.stderr


def test_the_estimator_trains_the_teams_program_as_it_is(real_data_dir, tmp_path):
  model_dir = tmp_path / "team"
  args = ["--estimator_program=team_program:PROGRAM", f"--model_dir={model_dir}",
          "--train_steps=20", "--checkpoint_every_steps=10", "--log_every_steps=10",
          f"--data_dir={real_data_dir}"]
  result = run_module("trainers.estimator_main", args, env=_env(real_data_dir))
  assert result.returncode == 0, result.stderr[-3000:]
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  # Their eval_metric_ops, every one, and their export through their receiver.
  assert sorted(summary["test_metrics"]) == ["accuracy", "auc_pr", "loss",
                                             "mean_per_class_accuracy", "mean_true_probability",
                                             "precision_at_3"]
  assert summary["test_accuracy"] == summary["test_metrics"]["accuracy"] > 0.2
  assert (pathlib.Path(summary["export_dir"]) / "saved_model.pb").exists()
  record = json.loads((model_dir / "run.json").read_text())
  assert (record["estimator_program"], record["optimizer"]) == ("team_program:PROGRAM",
                                                                "program")
  # Their run config's retention, and a resume of their checkpoint by name.
  resumed = run_module("trainers.estimator_main", [*args[:2], "--train_steps=30", *args[3:]],
                       env=_env(real_data_dir))
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert json.loads(resumed.stdout.strip().splitlines()[-1])["global_step"] == 30
  assert "Training from step 20 to 30" in resumed.stderr
  _warm_start_from_the_programs_model_dir(str(model_dir), real_data_dir, tmp_path)


def _warm_start_from_the_programs_model_dir(model_dir: str, data_dir: str, tmp_path) -> None:
  """A new run of the program (by its names) and of its port (through the map of their
  names, turned round: WarmStartSettings maps the new name to the old) start from it."""
  import numpy as np
  from trainers import checkpoints
  source = checkpoint_values(checkpoints.newest(model_dir))
  names = json.loads((EXAMPLES / "team_map.json").read_text())
  (tmp_path / "warm_map.json").write_text(json.dumps({new: old for old, new in names.items()}))
  for backend, flags, started in (
      ("estimator", [PORT_FLAGS[0]], {old: old for old in names}),
      ("keras", [*PORT_FLAGS[:2], *PORT_FLAGS[3:],
                 f"--warm_start_map={tmp_path / 'warm_map.json'}"],
       {new: old for old, new in names.items()})):
    warm = tmp_path / f"warm_{backend}"
    result = run_module(f"trainers.{backend}_main", [
        *flags, f"--model_dir={warm}", "--train_steps=2", f"--data_dir={data_dir}",
        f"--warm_start_from={model_dir}"], env=_env(data_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    first = checkpoint_values(checkpoints.find(str(warm))[0])  # Step 0, which both backends save.
    for name, old in started.items():
      np.testing.assert_array_equal(first[name], source[old], err_msg=f"{backend}: {name}")


@pytest.mark.slow
def test_one_migrate_command_proves_the_example_and_says_switch(real_data_dir, tmp_path):
  # launch.migrate runs parity, the serving check of their export and the handoff as a team
  # would run each; their reports are checked here as the tools wrote them. Their export:
  # their program trained a little, as their own launcher would.
  theirs, out = tmp_path / "theirs", tmp_path / "migration"
  trained = run_module("trainers.estimator_main", [
      "--estimator_program=team_program:PROGRAM", "--train_steps=2",
      "--checkpoint_every_steps=2", f"--model_dir={theirs}", f"--data_dir={real_data_dir}"],
      env=_env(real_data_dir))
  assert trained.returncode == 0, trained.stderr[-3000:]
  export = json.loads(trained.stdout.strip().splitlines()[-1])["export_dir"]
  before = _listing(theirs)
  result = run_module("launch.migrate", ["--workers=1", *PORT_FLAGS, "--long_steps=20",
                                         f"--model_dir={theirs}",
                                         f"--export_dir={export}",
                                         f"--data_dir={real_data_dir}", f"--out={out}"],
                      env=_env(real_data_dir), timeout=1200)
  assert result.returncode == 0, result.stdout + result.stderr[-3000:]
  said = result.stdout.splitlines()
  assert [line.split(":")[0] for line in said if line.startswith("[")] == (
      ["[1/4] inspect"] * 2 + ["[2/4] parity"] * 2 + ["[3/4] serving"] * 2
      + ["[4/4] handoff"] * 2)
  assert "    parity: Training short/keras: keras, 1 worker(s), to step 10." in said
  # Each long step's progress bar, one run longer after each run its tool finished.
  for step, runs in (("parity", 4), ("handoff", 3)):
    bars = [line.split("] ")[1].split(" runs")[0] for line in said
            if line.startswith(f"    {step}: [#")]
    assert bars == [f"{done}/{runs}" for done in range(1, runs + 1)], (step, said)
  assert [line for line in said if line.startswith("[")][3].startswith("[2/4] parity: PASS (")
  assert said[-2:] == ["Verdict: switch", f"Report: {out}/migration_report.html, "
                       "migration_report.md, migration_report.json"]
  page = (out / "migration_report.html").read_text()
  assert "<h1>Migration check: <span class=switch>switch</span></h1>" in page
  # The map given, each name the inspection of their model_dir guessed by shape marked.
  assert ("<tr class=fail><td>sequential/conv2d/kernel</td><td>conv/kernel</td><td>by shape: "
          "a guess to review</td></tr>") in page
  # Parity's and the handoff's plots, inline (the serving check draws none).
  assert page.count("<img alt='loss_curves.png' src='data:image/png;base64,") == 2
  migrated = json.loads((out / "migration_report.json").read_text())
  assert (migrated["verdict"], migrated["why"]) == ("switch", [])
  assert [(s["step"], s["passed"], s["exit_code"]) for s in migrated["steps"]] == [
      ("inspect", True, 0), ("parity", True, 0), ("serving", True, 0), ("handoff", True, 0)]
  assert (out / "migration_report.md").read_text().startswith(
      "# Migration check: **switch**")
  report = json.loads((out / "parity" / "parity_report.json").read_text())
  checks = {c["name"]: c for c in report["checks"]}
  assert checks["max |weight diff| keras vs estimator"]["measured"] <= 1e-6
  assert checks["names: every program variable mapped, every port weight given one"][
      "where"].startswith("sequential/conv2d/bias -> conv/bias")
  assert "adam (beta1=0.9, beta2=0.999, epsilon=1e-08); rate 1e-04" in checks[
      "recipe: optimizer, hyperparameters and rate, program vs port"]["where"]
  # Their export, through their receiver, against the port's own signatures.
  assert checks["signature serving_default: method, inputs and outputs, estimator vs keras"][
      "where"] == ("predict: pixels float32 [-1, 28, 28, 1] -> classes int64 [-1], "
                   "probabilities float32 [-1, 10]")
  assert checks["signatures fed the test split, estimator export"]["where"] == (
      "serving_default: 10000 examples")
  assert checks["images answered differently, answers serving_default/classes, estimator vs "
                "keras"]["passed"]
  assert [n.split(":")[0] for n in report["notes"]] == ["Shards"]
  # Each of their eval_metric_ops against the port's declared metric of its name.
  for key in ("auc_pr", "mean_per_class_accuracy", "mean_true_probability", "precision_at_3"):
    assert checks[f"eval {key}, Estimator evaluator vs Keras evaluate"]["passed"], key
  assert checks["eval per checkpoint, keras vs estimator"]["where"].startswith(
      "6 metrics (accuracy, auc_pr, loss, mean_per_class_accuracy, mean_true_probability, "
      "precision_at_3)")
  # Their hook ran as the Estimator runs it; its StepHook counts the same steps and reads
  # the same losses in both backends.
  short = out / "parity" / "short"
  logs = {name: [json.loads(line) for line in (short / backend / "model" / file)
                 .read_text().splitlines()]
          for name, backend, file in (("their hook", "estimator", "team_hook.jsonl"),
                                      ("estimator", "estimator", "loss_log.jsonl"),
                                      ("keras", "keras", "loss_log.jsonl"))}
  for name, log in logs.items():
    assert [r["step"] for r in log] == list(range(1, 11)), name
    assert [r["loss"] for r in log] == pytest.approx([r["loss"] for r in logs["their hook"]],
                                                     rel=1e-5), name
  # Their export against the port's, through their receiver and the port's signatures.
  served = json.loads((out / "serving" / "serving_check_report.json").read_text())
  checks = {c["name"]: c for c in served["checks"]}
  assert checks["signatures fed the test split, first export"]["where"] == (
      "serving_default: 10000 examples"), checks
  # The handoff from their newest checkpoint (step 2), to the port's and back; their
  # model_dir only read.
  report = json.loads((out / "handoff" / "handoff_report.json").read_text())
  checks = {c["name"]: c for c in report["checks"]}
  assert (report["split_at"], report["train_steps"]) == (2, 12)
  assert checks["1w: every Estimator variable mapped or ignored"]["measured"] == 21
  assert checks["1w: the checkpoint converted to Keras and back, max |value diff|"][
      "where"] == "21 variables"
  for leg in ("estimator-then-keras", "keras-then-estimator"):
    assert checks[f"1w {leg}: resumed from the split"]["measured"] == 2
    assert checks[f"1w estimator-then-estimator vs {leg}: max |weight diff| "
                  f"estimator-then-estimator vs {leg}"]["measured"] <= 1e-6
  assert any(name.startswith("1w: max |diff|, answers serving_default/probabilities, "
                             "program vs converted Keras") for name in checks)
  assert _listing(theirs) == before


def _listing(directory: pathlib.Path) -> dict:
  """Each file under `directory`, with its size and modification time."""
  return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
          for p in directory.rglob("*") if p.is_file()}


def test_sigterm_stops_the_running_step_and_its_runs_and_the_report_says_so(real_data_dir,
                                                                             tmp_path):
  env = {**os.environ, **_env(real_data_dir), "SIGTERM_TEST_MARK": str(tmp_path)}
  env["PYTHONPATH"] = os.pathsep.join([str(REPO), env["PYTHONPATH"]])
  out = tmp_path / "out"
  process = subprocess.Popen([sys.executable, "-m", "launch.migrate", "--workers=1", *PORT_FLAGS,
                              f"--data_dir={real_data_dir}", f"--out={out}"], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  for line in process.stdout:  # Once parity's first run trains.
    if "parity: Training short/keras" in line:
      break
  process.send_signal(signal.SIGTERM)
  said = process.communicate(timeout=120)[0]
  assert process.returncode == 143, said
  assert "[1/2] parity: FAIL (0 checks" in said and "stopped by SIGTERM" in said
  migrated = json.loads((out / "migration_report.json").read_text())
  assert migrated["why"] == ["parity: stopped by SIGTERM before it finished",
                             "handoff: not run (a step before it failed)"]
  # Parity and its runs (forked ones too, whose command line is their zygote's) stopped
  # with the migration: no process is left with its environment.
  assert _pids_with_environ(f"SIGTERM_TEST_MARK={tmp_path}") == []


def _pids_with_environ(entry: str) -> list:
  pids = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/environ", "rb") as f:
        if entry.encode() in f.read().split(b"\0"):
          pids.append(int(pid))
    except OSError:  # Ended meanwhile, or not ours to read.
      pass
  return pids


COLUMNS_FLAGS = ["--estimator_program=columns_program:PROGRAM", "--model=columns_port:SPEC",
                 "--optimizer=adagrad", "--learning_rate=0.05",
                 "--learning_rate_schedule=constant"]


@pytest.mark.slow
def test_a_model_fn_over_feature_columns_passes_parity_and_two_workers_train_the_port(
    real_data_dir, tmp_path):
  # Their own model_fn over tf.Examples: input_layer and linear_model over buckets, a
  # vocabulary, a hash bucket, a cross, weighted strings, an indicator and two embeddings;
  # the port's column twins name their weights as the columns do, so no map is given.
  env, data = _env(real_data_dir), f"--data_dir={real_data_dir}"
  result = run_module("launch.parity", ["--workers=1", *COLUMNS_FLAGS, "--train_steps=10",
                                        "--long_steps=0", data, f"--out={tmp_path / 'parity'}"],
                      env=env)
  assert result.returncode == 0, result.stdout + result.stderr[-3000:]
  report = json.loads((tmp_path / "parity" / "parity_report.json").read_text())
  checks = {c["name"]: c for c in report["checks"]}
  assert checks["max |weight diff| keras vs estimator"]["measured"] <= 1e-6
  assert checks["variable mapping"]["measured"] == 11
  assert checks["names: every program variable mapped, every port weight given one"][
      "where"] == "the same names"
  # Their parsing receiver fed the test split's tf.Examples, strings and lists too.
  assert checks["signature serving_default: method, inputs and outputs, estimator vs keras"][
      "where"].startswith("predict: examples string [-1] -> classes int64 [-1]")
  assert checks["signatures fed the test split, estimator export"]["where"] == (
      "serving_default: 10000 examples")
  assert checks["max |diff|, answers serving_default/probabilities, estimator vs keras"][
      "passed"]
  # At two workers the Estimator cannot all-reduce its rows (tensorflow#24003): refused
  # before training, naming the variables; the port trains there.
  said = _error(run_module("trainers.estimator_main", [
      "--estimator_program=columns_program:PROGRAM", "--workers=2", "--train_steps=4",
      f"--model_dir={tmp_path / 'estimator'}", data], env=env))
  assert ("its train op updates input_layer/grid_embedding/embedding_weights, "
          "input_layer/strokes_embedding/embedding_weights, linear_model/"
          "center_col_bucketized_X_quadrant/weights and 3 more by rows") in said
  assert "tensorflow#24003" in said and "--workers=1" in said
  assert not list((tmp_path / "estimator").glob("model.ckpt*"))
  keras = run_module("trainers.keras_main", [
      *COLUMNS_FLAGS[:2], "--workers=2", "--train_steps=4", "--checkpoint_every_steps=4",
      f"--model_dir={tmp_path / 'keras'}", data], env=env)
  assert keras.returncode == 0, keras.stderr[-3000:]
  assert json.loads(keras.stdout.strip().splitlines()[-1])["global_step"] == 4


def test_a_model_dir_their_own_launcher_wrote_converts_and_the_port_resumes_it(
    real_data_dir, tmp_path):
  env = _env(real_data_dir)
  theirs, ported = tmp_path / "theirs", tmp_path / "ported"
  trained = run_module("launch.local", ["--workers=1", "--", sys.executable,
                                        str(EXAMPLES / "team_estimator.py"),
                                        f"--model_dir={theirs}", "--train_steps=20"], env=env)
  assert trained.returncode == 0, trained.stderr[-3000:]
  program = [f for f in PORT_FLAGS if f.startswith(("--estimator_program", "--model="))]
  # The optimizer and its settings from the program's update ops: no recipe flags.
  converted = run_module("launch.convert", [f"--from_estimator={theirs}",
                                            f"--to_keras={ported}", *program,
                                            f"--assignment_map={EXAMPLES / 'team_map.json'}"],
                         env=env)
  assert converted.returncode == 0, converted.stderr[-3000:]
  assert converted.stdout.strip().endswith(f"Output directory: {ported}")
  assert f"{ported}/ckpt-20" in converted.stdout
  resumed = run_module("trainers.keras_main", [*PORT_FLAGS[:2], *PORT_FLAGS[3:],
                                               f"--model_dir={ported}", "--train_steps=30",
                                               f"--data_dir={real_data_dir}"], env=env)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "Training from step 20 to 30" in resumed.stderr
  # Another program's model_dir is refused, naming what its variables lack.
  refused = run_module("launch.convert", [f"--from_estimator={theirs}",
                                          f"--to_keras={tmp_path / 'other'}",
                                          "--estimator_program=legacy_program:PROGRAM",
                                          "--model=my_model:SPEC"], env=env)
  said = _error(refused)
  assert "it has no variable legacy/" in said and not (tmp_path / "other").exists()


NEWEST_TF_PYTHON = os.environ.get("NEWEST_TF_PYTHON")


@pytest.mark.slow
@pytest.mark.skipif(not NEWEST_TF_PYTHON, reason="needs $NEWEST_TF_PYTHON, the python of a "
                    "`pip install -e \".[tf221]\"` virtualenv (CI sets it)")
def test_the_port_on_the_newest_tf_trains_as_the_program_on_2_15(real_data_dir, tmp_path):
  landing = ["--estimator_program=team_landing:PROGRAM", *PORT_FLAGS[1:]]
  flags = [f"--keras_python={NEWEST_TF_PYTHON}", "--workers=1", "--train_steps=3",
           f"--data_dir={real_data_dir}"]
  # The example as it is: its module needs tf.estimator as it is imported.
  refused = run_module("launch.version_parity", [*flags, *PORT_FLAGS,
                                                 f"--out={tmp_path / 'refused'}"],
                       env=_env(real_data_dir))
  assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
  assert ("--estimator_program=team_program:PROGRAM does not load in TensorFlow 2.21"
          in refused.stderr and "module 'tensorflow' has no attribute 'estimator'"
          in refused.stderr and "Landing on TF 2.16+" in refused.stderr), refused.stderr
  assert not (tmp_path / "refused").exists()
  # Its parts moved as team_landing.py moves them.
  out = tmp_path / "out"
  result = run_module("launch.version_parity", [*flags, *landing, f"--out={out}"],
                      env=_env(real_data_dir), timeout=900)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  report = json.loads((out / "version_parity_report.json").read_text())
  checks = {c["name"]: c for c in report["checks"]}
  assert report["program"] == "team_landing:PROGRAM" and len(checks) == 15
  assert checks["max |weight diff| keras@new vs estimator@2.15 at 1 worker(s)"][
      "measured"] <= 1e-6
  for version in ("TF 2.15.1", "the newest TF"):
    assert checks[f"signatures fed the test split, estimator@2.15 export, served by {version}"][
        "where"] == "10000 examples"
    assert checks[f"max |diff|, answers serving_default/probabilities, estimator@2.15 vs "
                  f"keras@new, served by {version}"]["passed"]


@pytest.mark.slow
def test_a_port_with_another_activation_is_told_not_to_switch_yet(real_data_dir, tmp_path):
  (tmp_path / "tanh_port.py").write_text(
      "import tf_keras\nimport team_port\nfrom trainers.model import ModelSpec\n\n"
      "def build(seed, init, dropout=0.3):\n"
      "  model = team_port.build(seed, init, dropout)\n"
      "  model.get_layer('hidden').activation = tf_keras.activations.tanh\n"
      "  return model\n\n"
      "SPEC = ModelSpec('tanh_port', build, {'dropout': 0.3}, "
      "deterministic_options={'dropout': 0.0}, signatures=team_port.signatures)\n")
  flags = [f if not f.startswith("--model=") else "--model=tanh_port:SPEC" for f in PORT_FLAGS]
  out = tmp_path / "out"
  # No long run: the short one tells the port apart.
  result = run_module("launch.migrate", ["--workers=1", *flags, "--train_steps=3",
                                         "--long_steps=0",
                                         f"--data_dir={real_data_dir}", f"--out={out}"],
                      env=_env(real_data_dir, tmp_path), timeout=1200)
  assert result.returncode == 1, result.stdout + result.stderr[-3000:]
  migrated = json.loads((out / "migration_report.json").read_text())
  assert migrated["verdict"] == "do not switch yet"
  assert migrated["why"][0].startswith("parity: ") and "max |weight diff|" in migrated["why"][0]
  assert migrated["why"][1:] == ["handoff: not run (a step before it failed)"]
  assert not (out / "handoff").exists()
  report = json.loads((out / "parity" / "parity_report.json").read_text())
  failed = {c["name"] for c in report["checks"] if not c["passed"]}
  assert {"max |weight diff| keras vs estimator", "max |weight diff| reference vs estimator",
          "per-step loss rel diff keras vs estimator"} <= failed, failed
  assert "max |weight diff| reference vs keras" not in failed  # The port is what differs.


BROKEN_PROGRAM = '''
import tensorflow as tf
import team_estimator
from trainers.program import EstimatorProgram, StepHook


def model_fn(features, labels, mode, params):
  return team_estimator.model_fn({"pixels": features["pixel"]}, labels, mode, params)


PROGRAM = EstimatorProgram(model_fn, team_estimator.PARAMS, team_estimator.input_fn)


class Exploding(tf.estimator.SessionRunHook):
  def after_run(self, run_context, run_values):
    raise RuntimeError("no disk for the log")


def with_hook(features, labels, mode, params, config):
  spec = team_estimator.model_fn(features, labels, mode, params, config)
  return spec._replace(training_hooks=[Exploding()]) if mode == "train" else spec


class ExplodingStep(StepHook):
  def after_step(self, step, loss):
    raise ValueError(f"step {step}")


HOOK = EstimatorProgram(with_hook, team_estimator.PARAMS, team_estimator.input_fn)
STEP_HOOK = EstimatorProgram(team_estimator.model_fn, team_estimator.PARAMS,
                             team_estimator.input_fn, step_hooks=(ExplodingStep,))
'''


def test_each_bad_input_exits_2_naming_the_fix_and_writes_nothing(real_data_dir, tmp_path):
  (tmp_path / "broken_program.py").write_text(BROKEN_PROGRAM)
  env = _env(real_data_dir, tmp_path)
  model_dir, out = tmp_path / "model", tmp_path / "out"
  data = f"--data_dir={real_data_dir}"
  # Each message is held in process (test_program.py, test_program_probe.py); here, that a
  # binary exits 2 with it, once for each kind of fault: one process each is CI's cost.
  said = _error(run_module("trainers.estimator_main", [
      "--estimator_program=broken_program:PROGRAM", f"--model_dir={model_dir}", data], env=env))
  line = BROKEN_PROGRAM.splitlines().index(
      '  return team_estimator.model_fn({"pixels": features["pixel"]}, labels, mode, params)') + 1
  assert ("--estimator_program=broken_program:PROGRAM: its model_fn built the train graph and "
          f"failed: KeyError: 'pixel' (at {tmp_path / 'broken_program.py'}:{line}, in "
          "model_fn). Fix it there") in said
  said = _error(run_module("trainers.keras_main", [
      "--estimator_program=team_program:PROGRAM", "--model=cnn", f"--model_dir={model_dir}",
      data], env=env))
  assert ("its input_fn gives features {'pixels': (100, 28, 28, 1)}, which --model=cnn does "
          "not take: its inputs are {'image': (None, 28, 28, 1)}") in said
  parity = ["--workers=1", f"--out={out}", data]
  said = _error(run_module("launch.parity", [
      *parity, *[f for f in PORT_FLAGS if not f.startswith("--assignment_map")]], env=env))
  assert "6 variable(s) map to no model weight" in said and '"sequential/conv2d/kernel": ' \
      '"conv/kernel"' in said
  assert not model_dir.exists() and not out.exists()
  # Hooks that raise, once training has started: named, exit 2; what was saved stays.
  said = _error(run_module("trainers.estimator_main", [
      "--estimator_program=broken_program:HOOK", f"--model_dir={tmp_path / 'hook'}", data],
      env=env))
  assert ("its hook Exploding.after_run ran and failed: RuntimeError: no disk for the log (at "
          + str(tmp_path / "broken_program.py")) in said
  # A metric its eval_metric_ops do not have, found at its first evaluation.
  said = _error(run_module("trainers.estimator_main", [
      "--estimator_program=team_program:PROGRAM", "--export=best", "--export_metric=auc",
      "--train_steps=2", "--checkpoint_every_steps=2", f"--model_dir={tmp_path / 'metric'}",
      data], env=env))
  assert ("--export_metric=auc: the evaluation of step 2 has no such metric; it has "
          "accuracy, auc_pr, loss,") in said
  # Keras calls it after each execution: of 10 steps here (--steps_per_execution's auto).
  for backend, flags, step in (("estimator", [], 1), ("keras", ["--model=team_port:SPEC"], 10)):
    said = _error(run_module(f"trainers.{backend}_main", [
        "--estimator_program=broken_program:STEP_HOOK", *flags,
        f"--model_dir={tmp_path / backend}", data], env=env))
    assert ("--estimator_program=broken_program:STEP_HOOK: its step hook "
            f"ExplodingStep.after_step failed: ValueError: step {step}.") in said, backend


@pytest.mark.extended  # The same proof for a tf.compat.v1.layers program that reads params.
@pytest.mark.slow
def test_parity_passes_for_a_v1_layers_program_reading_params(real_data_dir, tmp_path):
  result = run_module("launch.parity", [
      "--workers=1", "--estimator_program=legacy_program:PROGRAM", "--model=my_model:SPEC",
      "--optimizer=momentum", "--learning_rate=0.05", "--decay_steps=2000", "--long_steps=20",
      f"--data_dir={real_data_dir}", f"--out={tmp_path}"], env=_env(real_data_dir))
  assert result.returncode == 0, result.stdout + result.stderr[-3000:]
