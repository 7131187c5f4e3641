"""Keras on the newest TensorFlow against the Estimator on TF 2.15.1: same init, same batches.

This process is the TF 2.15.1 install (the Estimator's); the Keras runs of the
newest TF go through another install's interpreter, `keras_python`. Each
SavedModel is also loaded and served by the other version.
"""

import dataclasses
import os
import subprocess
from typing import Dict, List, Sequence

import numpy as np
import tensorflow as tf

from launch.proofs import harness
from launch.proofs import runs
from launch.proofs import serving_check
from trainers import serving
from trainers.config import Config

# The runs compared, each as (backend, which install).
NEW_KERAS, OLD_KERAS, OLD_ESTIMATOR = "keras@new", "keras@2.15", "estimator@2.15"
LOGITS_ATOL = 1e-5
# Runs in the other install: loads a SavedModel, writes its answers and weights.
_PROBE = ("import sys; from launch.proofs import version_parity as v; "
          "v.probe_export(*sys.argv[1:])")


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


def _read_probe(probe: Dict[str, np.ndarray], kind: str) -> Dict[str, np.ndarray]:
  """The probe's `kind` ("answer", "error" or "weight") entries, by their own names."""
  return {k[len(kind) + 1:]: v for k, v in probe.items() if k.startswith(f"{kind}:")}


def _probe(python: str, export_dir: str, images_path: str, feature: str, out_path: str
           ) -> Dict[str, np.ndarray]:
  result = subprocess.run([python, "-c", _PROBE, export_dir, images_path, feature, out_path],
                          capture_output=True, text=True, check=False, env=runs.clean_env())
  if result.returncode != 0:
    raise runs.RunError(f"{python} could not load and serve {export_dir}: "
                        f"{result.stderr.strip()[-800:]}")
  with np.load(out_path) as f:
    return dict(f)


def save_test_images(config: Config, path: str) -> None:
  """Saves the whole test split to `path`, as the serving signature takes it."""
  np.save(path, np.concatenate(list(serving_check.test_images(config))))


def _cross_load(python_new: str, python_old: str, summaries: Dict[str, Dict], images_path: str,
                feature: str, out_dir: str, atol: float) -> List[harness.Check]:
  """Each version serves both exports the same requests: the two backends' exports must be
  defined alike and answer alike in each."""
  names = (OLD_ESTIMATOR, NEW_KERAS)
  checks = serving_check.compare_signatures(
      *(serving_check.signatures(summaries[run]["export_dir"]) for run in names), names)
  for version, python in (("TF 2.15.1", python_old), ("the newest TF", python_new)):
    probes = {}
    for run in names:
      served_by = "old" if python == python_old else "new"
      out = os.path.join(out_dir, f"probe-{run}-served-by-{served_by}.npz")
      try:
        probes[run] = _probe(python, summaries[run]["export_dir"], images_path, feature, out)
      except runs.RunError as e:
        checks.append(harness.Check(f"{run} export loads in {version}", False, float("nan"), 0,
                                   str(e)))
    if len(probes) == 2:
      answers = [_read_probe(probes[run], "answer") for run in names]
      errors = [{k: str(v) for k, v in _read_probe(probes[run], "error").items()}
                for run in names]
      count = len(np.load(images_path, mmap_mode="r"))
      checks += harness.named(
          serving_check.compare_answers(*answers, names, atol, f"{count} test images")
          + serving_check.compare_errors(*errors, names),
          lambda check, version=version: f"{check}, served by {version}")
  return checks


def run_version_parity(config: Config, workers: Sequence[int], out_dir: str, *, keras_python: str,
                       steps: int = 10, tolerances: Tolerances = Tolerances(),
                       timeout: float = runs.TIMEOUT_SECONDS) -> Report:
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

  Returns:
    The report; `report.passed` only if every check passed.

  Raises:
    runs.RunError: a run failed, or `keras_python` is not a TF install.
  """
  versions = {"new": stack_versions(keras_python), "2.15": stack_versions(runs.PYTHON)}
  config = dataclasses.replace(harness.prepare(config, out_dir), train_steps=steps,
                               log_every_steps=steps, checkpoint_every_steps=steps)
  images_path = os.path.join(out_dir, "test_images.npy")
  save_test_images(config, images_path)
  pythons = {NEW_KERAS: keras_python, OLD_KERAS: runs.PYTHON, OLD_ESTIMATOR: runs.PYTHON}
  checks: List[harness.Check] = []
  losses: Dict[str, List[float]] = {}
  for n in workers:
    size_dir = os.path.join(out_dir, f"{n}w")
    trainer_runs = harness.Runs(config, size_dir, timeout)
    summaries = {run: trainer_runs.train(run, run.split("@")[0], n, python=python)
                 for run, python in pythons.items()}
    for run in pythons:
      losses[f"{n}w/{run}"] = trainer_runs.losses(run)
    # Keras weights from its export, read by the version that wrote it.
    probe = _probe(keras_python, summaries[NEW_KERAS]["export_dir"], images_path,
                   serving.feature_name(config), os.path.join(size_dir, "probe-keras-new.npz"))
    weights = {NEW_KERAS: _read_probe(probe, "weight")}
    for run in (OLD_KERAS, OLD_ESTIMATOR):
      weights[run] = harness.backend_weights(run.split("@")[0], summaries[run], config)
    checks += harness.named(
        harness.compare_runs(weights, {run: losses[f"{n}w/{run}"] for run in pythons},
                             tolerances.weight_atol, tolerances.loss_rtol),
        lambda check, n=n: f"{check} at {n} worker(s)")
    if n == workers[0]:
      checks += _cross_load(keras_python, runs.PYTHON, summaries, images_path,
                            serving.feature_name(config), size_dir, tolerances.logits_atol)
  return Report(versions=versions, workers=list(workers), steps=steps, checks=checks,
                losses=losses)


def format_table(report: Report) -> str:
  return harness.format_checks(
      f"Version parity, {report.steps} steps at {report.workers} worker(s): "
      f"new = {report.versions['new']}; 2.15 = {report.versions['2.15']}", report.checks)


def write_report(report: Report, out_dir: str) -> None:
  """version_parity_report.md, .json and loss_curves.png in out_dir."""
  harness.write_report(out_dir, "version_parity", report, format_table(report))
