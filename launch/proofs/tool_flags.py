"""The flags the tool binaries share: one spelling and one meaning each, in every tool.

  --workers=1,2       the worker counts to run at (a list wherever a tool can run several)
  --train_steps=N     the steps each run trains
  --decay_steps=N     a learning-rate schedule's length, where a tool sets one apart
  --timeout=S         seconds allowed for each trainer run a tool starts
  --engine=ray        what runs a cluster's tasks, where a tool offers another than the local
                      launcher
  --data_dir, --mnist_idx_dir  where MNIST is, or is prepared from
  --model, --model_options     the model every run trains (trainers.flags.define_config_flags)
  --optimizer, its hyperparameters  the optimizer it trains with, where a tool offers one
  --estimator_program, --assignment_map  a team's own program, held to its port (--model),
                      the program's names mapped to the port's, where a tool takes one
  --out=DIR           where the reports and the runs go (`Output`: without it, a temporary
                      directory whose runs are removed when every check passes)

Binaries call the `define_*` functions at import time and read the holders in
`main`; the functions here never read FLAGS. Old spellings (`--steps`) still
work for now, say that they are deprecated, and name the new one.
"""

import fnmatch
import os
import sys
import tempfile
from typing import Any, Dict, List, Optional, Sequence, Tuple

from absl import app
from absl import flags

from launch.convert import assign
from launch.convert.kinds import ConversionError
from launch.ray import engine as ray_engine
from launch.proofs import program_probe
from launch.proofs import runs
from trainers import flags as trainer_flags
from trainers import config as config_lib
from trainers import model_registry
from trainers.config import Config

TIMEOUT_SECONDS = runs.TIMEOUT_SECONDS
TrainSteps = Tuple[flags.FlagHolder, flags.FlagHolder]


def define_workers(default: Sequence[int], help_text: str,
                   flag_values: flags.FlagValues = flags.FLAGS) -> flags.FlagHolder:
  """--workers: a comma-separated list of worker counts."""
  return flags.DEFINE_list("workers", [str(n) for n in default], help_text,
                           flag_values=flag_values)


def worker_counts(holder: flags.FlagHolder, minimum: int = 1) -> List[int]:
  """--workers as numbers; a usage error (exit 2) if one is not a count of at least `minimum`."""
  values = holder.value
  try:
    counts = [int(v) for v in values]
  except ValueError:
    raise app.UsageError(f"--workers must be integers, got {','.join(values)}.",
                         exitcode=2) from None
  if not counts or min(counts) < minimum:
    raise app.UsageError(f"--workers must be at least {minimum}, got {','.join(values)}.",
                         exitcode=2)
  return counts


def define_ps(help_text: str = "", flag_values: flags.FlagValues = flags.FLAGS
              ) -> flags.FlagHolder:
  """--ps: parameter servers every run of a proof trains on."""
  return flags.DEFINE_integer(
      "ps", 0, "Parameter servers both backends train on (their --ps), with --workers=1, "
      "whose steps are sequential: the Estimator's chief alone, Keras's one worker stepped by "
      "its chief." + (f" {help_text}" if help_text else ""), flag_values=flag_values)


def parameter_servers(holder: flags.FlagHolder, workers: Sequence[int],
                      engine: str = "local", asynchronous: bool = False) -> int:
  """--ps as a count; a usage error (exit 2) but on local workers, and at one worker, where
  each run's steps are sequential and so comparable to the bit, unless the tool checks
  `asynchronous` ones too."""
  if holder.value < 0 or (holder.value and engine != "local"):
    raise app.UsageError("--ps takes a count >= 0, and trains on local workers: Ray Train "
                         "does not run parameter servers.", exitcode=2)
  if holder.value and list(workers) != [1] and not asynchronous:
    raise app.UsageError("--ps goes with --workers=1 here: at more workers the steps are "
                         "asynchronous, and no run is another's to the bit (launch.parity "
                         "checks them statistically).", exitcode=2)
  return holder.value


def define_train_steps(default: int, help_text: str,
                       flag_values: flags.FlagValues = flags.FLAGS) -> TrainSteps:
  """--train_steps, and its deprecated spelling --steps."""
  return (flags.DEFINE_integer("train_steps", default, help_text, flag_values=flag_values),
          flags.DEFINE_integer("steps", None, "Deprecated: the old spelling of --train_steps.",
                               flag_values=flag_values))


def train_steps(holders: TrainSteps) -> int:
  """--train_steps, or the deprecated --steps (saying so); a usage error if below 1."""
  new, old = holders
  value = new.value
  if old.present:
    if new.present and new.value != old.value:
      raise app.UsageError(f"--steps={old.value} and --train_steps={new.value} disagree: --steps "
                           "is the deprecated spelling of --train_steps; give only that.",
                           exitcode=2)
    print("warning: --steps is deprecated; use --train_steps (it means the same).",
          file=sys.stderr)
    value = old.value
  if value < 1:
    raise app.UsageError(f"--train_steps must be at least 1, got {value}.", exitcode=2)
  return value


def define_timeout(flag_values: flags.FlagValues = flags.FLAGS) -> flags.FlagHolder:
  """--timeout, the same rule in every tool."""
  return flags.DEFINE_float("timeout", TIMEOUT_SECONDS,
                            "Seconds allowed for each trainer run this tool starts; a run "
                            "past it is stopped and named.", flag_values=flag_values)


def timeout(holder: flags.FlagHolder) -> float:
  """--timeout; a usage error if not positive."""
  if holder.value <= 0:
    raise app.UsageError(f"--timeout must be positive, got {holder.value}.", exitcode=2)
  return holder.value


def define_data_flags() -> Tuple[flags.FlagHolder, flags.FlagHolder]:
  """--data_dir and --mnist_idx_dir, as the trainers spell them."""
  return (flags.DEFINE_string("data_dir", None, "TFDS data directory holding mnist/."),
          flags.DEFINE_string("mnist_idx_dir", None, trainer_flags.help_text("mnist_idx_dir")))



def define_engine(help_text: str, flag_values: flags.FlagValues = flags.FLAGS
                  ) -> flags.FlagHolder:
  """--engine: the local launcher, or Ray Train (launch.ray)."""
  return flags.DEFINE_enum("engine", "local", list(runs.ENGINES), help_text,
                           flag_values=flag_values)


def engine(holder: flags.FlagHolder) -> str:
  """--engine; a usage error (exit 2) naming the extra if it is Ray and Ray is missing."""
  if holder.value == "ray":
    try:
      ray_engine.check_installed()
    except ray_engine.RayUnavailable as e:
      raise app.UsageError(f"--engine=ray: {e}", exitcode=2) from e
  return holder.value


def define_out(reports: str = "", flag_values: flags.FlagValues = flags.FLAGS
               ) -> flags.FlagHolder:
  """--out: where a tool writes `reports` (if any) and its runs."""
  return flags.DEFINE_string(
      "out", None, f"Output directory: {reports + ', and ' if reports else ''}every run's "
      "model_dir and logs. Default: a new temporary directory, of which only the reports "
      "are kept when every check passes.", flag_values=flag_values)


class Output:
  """A tool's output directory: --out, or a new temporary one; of the latter, `finish`
  removes what the tool made only for itself (its runs) when every check passed, keeping
  the reports, the files named as `reports` (fnmatch patterns) say."""

  def __init__(self, holder: flags.FlagHolder, tool: str, reports: Sequence[str] = ()):
    self.given, self.reports = holder.value is not None, tuple(reports)
    self.path = holder.value or tempfile.mkdtemp(prefix=f"{tool}-")
    if not self.given:
      print(f"Writing to {self.path} (a new temporary directory; --out chooses one).",
            flush=True)

  def finish(self, passed: bool) -> None:
    """Removes a temporary directory's runs if `passed`, saying what stays where."""
    if self.given:
      return
    if not passed:
      print(f"The runs are kept in {self.path}, to look into; remove it when done.")
      return
    for root, dirs, files in os.walk(self.path, topdown=False):
      for name in files:
        if not any(fnmatch.fnmatch(name, pattern) for pattern in self.reports):
          os.remove(os.path.join(root, name))
      for name in dirs:
        if not os.listdir(os.path.join(root, name)):
          os.rmdir(os.path.join(root, name))
    kept = "its reports stay" if os.listdir(self.path) else "nothing stays"
    print(f"Every check passed: the runs in {self.path} are removed; {kept}.")
    if not os.listdir(self.path):
      os.rmdir(self.path)


def define_assignment_map(flag_values: flags.FlagValues = flags.FLAGS) -> flags.FlagHolder:
  """--assignment_map, as launch.convert spells it, for a team's program."""
  return flags.DEFINE_string(
      "assignment_map", None, "With --estimator_program: a JSON object of the program's "
      "variable names -> the port's weights (or null), the map launch.convert takes; "
      "default: the same names.", flag_values=flag_values)


def probe_program(config: Config, workers: int, steps: int, assignment_map: flags.FlagHolder
                  ) -> Optional[program_probe.Probe]:
  """config.estimator_program's probe against its port (program_probe.probe) for `steps`
  steps on `workers`, before anything trains or is written; None without a program. A
  usage error (exit 2) for --assignment_map without a program; exit 2 with the message naming
  what differs (not a flag's usage: no help text)."""
  if not config.estimator_program:
    if assignment_map.value:
      raise app.UsageError("--assignment_map maps an --estimator_program's names to the "
                           "port's: give --estimator_program too.", exitcode=2)
    return None
  try:
    names = assign.load_assignment_map(assignment_map.value) if assignment_map.value else None
    return program_probe.probe(config, workers, steps, names)
  except (ConversionError, program_probe.ProbeError, model_registry.SpecError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


def models(holder: flags.FlagHolder) -> List[str]:
  """A --model list flag's names, once each; all: every built-in model."""
  return list(model_registry.BUILT_IN) if holder.value == ["all"] else list(
      dict.fromkeys(holder.value))


def model_settings(holders: trainer_flags.ConfigFlags, several: bool, **values: Any
                   ) -> Dict[str, Any]:
  """The flags as one model's Config fields (`values`: its model, ...). Among `several`
  models, a canned model's settings go to the models that take them, the optimizer's
  hyperparameters to the others; a setting the one model does not take is a usage error
  (exit 2)."""
  takes = config_lib.CANNED.get(values["model"], {})

  def foreign(name: str) -> bool:
    return bool(takes) if name in config_lib.HYPERPARAMETERS else name not in takes

  dropped = {name: None for name in (*config_lib.HYPERPARAMETERS, *config_lib.CANNED_SETTINGS)
             if several and foreign(name)}
  return trainer_flags.config_settings(holders, **values, **dropped)
