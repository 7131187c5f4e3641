r"""Benchmarks both backends against the fastest bare loop on this machine.

  python -m launch.bench [--workers=1,2] [--train_steps=N] [--repeats=R] [--ps=N] [--out=DIR]
  python -m launch.bench --model=all --repeats=3

At each worker count it runs the ceiling run (a bare tf.function loop of K
steps per call, Keras's steps per execution, trained to the end: no strategy
at 1 worker, a bare MultiWorkerMirroredStrategy step in a cluster), a probe
timing the parts of a step (input, compute, all-reduce) and the ceiling's loops
(one or K steps per call, on the input pipeline or on a batch held in memory),
and the Keras and the Estimator binaries, on the same model, batch size and
input pipeline. The ceiling is the fastest of those loops. Prints a table
(steady examples/s and ms/step, ratio to the ceiling, launch to first step,
launch to 98% test accuracy, peak RSS per worker), the targets (each backend
against the bare K-step loop on the same pipeline; the pipeline against that
loop on a batch in memory), the step's parts (each entry's ms/step beside the
bare K-step loop), any run faster than the ceiling (a bug in the ceiling), for
each missed target where the time went, what Keras's evaluator task adds to a
step (keras against keras-noevaluator), and with --ps=N each backend's step on
N parameter servers against its step under MultiWorkerMirroredStrategy; writes
bench.json and bench.md to --out. With several models (--model=cnn,dnn, or all: every
built-in) each is benched in turn into --out/<model>/, and --out's bench.md holds one
table of every model's runs and targets, and why each missed target missed. It is a
benchmark: it exits 0 whatever the numbers, and 1 only if a run failed.
"""

import os
import sys
from typing import Any, Mapping, Sequence

from absl import app
from absl import flags
from absl import logging

from launch import console

console.quiet_tool_process()  # Before the imports below load TensorFlow.
from launch.bench import measure as bench_measure  # noqa: E402 -- after quiet_tool_process
from launch.bench import report as bench_report  # noqa: E402 -- after quiet_tool_process
from launch.bench import run as bench_run  # noqa: E402 -- after quiet_tool_process
from launch.proofs import harness  # noqa: E402 -- after quiet_tool_process
from launch.proofs import runs  # noqa: E402 -- after quiet_tool_process
from launch.proofs import tool_flags  # noqa: E402 -- after quiet_tool_process
from trainers import runner  # noqa: E402 -- after quiet_tool_process
from trainers import flags as trainer_flags  # noqa: E402 -- after quiet_tool_process
from trainers.config import Config  # noqa: E402 -- after quiet_tool_process

_WORKERS = tool_flags.define_workers([1, 2], "Worker counts to run each backend at.")
_TRAIN_STEPS = tool_flags.define_train_steps(
    Config.train_steps, "Training steps of every run (the trainers' default, so the accuracy "
    "figure is meaningful).")
_OUT = tool_flags.define_out("bench.{md,json}")
_DATA_DIR, _MNIST_IDX_DIR = tool_flags.define_data_flags()
_MODELS = flags.DEFINE_list("model", [Config.model], "Models to bench, comma-separated: "
                            "built-in names or package.module:NAME; all: every built-in. "
                            "Each is benched in turn, into --out/<model>/ when several.")
_CONFIG = trainer_flags.define_config_flags(
    tuple(f for f in trainer_flags.TRAINING_FIELDS if f != "model"))
_TIMEOUT = tool_flags.define_timeout()
_BACKENDS = flags.DEFINE_list("backends", bench_run.DEFAULT_ENTRIES, "Entries to run: keras, "
                              "estimator (each with its evaluator task in a cluster), and "
                              "keras-noevaluator (at 2+ workers: the Keras chief evaluates).")
_PS = flags.DEFINE_integer("ps", 0, "Also run keras and estimator (those of --backends) on this "
                           "many parameter servers, as keras-ps and estimator-ps: what a step "
                           "costs there against MultiWorkerMirroredStrategy.")
_LOG_EVERY = flags.DEFINE_integer("log_every_steps", None, "Steps per timing window (default: "
                                  f"{Config.log_every_steps}, fewer for short runs).")
_REPEATS = flags.DEFINE_integer("repeats", 1, "Rounds of every run; each number is then the "
                                "median over the rounds (3 or more on a noisy machine).")
_EVAL_EVERY = flags.DEFINE_integer("checkpoint_every_steps", Config.checkpoint_every_steps,
                                   "Steps between checkpoints and evaluations.")


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}", exitcode=2)
  console.quiet_records(flags.FLAGS.verbosity)  # Their runs' logs keep everything.
  workers = tool_flags.worker_counts(_WORKERS)
  train_steps, timeout = tool_flags.train_steps(_TRAIN_STEPS), tool_flags.timeout(_TIMEOUT)
  if _REPEATS.value < 1:
    raise app.UsageError("--repeats must be at least 1.", exitcode=2)
  unknown = set(_BACKENDS.value) - set(bench_run.DEFAULT_ENTRIES)
  if unknown:
    raise app.UsageError(f"Unknown --backends {sorted(unknown)} (--ps=N adds the "
                         "parameter-server entries).", exitcode=2)
  if _PS.value < 0:
    raise app.UsageError(f"--ps must be at least 0, got {_PS.value}.", exitcode=2)
  entries = _BACKENDS.value
  if not _BACKENDS.present and runner.estimator_unavailable():
    # The newest-TF install benches what it can run; asked for, the Estimator is an error.
    entries = [e for e in entries if bench_run.ENTRIES[e][0] != "estimator"]
    logging.warning("Leaving the estimator entry out: %s", runner.estimator_unavailable())
  # At least ~10 windows, so the median has something to choose from.
  log_every = _LOG_EVERY.value or max(1, min(Config.log_every_steps, train_steps // 10))
  models = tool_flags.models(_MODELS)
  if not models:
    raise app.UsageError("--model needs at least one name.", exitcode=2)
  several = len(models) > 1
  if several and _CONFIG["model_options"].value:
    raise app.UsageError("--model_options goes with one --model: the options are a model's "
                         "own.", exitcode=2)
  configs = [Config(train_steps=train_steps, data_dir=_DATA_DIR.value, log_every_steps=log_every,
                    checkpoint_every_steps=min(_EVAL_EVERY.value, train_steps),
                    **tool_flags.model_settings(_CONFIG, several, model=model))
             for model in models]
  if any(config.example_weights() for config in configs):
    # The bare loop's step and evaluation take (images, labels): unweighted.
    raise app.UsageError("--weight_column: the benchmark times unweighted steps; leave "
                         "--weight_column and --digit_weights out.", exitcode=2)
  if _PS.value:
    entries = [*entries, *(e + bench_run.PS_SUFFIX for e in entries if e in bench_run.BACKENDS)]
  backends = [bench_run.ENTRIES[e][0] for e in entries]
  for config in configs:
    for n in workers:
      runs.check_or_exit(config, n, _MNIST_IDX_DIR.value, backends)
  output = tool_flags.Output(_OUT, "bench", ("bench.md", "bench.json"))
  out = output.path
  started = bench_report.machine()
  benches = []
  for config in configs:
    where = os.path.join(out, config.model) if several else out
    os.makedirs(where, exist_ok=True)
    results, step_costs = bench_run.run_bench(config, workers, where, backends=entries,
                                              timeout=timeout, repeats=_REPEATS.value,
                                              ps=_PS.value)
    bench_report.write_report(results, step_costs, config, where, started, entries)
    _print(results, step_costs, entries, config.model if several else "")
    benches.append((config, results, step_costs))
  if several:
    bench_report.write_models_report(benches, out, started)
    print("\n" + harness.for_terminal(bench_report.format_models(benches)))
  print(f"Report: {out}/bench.md, {out}/bench.json")
  failed = any(r.error for _, results, _ in benches for r in results) or any(
      "error" in c for _, _, step_costs in benches for c in step_costs.values())
  output.finish(not failed)
  sys.exit(1 if failed else 0)


def _print(results: Sequence[bench_measure.Result], step_costs: Mapping[int, Mapping[str, Any]],
           entries: Sequence[str], model: str) -> None:
  """One model's tables and findings, headed by its name among several."""
  if model:
    print(f"\n== {model} ==")
  print(harness.for_terminal(bench_report.format_table(results, step_costs)))
  costs = bench_report.format_step_costs(results, step_costs, entries)
  print("\nWhere a step's time goes (ms):\n" + harness.for_terminal(costs))
  for line in bench_report.ceiling_bugs(results):
    print(f"- faster than the ceiling: {line}")
  for line in bench_report.explain(results, step_costs):
    print(f"- {line}")
  for line in bench_report.evaluator_costs(results):
    print(f"- the evaluator task: {line}")
  for line in bench_report.ps_costs(results):
    print(f"- on parameter servers: {line}")


if __name__ == "__main__":
  app.run(main, flags_parser=console.parse_flags)
