"""What reaches the user's terminal: the run's own lines, warnings and errors, not TF's chatter.

A default run shows the project's own log lines (progress, evaluations, where
things were written), every warning and error, and the summary. TensorFlow's
own INFO logs (C++ start-up, every collective's "all_reduce tensors" line,
Estimator's hooks) and its known start-up noise are shown only with
`--verbosity=1` (`-v 1`). Task log files keep everything: this filters only
what a launcher streams to the terminal (`LineFilter`), or what a lone
process logs (`RecordFilter`, with TensorFlow's C++ logging turned down).
No TensorFlow import here.
"""

import logging
import os
import re
import sys
from typing import Dict, List

from absl import flags
from absl import logging as absl_logging

PACKAGES = ("data", "launch", "trainers")  # This project's code, by path.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Warnings and errors that TensorFlow prints on every start or about its own
# code, and that no user can act on.
NOISE = (
    "cuda_dnn.cc", "cuda_fft.cc", "cuda_blas.cc", "cudart_stub.cc", "cpu_feature_guard.cc",
    "cuda_platform.cc",  # TF 2.21 on a machine without a GPU: "failed call to cuInit".
    "py_utils.cc",  # TF-TRT: could not find TensorRT.
    "deprecation.py",  # TF's notices that its own code calls deprecated APIs.
    "distribute_coordinator.py",  # Estimator: "`eval_strategy` is not passed in".
    "dataset.cc",  # "Input of GeneratorDatasetOp::Dataset will not be optimized".
    # "The calling iterator did not fully read the dataset being cached": a run
    # that ends mid-epoch leaves input_fn's cache() part-filled, and nothing
    # reads it again.
    "cache_dataset_ops.cc",
    # tf_keras's "Callback method `on_train_batch_end` is slow compared to the batch time":
    # the callbacks are the trainer's own, which save and report at step ends by design.
    "callbacks.py",
)
# An absl line, optionally after a task tag: "[chief:0] I1123 07:47:46.041 1406 file.py:60] ".
_ABSL = re.compile(rb"^(?:\[[\w:]+\] )?([IWEF])\d{4} [\d:.]+ +\d+ (\S+):\d+\] ")
# A TensorFlow C++ line: "2026-11-23 07:47:36.259: E external/.../cuda_dnn.cc:9261] ".
_NATIVE = re.compile(rb"^\d{4}-\d\d-\d\d [\d:.]+: ([IWEF]) (\S+):\d+\] ")
# A Python warning: "/path/to/file.py:12: UserWarning: ...".
_WARNING = re.compile(rb"^(\S+\.py):\d+: \w*Warning: ")
# Lines printed before any log record, on every start (TF 2.21's C++ logging).
_NOISE_LINE = re.compile(rb"^WARNING: All log messages before absl::InitializeLog\(\) is called")
# Lines that start something the user must see, whatever came before.
_ALWAYS = re.compile(rb"^(Traceback |error: |Fatal Python error|[\w.]*(Error|Exception)\b)")


def is_own(source: str) -> bool:
  """Whether a log record's source path is this project's code."""
  path = os.path.relpath(source, REPO) if os.path.isabs(source) else source
  return "/" in path and path.split("/")[0] in PACKAGES and not path.startswith("..")


def shown(level: str, source: str) -> bool:
  """Whether a record of `level` ("I", "W", "E" or "F") from `source` is shown by default."""
  if is_own(source):
    return True
  return level != "I" and not any(source.endswith(n) for n in NOISE)


class LineFilter:
  """Decides, line by line, what of a task's stderr reaches the terminal.

  A log record's continuation lines (multi-line messages) follow its
  decision; a traceback or an error line is always shown.
  """

  def __init__(self, verbose: bool):
    self._verbose = verbose
    self._showing = True

  def __call__(self, line: bytes) -> bool:
    if self._verbose:
      return True
    match = _ABSL.match(line) or _NATIVE.match(line)
    if match:
      self._showing = shown(match.group(1).decode(), match.group(2).decode())
    elif _WARNING.match(line):  # Libraries' warnings about their own code are noise.
      self._showing = b"site-packages" not in _WARNING.match(line).group(1)
    elif _NOISE_LINE.match(line):
      self._showing = False
    elif _ALWAYS.match(line):
      self._showing = True
    return self._showing


class RecordFilter(logging.Filter):
  """The same rule for a lone process's Python log records."""

  def filter(self, record: logging.LogRecord) -> bool:
    return shown(record.levelname[0], record.pathname)


def quiet_lone_process(verbosity: int) -> None:
  """Before TensorFlow is imported: at verbosity < 1, hide its C++ logs and INFO records.

  TensorFlow's C++ logging is set once, from the environment, when it is
  imported; with it off, a lone process's C++ warnings and errors are hidden
  too (with -v they show). A process that starts TensorFlow children (a
  launcher) must give them the environment it had before this call: their
  logs keep everything.
  """
  if verbosity < 1:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  quiet_records(verbosity)


# Where quiet_tool_process keeps the user's own TF_CPP_MIN_LOG_LEVEL ("" if unset).
_USER_TF_CPP = "MNIST_USER_TF_CPP_MIN_LOG_LEVEL"


def _verbose_argv(argv: List[str]) -> bool:
  """Whether the command line asks for --verbosity (-v) of 1 or more."""
  for i, arg in enumerate(argv):
    name, _, value = arg.partition("=")
    if name in ("-v", "--v", "--verbosity", "-verbosity"):
      value = value or (argv[i + 1] if i + 1 < len(argv) else "")
      if value.lstrip("-").isdigit() and int(value) >= 1:
        return True
  return False


def quiet_tool_process() -> None:
  """For a tool binary, before its imports load TensorFlow: no C++ start-up lines
  (cuDNN, cuFFT, cuBLAS, CPU features) in its own output, unless -v 1. The runs
  it starts get the user's setting back (`child_environ`): their logs keep all."""
  if _USER_TF_CPP in os.environ or _verbose_argv(sys.argv):
    return
  os.environ[_USER_TF_CPP] = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "")
  os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"


def child_environ() -> Dict[str, str]:
  """This process's environment, as the user gave it, for a process it starts."""
  env = dict(os.environ)
  if _USER_TF_CPP in env:
    user = env.pop(_USER_TF_CPP)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    if user:
      env["TF_CPP_MIN_LOG_LEVEL"] = user
  return env


def quiet_records(verbosity: int) -> None:
  """At verbosity < 1, this process's Python log records pass through RecordFilter."""
  if verbosity < 1:
    absl_logging.get_absl_handler().addFilter(RecordFilter())
    # TF adds a stderr handler of its own when imported before absl's is set up:
    # without it, TF's records reach absl's handler, and the filter, through the root.
    tf_logger = logging.getLogger("tensorflow")
    for handler in list(tf_logger.handlers):
      tf_logger.removeHandler(handler)


# What an Estimator user types, by its RunConfig, TrainSpec or habit's name, and this
# project's flag of that meaning.
FLAG_ALIASES = {
    "batch_size": "global_batch_size", "max_steps": "train_steps",
    "save_checkpoints_steps": "checkpoint_every_steps", "log_step_count_steps": "log_every_steps",
    "tf_random_seed": "seed", "lr": "learning_rate", "num_workers": "workers",
}
_NOT_A_NUMBER = re.compile(r"^flag --(\w+)=(.*?): (invalid literal for int\(\)|could not convert "
                           r"string to float)")


def parse_flags(argv: List[str]) -> List[str]:
  """The binaries' flag parser (`app.run(main, flags_parser=...)`): a bad flag is a usage
  error, exit 2, as every other usage error; absl's own parser exits 1. A value that is not
  a number, and a flag an Estimator user would type by another name, are said in words."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(f"error: {_said(e)}\nPass --helpfull to see every flag.", file=sys.stderr)
    sys.exit(2)


def _said(error: flags.Error) -> str:
  """absl's message, or what it means where absl's is Python's or guesses by spelling."""
  name = getattr(error, "flagname", None)
  if isinstance(error, flags.UnrecognizedFlagError) and FLAG_ALIASES.get(name) in flags.FLAGS:
    ours = flags.FLAGS[FLAG_ALIASES[name]]
    return f"unknown flag --{name}: here it is --{ours.name} ({ours.help.split('; ')[0]})."
  bad = _NOT_A_NUMBER.match(str(error))
  if bad and bad.group(1) in flags.FLAGS:
    wanted = "a whole number" if bad.group(3).startswith("invalid") else "a number"
    default = flags.FLAGS[bad.group(1)].default
    example = "" if default is None else f", such as --{bad.group(1)}={default}"
    return f"--{bad.group(1)}={bad.group(2)}: it takes {wanted}{example}."
  return str(error)
