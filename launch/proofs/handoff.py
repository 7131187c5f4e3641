"""Handoff: an Estimator run carried across to Keras (and back) changes nothing, number by number.

From one initial-weights file, with op determinism, at each worker count, each
backend trains 0 -> split and stops; then, to `train_steps`:

- estimator-then-estimator: the Estimator resumes its own checkpoint;
- estimator-then-keras: the same checkpoint, `launch.convert`ed, Keras resumes it;
- keras-then-keras: Keras resumes its own checkpoint;
- keras-then-estimator: the same Keras checkpoint, converted, the Estimator resumes it.

A resumed run builds its input pipeline again, so it reads other batches than
an uninterrupted run would: each backend's own resume is compared with its
handed-over one, which read the same. Every run's learning rate decays over
`decay_steps`, so stopping at `split` leaves the schedule as an uninterrupted
run has it. How far a resumed run is from an uninterrupted one is measured and
reported, not checked.

With a team's program (config.estimator_program, probed by program_probe) the Estimator
legs run their model_fn and the Keras legs the port, the conversions map between their
names (the probe's assignment map), and where the program exports, each export is held to
the other side's (serving_check.compare_exports).
"""

import dataclasses
import os
import shutil
from typing import Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from launch.convert import carry
from launch.convert import kinds
from launch.proofs import harness
from launch.proofs import program_probe
from launch.proofs import reference
from launch.proofs import runs
from launch.proofs import serving_check
from trainers import checkpoints
from trainers import keras_trainer
from trainers import model_dir as layout
from trainers import schedules
from trainers.config import Config

Check = harness.Check


@dataclasses.dataclass(frozen=True)
class Tolerances:
  weight_atol: float = 1e-6
  loss_rtol: float = 1e-5
  logits_atol: float = 1e-5
  learning_rate_atol: float = 1e-7  # Both schedules compute in float32.


@dataclasses.dataclass
class Report:
  workers: List[int]
  split_at: int
  train_steps: int
  decay_steps: Optional[int]  # None: a canned model's constant rate.
  checks: List[Check]
  losses: Dict[str, List[float]]  # "<n>w/<run>": per-step training losses.
  measured: Dict[str, float]  # Reported, not checked: resumed vs uninterrupted runs.
  ps: int = 0  # The parameter servers every run trained on.
  from_model_dir: str = ""  # The team's model_dir whose newest checkpoint was the split.

  @property
  def passed(self) -> bool:
    return all(c.passed for c in self.checks)


class _Legs(harness.Runs):
  """The runs of one worker count, under `<out_dir>/<n>w/<run>/`; `own`: a backend's own
  changes to the config (a program's initial weights under its names)."""

  def __init__(self, config: Config, workers: int, out_dir: str, timeout: float,
               own: Optional[Dict[str, Dict]] = None, ps: int = 0):
    super().__init__(config, os.path.join(out_dir, f"{workers}w"), timeout)
    self.workers, self.own, self.ps = workers, own or {}, ps

  def train_to(self, name: str, backend: str, train_steps: int) -> Dict:
    """Trains `backend` in run `name`'s model_dir (resuming what it holds) to `train_steps`."""
    # Nothing here reads the Keras evaluator's results: the chief evaluates, one process fewer
    # (on parameter servers Keras's chief coordinates: the evaluator task evaluates).
    extra = ([f"--ps={self.ps}"] if self.ps else
             ["--noevaluator"] if backend == "keras" and self.workers > 1 else [])
    return self.train(name, backend, self.workers, extra_flags=extra, train_steps=train_steps,
                      checkpoint_every_steps=train_steps, **self.own.get(backend, {}))

  def copy(self, source: str, name: str) -> None:
    """A run's model_dir as it stood at the split, for a run of its own to resume."""
    shutil.copytree(self.model_dir(source), self.model_dir(name),
                    ignore=shutil.ignore_patterns(layout.PROGRESS_FILE, layout.SUMMARY_FILE))


def resume_checks(name: str, summaries: Dict[str, Dict], losses: Dict[str, List[float]],
                   backends: Dict[str, str], tolerances: Tolerances, config: Config,
                   assignment_map: Optional[Dict[str, Optional[str]]] = None) -> List[Check]:
  weights = {leg: harness.backend_weights(backends[leg], summaries[leg], config,
                                          assignment_map)
             for leg in summaries}
  return harness.named(harness.compare_runs(weights, losses, tolerances.weight_atol,
                                            tolerances.loss_rtol,
                                            "per-step loss rel diff after the split"),
                       lambda check: f"{name}: {check}")


def _resumed_from(summary: Dict) -> int:
  starts = [r for r in runs.read_progress(summary["model_dir"]) if r["event"] == "start"]
  return starts[-1]["from_step"] if starts else -1


def carried_rate(backend: str, model_dir: str, config: Config) -> Tuple[int, float]:
  """The step a converted checkpoint holds, and the rate `backend` would train its next step
  with: that backend's own schedule (Keras's LearningRateSchedule, the Estimator's v1
  function), fed with the restored step."""
  path = tf.train.latest_checkpoint(model_dir)
  if backend == "keras":
    model = keras_trainer.compile_model(config)
    tf.train.Checkpoint(model=model).restore(path).expect_partial()
    step = model.optimizer.iterations
    return int(step.numpy()), float(schedules.keras_schedule(config)(step))
  step = int(tf.train.load_checkpoint(path).get_tensor("global_step"))
  if config.estimator_program:  # The program's own rate, read off its update op.
    from trainers import estimator_program  # noqa: PLC0415 -- tf.estimator: TF 2.15 only.
    return step, estimator_program.recipe_values(estimator_program.graph(config),
                                                 [step])["rates"][0]
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    return step, float(session.run(schedules.v1_rate(config, tf.constant(step, tf.int64))))


def rate_check(name: str, backend: str, model_dir: str, config: Config, split_at: int,
                atol: float) -> Check:
  """The resumed run's first rate: the schedule's at the split (written out), not at 0."""
  step, got = carried_rate(backend, model_dir, config)
  want = reference.rate(config, split_at)
  return Check(f"{name}: learning rate at step {split_at + 1}", abs(got - want) <= atol,
               abs(got - want), atol, f"carried step {step}: rate {got:.6g}, schedule at the "
               f"split {want:.6g}")


# Each backend's own resume, and the other backend's resume of the same checkpoint.
PAIRS = (("estimator-then-estimator", "estimator-then-keras"),
         ("keras-then-keras", "keras-then-estimator"))


def run_handoff(config: Config, workers: List[int], out_dir: str, *, split_at: int,
                train_steps: int, decay_steps: int,
                tolerances: Tolerances = Tolerances(), timeout: float = runs.TIMEOUT_SECONDS,
                measure_uninterrupted: bool = True,
                program: Optional[program_probe.Probe] = None, ps: int = 0) -> Report:
  """Runs the four resumed runs (and the uninterrupted ones) at each worker count, and
  checks them.

  Args:
    config: hyperparameters; train_steps, decay_steps, init_weights, record_dir
      and deterministic are set here.
    workers: worker counts to run at.
    out_dir: runs, records, conversions and the weights file go here.
    split_at: the step at which each first run stops and is handed over.
    train_steps: the step every resumed run trains to.
    decay_steps: the schedule's length: every run's learning rate decays over it.
    tolerances: the limits of the checks.
    timeout: seconds for each run.
    measure_uninterrupted: also train each backend without a stop (two runs per
      worker count) and report how far the resumed runs are from them.
    program: with config.estimator_program, what program_probe.probe found of it.
    ps: parameter servers every run trains on (their --ps; at one worker).

  Returns:
    The report; `report.passed` only if every check passed.
  """
  if program:  # A backend's dropout draws other masks than the other's.
    config = harness.deterministic(config)
  config = dataclasses.replace(harness.prepare(config, out_dir), decay_steps=decay_steps)
  names = program.assignment_map if program else None
  own = ({"estimator": program_probe.estimator_changes(program, config, out_dir)}
         if program else {})
  end = train_steps
  checks: List[Check] = []
  losses: Dict[str, List[float]] = {}
  measured: Dict[str, float] = {}
  for n in workers:
    run = _Legs(config, n, out_dir, timeout, own, ps)
    first = {"estimator": run.train_to("estimator-first", "estimator", split_at),
             "keras": run.train_to("keras-first", "keras", split_at)}
    for backend in first:
      losses[f"{n}w/{backend} 0-{split_at}"] = run.losses(f"{backend}-first")

    checks += _handover_checks(run, f"{n}w", first, config, split_at, tolerances, program)

    run.copy("estimator-first", "estimator-then-estimator")
    run.copy("keras-first", "keras-then-keras")
    legs = [leg for pair in PAIRS for leg in pair]
    summaries = {leg: run.train_to(leg, _resumer(leg), end) for leg in legs}
    backends = {leg: _resumer(leg) for leg in legs}
    for leg, summary in summaries.items():
      losses[f"{n}w/{leg}"] = run.losses(leg)
      checks.append(Check(f"{n}w {leg}: resumed from the split", _resumed_from(summary) == split_at,
                          float(_resumed_from(summary)), float(split_at), "its start record"))
    for pair in PAIRS:
      checks += resume_checks(f"{n}w {' vs '.join(pair)}", {leg: summaries[leg] for leg in pair},
                               {leg: losses[f"{n}w/{leg}"] for leg in pair},
                               backends, tolerances, config, names)

    # Reported, not checked: a resumed run against an uninterrupted one.
    for leg, _ in PAIRS if measure_uninterrupted else ():
      backend = _resumer(leg)
      whole = run.train_to(f"{backend}-uninterrupted", backend, end)
      both = {leg: summaries[leg], "whole": whole}
      weights = {k: harness.backend_weights(backend, s, config, names)
                 for k, s in both.items()}
      measured[f"{n}w {leg} vs uninterrupted {backend}: max |weight diff|"] = max(
          float(np.max(np.abs(weights[leg][v] - weights["whole"][v]))) for v in weights[leg])
      whole_losses = run.losses(f"{backend}-uninterrupted")[split_at:]
      measured[f"{n}w {leg} vs uninterrupted {backend}: max per-step loss rel diff"] = max(
          abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses[f"{n}w/{leg}"], whole_losses))
  return Report(workers=list(workers), split_at=split_at, train_steps=train_steps,
                decay_steps=None if config.canned_settings() else decay_steps, checks=checks,
                losses=losses, measured=measured, ps=ps)


def their_step(model_dir: str) -> int:
  """The global step of the newest checkpoint in `model_dir` (an Estimator's).

  Raises:
    ValueError: it holds no checkpoint, or one without a global_step.
  """
  path = tf.train.latest_checkpoint(model_dir)
  if path is None:
    raise ValueError(f"{model_dir} holds no checkpoint (no `checkpoint` file naming one): "
                     "give the model_dir your program trains in.")
  try:
    return int(tf.train.load_checkpoint(path).get_tensor("global_step"))
  except (tf.errors.NotFoundError, tf.errors.DataLossError) as e:
    raise ValueError(f"{path} has no readable global_step ({type(e).__name__}): give the "
                     "model_dir an Estimator wrote.") from e


def _copy_newest(model_dir: str, dst: str) -> None:
  """The newest checkpoint of `model_dir` (its files alone, and a `checkpoint` file naming
  it) into a new `dst`, for a run to resume: `model_dir` is read, never written."""
  path = tf.train.latest_checkpoint(model_dir)
  os.makedirs(dst)
  for name in tf.io.gfile.glob(path + ".*"):
    shutil.copy2(name, dst)
  tf.compat.v1.train.update_checkpoint_state(dst, os.path.basename(path))


# From a team's model_dir: the Estimator's own resume of their checkpoint, against Keras's
# resume of it converted, and the Estimator's of it converted to Keras and back.
FROM_THEIRS = ("estimator-then-estimator", "estimator-then-keras", "keras-then-estimator")


def run_from_model_dir(config: Config, workers: List[int], out_dir: str, *, model_dir: str,
                       train_steps: int, tolerances: Tolerances = Tolerances(),
                       timeout: float = runs.TIMEOUT_SECONDS,
                       program: Optional[program_probe.Probe] = None) -> Report:
  """The handoff from the newest checkpoint of a model_dir the team's program wrote (at its
  step, the split), both ways, at each worker count: their checkpoint resumed by the
  Estimator as it is (estimator-then-estimator), converted to Keras and resumed by Keras
  (estimator-then-keras), and converted to Keras and back, resumed by the Estimator
  (keras-then-estimator), each to `train_steps`. Checks, before a step is taken: every
  variable is mapped or ignored, the round trip gives back every carried value to the bit,
  each converted checkpoint serves as their checkpoint does (where the program exports) and
  carries the learning rate; after: each resume against the Estimator's own (weights,
  per-step losses). `model_dir` is only read.

  Raises:
    ValueError: `model_dir` has no checkpoint with a step below `train_steps`.
    runs.RunError, ConversionError: a run or a conversion failed.
  """
  split_at = their_step(model_dir)
  if not split_at < train_steps:
    raise ValueError(f"{model_dir} is at step {split_at}: give a --train_steps above it.")
  # Deterministic, as every proof; no initial weights: every run resumes a checkpoint.
  config = dataclasses.replace(harness.deterministic(config), deterministic=True)
  names = program.assignment_map if program else None
  checks: List[Check] = []
  losses: Dict[str, List[float]] = {}
  for n in workers:
    run = _Legs(config, n, out_dir, timeout)
    _copy_newest(model_dir, run.model_dir("estimator-then-estimator"))
    to_keras = carry.estimator_to_keras(model_dir, run.model_dir("estimator-then-keras"),
                                        assignment_map=names, config=config)
    carry.keras_to_estimator(run.model_dir("estimator-then-keras"),
                             run.model_dir("keras-then-estimator"), assignment_map=names,
                             config=config)
    checks += _mapped_check(f"{n}w", to_keras)
    checks.append(_round_trip_check(f"{n}w", to_keras, run.model_dir("keras-then-estimator")))
    from trainers import estimator_trainer  # noqa: PLC0415 -- tf.estimator: TF 2.15 only.
    checks += _served(
        f"{n}w", estimator_trainer.export_checkpoint(run.model_dir(FROM_THEIRS[0]), config,
                                                     run.run_dir("export")),
        serving_check.export_keras_checkpoint(run.model_dir("estimator-then-keras"), config,
                                              run.run_dir("converted-export")),
        ("program", "converted Keras"), config, tolerances, program)
    checks += _carried(run, f"{n}w", config, split_at, tolerances)
    summaries = {leg: run.train_to(leg, _resumer(leg), train_steps) for leg in FROM_THEIRS}
    for leg, summary in summaries.items():
      losses[f"{n}w/{leg}"] = run.losses(leg)
      checks.append(Check(f"{n}w {leg}: resumed from the split", _resumed_from(summary) == split_at,
                          float(_resumed_from(summary)), float(split_at), "its start record"))
    for other in FROM_THEIRS[1:]:
      pair = (FROM_THEIRS[0], other)
      checks += resume_checks(f"{n}w {' vs '.join(pair)}", {leg: summaries[leg] for leg in pair},
                              {leg: losses[f"{n}w/{leg}"] for leg in pair},
                              {leg: _resumer(leg) for leg in pair}, tolerances, config, names)
  return Report(workers=list(workers), split_at=split_at, train_steps=train_steps,
                decay_steps=None if config.canned_settings() else config.decay_steps,
                checks=checks, losses=losses, measured={}, from_model_dir=model_dir)


def _mapped_check(size: str, to_keras: kinds.Conversion) -> List[Check]:
  """Every Estimator variable of the conversion's source mapped or ignored."""
  variables = len(tf.train.list_variables(to_keras.source))
  # By source: wide_deep_v1's global_step gives both of its twin's parts their step.
  mapped = {m.source for m in to_keras.mapped}
  accounted = len(mapped | {i.name for i in to_keras.ignored})
  ignored = ", ".join(i.name for i in to_keras.ignored) or "none"
  return [Check(f"{size}: every Estimator variable mapped or ignored", accounted == variables,
                float(accounted), float(variables), f"{len(mapped)} mapped, ignored: {ignored}")]


def _round_trip_check(size: str, to_keras: kinds.Conversion, back: str) -> Check:
  """Every carried value of the source checkpoint, converted to Keras and back, to the bit."""
  first = tf.train.load_checkpoint(to_keras.source)
  second = tf.train.load_checkpoint(tf.train.latest_checkpoint(back))
  sources = sorted({m.source for m in to_keras.mapped})
  missing = [s for s in sources if not second.has_tensor(s)]
  diff = max((float(np.max(np.abs(first.get_tensor(s).astype(np.float64)
                                  - second.get_tensor(s).astype(np.float64)), initial=0.0))
              for s in sources if s not in missing), default=0.0)
  return Check(f"{size}: the checkpoint converted to Keras and back, max |value diff|",
               diff == 0 and not missing, diff, 0.0,
               f"{len(sources) - len(missing)} variables" + (f"; not written back: "
                                                             f"{', '.join(missing)}"
                                                             if missing else ""))


def _handover_checks(run: _Legs, size: str, first: Dict[str, Dict], config: Config,
                     split_at: int, tolerances: Tolerances,
                     program: Optional[program_probe.Probe] = None) -> List[Check]:
  """Converts each backend's checkpoint at the split (`first`: each backend's summary
  there) for the other, and checks the converted ones before any step is taken from them:
  every Estimator variable accounted for, each converted model serving as the export of
  the run it came from, and the learning rate each carries."""
  names = program.assignment_map if program else None
  to_keras = carry.estimator_to_keras(run.model_dir("estimator-first"),
                                        run.model_dir("estimator-then-keras"),
                                        assignment_map=names, config=config)
  carry.keras_to_estimator(run.model_dir("keras-first"),
                             run.model_dir("keras-then-estimator"), assignment_map=names,
                             config=config)
  checks = _mapped_check(size, to_keras)
  # Served as clients call it: each run's export and its converted checkpoint's, both
  # ways (a migration, and its way back).
  from trainers import estimator_trainer  # noqa: PLC0415 -- tf.estimator: TF 2.15 only.
  converted = {
      "estimator": serving_check.export_keras_checkpoint(
          run.model_dir("estimator-then-keras"), config, run.run_dir("converted-export")),
      "keras": estimator_trainer.export_checkpoint(
          run.model_dir("keras-then-estimator"), config,
          run.run_dir("converted-estimator-export"))}
  for source, pair in (("estimator", ("Estimator", "converted Keras")),
                       ("keras", ("Keras", "converted Estimator"))):
    checks += _served(size, first[source]["export_dir"], converted[source], pair, config,
                      tolerances, program)
  return checks + _carried(run, size, config, split_at, tolerances)


def _carried(run: _Legs, size: str, config: Config, split_at: int, tolerances: Tolerances
             ) -> List[Check]:
  """What each converted checkpoint carries before a step is taken from it: the learning
  rate of the split (a canned model's constant rate: the step)."""
  checks = []
  for leg in ("estimator-then-keras", "keras-then-estimator"):
    if config.canned_settings():
      step = checkpoints.checkpoint_step(tf.train.latest_checkpoint(run.model_dir(leg)))[1]
      checks.append(Check(f"{size} {leg}: step carried", step == split_at, float(step),
                          float(split_at), "the converted checkpoint's step"))
    else:
      checks.append(rate_check(f"{size} {leg}", _resumer(leg), run.model_dir(leg), config,
                               split_at, tolerances.learning_rate_atol))
  return checks


def _served(size: str, first_export: str, second_export: str, names: Tuple[str, str],
            config: Config, tolerances: Tolerances,
            program: Optional[program_probe.Probe] = None) -> List[Check]:
  """Two exports, of a checkpoint and of its conversion, held to each other as clients call
  them (a program's own signatures, where it exports)."""
  if program is None:
    served = serving_check.compare_models(first_export, second_export, config,
                                          tolerances.logits_atol, names)
  elif program.exports:  # The program's own signatures, and the port's of them.
    served = serving_check.compare_exports(first_export, second_export,
                                           lambda: serving_check.test_features(config),
                                           tolerances.logits_atol, names)
  else:
    served = []
  return harness.named(served, lambda check: f"{size}: {check}")


def _resumer(leg: str) -> str:
  """The backend that trains a resumed run: the second of its name."""
  return leg.rsplit("-then-", 1)[1]


def format_table(report: Report) -> str:
  rate = (f"on a {report.decay_steps}-step schedule" if report.decay_steps is not None
          else "at the canned model's constant rates")
  theirs = (f" (the newest checkpoint of {report.from_model_dir})" if report.from_model_dir
            else "")
  rows = [harness.format_checks(f"Handoff at step {report.split_at}{theirs}, resumed to step "
                               f"{report.train_steps} {rate}, workers {report.workers}"
                               + (f", {report.ps} parameter server(s)" if report.ps else ""),
                               report.checks)]
  if report.measured:
    rows += ["", "Resumed vs uninterrupted (measured, not checked: a resumed run rebuilds its "
             "input pipeline and reads other batches):", "| comparison | value |",
             "| --- | --- |"]
    rows += [f"| {k} | {v:.3g} |" for k, v in report.measured.items()]
  return "\n".join(rows)


def write_report(report: Report, out_dir: str) -> None:
  """handoff_report.md, handoff_report.json and loss_curves.png in out_dir."""
  harness.write_report(out_dir, "handoff", report, format_table(report), _plot)


def _plot(report: Report, fig) -> None:
  """The runs to the split as lines, the resumed runs after it as dashes."""
  ax = fig.subplots()
  for run, values in report.losses.items():
    first = " 0-" in run
    start = 1 if first else report.split_at + 1
    ax.plot(range(start, start + len(values)), values, label=run,
            linestyle="-" if first else "--", marker=None if first else ".")
  ax.axvline(report.split_at + 0.5, color="grey", linewidth=0.5)
  ax.set(yscale="log", xlabel="step", ylabel="training loss (global batch)",
         title=f"Handoff at step {report.split_at}")
  ax.legend(fontsize="small")
