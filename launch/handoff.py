r"""Proves that carrying a run across backends mid-training changes nothing.

  python -m launch.handoff --workers=2 [--split_at=500] [--train_steps=510] \
      [--decay_steps=1000] [--out=DIR] [--data_dir=DIR]
  python -m launch.handoff --workers=1,2 --estimator_program=team_program:PROGRAM \
      --model=team_port:SPEC --assignment_map=team_map.json --optimizer=adam \
      --learning_rate=1e-4 --learning_rate_schedule=constant [--from_model_dir=THEIR_DIR]

From one initial-weights file, with op determinism, at each worker count each
backend trains 0 -> split and stops; then each resumes its own checkpoint
(estimator-then-estimator, keras-then-keras) and the other backend resumes it,
converted by launch.convert (estimator-then-keras, keras-then-estimator), all
to --train_steps. Checks that every Estimator variable is mapped, that an export
of the converted model serves as the Estimator's export, that each own resume equals
its handed-over twin (weights, per-step losses) and that the learning rate goes
on from the split; measures how far a resumed run is from an uninterrupted one.
Prints the table, writes handoff_report.{md,json} and loss_curves.png to --out,
and exits 0 only if every check passes.

With --estimator_program the Estimator legs run a team's own program and the Keras legs its
port (--model), the converter carrying between their names by --assignment_map; the
program is probed against the port first, as launch.parity probes it (exit 2 naming what
differs, nothing written), and each export is held to the other side's
(serving_check.compare_exports) where the program exports.

With --from_model_dir=DIR (a model_dir your program wrote, only read) the split is DIR's
newest checkpoint, at its own step: at each worker count the Estimator resumes a copy of it
(estimator-then-estimator), Keras resumes it converted (estimator-then-keras) and the
Estimator resumes it converted to Keras and back (keras-then-estimator), each --train_steps
(default: its step + 10); first, every variable is mapped or ignored, the round trip gives
back every carried value to the bit, the converted checkpoint serves as theirs does and
carries the rate; then each resume is held to the Estimator's own (weights, per-step
losses). Nothing of ours trains before the split, so there is no uninterrupted run.

--train_steps is the step every resumed run trains to, as in every tool; the
learning-rate schedule's length is --decay_steps. (Before, --train_steps was the
schedule's length and --resume_steps the steps past the split: a run that gives
--train_steps without --decay_steps says which meaning it took.)
"""

import dataclasses
import sys
from typing import Sequence

from absl import app
from absl import flags

from launch import console

console.quiet_tool_process()  # Before the imports below load TensorFlow.
from launch.convert.kinds import ConversionError  # noqa: E402 -- after quiet_tool_process
from launch.proofs import handoff  # noqa: E402 -- after quiet_tool_process
from launch.proofs import harness  # noqa: E402 -- after quiet_tool_process
from launch.proofs import runs  # noqa: E402 -- after quiet_tool_process
from launch.proofs import tool_flags  # noqa: E402 -- after quiet_tool_process
from trainers import config as config_lib  # noqa: E402 -- after quiet_tool_process
from trainers import flags as trainer_flags  # noqa: E402 -- after quiet_tool_process
from trainers.config import Config  # noqa: E402 -- after quiet_tool_process

_WORKERS = tool_flags.define_workers([2], "Worker counts to run at, e.g. 1,2.")
_PS = tool_flags.define_ps()
_SPLIT_AT = flags.DEFINE_integer("split_at", 500, "The step at which each run is handed over.")
_TRAIN_STEPS = flags.DEFINE_integer("train_steps", None, "The step every resumed run trains to "
                                    "(default: --split_at + 10).")
_DECAY_STEPS = flags.DEFINE_integer("decay_steps", 1000, "The learning-rate schedule's "
                                    "--decay_steps (every run's: cosine's and polynomial's "
                                    "length, exponential's and inverse_time's period).")
_RESUME_STEPS = flags.DEFINE_integer("resume_steps", None, "Deprecated: give --train_steps "
                                     "(--split_at + this) instead.")
_OUT = tool_flags.define_out("handoff_report.{md,json}, loss_curves.png")
_DATA_DIR, _MNIST_IDX_DIR = tool_flags.define_data_flags()
_CONFIG = trainer_flags.define_config_flags(trainer_flags.TRAINING_FIELDS
                                            + trainer_flags.PROGRAM_FIELDS)
_ASSIGNMENT_MAP = tool_flags.define_assignment_map()
_SEED = flags.DEFINE_integer("seed", Config.seed, "Seeds the initial-weights file and shuffles.")
_TIMEOUT = tool_flags.define_timeout()
_FROM_MODEL_DIR = flags.DEFINE_string(
    "from_model_dir", None, "A model_dir your program wrote: hand its newest checkpoint over "
    "(the split is its step) instead of training to --split_at; read, never written.")
_MEASURE_UNINTERRUPTED = flags.DEFINE_bool(
    "measure_uninterrupted", True, "Also train each backend without a stop (two more runs per "
    "worker count) and report how far the resumed runs are from them.")
_TOLERANCES = {f.name: flags.DEFINE_float(f.name, f.default, f"Limit: {f.name}.")
               for f in dataclasses.fields(handoff.Tolerances)}
_LOGIT_ATOL = flags.DEFINE_float("logit_atol", None, "Deprecated: give --logits_atol (as "
                                 "launch.version_parity spells it).")


def _tolerances() -> handoff.Tolerances:
  """The limits, taking the deprecated --logit_atol (saying so) for --logits_atol."""
  limits = {k: v.value for k, v in _TOLERANCES.items()}
  if _LOGIT_ATOL.present:
    if _TOLERANCES["logits_atol"].present:
      raise app.UsageError("Give --logits_atol or the deprecated --logit_atol, not both.",
                           exitcode=2)
    limits["logits_atol"] = _LOGIT_ATOL.value
    print(f"warning: --logit_atol is deprecated; use --logits_atol={_LOGIT_ATOL.value}.",
          file=sys.stderr)
  return handoff.Tolerances(**limits)


def _steps() -> Sequence[int]:
  """(split_at, train_steps, decay_steps), saying how old spellings were read."""
  split_at, train_steps = _SPLIT_AT.value, _TRAIN_STEPS.value
  if _RESUME_STEPS.present:
    if _TRAIN_STEPS.present:
      raise app.UsageError("Give --train_steps or the deprecated --resume_steps, not both.",
                           exitcode=2)
    train_steps = split_at + _RESUME_STEPS.value
    print(f"warning: --resume_steps is deprecated; use --train_steps={train_steps} (the step "
          "every resumed run trains to).", file=sys.stderr)
  elif _TRAIN_STEPS.present and not _DECAY_STEPS.present:
    print(f"note: --train_steps={train_steps} is taken as the step every resumed run trains "
          f"to, with the schedule's length --decay_steps={_DECAY_STEPS.value} (its default). "
          "Before, --train_steps was the schedule's length: to mean that, give "
          f"--decay_steps={train_steps} instead.", file=sys.stderr)
  if train_steps is None:
    train_steps = split_at + 10
  # A schedule that ends at --decay_steps must not end before the runs do.
  ends = _ends()
  if not 0 < split_at < train_steps or ends and train_steps > _DECAY_STEPS.value:
    raise app.UsageError(f"Need 0 < --split_at ({split_at}) < --train_steps ({train_steps})"
                         + (f" <= --decay_steps ({_DECAY_STEPS.value})" if ends else "") + ".",
                         exitcode=2)
  return split_at, train_steps, _DECAY_STEPS.value


def _their_steps() -> int:
  """With --from_model_dir: the step every resumed run trains to (their newest checkpoint's
  step + 10 by default); a usage error for flags that do not apply."""
  refused = [f"--{f.name}" for f in (_SPLIT_AT, _RESUME_STEPS, _PS, _MEASURE_UNINTERRUPTED)
             if f.present]
  if refused:
    raise app.UsageError(f"--from_model_dir hands over your newest checkpoint, at its own "
                         f"step, with no run of ours before it: leave out {', '.join(refused)}.",
                         exitcode=2)
  try:
    step = handoff.their_step(_FROM_MODEL_DIR.value)
  except ValueError as e:
    raise app.UsageError(f"--from_model_dir: {e}", exitcode=2) from e
  train_steps = _TRAIN_STEPS.value if _TRAIN_STEPS.present else step + 10
  if train_steps <= step:
    raise app.UsageError(f"--from_model_dir={_FROM_MODEL_DIR.value} is at step {step}: give "
                         f"a --train_steps above it (or leave it out: {step + 10}).", exitcode=2)
  if _ends() and train_steps > _DECAY_STEPS.value:
    raise app.UsageError(f"--train_steps={train_steps} is past the schedule's end: give a "
                         f"--decay_steps of {train_steps} or more.", exitcode=2)
  return train_steps


def _ends() -> bool:
  """Whether the schedule ends at --decay_steps (a run must not train past it)."""
  return bool(config_lib.schedule_ends(_CONFIG["learning_rate_schedule"].value,
                                       _CONFIG["cycle"].value))


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}", exitcode=2)
  console.quiet_records(flags.FLAGS.verbosity)  # Their runs' logs keep everything.
  workers = tool_flags.worker_counts(_WORKERS)
  ps = tool_flags.parameter_servers(_PS, workers)
  tolerances = _tolerances()
  if _FROM_MODEL_DIR.value:
    train_steps = _their_steps()
    split_at, decay_steps = None, _DECAY_STEPS.value
  else:
    split_at, train_steps, decay_steps = _steps()
  timeout = tool_flags.timeout(_TIMEOUT)
  config = Config(seed=_SEED.value, data_dir=_DATA_DIR.value,
                  **trainer_flags.config_settings(_CONFIG))
  for n in workers:
    runs.check_or_exit(config, n, _MNIST_IDX_DIR.value)
  program = tool_flags.probe_program(config, max(workers), train_steps, _ASSIGNMENT_MAP)
  output = tool_flags.Output(_OUT, "handoff", ("handoff_report.*", "loss_curves.png"))
  out = output.path
  try:
    if _FROM_MODEL_DIR.value:
      report = handoff.run_from_model_dir(
          dataclasses.replace(config, decay_steps=decay_steps), workers, out,
          model_dir=_FROM_MODEL_DIR.value, train_steps=train_steps, tolerances=tolerances,
          timeout=timeout, program=program)
    else:
      report = handoff.run_handoff(
          config, workers, out, split_at=split_at, train_steps=train_steps,
          decay_steps=decay_steps, timeout=timeout,
          measure_uninterrupted=_MEASURE_UNINTERRUPTED.value,
          tolerances=tolerances, program=program, ps=ps)
  except (runs.RunError, ConversionError) as e:  # Names the run's log, or the variable.
    sys.exit(f"error: {e}")
  handoff.write_report(report, out)
  print(harness.for_terminal(handoff.format_table(report)))
  print(f"Report: {out}/handoff_report.md, handoff_report.json, loss_curves.png")
  output.finish(report.passed)
  sys.exit(0 if report.passed else 1)


if __name__ == "__main__":
  app.run(main, flags_parser=console.parse_flags)
