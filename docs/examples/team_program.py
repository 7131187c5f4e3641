"""team_estimator.py's program named for the project: nothing in it is changed.

    PYTHONPATH=docs/examples python -m trainers.estimator_main \\
        --estimator_program=team_program:PROGRAM --workers=2
    PYTHONPATH=docs/examples python -m launch.parity --workers=1,2 \\
        --estimator_program=team_program:PROGRAM --model=team_port:SPEC \\
        --assignment_map=docs/examples/team_map.json \\
        --optimizer=adam --learning_rate=1e-4 --learning_rate_schedule=constant

docs/MIGRATION.md, "Prove your port", walks through it.
"""

import json
import os

import team_estimator

from trainers.program import EstimatorProgram, StepHook


class LossLog(StepHook):
  """team_estimator.LossLogHook written once for both backends: each step and its loss, to
  `<model_dir>/loss_log.jsonl`."""

  def begin(self, step, model_dir):
    self.path = os.path.join(model_dir, "loss_log.jsonl")

  def after_step(self, step, loss):
    with open(self.path, "a") as f:
      f.write(json.dumps({"step": step, "loss": loss}) + "\n")


PROGRAM = EstimatorProgram(
    model_fn=team_estimator.model_fn,
    params=team_estimator.PARAMS,
    input_fn=team_estimator.input_fn,
    serving_input_receiver_fn=team_estimator.serving_input_receiver_fn,
    run_config={"keep_checkpoint_max": 5},
    # Its dropout draws a mask without an op seed, another one in each backend.
    deterministic_params={"dropout": 0.0},
    step_hooks=(LossLog,),
)
