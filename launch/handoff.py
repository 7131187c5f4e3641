r"""Proves that carrying a run across backends mid-training changes nothing.

  python -m launch.handoff --workers=2 [--split_at=500] [--train_steps=1000] \
      [--resume_steps=10] [--out=DIR] [--data_dir=DIR]

From one initial-weights file, with op determinism, at each worker count:
A: the Estimator trains 0 -> split and resumes; B: its checkpoint at the split
converted (launch.convert), Keras resumes; C: Keras trains 0 -> split and
resumes; D: its checkpoint converted, the Estimator resumes. Checks that every
Estimator variable is mapped, that the converted model predicts as the
Estimator's export, that A = B and C = D (weights, per-step losses) and that
the learning rate goes on from the split; measures how far a resumed run is
from an uninterrupted one. Prints the table, writes handoff_report.{md,json}
and loss_curves.png to --out, and exits 0 only if every check passes.
"""

import dataclasses
import sys
import tempfile
from typing import Sequence

from absl import app
from absl import flags

from launch import console
from launch.tools import convert
from launch.tools import handoff
from launch.tools import runs
from trainers.config import Config

_WORKERS = flags.DEFINE_list("workers", ["2"], "Worker counts to run at, e.g. 1,2.")
_SPLIT_AT = flags.DEFINE_integer("split_at", 500, "The step at which each run is handed over.")
_TRAIN_STEPS = flags.DEFINE_integer("train_steps", 1000, "The learning-rate schedule's length "
                                    "(every run decays over it).")
_RESUME_STEPS = flags.DEFINE_integer("resume_steps", 10, "Steps each resumed run trains past "
                                     "the split.")
_OUT = flags.DEFINE_string("out", None, "Output directory (default: a new temporary one).")
_DATA_DIR, _MNIST_IDX_DIR = runs.define_data_flags()
_SEED = flags.DEFINE_integer("seed", Config.seed, "Seeds the initial-weights file and shuffles.")
_TIMEOUT = flags.DEFINE_float("timeout", 1800, "Seconds allowed for each run.")
_MEASURE_UNINTERRUPTED = flags.DEFINE_bool(
    "measure_uninterrupted", True, "Also train each backend without a stop (two more runs per "
    "worker count) and report how far the resumed runs are from them.")
_TOLERANCES = {f.name: flags.DEFINE_float(f.name, f.default, f"Limit: {f.name}.")
               for f in dataclasses.fields(handoff.Tolerances)}


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}", exitcode=2)
  console.quiet_records(flags.FLAGS.verbosity)  # Their runs' logs keep everything.
  workers = runs.worker_counts(_WORKERS.value)
  if not 0 < _SPLIT_AT.value < _TRAIN_STEPS.value or _RESUME_STEPS.value < 1:
    raise app.UsageError("Need 0 < --split_at < --train_steps and --resume_steps >= 1.",
                         exitcode=2)
  if _SPLIT_AT.value + _RESUME_STEPS.value > _TRAIN_STEPS.value:
    raise app.UsageError("--split_at + --resume_steps must not pass --train_steps.", exitcode=2)
  config = Config(seed=_SEED.value, data_dir=_DATA_DIR.value)
  for n in workers:
    runs.check_or_exit(config, n, _MNIST_IDX_DIR.value)
  out = _OUT.value or tempfile.mkdtemp(prefix="handoff-")
  try:
    report = handoff.run_handoff(
        config, workers, out, split_at=_SPLIT_AT.value, train_steps=_TRAIN_STEPS.value,
        resume_steps=_RESUME_STEPS.value, timeout=_TIMEOUT.value,
        measure_uninterrupted=_MEASURE_UNINTERRUPTED.value,
        tolerances=handoff.Tolerances(**{k: v.value for k, v in _TOLERANCES.items()}))
  except (runs.RunError, convert.ConversionError) as e:  # Names the run's log, or the variable.
    sys.exit(f"error: {e}")
  handoff.write_report(report, out)
  print(handoff.format_table(report))
  print(f"Report: {out}/handoff_report.md, handoff_report.json, loss_curves.png")
  sys.exit(0 if report.passed else 1)


if __name__ == "__main__":
  app.run(main, flags_parser=console.parse_flags)
