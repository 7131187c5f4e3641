"""Parity: Keras, Estimator and a GradientTape reference, from the same weights and batches.

`run_parity` trains the two backends with their binaries on N local workers
and the reference in this process, all from one initial-weights file and with
op determinism on, then compares, number by number: final weights, per-step
losses, the examples each worker read, test accuracy after a longer run, and
one checkpoint evaluated by both backends' evaluation code.

With a team's program (config.estimator_program) the Estimator trains their model_fn on
their input_fn and Keras the port (config.model) on the same input: program_probe.probe first
holds the two to each other where nothing need train, and the runs then start from the
port's initial weights under the program's names.
"""

import dataclasses
import itertools
import json
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from data.mnist import pipeline
from launch.proofs import harness
from launch.proofs import program_probe
from launch.proofs import reference
from launch.proofs import runs
from launch.proofs import serving_check
from trainers import config as config_lib
from trainers import evaluation
from trainers import keras_trainer
from trainers import model as model_lib
from trainers import model_dir as layout
from trainers import schedules
from trainers.config import Config

BACKENDS = runs.BACKENDS
Check = harness.Check
CURVE_START_STEP = 10  # Loss curves are compared from here on.


@dataclasses.dataclass(frozen=True)
class Tolerances:
  weight_atol: float = 1e-6
  loss_rtol: float = 1e-5
  accuracy_pp: float = 0.3
  curve_rtol: float = 0.05
  eval_atol: float = 1e-6  # Every metric of the head but accuracy, which must be equal.
  prediction_atol: float = 1e-5
  # The reference's weight limit, if above weight_atol: this many times its rounding floor.
  reference_floor_factor: float = 2.0
  # The statistical check (asynchronous workers on parameter servers, run_statistical):
  # the gap between the backends' mean test accuracy over the seeds, and their mean test
  # loss's, relative.
  seeds_accuracy_pp: float = 1.0
  seeds_loss_rtol: float = 0.25


@dataclasses.dataclass
class Report:
  workers: int
  steps: int
  long_steps: int
  checks: List[Check]
  losses: Dict[str, List[float]]  # "short/keras", "long/estimator", ...
  rates: Dict[str, List[float]] = dataclasses.field(default_factory=dict)  # Each step's, alike.
  # Reported, not checked: each measured run's test accuracy, or a regression's test loss
  # ("seed 2, keras").
  measured: Dict[str, float] = dataclasses.field(default_factory=dict)
  reference_floor: float = 0.0  # reference_floor's measure.
  model: str = ""
  optimizer: str = ""
  engine: str = "local"  # Another engine the short runs were repeated on, or "local".
  program: str = ""  # A team's program the Estimator ran (--estimator_program), or "".
  task: str = config_lib.MULTICLASS  # The head's kind (trainers/heads.py).
  notes: List[str] = dataclasses.field(default_factory=list)  # What was not compared, and why.
  ps: int = 0  # The parameter servers both backends trained on.
  # A statistical check's seeds (run_statistical), 0 for the exact one; its curves: each
  # run's progress-window losses as [step, loss] ("seed 2, keras").
  seeds: int = 0
  curves: Dict[str, List[List[float]]] = dataclasses.field(default_factory=dict)

  @property
  def passed(self) -> bool:
    return all(c.passed for c in self.checks)


def _shards(record_dir: str, workers: int) -> List[set]:
  shards = []
  for i in range(workers):
    with open(os.path.join(record_dir, f"shard-{i}-of-{workers}.json")) as f:
      shards.append(set(json.load(f)["fingerprints"]))
  return shards


def compare_shards(record_dirs: Dict[str, str], workers: int, data_dir: Optional[str]
                   ) -> List[Check]:
  """Worker i reads the same examples in every backend; shards are disjoint and cover."""
  whole = pipeline.shard_fingerprints("train", data_dir)
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


def run_parity(config: Config, workers: int, out_dir: str, *, steps: int = 10,
               long_steps: Optional[int] = None, tolerances: Tolerances = Tolerances(),
               backend_flags: Optional[Dict[str, Sequence[str]]] = None,
               measure_seeds: int = 0, measure_steps: Optional[int] = None,
               measure_model_options: str = "", engine: str = "local",
               timeout: float = runs.TIMEOUT_SECONDS, program: Optional[program_probe.Probe] = None,
               ps: int = 0) -> Report:
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
    measure_seeds: also train both backends with seeds 1..N for `measure_steps`,
      with `measure_model_options`, and report each test accuracy, unchecked: the
      reference cannot draw a backend's dropout masks, so these runs are outside the
      checks.
    measure_steps: steps of each measured run; None = the long run's, or one epoch
      if it is skipped.
    measure_model_options: --model_options of the measured runs ("" = the spec's
      defaults, dropout on).
    engine: another engine (runs.ENGINES) to run the short run of both backends on as
      well, each held to its local run (compare_engines); "local": none.
    timeout: seconds for each backend run.
    program: with config.estimator_program, what program_probe.probe found of it.
    ps: parameter servers both backends train on (their --ps); at one worker their steps
      are sequential, so the reference holds both as without them.

  Returns:
    The report; `report.passed` only if every check passed.
  """
  config = harness.prepare(_program_batch(harness.deterministic(config), workers, program),
                           out_dir)
  epoch = pipeline.num_examples("train", config.data_dir) // config.global_batch_size
  long_steps = epoch if long_steps is None else long_steps
  flags = {b: [*(backend_flags or {}).get(b, ()), *([f"--ps={ps}"] if ps else [])]
           for b in BACKENDS}
  run = _Phases(config, workers, harness.Runs(config, out_dir, timeout), flags, tolerances,
                program)
  checks, short, floor = run.short(steps, engine)
  summaries = short
  if long_steps:
    long_checks, summaries = run.long(long_steps)
    checks += long_checks
  checks.append(checkpoint_eval_parity({b: summaries[b]["model_dir"] for b in BACKENDS},
                                       tolerances.eval_atol))
  checks += _eval_parity(config, summaries["estimator"], tolerances.eval_atol,
                         run.assignment_map)
  notes = _program_notes(program, config) if program else []
  # The short run's exports: its weights agree to weight_atol, the long run's only in accuracy.
  if not program:
    checks += serving_check.compare_models(short["estimator"]["export_dir"],
                                           short["keras"]["export_dir"], config,
                                           tolerances.prediction_atol)
  elif program.exports:
    checks += serving_check.compare_exports(
        short["estimator"]["export_dir"], short["keras"]["export_dir"],
        lambda: serving_check.test_features(config), tolerances.prediction_atol,
        ("estimator", "keras"))
  measured = run.measured(measure_seeds, measure_steps or long_steps or epoch,
                          measure_model_options)
  return Report(workers=workers, steps=steps, long_steps=long_steps, checks=checks,
                losses=run.losses, rates=run.rates, measured=measured, reference_floor=floor,
                model=config.model, optimizer=config.optimizer_label(), engine=engine,
                program=config.estimator_program or "", notes=notes,
                task=config_lib.parse_task(config.task)[0], ps=ps)


def run_statistical(config: Config, workers: int, out_dir: str, *, ps: int, seeds: int = 3,
                    steps: Optional[int] = None, tolerances: Tolerances = Tolerances(),
                    timeout: float = runs.TIMEOUT_SECONDS,
                    program: Optional[program_probe.Probe] = None) -> Report:
  """Both backends on `ps` parameter servers and `workers` asynchronous workers, `seeds`
  times each: equivalence, where equality cannot be had.

  Which worker takes which step, from which values of the variables, depends on timing, so
  no run is another's to the bit, not even the same backend's twice. Seed k (config.seed,
  config.seed + 1, ...) gives both backends one initial-weights file and one shuffle; the
  checks hold the means over the seeds to each other: the test accuracy within
  seeds_accuracy_pp, the test loss within seeds_loss_rtol (held-out numbers: a training
  window's loss is one worker's few batches), and every run trains to `steps` (asynchronous
  workers may each finish a step they had started: a few more).

  Args:
    config: the model and recipe, trained as given (dropout as its options say: nothing
      here is compared to the bit).
    steps: each run's steps; None: one epoch of the training split.
    program: with config.estimator_program, what program_probe.probe found of it.

  Returns:
    The report: `seeds`, every run's headline in `measured` and its progress-window losses
    in `curves` (plotted, not checked).
  """
  config = _program_batch(config, workers, program)
  steps = steps or pipeline.num_examples("train", config.data_dir) // config.global_batch_size
  summaries, curves = {}, {}
  for seed in range(config.seed, config.seed + seeds):
    seed_dir = os.path.join(out_dir, f"seed-{seed}")
    seeded = dataclasses.replace(harness.prepare(dataclasses.replace(config, seed=seed),
                                                 seed_dir), deterministic=False)
    phases = _Phases(seeded, workers, harness.Runs(seeded, seed_dir, timeout),
                     {b: [f"--ps={ps}"] for b in BACKENDS}, tolerances, program)
    for backend, summary in phases.train_both(
        "", train_steps=steps, log_every_steps=max(1, steps // 10),
        checkpoint_every_steps=steps, record=False).items():
      summaries[f"seed {seed}, {backend}"] = summary
      curves[f"seed {seed}, {backend}"] = [
          [p["step"], p["loss"]] for p in runs.read_progress(summary["model_dir"])
          if p["event"] == "step"]
  reached = {label: s["global_step"] for label, s in summaries.items()}
  checks = [Check("every run trained its steps", min(reached.values()) >= steps,
                  float(min(reached.values())), float(steps),
                  "; ".join(f"{label}: step {step}" for label, step in reached.items()))]
  checks += _seed_means(summaries, tolerances)
  return Report(workers=workers, steps=0, long_steps=steps, checks=checks, losses={},
                measured={label: harness.headline(s)[1] for label, s in summaries.items()},
                model=config.model, optimizer=config.optimizer_label(),
                program=config.estimator_program or "", task=config_lib.parse_task(config.task)[0],
                ps=ps, seeds=seeds, curves=curves)


def _seed_means(summaries: Dict[str, Dict[str, Any]], tolerances: Tolerances) -> List[Check]:
  """Each backend's mean test loss and accuracy (a regression's: loss alone) over the
  seeds, against the other's."""
  (keras, keras_where), (estimator, estimator_where) = (
      _seed_mean(summaries, "test_loss", b) for b in BACKENDS)
  gap = abs(keras - estimator) / estimator
  checks = [Check("mean test loss rel diff over the seeds", gap <= tolerances.seeds_loss_rtol,
                  gap, tolerances.seeds_loss_rtol, f"{keras_where}, {estimator_where}")]
  if all(s["test_accuracy"] is not None for s in summaries.values()):
    (keras, keras_where), (estimator, estimator_where) = (
        _seed_mean(summaries, "test_accuracy", b) for b in BACKENDS)
    gap = 100 * abs(keras - estimator)
    checks.append(Check("mean test accuracy gap over the seeds (pp)",
                        gap <= tolerances.seeds_accuracy_pp, gap, tolerances.seeds_accuracy_pp,
                        f"{keras_where}, {estimator_where}"))
  return checks


def _seed_mean(summaries: Dict[str, Dict[str, Any]], key: str, backend: str
               ) -> Tuple[float, str]:
  """`backend`'s mean of summary `key` over the seeds, and how a check's `where` says it."""
  values = [s[key] for label, s in summaries.items() if label.endswith(f", {backend}")]
  return float(np.mean(values)), f"{backend} {np.mean(values):.4g} (sd {np.std(values):.2g})"


def _program_batch(config: Config, workers: int, program: Optional[program_probe.Probe]
                   ) -> Config:
  """`config` with a team's program's global batch: its input batches itself, so the
  epoch is its batches'."""
  if not program:
    return config
  return dataclasses.replace(config, global_batch_size=program.batch * workers)


def _program_notes(program: program_probe.Probe, config: Config) -> List[str]:
  """What parity does not yet compare of a team's program, and why."""
  others = [m for m in program.metrics if m not in model_lib.metric_keys(config)]
  notes = [] if program.exports else [
      "Serving: the program has no serving_input_receiver_fn, so nothing of it is exported."]
  if program.own_input:
    notes.append("Shards: the program's input_fn records no example fingerprints; the probe "
                 "held each worker's first batches equal in a graph and eagerly instead.")
  if others:
    notes.append(f"Their eval_metric_ops {', '.join(others)}: measured by the Estimator "
                 f"(summary.json's test_metrics), not compared: the port declares no metric "
                 f"of that name (ModelSpec.metrics, trainers/v1_metrics.py).")
  return notes


class _Phases:
  """The phases of one parity run (the short run, the long one, the measured seeds), which
  share its runs, the losses read so far and the limits."""

  def __init__(self, config: Config, workers: int, trainer_runs: harness.Runs,
               backend_flags: Dict[str, Sequence[str]], tolerances: Tolerances,
               program: Optional[program_probe.Probe] = None):
    self.config, self.workers, self.runs = config, workers, trainer_runs
    self.backend_flags, self.tolerances, self.program = backend_flags, tolerances, program
    self.assignment_map = program.assignment_map if program else None
    self.losses: Dict[str, List[float]] = {}
    self.rates: Dict[str, List[float]] = {}  # Each backend's, as it recorded them.
    # Each backend's own changes to the config: a program's run starts from the initial
    # weights under its own names.
    self.own: Dict[str, Dict[str, Any]] = {b: {} for b in BACKENDS}
    if program:
      self.own["estimator"] = program_probe.estimator_changes(program, config,
                                                              trainer_runs.out_dir)

  def train_both(self, phase: str, **changes: Any) -> Dict[str, Dict[str, Any]]:
    """Each backend's run, `<phase>/<backend>` (`<backend>` with no phase)."""
    return {b: self.runs.train(f"{phase}/{b}" if phase else b, b, self.workers,
                               extra_flags=self.backend_flags.get(b, ()),
                               **{**changes, **self.own[b]})
            for b in BACKENDS}

  def weights(self, backend: str, summary: Dict[str, Any]) -> model_lib.Weights:
    """A backend's final weights under the port's names."""
    return harness.backend_weights(backend, summary, self.config, self.assignment_map)

  def short(self, steps: int, engine: str
            ) -> Tuple[List[Check], Dict[str, Dict[str, Any]], float]:
    """The three ways, `steps` steps (and both backends on `engine` too): every check of
    weights, losses, progress, shards, rates and clipping; the summaries; the floor."""
    config, workers, tolerances, losses = self.config, self.workers, self.tolerances, self.losses
    # Two progress windows (where one window's mean would equal the running mean).
    short_run = dict(train_steps=steps, log_every_steps=max(1, steps // 2),
                     checkpoint_every_steps=steps)
    summaries = self.train_both("short", **short_run)
    # The same runs on another engine, each named "<backend> on <engine>" in the checks.
    engine_runs = {f"{b} on {engine}": f"short/{b}-{engine}"
                   for b in (BACKENDS if engine != "local" else ())}
    on_engine = {label: self.runs.train(name, label.split(" on ")[0], workers, engine=engine,
                                        **{**short_run, **self.own[label.split(" on ")[0]]})
                 for label, name in engine_runs.items()}
    short = dataclasses.replace(config, train_steps=steps)
    losses["short/reference"], ref_weights, clipped = reference.train_as_workers(short, workers)
    weights = {"reference": ref_weights}
    for backend in BACKENDS:
      weights[backend] = self.weights(backend, summaries[backend])
      losses[f"short/{backend}"] = self.runs.losses(f"short/{backend}")
      self.rates[f"short/{backend}"] = self.runs.learning_rates(f"short/{backend}")
    floor = reference_floor(short, workers, ref_weights)
    checks = compare_short_runs(weights, {r: losses[f"short/{r}"] for r in weights}, floor,
                                tolerances)
    for label, name in engine_runs.items():
      losses[f"short/{label}"] = self.runs.losses(name)
    checks += compare_engines(config, weights, summaries, on_engine, losses, tolerances,
                              self.assignment_map)
    # The progress records (what users see as "loss" in each backend's progress
    # lines) must be the same quantity: the window mean of the global-batch loss.
    progress = {r: [p["loss"] for p in runs.read_progress(s["model_dir"])
                    if p["event"] == "step"]
                for r, s in {**summaries, **on_engine}.items()}
    checks += harness.compare_losses(progress, tolerances.loss_rtol,
                                     "progress.jsonl loss rel diff")
    checks += [window_mean_check(b, summaries[b]["model_dir"], losses[f"short/{b}"],
                                 tolerances.loss_rtol) for b in BACKENDS]
    if self.program:
      checks += self.program.checks
    if not self.program or not self.program.own_input:  # Its own records no shards.
      short_runs = {**{b: f"short/{b}" for b in BACKENDS}, **engine_runs}
      checks += compare_shards({r: self.runs.run_dir(n) for r, n in short_runs.items()},
                               workers, config.data_dir)
    checks += rate_checks(config, "short", steps, self.runs)
    checks += tensorboard_checks(config, summaries, steps)
    if not self.program:  # The port's clipping, if any, is held by the weights' checks.
      checks += clipping_checks(short, workers, clipped, weights, tolerances.weight_atol)
    return checks, summaries, floor

  def long(self, long_steps: int) -> Tuple[List[Check], Dict[str, Dict[str, Any]]]:
    """Both backends, `long_steps` steps: accuracy, loss curves and rates; the summaries."""
    tolerances, losses = self.tolerances, self.losses
    # Four checkpoints, so both evaluators have several steps to agree on.
    summaries = self.train_both("long", train_steps=long_steps,
                                checkpoint_every_steps=max(1, long_steps // 4))
    keras, estimator = summaries["keras"], summaries["estimator"]
    if estimator["test_accuracy"] is None:  # A regression head: its loss.
      gap = abs(keras["test_loss"] - estimator["test_loss"]) / estimator["test_loss"]
      checks = [Check("test loss rel diff, long run", gap <= tolerances.curve_rtol, gap,
                      tolerances.curve_rtol, f"step {long_steps}")]
    else:
      gap = 100 * abs(keras["test_accuracy"] - estimator["test_accuracy"])
      checks = [Check("test accuracy gap (pp), long run", gap <= tolerances.accuracy_pp, gap,
                      tolerances.accuracy_pp, f"step {long_steps}")]
    for backend in BACKENDS:
      losses[f"long/{backend}"] = self.runs.losses(f"long/{backend}")
      self.rates[f"long/{backend}"] = self.runs.learning_rates(f"long/{backend}")
    checks += harness.compare_losses({b: losses[f"long/{b}"] for b in BACKENDS},
                                     tolerances.curve_rtol, "loss curve rel diff, long run",
                                     start=CURVE_START_STEP)
    checks += rate_checks(self.config, "long", long_steps, self.runs)
    return checks, summaries

  def measured(self, seeds: int, steps: int, model_options: str) -> Dict[str, float]:
    """Each backend's test accuracy with seeds 1..`seeds`, dropout as `model_options` says."""
    measured = {}
    for seed in range(1, seeds + 1):
      for backend, summary in self.train_both(
          f"seed-{seed}", train_steps=steps, seed=seed, init_weights=None,
          model_options=model_options, record=False).items():
        measured[f"seed {seed}, {backend}"] = harness.headline(summary)[1]
    return measured


def compare_engines(config: Config, weights: Dict[str, model_lib.Weights],
                    local: Dict[str, Dict[str, Any]], other: Dict[str, Dict[str, Any]],
                    losses: Dict[str, List[float]], tolerances: Tolerances,
                    assignment_map: Optional[Dict[str, Optional[str]]] = None) -> List[Check]:
  """Each backend's run on another engine against its local run: the same variables,
  weights within weight_atol, per-step losses within loss_rtol, and the same evaluation
  of each checkpoint.

  Args:
    config: the runs' hyperparameters.
    weights: each local run's weights, by backend.
    local: each local run's summary, by backend.
    other: each run on the other engine's summary, by "<backend> on <engine>".
    losses: every run's per-step losses, by "short/<name>".
    tolerances: the limits.
    assignment_map: a team's program's names to the port's.
  """
  checks = []
  for label, summary in other.items():
    backend = label.split(" on ")[0]
    pair = {backend: weights[backend],
            label: harness.backend_weights(backend, summary, config, assignment_map)}
    checks += harness.named(
        harness.compare_runs(pair, {r: losses[f"short/{r}"] for r in pair},
                             tolerances.weight_atol, tolerances.loss_rtol),
        lambda name, pair=pair: f"{name}, {' vs '.join(pair)}"
        if name == "variable mapping" else name)
    checks.append(checkpoint_eval_parity({backend: local[backend]["model_dir"],
                                          label: summary["model_dir"]},
                                         tolerances.eval_atol))
  return checks


def rate_checks(config: Config, phase: str, steps: int, trainer_runs: harness.Runs
                ) -> List[Check]:
  """Each step's learning rate in both backends against the reference's, to the bit (over
  the whole run of `phase`, `steps` long); none for a canned model's constant rates."""
  if config.canned_settings():
    return []
  run = dataclasses.replace(config, train_steps=steps)
  rates = {"reference": [reference.rate(run, i) for i in range(steps)],
           **{b: trainer_runs.learning_rates(f"{phase}/{b}") for b in BACKENDS}}
  return harness.compare_losses(rates, 0.0, f"per-step learning rate rel diff, {phase} run")


def clipping_checks(config: Config, workers: int, clipped: List[int],
                    weights: Dict[str, model_lib.Weights], atol: float) -> List[Check]:
  """With --clip_global_norm: how many steps the reference clipped a replica's gradients
  (said, not judged), and, at 2 workers and more, the negative control: the reference
  clipping the summed gradients instead (as Keras's own clipnorm does) must end apart from
  both backends, or this run could not tell the two meanings apart."""
  if not config.clip_global_norm:
    return []
  steps = sum(1 for n in clipped if n)
  checks = [Check("steps whose replica gradients the reference clipped", True, float(steps),
                  float(len(clipped)), f"{steps} of {len(clipped)} steps, "
                  f"{sum(clipped)} replica-steps above --clip_global_norm="
                  f"{config.clip_global_norm:g}")]
  if workers < 2 or not steps:
    return checks
  _, after, _ = reference.train_as_workers(config, workers, clip_after_all_reduce=True)
  for backend in BACKENDS:
    [apart] = harness.compare_weights({"clipped after the all-reduce": after,
                                       backend: weights[backend]}, atol)
    checks.append(Check(f"negative control: reference clipping after the all-reduce vs "
                        f"{backend} (must differ)", not apart.passed, apart.measured, atol,
                        apart.where))
  return checks


def compare_short_runs(weights: Dict[str, model_lib.Weights], losses: Dict[str, List[float]],
                       floor: float, tolerances: Tolerances) -> List[Check]:
  """harness.compare_runs, the reference's weights held to `reference_floor_factor` x
  its rounding `floor` where that exceeds weight_atol (reference_floor says why)."""
  limit = tolerances.reference_floor_factor * floor
  checks = harness.compare_runs(weights, losses, tolerances.weight_atol, tolerances.loss_rtol,
                                weight_limits={"reference": limit})
  return [dataclasses.replace(c, where=f"{c.where}; limit {tolerances.reference_floor_factor:g} x "
                              f"the reference's rounding floor {floor:.3g}")
          if c.name.startswith("max |weight diff| reference") and c.limit == limit
          and limit > tolerances.weight_atol else c for c in checks]


def reference_floor(config: Config, workers: int, weights: model_lib.Weights) -> float:
  """How far the reference (`weights`) ends from itself compiled for any batch size.

  Both compilations are right; they order float32 sums otherwise. After a few steps of
  a model that normalizes small batches (BatchNorm at 2 workers), that rounding grows
  past 1e-6, so neither backend, compiled otherwise again, can be held closer to the
  reference than a few times this. Keras and the Estimator run the same kernels, so
  they are still held to weight_atol.
  """
  _, other, _ = reference.train_as_workers(config, workers, any_batch_size=True)
  (check,) = harness.compare_weights({"reference": weights, "any batch size": other}, 0.0)
  return check.measured


def tensorboard_checks(config: Config, summaries: Dict[str, Dict[str, Any]], steps: int
                       ) -> List[Check]:
  """The TensorBoard scalars each backend wrote in model_dir during a run of `steps` steps:
  Keras writes every tag the Estimator writes (its dashboards keep working); each
  `learning_rate` point (the project's model_fn's) is the rate its step trained with, the
  reference's. None for a canned model, whose Estimator writes its own (each hidden layer's
  fraction_of_zero_values)."""
  if config.canned_settings():
    return []
  scalars = {b: evaluation.read_scalars(summaries[b]["model_dir"]) for b in BACKENDS}
  tags = {b: sorted({tag for values in s.values() for tag in values}) for b, s in scalars.items()}
  missing = sorted(set(tags["estimator"]) - set(tags["keras"]))
  checks = [Check("TensorBoard tags in model_dir, the estimator's written by keras too",
                  not missing, float(len(missing)), 0.0,
                  "; ".join(f"{b}: {', '.join(t)}" for b, t in tags.items())
                  + (f"; keras lacks {', '.join(missing)}" if missing else ""))]
  if config.estimator_program:  # Its model_fn writes what it writes; rate_checks hold rates.
    return checks
  run = dataclasses.replace(config, train_steps=steps)
  for backend in BACKENDS:
    points = {step: values[schedules.SUMMARY_TAG] for step, values in scalars[backend].items()
              if schedules.SUMMARY_TAG in values}
    # Summaries hold float32: the step's rate as the step computed it, to the bit.
    gaps = {step: abs(float(np.float32(reference.rate(run, step - 1))) - value)
            for step, value in points.items()}
    worst = max(gaps, key=gaps.get, default=None)
    checks.append(Check(
        f"TensorBoard {schedules.SUMMARY_TAG} is its step's rate, {backend}",
        bool(points) and not any(gaps.values()), gaps[worst] if gaps else float("nan"), 0.0,
        f"steps {sorted(points)}" + (f", the widest gap at step {worst}" if gaps else
                                     f": no {schedules.SUMMARY_TAG} points")))
  return checks


def window_mean_check(backend: str, model_dir: str, losses: Sequence[float],
                      rtol: float) -> Check:
  """Each progress record's loss is the mean of the per-step losses since the previous one."""
  worst, where = 0.0, "no progress records"
  previous = 0
  for record in runs.read_progress(model_dir):
    if record["event"] != "step":
      continue
    window = losses[previous:record["step"]]
    previous = record["step"]
    if not window:
      return Check(f"progress.jsonl loss is the window mean, {backend}", False, float("nan"),
                   rtol, f"no per-step losses up to step {record['step']}")
    rel = abs(record["loss"] - float(np.mean(window))) / max(abs(float(np.mean(window))), 1e-12)
    if rel >= worst:
      worst, where = rel, f"window ending at step {record['step']} ({len(window)} steps)"
  return Check(f"progress.jsonl loss is the window mean, {backend}",
               where != "no progress records" and worst <= rtol, worst, rtol, where)


def checkpoint_eval_parity(model_dirs: Dict[str, str], atol: float) -> Check:
  """Each backend's evaluator (or, in one process, its own evaluation), checkpoint by
  checkpoint: at every step both evaluated, accuracy equal and every other metric of the
  head (the loss too) within `atol`.

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
  gaps = {s: metric_gaps(ra[s], rb[s]) for s in common_steps}
  worst = max(common_steps, key=lambda s: max(gaps[s].values()))
  worst_metric = max(gaps[worst], key=gaps[worst].get)
  wrong_accuracy = [s for s in common_steps if gaps[s].get("accuracy")]
  passed = not wrong_accuracy and all(max(g.values()) <= atol for g in gaps.values())
  keys = sorted(gaps[worst])
  return Check(name, passed, gaps[worst][worst_metric], atol,
               f"{len(keys)} metrics ({', '.join(keys)}), the widest gap {worst_metric} at "
               f"step {worst}"
               + (f"; accuracy differs at steps {wrong_accuracy}" if wrong_accuracy else
                  f"; accuracy equal at all {len(common_steps)} common steps"
                  if "accuracy" in keys else "") + f"; {evaluated}")


def metric_gaps(a: Dict[str, float], b: Dict[str, float]) -> Dict[str, float]:
  """|a - b| of each metric both evaluations report (a head's: trainers/heads.py; a team's
  program's others have no counterpart in its port's)."""
  return {k: abs(a[k] - b[k]) for k in sorted(set(a) & set(b))}


def _eval_parity(config: Config, summary: Dict, atol: float,
                 assignment_map: Optional[Dict[str, Optional[str]]] = None) -> List[Check]:
  """The Estimator evaluator's numbers for its final checkpoint, and Keras evaluate's: each
  metric of the head, accuracy equal, the others within `atol`."""
  step = summary["global_step"]
  estimator_metrics = evaluation.read_result(
      os.path.join(summary["model_dir"], layout.EVAL_SUBDIR), step)
  if estimator_metrics is None:
    return [Check("evaluation parity", False, float("nan"), 0.0, f"no eval events at step {step}")]
  keras_metrics = keras_trainer.evaluate_weights(
      config, harness.backend_weights("estimator", summary, config, assignment_map))
  gaps = metric_gaps(keras_metrics, estimator_metrics)
  return [Check(f"eval {k}, Estimator evaluator vs Keras evaluate",
                gap == 0.0 if k == "accuracy" else gap <= atol, gap,
                0.0 if k == "accuracy" else atol,
                f"checkpoint step {step}: {k} {estimator_metrics[k]:.6g}")
          for k, gap in gaps.items()]


def format_table(report: Report) -> str:
  if report.seeds:
    return _format_statistical(report)
  on = f" (also on {report.engine})" if report.engine != "local" else ""
  program = _program_clause(report)
  servers = f" and {report.ps} parameter server(s)" if report.ps else ""
  table = harness.format_checks(f"Parity at {report.workers} worker(s){servers}: "
                                f"{report.steps}-step "
                                f"short run{on}, {report.long_steps}-step long run{program}",
                                report.checks)
  if report.notes:
    table += "\n\nNot compared:\n" + "\n".join(f"- {note}" for note in report.notes)
  if not report.measured:
    return table
  return table + "\n" + _by_seed(report, "measured, not checked: dropout on, which the "
                                 "reference cannot follow")


def _program_clause(report: Report) -> str:
  """What a table's title says of a team's program, if the Estimator ran one."""
  return (f"; the Estimator runs --estimator_program={report.program}, Keras its port "
          f"--model={report.model}" if report.program else "")


def _format_statistical(report: Report) -> str:
  table = harness.format_checks(
      f"Statistical parity at {report.workers} workers and {report.ps} parameter server(s): "
      f"{report.seeds} seeds, {report.long_steps} steps each{_program_clause(report)}. "
      "The workers step asynchronously, so no run is another's to the bit: the checks hold "
      "each backend's means over the seeds to the other's.", report.checks)
  return table + "\n" + _by_seed(report, "each run; the means are checked above")


def _by_seed(report: Report, what_it_is: str) -> str:
  """The measured headline of each run, and each backend's mean, as a table."""
  what = "test loss" if report.task == config_lib.REGRESSION else "test accuracy"
  rows = ["", f"{what.capitalize()} by seed ({what_it_is})", f"| run | {what} |",
          "| --- | --- |"]
  rows += [f"| {run} | {value:.4f} |" for run, value in report.measured.items()]
  for backend in BACKENDS:
    values = [v for run, v in report.measured.items() if run.endswith(f", {backend}")]
    rows.append(f"| mean, {backend} | {np.mean(values):.4f} |")
  return "\n".join(rows)


def cell_name(config: Config) -> str:
  """The directory of one (model, optimizer) of a matrix: `cnn-adam`."""
  return re.sub(r"[^\w.-]", "_", f"{config.model}-{config.optimizer_label()}")


def _keras_vs_estimator(report: Report) -> str:
  check = next((c for c in report.checks
                if c.name == "max |weight diff| keras vs estimator"), None)
  return f"{check.measured:.2g}" if check else "-"


def format_matrix(reports: Sequence[Report]) -> str:
  """One row per (model, optimizer, workers): passed or the checks that failed."""
  rows = ["| model | optimizer | workers | result | keras vs estimator, max weight diff "
          "| reference floor | failed checks |", "| --- | --- | --- | --- | --- | --- | --- |"]
  for r in reports:
    failed = harness.md_cell("; ".join(c.name for c in r.checks if not c.passed) or "none")
    rows.append(f"| {r.model} | {r.optimizer} | {r.workers}{' (statistical)' if r.seeds else ''} "
                f"| {'PASS' if r.passed else 'FAIL'} "
                f"| {_keras_vs_estimator(r)} | {r.reference_floor:.2g} | {failed} |")
  rows.append("\n" + harness.overall([r.passed for r in reports], "cells"))
  return "\n".join(rows)


def write_matrix(reports: Sequence[Report], out_dir: str) -> None:
  """parity_matrix.md (format_matrix) and parity_matrix.json (every cell's checks)."""
  cells = [{"model": r.model, "optimizer": r.optimizer, "workers": r.workers,
            "passed": r.passed, "reference_floor": r.reference_floor,
            "checks": [dataclasses.asdict(c) for c in r.checks]} for r in reports]
  harness.write_files(out_dir, {
      "parity_matrix.md": f"# Parity matrix\n\n{format_matrix(reports)}\n",
      "parity_matrix.json": json.dumps({"passed": all(r.passed for r in reports),
                                        "cells": cells}, indent=2)})


def write_report(report: Report, out_dir: str) -> None:
  """parity_report.md, parity_report.json and loss_curves.png in out_dir."""
  harness.write_report(out_dir, "parity", report, format_table(report), _plot)


# How each run is drawn: where runs agree their curves lie on each other, each still seen.
_STYLE = {"reference": dict(color="tab:blue", linewidth=6, alpha=0.3),
          "keras": dict(color="tab:orange", linewidth=2, marker="o", markersize=3),
          "estimator": dict(color="tab:green", linewidth=1, linestyle="--", marker="x",
                            markersize=5)}


def _plot(report: Report, fig) -> None:
  """A column per phase (the short run, the long one): each run's per-step loss above, drawn
  so agreeing curves each show; below, every pair's relative difference on a log scale under
  the limit its check holds it to; then, where they were recorded, each backend's learning
  rate per step. A statistical check: its progress-window losses."""
  if report.seeds:
    _plot_curves(report, fig)
    return
  phases = [p for p in ("short", "long") if any(r.startswith(p + "/") for r in report.losses)]
  rows = 3 if any(report.rates.values()) else 2
  axes = fig.subplots(rows, len(phases), squeeze=False)
  fig.set_size_inches(6 * len(phases) + 2, 4 * rows)
  limits = {c.name: c.limit for c in report.checks}
  for column, phase in enumerate(phases):
    top, bottom = axes[0][column], axes[1][column]
    runs = {r.split("/", 1)[1]: v for r, v in report.losses.items() if r.startswith(phase + "/")}
    for run, values in runs.items():
      top.plot(range(1, len(values) + 1), values, label=run,
               **_STYLE.get(run.split(" on ")[0], {}))
    top.set(yscale="log", ylabel="training loss (global batch)",
            title=f"{phase} run: {report.steps if phase == 'short' else report.long_steps} steps")
    top.legend()
    check = ("per-step loss rel diff" if phase == "short"
             else "loss curve rel diff, long run")
    for width, (a, b) in zip((5, 3, 1.5, 1), itertools.combinations(runs, 2)):
      if len(runs[a]) == len(runs[b]):  # Wider lines first: a pair under another still shows.
        rel = harness.relative_diff(runs[a], runs[b])
        bottom.plot(range(1, len(rel) + 1), np.maximum(rel, 1e-12), linewidth=width,
                    label=f"{a} vs {b}")
    if phase == "long":
      bottom.axvline(CURVE_START_STEP, color="grey", linestyle=":",
                     label=f"compared from step {CURVE_START_STEP}")
    limit = limits.get(f"{check} keras vs estimator")
    if limit:
      bottom.axhline(limit, color="red", linestyle=":", label=f"limit {limit:g}")
    bottom.set(yscale="log", xlabel="step", ylabel="|relative loss difference| (floor 1e-12)")
    for ax in (top, bottom):
      ax.xaxis.get_major_locator().set_params(integer=True)
    bottom.legend(fontsize="small")
    if rows == 3:
      rates = axes[2][column]
      for backend in BACKENDS:
        values = report.rates.get(f"{phase}/{backend}", [])
        rates.plot(range(1, len(values) + 1), values, label=backend, **_STYLE[backend])
      rates.set(xlabel="step", ylabel="learning rate", title=f"{phase} run: the rate of each "
                "step, as each backend recorded it")
      rates.legend(fontsize="small")


def _plot_curves(report: Report, fig) -> None:
  ax = fig.subplots()
  colors = {}
  for run, points in report.curves.items():
    seed, backend = run.split(", ")
    steps, losses = zip(*points) if points else ((), ())
    line, = ax.plot(steps, losses, color=colors.get(seed), label=run,
                    linestyle="-" if backend == "keras" else "--")
    colors.setdefault(seed, line.get_color())
  ax.set(yscale="log", xlabel="step", ylabel="training loss (progress window mean)",
         title=f"{report.seeds} seeds, {report.workers} asynchronous workers, "
               f"{report.ps} parameter server(s): Keras solid, the Estimator dashed")
  ax.legend(fontsize="small")
