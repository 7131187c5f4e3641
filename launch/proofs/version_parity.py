"""Keras on the newest TensorFlow against the Estimator on TF 2.15.1: same init, same batches.

This process is the TF 2.15.1 install (the Estimator's); the Keras runs of the
newest TF go through another install's interpreter, `keras_python`. Each
SavedModel is also loaded and served by the other version.

With a team's program (config.estimator_program, probed by program_probe) the Estimator
trains their model_fn and Keras, in both versions, the port on their input_fn, from the
port's initial weights (the program's under its names); the two exports, of the program's
own signatures, are fed the test split's features in each version. Keras reads the
program's input_fn in the newest TF, so the program's module must import there (no
`tf.estimator` as it is imported): `program_imports` says so first, naming the fix.
"""

import dataclasses
import json
import os
import pickle
import re
import subprocess
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from launch.proofs import harness
from launch.proofs import runs
from launch.proofs import serving_check
from trainers import serving
from trainers.config import Config

if TYPE_CHECKING:  # It imports tf.estimator; the probes import this module in the newest TF.
  from launch.proofs import program_probe

# The runs compared, each as (backend, which install).
NEW_KERAS, OLD_KERAS, OLD_ESTIMATOR = "keras@new", "keras@2.15", "estimator@2.15"
LOGITS_ATOL = 1e-5
# Runs in the other install: loads a SavedModel, writes its answers and weights.
_PROBE = ("import sys; from launch.proofs import version_parity as v; "
          "v.probe_export(*sys.argv[1:])")
_PROBE_PROGRAM = ("import sys; from launch.proofs import version_parity as v; "
                  "v.probe_program_export(*sys.argv[1:])")


@dataclasses.dataclass(frozen=True)
class Tolerances:
  weight_atol: float = 1e-6
  loss_rtol: float = 1e-5
  logits_atol: float = LOGITS_ATOL


@dataclasses.dataclass
class Report:
  versions: Dict[str, str]  # "new", "2.15": "TensorFlow x, tf-keras y"
  workers: List[int]
  steps: int
  checks: List[harness.Check]
  losses: Dict[str, List[float]]  # "2w/keras@new", ...
  program: str = ""  # A team's program the Estimator ran (--estimator_program), or "".

  @property
  def passed(self) -> bool:
    return all(c.passed for c in self.checks)


def stack_versions(python: str) -> str:
  """'TensorFlow X, tf-keras Y' of the install `python` belongs to.

  Raises:
    runs.RunError: that interpreter cannot import TensorFlow and tf_keras.
  """
  code = ("from importlib import metadata as m; "
          "print(f\"TensorFlow {m.version('tensorflow')}, tf-keras {m.version('tf-keras')}\")")
  try:
    result = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False,
                            env=runs.clean_env())
    error = result.stderr.strip()[-500:] if result.returncode else None
  except OSError as e:
    error = str(e)
  if error:
    raise runs.RunError(f"{python} cannot report its TensorFlow and tf-keras versions (is it "
                        f"the python of a `pip install -e \".[tf221]\"` virtualenv?): {error}")
  return result.stdout.strip()


def probe_export(export_dir: str, images_path: str, feature: str, out_path: str) -> None:
  """Writes what an export answers a client's requests for `images_path` and its bad
  requests (launch/proofs/serving_check.py), and (a Keras export's) every weight."""
  images = np.load(images_path)
  loaded = tf.saved_model.load(export_dir)
  answers = serving_check.answers(
      loaded, (images[i:i + 1000] for i in range(0, len(images), 1000)), feature)
  errors = serving_check.bad_request_errors(loaded, feature)
  weights = harness.export_weights(loaded) if hasattr(loaded, "variables") else {}
  np.savez(out_path, **{f"answer:{k}": v for k, v in answers.items()},
           **{f"error:{k}": np.array(v) for k, v in errors.items()},
           **{f"weight:{k}": v for k, v in weights.items()})


def probe_program_export(export_dir: str, features_path: str, out_path: str) -> None:
  """Writes what an export of a team's program's signatures answers the pickled batches of
  features at `features_path` (serving_check.export_answers), the signatures those could
  not feed (`out_path`.json) and every weight (a Keras export's)."""
  with open(features_path, "rb") as f:
    batches = pickle.load(f)
  loaded = tf.saved_model.load(export_dir)
  answers, unfed = serving_check.export_answers(loaded, batches)
  weights = harness.export_weights(loaded) if hasattr(loaded, "variables") else {}
  np.savez(out_path, **{f"answer:{k}": v for k, v in answers.items()},
           **{f"weight:{k}": v for k, v in weights.items()})
  with open(out_path + ".json", "w") as f:
    json.dump(unfed, f)


def program_imports(python: str, name: str) -> None:
  """Raises runs.RunError, naming the fix, if the install of `python` cannot load the team's
  program `name` (Keras reads its input_fn there)."""
  code = "import sys; from trainers import program; program.load(sys.argv[1])"
  result = subprocess.run([python, "-c", code, name], capture_output=True, text=True,
                          check=False, env=runs.clean_env())
  if result.returncode != 0:
    said = (result.stderr.strip().splitlines() or ["(nothing)"])[-1]
    said = re.sub(r"^[\w.]+Error: ", "", said).rstrip(".")  # Its message, not its class.
    raise runs.RunError(
        f"--estimator_program={name} does not load in {stack_versions(python)}, where Keras "
        f"reads its input_fn: {said}. tf.estimator is gone there: give the program an input_fn "
        "(and step_hooks) from a module that does not use tf.estimator as it is imported or "
        "called by Keras (docs/MIGRATION.md, \"Landing on TF 2.16+\").")


def _read_probe(probe: Dict[str, np.ndarray], kind: str) -> Dict[str, np.ndarray]:
  """The probe's `kind` ("answer", "error" or "weight") entries, by their own names."""
  return {k[len(kind) + 1:]: v for k, v in probe.items() if k.startswith(f"{kind}:")}


@dataclasses.dataclass(frozen=True)
class Requests:
  """What each version's probes send the exports, saved at `path`: the test images, sent
  as the tf.Example `feature` (probe_export); or, for a team's program (`feature` None), its
  test features batch by batch, fed to its own signatures (probe_program_export)."""
  path: str
  feature: Optional[str] = None

  @property
  def program(self) -> bool:
    return self.feature is None


def _probe(python: str, export_dir: str, requests: Requests, out_path: str
           ) -> Dict[str, np.ndarray]:
  """What the install of `python` answers from `export_dir` to `requests`."""
  args = ([_PROBE_PROGRAM, export_dir, requests.path, out_path] if requests.program else
          [_PROBE, export_dir, requests.path, requests.feature, out_path])
  result = subprocess.run([python, "-c", *args],
                          capture_output=True, text=True, check=False, env=runs.clean_env())
  if result.returncode != 0:
    raise runs.RunError(f"{python} could not load and serve {export_dir}: "
                        f"{result.stderr.strip()[-800:]}")
  with np.load(out_path) as f:
    return dict(f)


def _save_requests(config: Config, out_dir: str, program: bool) -> Requests:
  """The Requests each version's probes send, saved once in `out_dir`: the test images
  (test_images.npy), or a program's test features (test_features.pkl)."""
  if not program:
    path = os.path.join(out_dir, "test_images.npy")
    save_test_images(config, path)
    return Requests(path, serving.feature_name(config))
  path = os.path.join(out_dir, "test_features.pkl")
  with open(path, "wb") as f:
    pickle.dump(list(serving_check.test_features(config)), f, protocol=4)
  return Requests(path)


def save_test_images(config: Config, path: str) -> None:
  """Saves the whole test split to `path`, as the serving signature takes it."""
  np.save(path, np.concatenate(list(serving_check.test_images(config))))


def _cross_load(python_new: str, python_old: str, summaries: Dict[str, Dict],
                requests: Requests, out_dir: str, atol: float) -> List[harness.Check]:
  """Each version serves both exports the same requests: the two backends' exports must be
  defined alike and answer alike in each. A program's requests: its own signatures, each
  fed them (no bad requests: the program's receiver says what a bad one is)."""
  names = (OLD_ESTIMATOR, NEW_KERAS)
  program = requests.program
  defined = [serving_check.signatures(summaries[run]["export_dir"]) for run in names]
  checks = serving_check.compare_signatures(
      *defined, names, **({"required": sorted(defined[0])} if program else {}))
  for version, python in (("TF 2.15.1", python_old), ("the newest TF", python_new)):
    probes = {}
    served_by = "old" if python == python_old else "new"
    for run in names:
      out = os.path.join(out_dir, f"probe-{run}-served-by-{served_by}.npz")
      try:
        probes[run] = _probe(python, summaries[run]["export_dir"], requests, out)
      except runs.RunError as e:
        checks.append(harness.Check(f"{run} export loads in {version}", False, float("nan"), 0,
                                   str(e)))
    if len(probes) == 2:
      answers = [_read_probe(probes[run], "answer") for run in names]
      if program:
        with open(os.path.join(out_dir, f"probe-{names[0]}-served-by-{served_by}.npz.json")) as f:
          unfed = json.load(f)
        count = len(next(iter(answers[0].values()), []))
        found = [harness.Check(f"signatures fed the test split, {names[0]} export", not unfed,
                               float(len(unfed)), 0.0, "; ".join(
                                   f"{n} not fed: {why}" for n, why in sorted(unfed.items()))
                               or f"{count} examples")]
        found += serving_check.compare_answers(*answers, names, atol, f"{count} test examples")
      else:
        errors = [{k: str(v) for k, v in _read_probe(probes[run], "error").items()}
                  for run in names]
        count = len(np.load(requests.path, mmap_mode="r"))
        found = (serving_check.compare_answers(*answers, names, atol, f"{count} test images")
                 + serving_check.compare_errors(*errors, names))
      checks += harness.named(found, lambda check, version=version: f"{check}, served by "
                              f"{version}")
  return checks


def run_version_parity(config: Config, workers: Sequence[int], out_dir: str, *, keras_python: str,
                       steps: int = 10, tolerances: Tolerances = Tolerances(),
                       timeout: float = runs.TIMEOUT_SECONDS,
                       program: Optional["program_probe.Probe"] = None) -> Report:
  """Trains Keras on both installs and the Estimator on this one, then compares.

  Args:
    config: hyperparameters; train_steps, init_weights, record_dir and
      deterministic are set here.
    workers: the local worker counts to compare at.
    out_dir: runs, records, the weights file and the probes' outputs.
    keras_python: the interpreter of the newest-TF install.
    steps: training steps of each run.
    tolerances: the limits.
    timeout: seconds for each run.
    program: with config.estimator_program, what program_probe.probe found of it (check
      first that it loads in `keras_python`: program_imports).

  Returns:
    The report; `report.passed` only if every check passed.

  Raises:
    runs.RunError: a run failed, or `keras_python` is not a TF install.
  """
  versions = {"new": stack_versions(keras_python), "2.15": stack_versions(runs.PYTHON)}
  if program:
    config = harness.deterministic(config)  # A backend's dropout draws other masks.
  config = dataclasses.replace(harness.prepare(config, out_dir), train_steps=steps,
                               log_every_steps=steps, checkpoint_every_steps=steps)
  requests = _save_requests(config, out_dir, bool(program))
  pythons = {NEW_KERAS: keras_python, OLD_KERAS: runs.PYTHON, OLD_ESTIMATOR: runs.PYTHON}
  own: Dict[str, Any] = {}
  if program:
    from launch.proofs import program_probe  # noqa: PLC0415 -- see TYPE_CHECKING above.
    own[OLD_ESTIMATOR] = program_probe.estimator_changes(program, config, out_dir)
  names = program.assignment_map if program else None
  checks: List[harness.Check] = []
  losses: Dict[str, List[float]] = {}
  for n in workers:
    size_dir = os.path.join(out_dir, f"{n}w")
    # A program's input batches itself: its global batch, at n workers.
    sized = (dataclasses.replace(config, global_batch_size=program.batch * n) if program
             else config)
    trainer_runs = harness.Runs(sized, size_dir, timeout)
    summaries = {run: trainer_runs.train(run, run.split("@")[0], n, python=python,
                                         **own.get(run, {}))
                 for run, python in pythons.items()}
    for run in pythons:
      losses[f"{n}w/{run}"] = trainer_runs.losses(run)
    # Keras weights from its export, read by the version that wrote it.
    probe = _probe(keras_python, summaries[NEW_KERAS]["export_dir"], requests,
                   os.path.join(size_dir, "probe-keras-new.npz"))
    weights = {NEW_KERAS: _read_probe(probe, "weight")}
    for run in (OLD_KERAS, OLD_ESTIMATOR):
      weights[run] = harness.backend_weights(run.split("@")[0], summaries[run], sized, names)
    checks += harness.named(
        harness.compare_runs(weights, {run: losses[f"{n}w/{run}"] for run in pythons},
                             tolerances.weight_atol, tolerances.loss_rtol),
        lambda check, n=n: f"{check} at {n} worker(s)")
    if n == workers[0] and (not program or program.exports):
      checks += _cross_load(keras_python, runs.PYTHON, summaries, requests, size_dir,
                            tolerances.logits_atol)
  return Report(versions=versions, workers=list(workers), steps=steps, checks=checks,
                losses=losses, program=config.estimator_program or "")


def format_table(report: Report) -> str:
  return harness.format_checks(
      f"Version parity, {report.steps} steps at {report.workers} worker(s): "
      f"new = {report.versions['new']}; 2.15 = {report.versions['2.15']}"
      + (f"; the Estimator runs --estimator_program={report.program}, Keras its port"
         if report.program else ""), report.checks)


def write_report(report: Report, out_dir: str) -> None:
  """version_parity_report.md, .json and loss_curves.png in out_dir."""
  harness.write_report(out_dir, "version_parity", report, format_table(report))
