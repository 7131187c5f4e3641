r"""Proves, number by number, that the Keras and Estimator backends train the same model.

  python -m launch.parity --workers=2 [--steps=10] [--long_steps=N] [--out=DIR]

Trains Keras (Model.fit, N local workers), the Estimator (train_and_evaluate,
N local workers) and a single-process GradientTape reference from one
initial-weights file, with op determinism, and compares weights, per-step
losses, shards, accuracy and evaluation. Prints the table, writes
parity_report.{md,json} and loss_curves.png to --out, and exits 0 only if
every check passes.
"""

import dataclasses
import sys
import tempfile
from typing import Sequence

from absl import app
from absl import flags

from launch import console
from launch.tools import parity
from launch.tools import runs
from trainers.config import Config

_WORKERS = flags.DEFINE_integer("workers", 2, "Local workers for both backends.")
_STEPS = flags.DEFINE_integer("steps", 10, "Steps of the short run.")
_LONG_STEPS = flags.DEFINE_integer("long_steps", None, "Steps of the long run (default: one "
                                   "epoch of the training split; 0 skips it).")
_OUT = flags.DEFINE_string("out", None, "Output directory (default: a new temporary one).")
_DATA_DIR, _MNIST_IDX_DIR = runs.define_data_flags()
_SEED = flags.DEFINE_integer("seed", Config.seed, "Seeds the initial-weights file and shuffles.")
_TIMEOUT = flags.DEFINE_float("timeout", 1800, "Seconds allowed for each backend run.")
_TOLERANCES = {f.name: flags.DEFINE_float(f.name, f.default, f"Limit: {f.name}.")
               for f in dataclasses.fields(parity.Tolerances)}


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}", exitcode=2)
  console.quiet_records(flags.FLAGS.verbosity)  # Their runs' logs keep everything.
  if _WORKERS.value < 1 or _STEPS.value < 1:
    raise app.UsageError("--workers and --steps must be at least 1.", exitcode=2)
  config = Config(seed=_SEED.value, data_dir=_DATA_DIR.value)
  runs.check_or_exit(config, _WORKERS.value, _MNIST_IDX_DIR.value)
  out = _OUT.value or tempfile.mkdtemp(prefix="parity-")
  try:
    report = parity.run_parity(
        config, _WORKERS.value, out, steps=_STEPS.value, long_steps=_LONG_STEPS.value,
        tolerances=parity.Tolerances(**{k: v.value for k, v in _TOLERANCES.items()}),
        timeout=_TIMEOUT.value)
  except runs.RunError as e:  # A backend run failed: its log is named in the message.
    sys.exit(f"error: {e}")
  parity.write_report(report, out)
  print(parity.format_table(report))
  print(f"Report: {out}/parity_report.md, parity_report.json, loss_curves.png")
  sys.exit(0 if report.passed else 1)


if __name__ == "__main__":
  app.run(main, flags_parser=console.parse_flags)
