r"""Proves that Keras on the newest TensorFlow trains what the Estimator trained on TF 2.15.1.

  python -m launch.version_parity --keras_python=.venv-tf221/bin/python \
      [--workers=1,2] [--train_steps=10] [--out=DIR]
  python -m launch.version_parity --keras_python=.venv-tf221/bin/python \
      --estimator_program=team_program:PROGRAM --model=team_port:SPEC \
      --assignment_map=team_map.json --optimizer=adam --learning_rate=1e-4 \
      --learning_rate_schedule=constant

Run it with the TF 2.15.1 install (README: "Install"); --keras_python is the
interpreter of the newest-TF install. From one initial-weights file, with op
determinism, it trains Keras on the newest TF, Keras on TF 2.15.1 and the
Estimator on TF 2.15.1 at each worker count, compares final weights and
per-step losses, and serves each version's SavedModel in the other version.
Prints the table, writes version_parity_report.{md,json} and loss_curves.png
to --out, and exits 0 only if every check passes.

With --estimator_program (and --model, its port; --assignment_map, the recipe flags, as
launch.parity takes them) the Estimator on TF 2.15.1 trains the team's program and Keras,
on both versions, the port on the program's input_fn, from the same weights; the program is
probed against the port first (exit 2 naming what differs), and must load in the newest TF,
where tf.estimator is gone (else exit 1 naming the fix). Each version serves both exports
the test split's features, through the program's own signatures.
"""

import dataclasses
import sys
from typing import Sequence

from absl import app
from absl import flags

from launch import console

console.quiet_tool_process()  # Before the imports below load TensorFlow.
from launch.proofs import harness  # noqa: E402 -- after quiet_tool_process
from launch.proofs import runs  # noqa: E402 -- after quiet_tool_process
from launch.proofs import tool_flags  # noqa: E402 -- after quiet_tool_process
from launch.proofs import version_parity  # noqa: E402 -- after quiet_tool_process
from trainers import flags as trainer_flags  # noqa: E402 -- after quiet_tool_process
from trainers.config import Config  # noqa: E402 -- after quiet_tool_process

_KERAS_PYTHON = flags.DEFINE_string("keras_python", None, "Python of the newest-TF install, "
                                    "e.g. .venv-tf221/bin/python.", required=True)
_WORKERS = tool_flags.define_workers([1, 2], "Local worker counts to compare at.")
_TRAIN_STEPS = tool_flags.define_train_steps(10, "Training steps of each run.")
_OUT = tool_flags.define_out("version_parity_report.{md,json}, loss_curves.png")
_DATA_DIR, _MNIST_IDX_DIR = tool_flags.define_data_flags()
_CONFIG = trainer_flags.define_config_flags(trainer_flags.TRAINING_FIELDS
                                            + trainer_flags.PROGRAM_FIELDS)
_ASSIGNMENT_MAP = tool_flags.define_assignment_map()
_SEED = flags.DEFINE_integer("seed", Config.seed, "Seeds the initial-weights file and shuffles.")
_TIMEOUT = tool_flags.define_timeout()
_TOLERANCES = {f.name: flags.DEFINE_float(f.name, f.default, f"Limit: {f.name}.")
               for f in dataclasses.fields(version_parity.Tolerances)}


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}", exitcode=2)
  console.quiet_records(flags.FLAGS.verbosity)  # Their runs' logs keep everything.
  workers = tool_flags.worker_counts(_WORKERS)
  train_steps, timeout = tool_flags.train_steps(_TRAIN_STEPS), tool_flags.timeout(_TIMEOUT)
  try:
    version_parity.stack_versions(_KERAS_PYTHON.value)
  except runs.RunError as e:
    raise app.UsageError(f"--keras_python: {e}", exitcode=2) from e
  config = Config(seed=_SEED.value, data_dir=_DATA_DIR.value,
                  **trainer_flags.config_settings(_CONFIG))
  for n in workers:
    runs.check_or_exit(config, n, _MNIST_IDX_DIR.value)
  program = tool_flags.probe_program(config, max(workers), train_steps, _ASSIGNMENT_MAP)
  if program and not program.exports:
    raise app.UsageError(f"--estimator_program={config.estimator_program} exports nothing (no "
                         "serving_input_receiver_fn), and the newest TF's Keras weights are "
                         "read from its export: give the program its receiver.", exitcode=2)
  if program:
    try:
      version_parity.program_imports(_KERAS_PYTHON.value, config.estimator_program)
    except runs.RunError as e:  # Not a flag's fault: what the program must change.
      sys.exit(f"error: {e}")
  output = tool_flags.Output(_OUT, "version-parity", ("version_parity_report.*",
                                                      "loss_curves.png"))
  out = output.path
  try:
    report = version_parity.run_version_parity(
        config, workers, out, keras_python=_KERAS_PYTHON.value, steps=train_steps,
        tolerances=version_parity.Tolerances(**{k: v.value for k, v in _TOLERANCES.items()}),
        timeout=timeout, program=program)
  except runs.RunError as e:  # A run failed: its log is named in the message.
    sys.exit(f"error: {e}")
  version_parity.write_report(report, out)
  print(harness.for_terminal(version_parity.format_table(report)))
  print(f"Report: {out}/version_parity_report.md, version_parity_report.json, loss_curves.png")
  output.finish(report.passed)
  sys.exit(0 if report.passed else 1)


if __name__ == "__main__":
  app.run(main, flags_parser=console.parse_flags)
