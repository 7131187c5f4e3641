r"""Measures each tf.compat.v1.metrics function on MNIST against this project's Keras metric
for it and Keras's stock metric of the same name.

  python -m launch.metric_gaps [--train_steps=200] [--data_dir=DIR] [--out=DIR]

Trains the default CNN --train_steps steps with Keras, feeds the whole test split's labels
and logits to every function trainers/v1_metrics.py computes (the v1 function in a graph,
this project's metric and Keras's stock one eagerly; launch/proofs/metric_gaps.py), prints
the table, writes metric_gaps.{md,json} to --out if given, and exits 0 only if each of this
project's metrics is within --atol of its v1 function. The stock metrics' gaps are measured,
not checked: docs/parity.md, "v1 metrics", holds the run's numbers.
"""

import dataclasses
import json
import os
import sys
from typing import Sequence

from absl import app
from absl import flags

from launch import console

console.quiet_tool_process()  # Before the imports below load TensorFlow.
from launch.proofs import harness  # noqa: E402 -- after quiet_tool_process
from launch.proofs import metric_gaps  # noqa: E402 -- after quiet_tool_process
from launch.proofs import runs  # noqa: E402 -- after quiet_tool_process
from launch.proofs import tool_flags  # noqa: E402 -- after quiet_tool_process
from trainers.config import Config  # noqa: E402 -- after quiet_tool_process

_STEPS = flags.DEFINE_integer("train_steps", 200, "Steps the CNN trains before it is "
                              "evaluated.", lower_bound=0)
_ATOL = flags.DEFINE_float("atol", 1e-6, "Limit on |this project's metric - the v1 "
                           "function's|.", lower_bound=0.0)
_DATA_DIR, _MNIST_IDX_DIR = tool_flags.define_data_flags()
_OUT = flags.DEFINE_string("out", None, "Where to write metric_gaps.{md,json}.")


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}", exitcode=2)
  console.quiet_records(flags.FLAGS.verbosity)  # TFDS's INFO: at -v 1.
  config = Config(data_dir=_DATA_DIR.value)
  runs.check_or_exit(config, 1, _MNIST_IDX_DIR.value, backends=())
  measured = metric_gaps.measure(metric_gaps.predictions(config, _STEPS.value))
  passed = all(m.passed(_ATOL.value) for m in measured)
  table = metric_gaps.format_table(measured, _ATOL.value)
  title = (f"v1 metrics on the MNIST test split, the CNN after {_STEPS.value} steps: "
           f"{'PASS' if passed else 'FAIL'}")
  print(harness.for_terminal(f"{title}\n\n{table}"))
  if _OUT.value:
    os.makedirs(_OUT.value, exist_ok=True)
    harness.write_files(_OUT.value, {
        "metric_gaps.md": f"# {title}\n\n{table}\n",
        "metric_gaps.json": json.dumps(
            {"passed": passed, "train_steps": _STEPS.value, "atol": _ATOL.value,
             "rows": [dataclasses.asdict(m) for m in measured]}, indent=2)})
    print(f"Report: {_OUT.value}/metric_gaps.md, metric_gaps.json")
  sys.exit(0 if passed else 1)


if __name__ == "__main__":
  app.run(main, flags_parser=console.parse_flags)
