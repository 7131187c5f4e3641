r"""Makes faults a run meets in the wild, trial after trial, and checks each ends as documented.

  python -m launch.chaos --backend={keras,estimator} [--fault=kill_worker,...|all]
      [--workers=2] [--trials=N] [--train_steps=300] [--data_dir=DIR] [--out=DIR] [--seed=0]
      [--engine=ray] [--ps=1]

Faults (docs/operations.md, "When things go wrong", has what each must leave):
  kill_worker          SIGKILL to a random training task (chief included)
  kill_evaluator       the same to the evaluator task
  preempt              SIGTERM to a random training task: 0 steps redone
  drain                SIGTERM to every task at once: 0 steps redone
  stop_chief           SIGSTOP to the chief, the coordination service's leader
  kill_launcher        SIGKILL to the launcher; then the same command again
  truncate_checkpoint  a finished run's newest checkpoint cut short; then the run extended
  nan_loss             one training batch made NaN (a test-only hook)
  disk_full            model_dir's own small tmpfs filled (root only; skipped otherwise)
  early_stop_kill_evaluator  a run that stops early (its loss must not fall): the evaluator
                       SIGKILLed as the chief records the stop's step
  early_stop_preempt   the same run: SIGTERM to a training task then
  kill_ps              SIGKILL to a parameter server (with --ps, where stop_chief and
                       the early_stop_ faults do not apply; launch/proofs/chaos.py says
                       what each fault must leave there)

Each trial trains the backend on local workers (--engine=ray: on Ray Train, a Ray
cluster started on this machine) with its evaluator task and makes its fault at a
random step. Prints a table: trial, backend, fault, what was done,
at which step, exit code, restarts, final step, steps redone, checkpoint valid,
wall time. Each trial's outcome is also appended to <out>/chaos_trials.jsonl as it
ends, so a long run that is stopped keeps what it finished. Exits 0 only if every
trial (but those skipped, which say why) ended with the documented exit code, at
exactly --train_steps (an early stop's step, below it) with a valid, evaluated checkpoint
where the run recovers,
with the newest checkpoint loadable where it stops, its output naming the fault,
no process left running and nothing left behind in model_dir or the tasks'
temporary directory.
"""

import os
import sys
from typing import Sequence

from absl import app
from absl import flags

from launch import console

console.quiet_tool_process()  # Before the imports below load TensorFlow.
from launch.proofs import chaos  # noqa: E402 -- after quiet_tool_process
from launch.proofs import harness  # noqa: E402 -- after quiet_tool_process
from launch.proofs import runs  # noqa: E402 -- after quiet_tool_process
from launch.proofs import tool_flags  # noqa: E402 -- after quiet_tool_process
from trainers import flags as trainer_flags  # noqa: E402 -- after quiet_tool_process
from trainers.config import Config  # noqa: E402 -- after quiet_tool_process

_BACKEND = flags.DEFINE_enum("backend", None, ["keras", "estimator"], "Backend to train.",
                             required=True)
_WORKERS = tool_flags.define_workers([2], "Local training worker counts (each at least 2); "
                                     "every fault is made --trials times at each.")
_TRIALS = flags.DEFINE_integer("trials", 10, "Number of trials.")
_FAULT = flags.DEFINE_list("fault", ["kill_worker"], f"Faults to make, each --trials times, "
                           f"comma-separated: {', '.join(chaos.FAULTS)}; or all.")
_TRAIN_STEPS = tool_flags.define_train_steps(300, "Steps of each trial's run.")
_BACKUP_EVERY = flags.DEFINE_integer("backup_every_steps", 50, "Keras backups and Estimator "
                                     "checkpoints, in steps: the most a kill can cost.")
_DATA_DIR, _MNIST_IDX_DIR = tool_flags.define_data_flags()
_CONFIG = trainer_flags.define_config_flags(trainer_flags.TRAINING_FIELDS)
_OUT = tool_flags.define_out()
_SEED = flags.DEFINE_integer("seed", 0, "Seeds the choice of step, signal and victim.")
_TIMEOUT = tool_flags.define_timeout()
_ENGINE = tool_flags.define_engine("What runs the tasks: the local launcher, or Ray Train "
                                   "(launch.ray, a Ray cluster started on this machine).")
_PS = flags.DEFINE_integer("ps", 0, "Parameter servers every trial's run trains on (its --ps); "
                           f"adds {', '.join(chaos.PS_ONLY)}, and {', '.join(chaos.NOT_ON_PS)} "
                           "do not apply.")


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}", exitcode=2)
  console.quiet_records(flags.FLAGS.verbosity)  # Their runs' logs keep everything.
  try:
    workers = tool_flags.worker_counts(_WORKERS, minimum=2)
  except app.UsageError as e:
    raise app.UsageError(f"{e} A lone process has no launcher to restart it.",
                         exitcode=2) from e
  train_steps, timeout = tool_flags.train_steps(_TRAIN_STEPS), tool_flags.timeout(_TIMEOUT)
  engine = tool_flags.engine(_ENGINE)
  if _TRIALS.value < 1 or train_steps < 2:
    raise app.UsageError("--trials must be >= 1 and --train_steps >= 2.", exitcode=2)
  unknown = sorted(set(_FAULT.value) - {*chaos.FAULTS, "all"})
  if unknown or not _FAULT.value:
    raise app.UsageError(f"--fault: unknown {', '.join(unknown) or 'empty list'}; choose from "
                         f"{', '.join(chaos.FAULTS)}, or all.", exitcode=2)
  ps = _PS.value
  if ps < 0 or (ps and engine != "local"):
    raise app.UsageError("--ps takes a count >= 0, on local workers: Ray Train runs no "
                         "parameter servers.", exitcode=2)
  skipped = chaos.NOT_ON_PS if ps else chaos.PS_ONLY
  faults = (tuple(f for f in chaos.FAULTS if f not in skipped) if "all" in _FAULT.value
            else tuple(dict.fromkeys(_FAULT.value)))
  wrong = [f for f in faults if f in skipped]
  if wrong:
    raise app.UsageError(f"--fault={','.join(wrong)} {'does not run on' if ps else 'needs'} "
                         f"parameter servers: {'drop it' if ps else 'give --ps=1'}.", exitcode=2)
  every = _BACKUP_EVERY.value
  config = Config(train_steps=train_steps, data_dir=_DATA_DIR.value,
                  backup_every_steps=every, checkpoint_every_steps=every,
                  log_every_steps=max(1, min(5, every)),
                  **trainer_flags.config_settings(_CONFIG))
  for n in workers:
    runs.check_or_exit(config, n, _MNIST_IDX_DIR.value, [_BACKEND.value])
  output = tool_flags.Output(_OUT, "chaos")
  out = output.path
  passed = True
  for n in workers:
    where = out if len(workers) == 1 else os.path.join(out, f"workers-{n}")
    results = chaos.run_chaos(_BACKEND.value, config, n, _TRIALS.value, where,
                              seed=_SEED.value, timeout=timeout, faults=faults,
                              engine=engine, ps=ps)
    print(harness.for_terminal(chaos.format_table(results)))
    if output.given:  # Else `finish` says whether they are kept, and where.
      print(f"Runs: {where}")
    passed = passed and chaos.overall_passed(results)
  output.finish(passed)
  sys.exit(0 if passed else 1)


if __name__ == "__main__":
  app.run(main, flags_parser=console.parse_flags)
