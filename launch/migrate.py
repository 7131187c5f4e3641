r"""One command, one report: whether a team's Keras port can replace its Estimator program.

  python -m launch.migrate --estimator_program=team_program:PROGRAM --model=team_port:SPEC \
      --assignment_map=team_map.json --optimizer=adam --learning_rate=1e-4 \
      --learning_rate_schedule=constant [--workers=1,2] [--long_steps=N] \
      [--model_dir=THEIR_MODEL_DIR] [--export_dir=THEIR_EXPORT] \
      [--keras_python=NEWEST_TF_PYTHON] [--keep_going] --out=DIR

Runs, in order, each proof that applies, as the tool a team could run alone:
- with --model_dir, the inspection (`launch.convert --inspect`) of a model_dir their program
  wrote: every variable has a place in the port; with no --assignment_map, every name
  matched by name, or the step fails naming DIR/inspect/proposed_map.json to review and
  give; with one, it places every variable the proposal does;
- parity (`launch.parity`) at each --workers count: the port against the program from the
  same weights, step by step (losses, learning rates, weights, evaluations, every declared
  metric), and their two exports fed the test split; and a long run (--long_steps, one epoch
  by default) compared by accuracy and loss curve;
- the handoff (`launch.handoff`): with --model_dir, its newest checkpoint (only read)
  converted to the port's, and to the port's and back, each resumed 10 steps and held to the
  program's own resume of it; without, a run of the program and one of the port, each
  converted to the other and resumed, against its own backend's resume;
- with --export_dir, the serving contract (`launch.serving_check --contract_only`) of the
  export their clients call today against the port's (parity's short run at the fewest
  workers): signatures, methods, inputs and outputs; their answers differ, the weights
  being others (parity compares answers, from the same weights).
- with --keras_python, version parity (`launch.version_parity`): the port on the newest TF
  (that install's python) against the program on 2.15.1, and each version serving both
  exports; the program's module must import there, where tf.estimator is gone
  (docs/examples/team_landing.py).
Each step prints a line when it starts, its tool's log lines as they come (what it trains,
where each run is), and a line with its result and time; a failing step stops the run
(every later step is reported as not run) unless --keep_going. Writes
DIR/migration_report.html (one page, no network needed, printable), .md and .json: the
verdict first, "switch" or "do not switch yet" and why; what was checked (flags, versions,
the variable map); then each step's checks as its tool reported them, its metrics, its
plots and its command. Each tool's own report and runs are in DIR/<step>/. Exits 0 on
"switch", 1 on "do not switch yet", 2 on bad flags (naming the fix, writing nothing); SIGINT
or SIGTERM stops the running step's tool and its runs, writes the report of what finished,
and exits 128 + the signal's number.

The recipe flags (--optimizer and its hyperparameters, the schedule, --program_params,
--assignment_map, --seed) go to every training step as given; a tool that refuses them
fails its step, saying why.
"""

import dataclasses
import os
import signal
import sys
from typing import List, Sequence

from absl import app
from absl import flags

from launch import console

console.quiet_tool_process()  # Before the imports below load TensorFlow.
from launch.proofs import migration  # noqa: E402 -- after quiet_tool_process
from launch.proofs import tool_flags  # noqa: E402 -- after quiet_tool_process
from trainers import flags as trainer_flags  # noqa: E402 -- after quiet_tool_process

_WORKERS = tool_flags.define_workers([1, 2], "Worker counts to prove parity and the handoff at.")
_TRAIN_STEPS = flags.DEFINE_integer("train_steps", 10, "Steps of parity's short run and of "
                                    "each half of the handoff.", lower_bound=1)
_LONG_STEPS = flags.DEFINE_integer("long_steps", None, "Steps of parity's long run, whose "
                                   "accuracy and loss curves are compared (default: one epoch "
                                   "of the training split; 0: none).", lower_bound=0)
_OUT = flags.DEFINE_string("out", None, "Where to write migration_report.{md,json} and each "
                           "step's reports and runs (new or empty).", required=True)
_DATA_DIR, _MNIST_IDX_DIR = tool_flags.define_data_flags()
_CONFIG = trainer_flags.define_config_flags(trainer_flags.TRAINING_FIELDS
                                            + trainer_flags.PROGRAM_FIELDS)
_ASSIGNMENT_MAP = tool_flags.define_assignment_map()
_SEED = flags.DEFINE_integer("seed", None, "Seeds every step's initial weights and shuffles "
                             "(default: each tool's).")
_MODEL_DIR = flags.DEFINE_string("model_dir", None, "A model_dir your program wrote: its "
                                 "variables are inspected and mapped onto the port.")
_EXPORT_DIR = flags.DEFINE_string("export_dir", None, "The export your clients call today: "
                                  "held to the port's in a serving check.")
_KERAS_PYTHON = flags.DEFINE_string("keras_python", None, "The python of your newest-TF "
                                    "install (.venv-tf221/bin/python): also prove the port "
                                    "there (version parity).")
_KEEP_GOING = flags.DEFINE_bool("keep_going", False, "Run every step even after one fails.")
_TIMEOUT = tool_flags.define_timeout()


def _recipe() -> List[str]:
  """The training flags given on the command line, as given: every training step's."""
  names = [*_CONFIG, "assignment_map", "seed"]
  return [flags.FLAGS[name].serialize() for name in names if flags.FLAGS[name].present]


def _check_flags() -> None:
  if not _CONFIG["estimator_program"].value:
    raise app.UsageError("--estimator_program is the program to migrate from: give "
                         "package.module:NAME (docs/MIGRATION.md, 'Prove your port').",
                         exitcode=2)
  if not flags.FLAGS["model"].present:
    raise app.UsageError("--model is the Keras port to migrate to: give "
                         "package.module:SPEC (docs/MIGRATION.md, 'Port your model').",
                         exitcode=2)
  for holder, what in ((_EXPORT_DIR, "the export your clients call"),
                       (_MODEL_DIR, "a model_dir your program wrote")):
    if holder.value and not os.path.isdir(holder.value):
      raise app.UsageError(f"--{holder.name}={holder.value} is not a directory: give {what}, "
                           "or leave the flag out.", exitcode=2)
  if _KERAS_PYTHON.value and not (os.path.isfile(_KERAS_PYTHON.value)
                                  and os.access(_KERAS_PYTHON.value, os.X_OK)):
    raise app.UsageError(f"--keras_python={_KERAS_PYTHON.value} is not a program: give the "
                         "python of your newest-TF install (README, \"Install\"), or leave "
                         "the flag out.", exitcode=2)
  if os.path.exists(_OUT.value) and os.listdir(_OUT.value):
    raise app.UsageError(f"--out={_OUT.value} is not empty: give a new directory, so no "
                         "earlier report is overwritten.", exitcode=2)


def main(argv: Sequence[str]) -> None:
  del argv
  _check_flags()
  inputs = migration.Inputs(
      recipe=_recipe(), workers=tool_flags.worker_counts(_WORKERS),
      data_dir=_DATA_DIR.value, estimator_program=_CONFIG["estimator_program"].value,
      export_dir=_EXPORT_DIR.value, model_dir=_MODEL_DIR.value,
      train_steps=_TRAIN_STEPS.value, long_steps=_LONG_STEPS.value,
      keras_python=_KERAS_PYTHON.value)
  for signum in (signal.SIGINT, signal.SIGTERM):  # Each tool runs in a session of its own.
    signal.signal(signum, _raise_stopped)
  try:
    outcomes = _run_steps(inputs, _OUT.value)
    judged = migration.write_report(outcomes, _OUT.value, inputs)
  except migration.Stopped as e:  # Between steps, or while the report was written.
    sys.exit(f"launch.migrate: stopped by {e}; the finished steps' reports are in "
             f"{_OUT.value}.")
  print(f"Verdict: {judged['verdict']}" + "".join(f"\n- {why}" for why in judged["why"]))
  print(f"Report: {_OUT.value}/{migration.REPORT}.html, {migration.REPORT}.md, "
        f"{migration.REPORT}.json")
  stopped = next((o.exit_code for o in outcomes if o.stopped_by), None)
  sys.exit(stopped or (0 if judged["verdict"] == migration.SWITCH else 1))


def _raise_stopped(signum: int, frame) -> None:
  del frame
  raise migration.Stopped(signum)


def _run_steps(inputs: migration.Inputs, out: str) -> List[migration.Outcome]:
  """Each step in turn, saying so; after a failure (or a stop) the rest are not run."""
  os.makedirs(out, exist_ok=True)
  steps = migration.plan(inputs)
  outcomes: List[migration.Outcome] = []
  stopped = False
  for index, step in enumerate(steps, 1):
    export = migration.port_export(outcomes) if step.port_export else None
    if stopped or (step.port_export and export is None):
      outcomes.append(migration.Outcome(step.name, step.proves, []))
      continue
    if export:
      step = dataclasses.replace(step, args=[*step.args, f"--second={export}"])
    print(f"[{index}/{len(steps)}] {step.name}: {step.proves}", flush=True)
    outcome = migration.run_step(step, out, tool_flags.timeout(_TIMEOUT))
    outcomes.append(outcome)
    failed = outcome.failed_checks
    detail = (f"; stopped by {outcome.stopped_by}" if outcome.stopped_by
              else f"; failed: {'; '.join(failed[:3])}" if failed else "" if outcome.passed
              else f"; exit {outcome.exit_code}, see {outcome.out_dir}/log.txt")
    print(f"[{index}/{len(steps)}] {step.name}: {outcome.result} "
          f"({len(outcome.checks)} checks, {outcome.seconds:.0f} s{detail})", flush=True)
    stopped = bool(outcome.stopped_by) or (not outcome.passed and not _KEEP_GOING.value)
  return outcomes


if __name__ == "__main__":
  app.run(main, flags_parser=console.parse_flags)
