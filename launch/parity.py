r"""Proves, number by number, that the Keras and Estimator backends train the same model.

  python -m launch.parity --workers=2 [--train_steps=10] [--long_steps=N] [--out=DIR]
  python -m launch.parity --model=cnn_bn --model_options=dropout=0 --measure_seeds=3
  python -m launch.parity --workers=2 --engine=ray --long_steps=0
  python -m launch.parity --workers=1,2 --ps=1 [--statistical_seeds=3] [--statistical_steps=N]
  python -m launch.parity --workers=2 --learning_rate_schedule=exponential --decay_rate=0.5 \
      --decay_steps=4 --staircase --warmup_steps=3 [--clip_global_norm=N]
  python -m launch.parity --workers=1,2 --estimator_program=team_program:PROGRAM \
      --model=team_port:SPEC --assignment_map=team_map.json --optimizer=adam \
      --learning_rate=1e-4 --learning_rate_schedule=constant

Trains Keras (Model.fit, N local workers), the Estimator (train_and_evaluate,
N local workers) and a single-process GradientTape reference from one
initial-weights file, with op determinism, and compares weights, per-step
losses, shards, accuracy and evaluation. Prints the table, writes
parity_report.{md,json} and loss_curves.png to --out, and exits 0 only if
every check passes. With several worker counts (--workers=1,2) it runs the
suite at each, into --out/workers-<N>, and passes only if every one passes.
With --engine=ray the short run of each backend is also trained on Ray Train
(launch.ray) and held to its local run: the engine changes nothing.
The reference cannot draw a backend's dropout masks, so parity needs the rate at
0; --measure_seeds=N then also trains both backends N times with dropout on and
reports each test accuracy, measured and not checked.
With --estimator_program the Estimator trains a team's own model_fn on its input_fn and
Keras the port (--model) on the same input, from the port's initial weights under the
program's names (--assignment_map, the converter's); first, before anything trains, the
names, the recipe (optimizer, hyperparameters, each step's rate) and the input (the same
batches in a graph as eagerly) are held to the port's, or it exits 2 naming what differs
(docs/MIGRATION.md, "Prove your port").
With --ps both backends train on parameter servers: at one worker their steps are
sequential and held to the reference as without them; at more they are asynchronous, and
each backend trains --statistical_seeds times for --statistical_steps instead, both from one
initial-weights file per seed, and the means over the seeds are checked (test accuracy
and loss): a statistical check, and the report says so.
Every run takes the trainers' schedule and clipping flags (--learning_rate_schedule and
its settings, --decay_steps, --warmup_steps, --clip_global_norm): each step's rate is held
to the reference's to the bit, and with clipping at 2 workers and more the reference
clipping the summed gradients instead must end apart from both backends.
"""

import dataclasses
import os
import sys
from typing import List, Sequence, Tuple

from absl import app
from absl import flags

from launch import console

console.quiet_tool_process()  # Before the imports below load TensorFlow.
from launch.proofs import harness  # noqa: E402 -- after quiet_tool_process
from launch.proofs import parity  # noqa: E402 -- after quiet_tool_process
from launch.proofs import reference  # noqa: E402 -- after quiet_tool_process
from launch.proofs import runs  # noqa: E402 -- after quiet_tool_process
from launch.proofs import tool_flags  # noqa: E402 -- after quiet_tool_process
from trainers import flags as trainer_flags  # noqa: E402 -- after quiet_tool_process
from trainers import config as config_lib  # noqa: E402 -- after quiet_tool_process
from trainers.config import Config  # noqa: E402 -- after quiet_tool_process

_WORKERS = tool_flags.define_workers([2], "Local worker counts, each run by both backends.")
_TRAIN_STEPS = tool_flags.define_train_steps(10, "Steps of the short run.")
_LONG_STEPS = flags.DEFINE_integer("long_steps", None, "Steps of the long run (default: one "
                                   "epoch of the training split; 0 skips it).")
_OUT = tool_flags.define_out("parity_report.{md,json}, loss_curves.png (parity_matrix.{md,json})")
_DATA_DIR, _MNIST_IDX_DIR = tool_flags.define_data_flags()
_MODELS = flags.DEFINE_list("model", [Config.model], "Models to prove, comma-separated: built-in "
                            "names or package.module:NAME; all: every built-in.")
_OPTIMIZERS = flags.DEFINE_list("optimizer", [Config.optimizer], "Optimizers to prove each model "
                                "with, comma-separated; all: "
                                + ", ".join(config_lib.OPTIMIZER_DEFAULTS)
                                + ". A canned model (dnn, linear, wide_deep) trains once, "
                                "with its own (--dnn_optimizer, --linear_optimizer).")
_CONFIG = trainer_flags.define_config_flags(("model_options", "task",
                                             *trainer_flags.PROGRAM_FIELDS,
                                             *trainer_flags.WARM_START_FIELDS,
                                             *config_lib.HYPERPARAMETERS,
                                             *config_lib.CANNED_SETTINGS,
                                             *trainer_flags.STEP_FIELDS, "decay_steps"))
_ASSIGNMENT_MAP = tool_flags.define_assignment_map()
_SEED = flags.DEFINE_integer("seed", Config.seed, "Seeds the initial-weights file and shuffles.")
_TIMEOUT = tool_flags.define_timeout()
_ENGINE = tool_flags.define_engine(
    "Also train the short run of both backends on this engine (ray: launch.ray, a Ray "
    "cluster started on this machine), each held to its local run: weights within "
    "--weight_atol, per-step losses, shards and evaluation.")
_MEASURE_SEEDS = flags.DEFINE_integer(
    "measure_seeds", 0, "Also train both backends with seeds 1..N for --measure_steps, with "
    "--measure_model_options, and report each test accuracy, unchecked: the reference "
    "cannot draw a backend's dropout masks.")
_MEASURE_STEPS = flags.DEFINE_integer(
    "measure_steps", None, "Steps of each --measure_seeds run (default: the long run's, or "
    "one epoch if it is skipped).")
_MEASURE_OPTIONS = flags.DEFINE_string(
    "measure_model_options", "", "--model_options of the --measure_seeds runs (default: the "
    "model's own, dropout on).")
_PS = tool_flags.define_ps("At more workers, whose steps are asynchronous, the check is "
                           "statistical (--statistical_seeds).")
_STATISTICAL_SEEDS = flags.DEFINE_integer(
    "statistical_seeds", 3, "With --ps at more than one worker: each backend trains this many "
    "times (seeds --seed, --seed + 1, ...) for --statistical_steps, and the means are checked.")
_STATISTICAL_STEPS = flags.DEFINE_integer(
    "statistical_steps", None, "Steps of each --statistical_seeds run (default: one epoch of "
    "the training split).")
_TOLERANCES = {f.name: flags.DEFINE_float(f.name, f.default, f"Limit: {f.name}.")
               for f in dataclasses.fields(parity.Tolerances)}


def _matrix() -> List[Tuple[str, str]]:
  """The (model, optimizer) pairs --model and --optimizer name (a canned model once, with
  the default optimizer, which it does not read); a usage error (exit 2) for an empty
  list, or --model_options with several models."""
  models = tool_flags.models(_MODELS)
  optimizers = (list(config_lib.OPTIMIZER_DEFAULTS) if _OPTIMIZERS.value == ["all"]
                else _OPTIMIZERS.value)
  if not models or not optimizers:
    raise app.UsageError("--model and --optimizer each need at least one name.", exitcode=2)
  if len(models) > 1 and _CONFIG["model_options"].value:
    raise app.UsageError("--model_options goes with one --model: the options are a model's "
                         "own.", exitcode=2)
  if _CONFIG["estimator_program"].value and (len(models) > 1 or len(optimizers) > 1):
    raise app.UsageError("--estimator_program goes with one --model, its port, and one "
                         "--optimizer, the one its model_fn trains with.", exitcode=2)
  return [(m, o) for m in models
          for o in ([Config.optimizer] if m in config_lib.CANNED else dict.fromkeys(optimizers))]


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}", exitcode=2)
  console.quiet_records(flags.FLAGS.verbosity)  # Their runs' logs keep everything.
  workers = tool_flags.worker_counts(_WORKERS)
  train_steps = tool_flags.train_steps(_TRAIN_STEPS)
  timeout = tool_flags.timeout(_TIMEOUT)
  engine = tool_flags.engine(_ENGINE)
  if engine != "local" and min(workers) < 2:
    raise app.UsageError(f"--engine={engine} runs clusters: give --workers of 2 or more.",
                         exitcode=2)
  ps = tool_flags.parameter_servers(_PS, workers, engine, asynchronous=True)
  if ps and max(workers) > 1 and (_STATISTICAL_SEEDS.value < 2 or _MEASURE_SEEDS.value
                                  or (_STATISTICAL_STEPS.value or 1) < 1):
    raise app.UsageError("--ps at more than one worker is checked statistically: give "
                         "--statistical_seeds of 2 or more, --statistical_steps of 1 or more, "
                         "and no --measure_seeds (every run is measured).", exitcode=2)
  referenced = [n for n in workers if not (ps and n > 1)]  # The others are statistical.
  if referenced:  # The reference trains in this process at that count, in a child at others.
    reference.compute_as_workers(max(referenced))
  matrix = _matrix()
  several = len({m for m, _ in matrix}) > 1
  configs = [Config(seed=_SEED.value, data_dir=_DATA_DIR.value,
                    **tool_flags.model_settings(_CONFIG, several, model=m, optimizer=o))
             for m, o in matrix]
  if _MEASURE_SEEDS.value < 0:
    raise app.UsageError("--measure_seeds must be >= 0.", exitcode=2)
  if _MEASURE_STEPS.value is not None and _MEASURE_STEPS.value < 1:
    raise app.UsageError("--measure_steps must be >= 1.", exitcode=2)
  for config in configs:
    trainer_flags.config_settings({}, model=config.model,  # Exit 2 if malformed.
                                  model_options=_MEASURE_OPTIONS.value)
    for n in workers:
      runs.check_or_exit(config, n, _MNIST_IDX_DIR.value)
  # Each program's probe, at each worker count, before anything trains or is written.
  programs = {(c.model, n): tool_flags.probe_program(c, n, train_steps, _ASSIGNMENT_MAP)
              for c in configs for n in workers}
  output = tool_flags.Output(_OUT, "parity", ("parity_*", "loss_curves.png"))
  out = output.path
  reports = []
  for config in configs:
    for n in workers:
      where = out
      if len(configs) > 1:
        where = os.path.join(where, parity.cell_name(config))
      if len(workers) > 1:
        where = os.path.join(where, f"workers-{n}")
      tolerances = parity.Tolerances(**{k: v.value for k, v in _TOLERANCES.items()})
      try:
        if ps and n > 1:
          report = parity.run_statistical(
              config, n, where, ps=ps, seeds=_STATISTICAL_SEEDS.value,
              steps=_STATISTICAL_STEPS.value, tolerances=tolerances, timeout=timeout,
              program=programs.get((config.model, n)))
        else:
          report = parity.run_parity(
              config, n, where, steps=train_steps, long_steps=_LONG_STEPS.value,
              tolerances=tolerances, measure_seeds=_MEASURE_SEEDS.value,
              measure_steps=_MEASURE_STEPS.value, measure_model_options=_MEASURE_OPTIONS.value,
              engine=engine, timeout=timeout, program=programs.get((config.model, n)), ps=ps)
      except runs.RunError as e:  # A backend run failed: its log is named in the message.
        sys.exit(f"error: {e}")
      parity.write_report(report, where)
      print(harness.for_terminal(parity.format_table(report)))
      print(f"Report: {where}/parity_report.md, parity_report.json, loss_curves.png")
      reports.append(report)
  if len(reports) > 1:
    parity.write_matrix(reports, out)
    print(harness.for_terminal(parity.format_matrix(reports)))
    print(f"Matrix: {out}/parity_matrix.md, parity_matrix.json")
  passed = all(r.passed for r in reports)
  output.finish(passed)
  sys.exit(0 if passed else 1)


if __name__ == "__main__":
  app.run(main, flags_parser=console.parse_flags)
