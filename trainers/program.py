"""A team's own Estimator program, named by `--estimator_program=package.module:NAME`.

Their code is imported, never copied or changed; a module of a few lines beside it names
its parts:

    # my_team/program.py
    from trainers.program import EstimatorProgram
    from my_team import trainer  # Their Estimator program, as it runs today.

    PROGRAM = EstimatorProgram(
        model_fn=trainer.model_fn,
        params={"learning_rate": 1e-4, "dropout": 0.4},
        input_fn=lambda mode, input_context: trainer.input_fn(mode, input_context),
        serving_input_receiver_fn=trainer.serving_input_receiver_fn,
        run_config={"keep_checkpoint_max": 5},
        deterministic_params={"dropout": 0.0})

    python -m trainers.estimator_main --estimator_program=my_team.program:PROGRAM --workers=2
    python -m launch.parity --estimator_program=my_team.program:PROGRAM \\
        --model=my_team.port:SPEC --optimizer=adam --learning_rate=1e-4 \\
        --learning_rate_schedule=constant --assignment_map=map.json

The Estimator backend trains `model_fn` under the project's runner (its cluster, evaluator,
restarts, preemption, model_dir rules, progress lines and summary); the Keras backend
trains `--model`, the port, on the same `input_fn`. docs/MIGRATION.md, "Prove your port",
walks through it. TensorFlow-free: a launcher checks the name before any task starts.
"""

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from trainers import model_registry

NAMED = model_registry.Named(
    "estimator program", "trainers.program.EstimatorProgram",
    "EstimatorProgram(model_fn=...)",
    "--estimator_program takes package.module:NAME, an EstimatorProgram in a module on "
    "PYTHONPATH (docs/MIGRATION.md, \"Prove your port\")")

# The RunConfig settings the project's flags and strategy own, with what sets each here.
OWNED_RUN_CONFIG = {
    "model_dir": "--model_dir",
    "tf_random_seed": "--seed",
    "save_checkpoints_steps": "--checkpoint_every_steps",
    "save_checkpoints_secs": "--checkpoint_every_steps (under MultiWorkerMirroredStrategy in a "
                             "cluster the Estimator replaces seconds with every 1,000 steps)",
    "save_summary_steps": "--log_every_steps",
    "log_step_count_steps": "--log_every_steps",
    "train_distribute": "the project's strategy",
    "eval_distribute": "the project's strategy",
    "experimental_distribute": "the project's strategy",
    "device_fn": "the project's strategy",
    "session_config": "the project's strategy, which configures the session for its "
                      "collectives",
}
# The RunConfig settings a program may give, and the type each takes.
RUN_CONFIG = {"keep_checkpoint_max": int, "keep_checkpoint_every_n_hours": (int, float)}


class ProgramError(model_registry.SpecError):
  """--estimator_program names no usable program; the message says why and the fix."""


class StepHook:
  """What a SessionRunHook's before_run/after_run do each step, written once for both
  backends against the values both give it: the step that ended and its global-batch loss.

      class LossLog(StepHook):  # A hook that fetched the global step and the loss.
        def begin(self, step, model_dir):
          self.path = model_dir and os.path.join(model_dir, "loss_log.jsonl")
        def after_step(self, step, loss):
          ...  # What its after_run did with run_values.results.

      EstimatorProgram(..., step_hooks=(LossLog,))

  The Estimator calls it after each step, Keras after each execution of
  --steps_per_execution steps, with their mean loss (give 1 to see each step). It runs on
  the chief (`model_dir` given) and, with `chief_only` False, on every worker (None there).
  Raising stops the run with exit 2, naming it.
  """

  chief_only = True

  def begin(self, step: int, model_dir: Optional[str]) -> None:
    """Training starts (or resumes) at `step`."""

  def after_step(self, step: int, loss: float) -> None:
    """The step `step` ended, with this global-batch loss."""

  def end(self, step: int) -> None:
    """Training ended at `step`."""


@dataclasses.dataclass(frozen=True)
class EstimatorProgram:
  """A team's Estimator program: what they passed to `tf.estimator.Estimator` and
  `train_and_evaluate`.

  Attributes:
    model_fn: their model_fn, called as `tf.estimator.Estimator(model_fn, params=params)`
      calls it: with the arguments it declares of (features, labels, mode, params, config).
    params: their `params`.
    input_fn: `input_fn(mode, input_context)` -> a `tf.data.Dataset` of (features, labels)
      batched per replica: `mode` "train" (shuffled, repeated) or "eval" (the test split,
      once, in order), `input_context` a `tf.distribute.InputContext` under a strategy
      (shard by its `input_pipeline_id`) or None. Wrap theirs in a lambda if it takes
      other arguments. Both backends read it; None: the project's MNIST input_fn (images
      as features, batched by --global_batch_size).
    serving_input_receiver_fn: what their `export_saved_model` was given; None: no export.
    run_config: their `tf.estimator.RunConfig` settings the project does not own
      (keep_checkpoint_max, keep_checkpoint_every_n_hours); the rest are flags here
      (`OWNED_RUN_CONFIG`).
    deterministic_params: the `params` that take chance out of training (every dropout
      rate at 0), which launch.parity trains with: a model_fn that draws a mask without
      an op seed draws another one in each backend.
    step_hooks: StepHook classes (or factories), what their SessionRunHooks did each step,
      run in both backends (a fresh one each run).
  """

  model_fn: Callable[..., Any]
  params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  input_fn: Optional[Callable[..., Any]] = None
  serving_input_receiver_fn: Optional[Callable[[], Any]] = None
  run_config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  deterministic_params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  step_hooks: Sequence[Callable[[], StepHook]] = ()

  def __post_init__(self):
    for field in ("model_fn", "input_fn", "serving_input_receiver_fn"):
      value = getattr(self, field)
      if value is not None and not callable(value):
        raise ProgramError(f"EstimatorProgram({field}=...) is a {type(value).__name__}, not a "
                           f"function: give the function itself.")
    for key, value in self.run_config.items():
      if key in OWNED_RUN_CONFIG:
        raise ProgramError(f"EstimatorProgram(run_config={{{key!r}: ...}}): the project sets "
                           f"{key} from {OWNED_RUN_CONFIG[key]}; take it out of run_config.")
      if key not in RUN_CONFIG:
        raise ProgramError(f"EstimatorProgram(run_config={{{key!r}: ...}}) is not a RunConfig "
                           f"setting a program gives here; it takes "
                           f"{', '.join(RUN_CONFIG)}.")
      if isinstance(value, bool) or not isinstance(value, RUN_CONFIG[key]) or value <= 0:
        raise ProgramError(f"EstimatorProgram(run_config={{{key!r}: {value!r}}}): give a "
                           f"positive number.")
    unknown = sorted(set(self.deterministic_params) - set(self.params))
    if unknown:
      raise ProgramError(f"EstimatorProgram(deterministic_params=...) sets {unknown[0]!r}, which "
                         f"params does not have: name one of its keys "
                         f"({', '.join(map(repr, self.params)) or 'none'}).")

  def params_with(self, settings: str) -> Dict[str, Any]:
    """`params` with --program_params (`settings`, NAME=VALUE,...) over them; ProgramError
    naming a key `params` lacks."""
    try:
      given = model_registry.parse_options(settings, self.params, "the program's params",
                                           "--program_params")
    except model_registry.SpecError as e:
      raise ProgramError(str(e)) from None
    return {**self.params, **given}


def check(name: str, find: bool = True) -> None:
  """Raises ProgramError if `name` is malformed or (if `find`) names a module this Python
  cannot find; imports no TensorFlow (only the parent packages of the module)."""
  try:
    model_registry.find_module(name, NAMED, find)
  except model_registry.SpecError as e:
    raise ProgramError(str(e)) from None


def load(name: str) -> EstimatorProgram:
  """Imports the program `name` names; ProgramError, naming the fix, if it cannot."""
  try:
    return model_registry.load(name, EstimatorProgram, NAMED)
  except ProgramError:
    raise
  except model_registry.SpecError as e:
    raise ProgramError(str(e)) from e.__cause__


def step_hooks(name: Optional[str], chief: bool) -> Sequence[StepHook]:
  """A fresh StepHook of each of the program `name`'s step_hooks that runs on this task."""
  if not name:
    return []
  hooks = [make() for make in load(name).step_hooks]
  return [h for h in hooks if chief or not h.chief_only]
