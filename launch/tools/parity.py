"""Parity: Keras, Estimator and a GradientTape reference, from the same weights and batches.

`run_parity` trains the two backends with their binaries on N local workers
and the reference in this process, all from one initial-weights file and with
op determinism on, then compares, number by number: final weights, per-step
losses, the examples each worker read, test accuracy after a longer run, and
one checkpoint evaluated by both backends' evaluation code.
"""

import dataclasses
import itertools
import json
import os
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from data import mnist
from launch.tools import convert
from launch.tools import reference
from launch.tools import runs
from trainers import evaluation
from trainers import keras_trainer
from trainers import model as model_lib
from trainers import model_dir as layout
from trainers.config import Config

BACKENDS = runs.BACKENDS
CURVE_START_STEP = 10  # Loss curves are compared from here on.


@dataclasses.dataclass(frozen=True)
class Tolerances:
  weight_atol: float = 1e-6
  loss_rtol: float = 1e-5
  accuracy_pp: float = 0.3
  curve_rtol: float = 0.05
  eval_loss_atol: float = 1e-6


@dataclasses.dataclass
class Check:
  """One comparison: what was measured, its limit, and where the worst case is."""

  name: str
  passed: bool
  measured: float
  limit: float
  where: str = ""


@dataclasses.dataclass
class Report:
  workers: int
  steps: int
  long_steps: int
  checks: List[Check]
  losses: Dict[str, List[float]]  # "short/keras", "long/estimator", ...

  @property
  def passed(self) -> bool:
    return all(c.passed for c in self.checks)


def backend_weights(backend: str, summary: Dict) -> model_lib.Weights:
  """Every final model weight by name: Keras from its SavedModel, Estimator from its checkpoint.

  All of them, not only the names the reference has: check_mapping must see a
  variable one backend has and another has not.
  """
  if backend == "keras":
    loaded = tf.saved_model.load(summary["export_dir"])
    return {model_lib.weight_name(v): v.numpy() for v in loaded.trainable_variables}
  reader = tf.train.load_checkpoint(summary["model_dir"])
  # Weights, and whatever the conversion could not place (an extra variable).
  names = [e.name for e in convert.classify(reader.get_variable_to_shape_map())
           if e.kind in (convert.WEIGHT, convert.UNMAPPED)]
  return {name: reader.get_tensor(name) for name in names}


def check_mapping(weights: Dict[str, model_lib.Weights]) -> Check:
  """Same variable count, names and shapes in every run, before any number is compared."""
  signatures = {run: sorted((n, tuple(w.shape)) for n, w in ws.items())
                for run, ws in weights.items()}
  first_run, first = next(iter(signatures.items()))
  for run, signature in signatures.items():
    if signature != first:
      return Check("variable mapping", False, float(len(signature)), float(len(first)),
                   f"{run}: {signature} vs {first_run}: {first}")
  return Check("variable mapping", True, float(len(first)), float(len(first)),
               ", ".join(f"{n}{list(s)}" for n, s in first))


def compare_weights(weights: Dict[str, model_lib.Weights], atol: float) -> List[Check]:
  checks = []
  for a, b in itertools.combinations(weights, 2):
    diffs = {n: float(np.max(np.abs(weights[a][n] - weights[b][n]))) for n in weights[a]}
    worst = max(diffs, key=diffs.get)
    checks.append(Check(f"max |weight diff| {a} vs {b}", diffs[worst] <= atol, diffs[worst],
                        atol, f"variable {worst}"))
  return checks


def compare_losses(losses: Dict[str, List[float]], rtol: float, name: str,
                   start: int = 0) -> List[Check]:
  checks = []
  for a, b in itertools.combinations(losses, 2):
    x, y = np.asarray(losses[a][start:]), np.asarray(losses[b][start:])
    if len(x) != len(y) or not len(x):
      checks.append(Check(f"{name} {a} vs {b}", False, float(len(x)), float(len(y)),
                          "different or zero step counts"))
      continue
    rel = np.abs(x - y) / np.maximum(np.abs(y), 1e-12)
    worst = int(np.argmax(rel))
    checks.append(Check(f"{name} {a} vs {b}", bool(rel[worst] <= rtol), float(rel[worst]), rtol,
                        f"step {start + worst + 1}"))
  return checks


def _shards(record_dir: str, workers: int) -> List[set]:
  shards = []
  for i in range(workers):
    with open(os.path.join(record_dir, f"shard-{i}-of-{workers}.json")) as f:
      shards.append(set(json.load(f)["fingerprints"]))
  return shards


def compare_shards(record_dirs: Dict[str, str], workers: int, data_dir: Optional[str]
                   ) -> List[Check]:
  """Worker i reads the same examples in every backend; shards are disjoint and cover."""
  whole = mnist.shard_fingerprints("train", data_dir)
  shards = {run: _shards(d, workers) for run, d in record_dirs.items()}
  checks = []
  first_run, first = next(iter(shards.items()))
  for run, run_shards in list(shards.items())[1:]:
    differing = [i for i in range(workers) if run_shards[i] != first[i]]
    checks.append(Check(f"shards {run} = {first_run}", not differing, float(len(differing)), 0.0,
                        f"pipelines {differing}" if differing else f"{workers} pipelines"))
  overlap = sum(len(a & b) for a, b in itertools.combinations(first, 2))
  checks.append(Check("shards disjoint", overlap == 0, float(overlap), 0.0, "examples in 2 shards"))
  missing = len(set(whole) - set().union(*first))
  checks.append(Check("shards cover the split", missing == 0 and len(whole) == sum(map(len, first)),
                      float(missing), 0.0, f"{len(whole)} examples, {missing} unread"))
  return checks


def _read_losses(record_dir: str) -> List[float]:
  with open(os.path.join(record_dir, layout.LOSSES_FILE)) as f:
    return json.load(f)["losses"]


def _train_both(config: Config, workers: int, out_dir: str, backend_flags, timeout):
  summaries, record_dirs = {}, {}
  for backend in BACKENDS:
    run_dir = os.path.join(out_dir, backend)
    os.makedirs(run_dir, exist_ok=True)
    run_config = dataclasses.replace(config, record_dir=run_dir)
    summaries[backend] = runs.run_trainer(
        backend, run_config, workers=workers, model_dir=os.path.join(run_dir, "model"),
        log_path=os.path.join(run_dir, "run.log"), timeout=timeout,
        extra_flags=backend_flags.get(backend, ()))
    record_dirs[backend] = run_dir
  return summaries, record_dirs


def run_parity(config: Config, workers: int, out_dir: str, *, steps: int = 10,
               long_steps: Optional[int] = None, tolerances: Tolerances = Tolerances(),
               backend_flags: Optional[Dict[str, Sequence[str]]] = None,
               timeout: float = 1800) -> Report:
  """Trains three ways and compares them.

  Args:
    config: hyperparameters; train_steps, init_weights, record_dir and
      deterministic are set here.
    workers: local workers for both backends (and shards for the reference).
    out_dir: where runs, records and the weights file go.
    steps: steps of the short run (weights and per-step losses of all three).
    long_steps: steps of the long run (accuracy and loss curves of the two
      backends); None = one epoch of the training split, 0 = skip.
    tolerances: the limits every check uses.
    backend_flags: extra flags for one backend's binary (tests use them to
      break one thing on purpose).
    timeout: seconds for each backend run.

  Returns:
    The report; `report.passed` only if every check passed.
  """
  backend_flags = backend_flags or {}
  os.makedirs(out_dir, exist_ok=True)
  init_path = os.path.join(out_dir, "init_weights.npz")
  model_lib.save_weights_npz(init_path, model_lib.get_weights(model_lib.build_model(config.seed)))
  config = dataclasses.replace(config, init_weights=init_path, deterministic=True)
  if long_steps is None:
    long_steps = mnist.num_examples("train", config.data_dir) // config.global_batch_size
  checks: List[Check] = []
  losses: Dict[str, List[float]] = {}

  short = dataclasses.replace(config, train_steps=steps, log_every_steps=steps,
                              checkpoint_every_steps=steps)
  summaries, record_dirs = _train_both(short, workers, os.path.join(out_dir, "short"),
                                       backend_flags, timeout)
  losses["short/reference"], ref_weights = reference.train_reference(short, workers)
  weights = {"reference": ref_weights}
  for backend in BACKENDS:
    weights[backend] = backend_weights(backend, summaries[backend])
    losses[f"short/{backend}"] = _read_losses(record_dirs[backend])
  mapping = check_mapping(weights)
  checks.append(mapping)
  if mapping.passed:
    checks += compare_weights(weights, tolerances.weight_atol)
  checks += compare_losses({r: losses[f"short/{r}"] for r in weights}, tolerances.loss_rtol,
                           "per-step loss rel diff")
  # The progress records (what users see as "loss" in each backend's progress
  # lines) must be the same quantity: the window mean of the global-batch loss.
  progress = {b: [r["loss"] for r in runs.read_progress(summaries[b]["model_dir"])
                  if r["event"] == "step"] for b in BACKENDS}
  checks += compare_losses(progress, tolerances.loss_rtol, "progress.jsonl loss rel diff")
  checks += compare_shards(record_dirs, workers, config.data_dir)
  eval_summary = summaries["estimator"]

  if long_steps:
    # Four checkpoints, so both evaluators have several steps to agree on.
    long = dataclasses.replace(config, train_steps=long_steps,
                               checkpoint_every_steps=max(1, long_steps // 4))
    long_summaries, long_dirs = _train_both(long, workers, os.path.join(out_dir, "long"),
                                            backend_flags, timeout)
    gap = 100 * abs(long_summaries["keras"]["test_accuracy"] -
                    long_summaries["estimator"]["test_accuracy"])
    checks.append(Check("test accuracy gap (pp), long run", gap <= tolerances.accuracy_pp, gap,
                        tolerances.accuracy_pp, f"step {long_steps}"))
    for backend in BACKENDS:
      losses[f"long/{backend}"] = _read_losses(long_dirs[backend])
    checks += compare_losses({b: losses[f"long/{b}"] for b in BACKENDS}, tolerances.curve_rtol,
                             "loss curve rel diff, long run", start=CURVE_START_STEP)
    eval_summary = long_summaries["estimator"]
    summaries = long_summaries

  checks.append(checkpoint_eval_parity({b: summaries[b]["model_dir"] for b in BACKENDS},
                                       tolerances.eval_loss_atol))
  checks += _eval_parity(config, eval_summary, tolerances.eval_loss_atol)
  return Report(workers=workers, steps=steps, long_steps=long_steps, checks=checks, losses=losses)


def checkpoint_eval_parity(model_dirs: Dict[str, str], loss_atol: float) -> Check:
  """Each backend's evaluator (or, in one process, its own evaluation), checkpoint by
  checkpoint: at every step both evaluated, accuracy equal and loss within `loss_atol`.

  An evaluator takes the newest checkpoint each time it looks, so it may skip
  some: `where` lists the steps each side evaluated. The final step must be
  among the common ones.
  """
  results = {b: evaluation.read_results(os.path.join(d, layout.EVAL_SUBDIR))
             for b, d in model_dirs.items()}
  (a, ra), (b, rb) = results.items()
  common_steps = sorted((set(ra) & set(rb)) - {0})  # Step 0: the Estimator's initial save.
  evaluated = "; ".join(f"{backend} evaluated steps {sorted(r)}" for backend, r in results.items())
  name = f"eval per checkpoint, {a} vs {b}"
  final = max(max(ra, default=-1), max(rb, default=-1))
  if not common_steps or common_steps[-1] != final:
    return Check(name, False, float(len(common_steps)), 1.0,
                 f"final step {final} not evaluated by both: {evaluated}")
  gaps = {s: (abs(ra[s]["accuracy"] - rb[s]["accuracy"]), abs(ra[s]["loss"] - rb[s]["loss"]))
          for s in common_steps}
  worst = max(common_steps, key=lambda s: gaps[s][1])
  passed = all(acc == 0.0 and loss <= loss_atol for acc, loss in gaps.values())
  wrong_accuracy = [s for s in common_steps if gaps[s][0]]
  return Check(name, passed, gaps[worst][1], loss_atol,
               f"loss gap worst at step {worst}; accuracy differs at steps {wrong_accuracy}; "
               f"{evaluated}" if wrong_accuracy else
               f"loss gap worst at step {worst}; accuracy equal at all {len(common_steps)} "
               f"common steps; {evaluated}")


def _eval_parity(config: Config, summary: Dict, loss_atol: float) -> List[Check]:
  """The Estimator evaluator's numbers for its final checkpoint, and Keras evaluate's."""
  step = summary["global_step"]
  estimator_metrics = evaluation.read_result(
      os.path.join(summary["model_dir"], layout.EVAL_SUBDIR), step)
  if estimator_metrics is None:
    return [Check("evaluation parity", False, float("nan"), 0.0, f"no eval events at step {step}")]
  keras_metrics = keras_trainer.evaluate_weights(
      config, backend_weights("estimator", summary))
  acc_gap = abs(keras_metrics["accuracy"] - estimator_metrics["accuracy"])
  loss_gap = abs(keras_metrics["loss"] - estimator_metrics["loss"])
  where = f"checkpoint step {step}: accuracy {estimator_metrics['accuracy']:.4f}"
  return [Check("eval accuracy, Estimator evaluator vs Keras evaluate", acc_gap == 0.0, acc_gap,
                0.0, where),
          Check("eval loss, Estimator evaluator vs Keras evaluate", loss_gap <= loss_atol,
                loss_gap, loss_atol, where)]


def format_checks(title: str, checks: Sequence[Check]) -> str:
  """A Markdown table of checks under `title`, then the overall verdict."""
  rows = [title, "| check | result | measured | limit | where |", "| --- | --- | --- | --- | --- |"]
  for c in checks:
    rows.append(f"| {c.name} | {'PASS' if c.passed else 'FAIL'} | {c.measured:.3g} | "
                f"{c.limit:.3g} | {c.where} |")
  passed = sum(c.passed for c in checks)
  rows.append(f"Overall: {'PASS' if passed == len(checks) else 'FAIL'} "
              f"({passed}/{len(checks)} checks)")
  return "\n".join(rows)


def format_table(report: Report) -> str:
  return format_checks(f"Parity at {report.workers} worker(s): {report.steps}-step short run, "
                       f"{report.long_steps}-step long run", report.checks)


def write_files(out_dir: str, name: str, report: Any, table: str,
                plot: Callable[[Any, str], None]) -> None:
  """`<name>_report.md` (the table), `<name>_report.json` and `loss_curves.png` in out_dir."""
  with open(os.path.join(out_dir, f"{name}_report.md"), "w") as f:
    f.write(f"# {name.capitalize()} report\n\n{table}\n")
  with open(os.path.join(out_dir, f"{name}_report.json"), "w") as f:
    json.dump({"passed": report.passed, **dataclasses.asdict(report)}, f, indent=2)
  plot(report, os.path.join(out_dir, "loss_curves.png"))


def write_report(report: Report, out_dir: str) -> None:
  """parity_report.md, parity_report.json and loss_curves.png in out_dir."""
  write_files(out_dir, "parity", report, format_table(report), _plot)


def _plot(report: Report, path: str) -> None:
  import matplotlib  # noqa: PLC0415 -- loaded only when a plot is drawn.
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # noqa: PLC0415 -- after matplotlib.use.

  fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 8), sharex=True)
  for run, values in report.losses.items():
    top.plot(range(1, len(values) + 1), values, label=run,
             linestyle="--" if "reference" in run else "-")
  top.set(yscale="log", ylabel="training loss (global batch)", title="Per-step loss")
  top.legend()
  for phase in ("short", "long"):
    runs = [r for r in report.losses if r.startswith(phase + "/")]
    for a, b in itertools.combinations(runs, 2):
      diff = np.abs(np.asarray(report.losses[a]) - np.asarray(report.losses[b]))
      bottom.plot(range(1, len(diff) + 1), np.maximum(diff, 1e-12),
                  label=f"|{a} - {b.split('/')[1]}|")
  bottom.set(yscale="log", xlabel="step", ylabel="|loss difference| (floor 1e-12)")
  bottom.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
