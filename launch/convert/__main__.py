r"""Converts a training checkpoint to the other backend, so the run goes on there.

  python -m launch.convert --from_estimator=EST_MODEL_DIR --to_keras=KERAS_MODEL_DIR \
      [--assignment_map=map.json]
  python -m launch.convert --from_keras=KERAS_MODEL_DIR --to_estimator=EST_MODEL_DIR \
      [--assignment_map=map.json]
  python -m trainers.keras_main --model_dir=KERAS_MODEL_DIR --train_steps=1500  # Resumes.
  python -m launch.convert --inspect=ANY_MODEL_DIR [--model=NAME] [--inspect_format=json]

Carries the newest checkpoint that loads (saying which newer ones it skipped, and
why): its weights, its optimizer's slots (and Adam's powers of beta) and step, for
every --optimizer. A source trained with another optimizer than --optimizer stops
the conversion; --reset_slots carries the weights and the step and starts the
optimizer's slots afresh, listing each. --from_backup converts a Keras run's
BackupAndRestore backup (an interrupted run's newest state) instead.
--inspect only reads: every variable of any checkpoint (this project's or not),
what each is, and the --assignment_map it proposes onto --model, guesses marked.
--assignment_map is a JSON object of old checkpoint name -> model weight name
({"dense_1/kernel": "hidden/kernel"}), or null to drop a variable that is not
state to carry; any variable left unmapped is an error naming the entry that
fixes it. Prints what went where, what was not carried, the step and the
output directory. The target must be new (or empty); it appears only when
complete. Exits 2, writing nothing, if the checkpoint cannot be converted; SIGINT
or SIGTERM stops it with 128 + the signal's number, writing nothing.
The model and the optimizer are the ones the source's run.json names; --model,
--model_options, --optimizer and its hyperparameter flags give them for a
model_dir without one.
With --estimator_program (a team's own program, docs/MIGRATION.md "Prove your port") the
Estimator side is that program's: its model_dir must hold the variables its model_fn makes,
the optimizer and its settings default to what its update ops apply, and --model is its
port.
"""

import functools
import os
import signal
import sys
from typing import Any, Callable, Dict, List, NoReturn, Sequence, Tuple

from absl import app
from absl import flags

from launch import console
from launch.convert.kinds import ConversionError
from trainers import config as config_lib
from trainers import flags as trainer_flags
from trainers import run_record
from trainers.config import Config

_FROM_ESTIMATOR = flags.DEFINE_string("from_estimator", None, "The Estimator model_dir to "
                                      "convert (its newest model.ckpt-<step>).")
_TO_KERAS = flags.DEFINE_string("to_keras", None, "The new Keras model_dir to write.")
_FROM_KERAS = flags.DEFINE_string("from_keras", None, "The Keras model_dir to convert (its "
                                  "newest ckpt-<step>).")
_TO_ESTIMATOR = flags.DEFINE_string("to_estimator", None, "The new Estimator model_dir to "
                                    "write.")
_CONFIG = trainer_flags.define_config_flags(trainer_flags.TRAINING_FIELDS
                                            + trainer_flags.PROGRAM_FIELDS)
_ASSIGNMENT_MAP = flags.DEFINE_string("assignment_map", None, "A JSON file: an object of old "
                                      "checkpoint name -> model weight name, or null to drop it.")
_RESET_SLOTS = flags.DEFINE_bool("reset_slots", False, "Carry the weights and the step only: "
                                 "--optimizer's slots start at their initial values (for a "
                                 "source trained with another optimizer).")
_INSPECT = flags.DEFINE_string("inspect", None, "Only read: list every variable of this "
                                "model_dir's newest checkpoint (or of this checkpoint path), "
                                "what each is, and the --assignment_map it proposes onto "
                                "--model.")
_INSPECT_FORMAT = flags.DEFINE_enum("inspect_format", "text", ["text", "json"],
                                    "How --inspect prints.")
_FROM_BACKUP = flags.DEFINE_bool("from_backup", False, "With --from_keras: convert the "
                                 "BackupAndRestore backup an interrupted run left, not its "
                                 "newest ckpt-<step>.")


_SIGNALS: List[int] = []  # The signals that interrupted the conversion.


def _interrupted(signum: int, frame: object) -> None:
  """Unwinds the conversion (its staging directory is removed on the way out)."""
  del frame
  _SIGNALS.append(signum)
  raise KeyboardInterrupt  # Whatever TensorFlow code it lands in may wrap it: see main.


def _unraisable(hook: Callable[[Any], None]) -> Callable[[Any], None]:
  """`hook`, quiet for _interrupted's KeyboardInterrupt raised where Python can only print
  it (a weakref callback, a __del__): the conversion goes on, and main ends it as
  interrupted once it is done."""
  def quiet(unraisable: Any) -> None:
    if not (_SIGNALS and isinstance(unraisable.exc_value, KeyboardInterrupt)):
      hook(unraisable)
  return quiet


def _fail(message: str) -> NoReturn:
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def _model_settings(source: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
  """The flags' settings, with the model the source's run record names unless the flags name
  one; and that record ({} without one)."""
  settings = trainer_flags.config_settings(_CONFIG)
  recorded = run_record.read(source) or {}
  if "model" in recorded and not any(_CONFIG[n].present for n in trainer_flags.MODEL_FIELDS):
    settings.update(model=recorded["model"], model_options=recorded.get("model_options", ""),
                    task=recorded.get("task", config_lib.MULTICLASS),
                    **{n: recorded[n] for n in config_lib.CANNED_SETTINGS if n in recorded})
  return settings, recorded


def _settings(source: str, keras_source: bool) -> Dict[str, Any]:
  """The model and optimizer: the flags', and what they leave out, the source's run record
  (flags win, group by group)."""
  settings, recorded = _model_settings(source)
  optimizer = run_record.optimizer_of(recorded)
  if optimizer == run_record.CANNED_OPTIMIZER:
    return settings  # A canned model's optimizers are among its own settings.
  if keras_source and not recorded and not _CONFIG["optimizer"].present and not (
      Config(**settings).canned_settings()):
    # An Estimator checkpoint's slot names say which optimizer made them; a Keras one's do
    # not tell plain SGD from momentum.
    _fail(f"{source} has no {run_record.RECORD_FILE} naming the optimizer it was trained "
          "with: give --optimizer (and its hyperparameter flags) as it was trained.")
  if recorded and not any(_CONFIG[n].present for n in trainer_flags.STEP_FIELDS):
    settings.update({n: recorded[n] for n in trainer_flags.STEP_FIELDS if n in recorded})
  if recorded and not any(_CONFIG[n].present for n in trainer_flags.OPTIMIZER_FIELDS):
    settings.update(optimizer=optimizer, **{n: recorded[n] for n in
                                            config_lib.OPTIMIZER_DEFAULTS.get(optimizer, {})
                                            if n in recorded})
  return settings


def _inspect(path: str) -> None:
  from launch.convert import inspection  # noqa: PLC0415 -- imports TensorFlow.
  import tensorflow as tf  # noqa: PLC0415
  settings, _ = _model_settings(path)
  try:
    found = inspection.inspect(path, Config(**settings))
  except (ValueError, tf.errors.OpError) as e:
    _fail(f"--inspect={path}: {e}")
  print(found.to_json() if _INSPECT_FORMAT.value == "json" else inspection.format_text(found))


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}", exitcode=2)
  to_keras = (_FROM_ESTIMATOR.value, _TO_KERAS.value)
  to_estimator = (_FROM_KERAS.value, _TO_ESTIMATOR.value)
  console.quiet_lone_process(flags.FLAGS.verbosity)  # Before TensorFlow is imported.
  if _INSPECT.value:
    if any(to_keras) or any(to_estimator):
      raise app.UsageError("--inspect only reads: give it without a direction.", exitcode=2)
    _inspect(_INSPECT.value)
    return
  if any(to_keras) == any(to_estimator) or not all(to_keras if any(to_keras) else to_estimator):
    raise app.UsageError("Give exactly one direction: --from_estimator and --to_keras, or "
                         "--from_keras and --to_estimator (or --inspect=DIR).", exitcode=2)
  if _FROM_BACKUP.value and not _FROM_KERAS.value:
    raise app.UsageError("--from_backup converts a Keras backup: give it with --from_keras.",
                         exitcode=2)
  sys.unraisablehook = _unraisable(sys.unraisablehook)
  signal.signal(signal.SIGINT, _interrupted)
  signal.signal(signal.SIGTERM, _interrupted)
  source, target = to_keras if any(to_keras) else to_estimator
  try:
    conversion = _convert(source, target, any(to_keras))
  except BaseException:
    if _SIGNALS:  # However the code it landed in wrapped it.
      _exit_interrupted(target)
    raise
  signal.signal(signal.SIGINT, signal.SIG_DFL)  # The target is whole from here on.
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  if _SIGNALS:  # Landed where Python could not raise it (_unraisable).
    _exit_interrupted(target)
  print(conversion)


def _exit_interrupted(target: str) -> NoReturn:
  """Ends the process as the first signal asked, saying whether `target` was written."""
  whole = os.path.isdir(target) and any(n.endswith(".index") for n in os.listdir(target))
  print(f"error: interrupted by {signal.Signals(_SIGNALS[0]).name}; {target} was "
        + ("already written whole." if whole else "not written."), file=sys.stderr)
  sys.exit(128 + _SIGNALS[0])


def _convert(source: str, target: str, to_keras: bool) -> str:
  """Converts, returning the table to print; exits 2 with the message if it cannot."""
  # These import TensorFlow: after main has quieted it.
  from launch.convert import assign  # noqa: PLC0415
  from launch.convert import carry  # noqa: PLC0415
  from launch.convert import report  # noqa: PLC0415
  import tensorflow as tf  # noqa: PLC0415
  run = (carry.estimator_to_keras if to_keras else
         functools.partial(carry.keras_to_estimator, from_backup=_FROM_BACKUP.value))
  settings = _with_program_recipe(_settings(source, keras_source=not to_keras))
  try:
    _check_program_source(source if to_keras else None, Config(**settings))
    assignment_map = (assign.load_assignment_map(_ASSIGNMENT_MAP.value)
                      if _ASSIGNMENT_MAP.value else None)
    return report.format_table(run(source, target, assignment_map=assignment_map,
                                    config=Config(**settings),
                                    reset_slots=_RESET_SLOTS.value))
  except ConversionError as e:
    _fail(str(e))
  except (OSError, tf.errors.OpError) as e:  # A file TensorFlow or Python could not use.
    _fail(f"converting {source} to {target}: {type(e).__name__}: {e}. Nothing was written.")


def _with_program_recipe(settings: Dict[str, Any]) -> Dict[str, Any]:
  """With --estimator_program and no optimizer flags: the optimizer, its hyperparameters and
  its first rate, as the program's update ops apply them (trainers/estimator_program.py)."""
  if not settings.get("estimator_program") or any(
      _CONFIG[n].present for n in trainer_flags.OPTIMIZER_FIELDS):
    return settings
  from trainers import estimator_program  # noqa: PLC0415 -- imports tf.estimator.
  from trainers import program  # noqa: PLC0415
  try:
    found = estimator_program.recipe_values(
        estimator_program.graph(Config(**settings)), [0])
  except program.ProgramError as e:
    _fail(str(e))
  if found["optimizer"] not in config_lib.OPTIMIZER_DEFAULTS or found["others"]:
    _fail(f"--estimator_program={settings['estimator_program']} trains with "
          f"{', '.join([found['optimizer'], *found['others']])}, which no port here trains "
          f"with; the ports take one of {', '.join(config_lib.OPTIMIZER_DEFAULTS)}.")
  return {**settings, "optimizer": found["optimizer"], "learning_rate": found["rates"][0],
          **found["hyperparameters"]}


def _check_program_source(source: Any, config: Config) -> None:
  """An Estimator model_dir given with --estimator_program holds that program's variables."""
  if source is None or not config.estimator_program:
    return
  from trainers import checkpoints  # noqa: PLC0415 -- imports TensorFlow.
  problem = checkpoints.resume_problem("estimator", source, config)
  if problem:
    _fail(problem.replace("it will not be overwritten.", "it was not converted."))


if __name__ == "__main__":
  app.run(main, flags_parser=console.parse_flags)
