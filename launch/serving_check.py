r"""Proves that two SavedModels serve alike, as a model server's clients see it: run it on
the Estimator export your clients call today and the Keras export you would switch to.

  python -m launch.serving_check --first=ESTIMATOR_EXPORT --second=KERAS_EXPORT \
      [--feature_name=image] [--atol=1e-5] [--data_dir=DIR] [--out=DIR]
  python -m launch.serving_check --first=THEIR_EXPORT --second=PORT_EXPORT \
      --estimator_program=team_program:PROGRAM
  python -m launch.serving_check --first=ESTIMATOR_EXPORT --second=KERAS_EXPORT \
      --features=tabular [--feature_columns=package.module:NAME]
  python -m launch.serving_check --first=TODAYS_EXPORT --second=RETRAINED_EXPORT --contract_only

Two questions. Without --contract_only: do the two exports serve the same model alike (one
model's weights exported by both backends, or carried across)? Every answer is compared.
With it: could a client switch from the first to the second unchanged (exports of
differently trained runs)? Only the contract is: the signatures, the outputs each request
gets with their dtypes and shapes, and the bad requests failing alike.

Each export is a SavedModel directory (`model_dir/export/<timestamp>`). Sends both the
whole MNIST test split as Classify requests (to `serving_default` and `classification`)
and Predict requests (to `predict`, and `image:predict` where both have it), built with
`tensorflow-serving-api`'s protos, with each image as a tf.Example of `--feature_name`
(784 floats); then checks that every signature of either export is defined alike in both
(method, input and output keys, dtypes, shapes), that labels, classes and ids are equal
and scores, probabilities and logits within --atol, and that three bad requests fail alike
(launch/proofs/serving_check.py). Prints the table, writes serving_check_report.{md,json}
to --out if given, and exits 0 only if every check passes.

With --features=tabular the exports parse a canned model's feature columns (the built-in
ones, or --feature_columns): each test image is sent as its tabular tf.Example
(data/mnist/tabular.py), the first hundred again without their lists, with every string
out of vocabulary and with empty lists, and the bad requests are the columns' own.

With --estimator_program the exports serve a team's program's own signatures (its
export_outputs, and its port's `ModelSpec.signatures`): every signature of the first is
defined alike in the second, and every output of each is compared on the whole test split
as the program's input_fn gives its features (serving_check.compare_exports).
"""

import dataclasses
import json
import os
import sys
from typing import Any, Dict, Optional, Sequence

from absl import app
from absl import flags

from launch import console

console.quiet_tool_process()  # Before the imports below load TensorFlow.
from launch.proofs import harness  # noqa: E402 -- after quiet_tool_process
from launch.proofs import runs  # noqa: E402 -- after quiet_tool_process
from launch.proofs import serving_check  # noqa: E402 -- after quiet_tool_process
from launch.proofs import tool_flags  # noqa: E402 -- after quiet_tool_process
from trainers import serving  # noqa: E402 -- after quiet_tool_process
from trainers import model_registry  # noqa: E402 -- after quiet_tool_process
from trainers.config import Config  # noqa: E402 -- after quiet_tool_process
from trainers.models import canned  # noqa: E402 -- after quiet_tool_process

_FIRST = flags.DEFINE_string("first", None, "The SavedModel your clients call today.",
                             required=True)
_SECOND = flags.DEFINE_string("second", None, "The SavedModel to switch to.", required=True)
_FEATURE = flags.DEFINE_string("feature_name", serving.IMAGE, "The tf.Example feature "
                               "holding the image (a canned model's --feature_name).")
_ATOL = flags.DEFINE_float("atol", 1e-5, "Limit on |difference| of scores, probabilities and "
                           "logits.")
_DATA_DIR, _MNIST_IDX_DIR = tool_flags.define_data_flags()
_OUT = flags.DEFINE_string("out", None, "Where to write serving_check_report.{md,json}.")
_FEATURES = flags.DEFINE_enum("features", "image", ["image", "tabular"], "What the exports "
                              "read: the image as --feature_name, or a canned model's "
                              "tabular features through feature columns (--feature_columns).")
_COLUMNS = flags.DEFINE_string("feature_columns", None, "With --features=tabular: "
                               "package.module:NAME of the feature columns the exports parse "
                               "requests by (a list, a dict of lists by part, or a function "
                               "making either); default the built-in ones "
                               "(trainers/models/tabular.py).")
_CONTRACT_ONLY = flags.DEFINE_bool(
    "contract_only", False, "Compare the serving contract only (signatures, outputs, dtypes, "
    "shapes, bad requests), not the answers: for exports of differently trained runs.")
_PROGRAM = flags.DEFINE_string("estimator_program", None, "package.module:NAME, a team's "
                               "program whose export (and its port's) are compared, fed its "
                               "input_fn's test features (docs/MIGRATION.md, \"Prove your "
                               "port\").")


def _check_export(flag: flags.FlagHolder) -> str:
  path = flag.value
  if not os.path.isfile(os.path.join(path, "saved_model.pb")):
    raise app.UsageError(f"--{flag.name}={path} holds no SavedModel (saved_model.pb): give an "
                         "export directory, such as model_dir/export/<timestamp>.", exitcode=2)
  return path


def _spec() -> Optional[Dict[str, Any]]:
  """The tabular features' parse spec under --features=tabular, else None; a team's
  columns that cannot load end the run naming the fix."""
  if _FEATURES.value != "tabular":
    return None
  try:
    return canned.columns_spec(_COLUMNS.value or "")
  except model_registry.SpecError as e:
    raise app.UsageError(str(e), exitcode=2) from None


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}", exitcode=2)
  console.quiet_records(flags.FLAGS.verbosity)  # TFDS's and the loader's INFO: at -v 1.
  first, second = _check_export(_FIRST), _check_export(_SECOND)
  if not _FEATURE.value.isidentifier() or _ATOL.value < 0:
    raise app.UsageError("--feature_name must be a name of letters, digits and _, and --atol "
                         ">= 0.", exitcode=2)
  if _COLUMNS.value and _FEATURES.value != "tabular":
    raise app.UsageError("--feature_columns is read only with --features=tabular.", exitcode=2)
  if _PROGRAM.value and _FEATURES.value == "tabular":
    raise app.UsageError("--features=tabular is a canned model's: a team's program's exports "
                         "are fed its own input_fn's features; leave --features out.",
                         exitcode=2)
  config = Config(data_dir=_DATA_DIR.value, estimator_program=_PROGRAM.value)
  runs.check_or_exit(config, 1, _MNIST_IDX_DIR.value, backends=())
  names = ("first", "second")
  if config.estimator_program:
    checks = serving_check.compare_exports(first, second,
                                           lambda: serving_check.test_features(config),
                                           _ATOL.value, names, values=not _CONTRACT_ONLY.value)
  else:  # Only the signatures the first has are required: clients call what it serves.
    checks = serving_check.compare(first, second, lambda: serving_check.test_images(config),
                                   _FEATURE.value, _ATOL.value, names=names,
                                   required=sorted(serving_check.signatures(first)),
                                   spec=_spec(), values=not _CONTRACT_ONLY.value)
  passed = all(c.passed for c in checks)
  what = "Serving contract:" if _CONTRACT_ONLY.value else "Serving:"
  table = harness.format_checks(f"{what} {first} (first) against {second} (second)", checks)
  print(harness.for_terminal(table))
  if _OUT.value:
    os.makedirs(_OUT.value, exist_ok=True)
    harness.write_files(_OUT.value, {
        "serving_check_report.md": f"# Serving check report\n\n{table}\n",
        "serving_check_report.json": json.dumps(
            {"passed": passed, "first": first, "second": second,
             "checks": [dataclasses.asdict(c) for c in checks]}, indent=2)})
    print(f"Report: {_OUT.value}/serving_check_report.md, serving_check_report.json")
  sys.exit(0 if passed else 1)


if __name__ == "__main__":
  app.run(main, flags_parser=console.parse_flags)
