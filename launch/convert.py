r"""Converts a training checkpoint to the other backend, so the run goes on there.

  python -m launch.convert --from_estimator=EST_MODEL_DIR --to_keras=KERAS_MODEL_DIR \
      [--assignment_map=map.json]
  python -m launch.convert --from_keras=KERAS_MODEL_DIR --to_estimator=EST_MODEL_DIR \
      [--assignment_map=map.json]
  python -m trainers.keras_main --model_dir=KERAS_MODEL_DIR --train_steps=1500  # Resumes.

Carries the newest checkpoint's weights, momentum accumulators and step; a run
trained with another --optimizer is refused (exit 2).
--assignment_map is a JSON object of old checkpoint name -> model weight name
({"dense_1/kernel": "hidden/kernel"}), or null to drop a variable that is not
state to carry; any variable left unmapped is an error naming the entry that
fixes it. Prints what went where, what was not carried, the step and the
output directory. The target must be new (or empty); it appears only when
complete. Exits 2, writing nothing, if the checkpoint cannot be converted.
The model is the one the source's run.json names; --model and --model_options
give it for a model_dir without one.
"""

import sys
from typing import Sequence

from absl import app
from absl import flags

from launch import console
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
_CONFIG = trainer_flags.define_config_flags(trainer_flags.MODEL_FIELDS)
_ASSIGNMENT_MAP = flags.DEFINE_string("assignment_map", None, "A JSON file: an object of old "
                                      "checkpoint name -> model weight name, or null to drop it.")



def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}", exitcode=2)
  to_keras = (_FROM_ESTIMATOR.value, _TO_KERAS.value)
  to_estimator = (_FROM_KERAS.value, _TO_ESTIMATOR.value)
  if any(to_keras) == any(to_estimator) or not all(to_keras if any(to_keras) else to_estimator):
    raise app.UsageError("Give exactly one direction: --from_estimator and --to_keras, or "
                         "--from_keras and --to_estimator.", exitcode=2)
  console.quiet_lone_process(flags.FLAGS.verbosity)  # Before TensorFlow is imported.
  from launch.tools import convert  # noqa: PLC0415 -- imports TensorFlow, quieted first.
  source, target = to_keras if any(to_keras) else to_estimator
  run = convert.estimator_to_keras if any(to_keras) else convert.keras_to_estimator
  model = trainer_flags.config_settings(_CONFIG)
  recorded = run_record.read(source) or {}
  if "model" in recorded and not any(holder.present for holder in _CONFIG.values()):
    model = {"model": recorded["model"], "model_options": recorded.get("model_options", "")}
  if run_record.optimizer_of(recorded) == run_record.CANNED_OPTIMIZER:
    print(f"error: {source} holds a canned model ({recorded['model']}); launch.convert does "
          "not carry canned models yet. Go on training it with its own backend.",
          file=sys.stderr)
    sys.exit(2)
  if run_record.optimizer_of(recorded) != "momentum":
    print(f"error: {source} was trained with --optimizer={recorded['optimizer']}; launch.convert "
          "carries only momentum's state so far. Go on training it with its own backend.",
          file=sys.stderr)
    sys.exit(2)
  try:
    assignment_map = (convert.load_assignment_map(_ASSIGNMENT_MAP.value)
                      if _ASSIGNMENT_MAP.value else None)
    conversion = run(source, target, assignment_map=assignment_map, config=Config(**model))
  except convert.ConversionError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  print(convert.format_table(conversion))


if __name__ == "__main__":
  app.run(main, flags_parser=console.parse_flags)
