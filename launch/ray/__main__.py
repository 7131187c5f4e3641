r"""Trains either backend on a Ray cluster, through Ray Train's `TensorflowTrainer`.

  python -m launch.ray --backend={keras,estimator} --workers=N [--address=HOST:PORT] \
      [--model_dir=DIR] [any trainer flag]

With no --address it starts a Ray cluster on this machine; with one it joins that
cluster (every node must reach --model_dir, and have this project installed). Each of
the N Ray Train workers runs the trainer binary with Ray's TF_CONFIG; an evaluator runs
beside them (--noevaluator: the chief evaluates). The trainer flags mean what they mean
to the binaries, --max_restarts, --timeout, --stall_timeout and --grace_seconds too, and
SIGTERM or Ctrl-C drains every task, as the local launcher does (docs/ray.md). The
chief's output is streamed, task logs and tasks.json go to <model_dir>/logs, and the
summary JSON is the last line, as with the binaries. Needs the `ray` extra:
pip install -e ".[tf215,ray]" (Python 3.10 or 3.11; ".[tf221,ray]" for Keras on TF 2.21).
"""

import dataclasses
import functools
import sys
from typing import List, Sequence

from absl import app
from absl import flags

from launch import console
from launch import exit_codes
from launch.ray import engine as ray_engine
from trainers import flags as trainer_flags
from trainers import runner

trainer_flags.define_flags()
_BACKEND = flags.DEFINE_enum("backend", None, list(runner.BACKENDS), "The backend to train.")
_ADDRESS = flags.DEFINE_string("address", None, "A Ray cluster's head (host:port, or auto); "
                               "default: start one on this machine.")
_OWN = ("backend", "address")


def _without_own_flags(args: Sequence[str]) -> List[str]:
  """`args` without this binary's own flags (`--backend=keras`, or `--backend keras`)."""
  kept, skip = [], False
  for arg in args:
    name = arg.lstrip("-").split("=")[0] if arg.startswith("--") else None
    if skip or name in _OWN:
      skip = not skip and name in _OWN and "=" not in arg
      continue
    kept.append(arg)
  return kept


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}", exitcode=2)
  if _BACKEND.value is None:
    raise app.UsageError("Give --backend=keras or --backend=estimator.", exitcode=2)
  if (flags.FLAGS.workers or 1) < 2:
    raise app.UsageError(f"--workers must be at least 2 on Ray, got {flags.FLAGS.workers or 1}; "
                         "one worker trains with the trainer binary itself.", exitcode=2)
  if flags.FLAGS.ps:
    raise app.UsageError(f"--ps={flags.FLAGS.ps}: Ray Train runs no parameter servers "
                         "(ray-project/ray#38972); train on parameter servers with the "
                         "trainer binary's local cluster or Kubeflow (launch.tfjob).",
                         exitcode=2)
  try:
    ray_engine.check_installed()
    if _ADDRESS.value:
      ray_engine.check_reachable(_ADDRESS.value)
    else:
      ray_engine.check_temp_dir()
  except ray_engine.RayUnavailable as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(exit_codes.USAGE)
  backend = _BACKEND.value
  options = trainer_flags.run_options_from_flags(runner.BINARIES[backend])
  # Every task runs the trainer binary with this command's trainer flags.
  options = dataclasses.replace(options, relaunch=_without_own_flags(options.relaunch))
  sys.exit(runner.run(backend, trainer_flags.config_from_flags(), options,
                      start_cluster=functools.partial(ray_engine.run_ray_cluster,
                                                      address=_ADDRESS.value)))


if __name__ == "__main__":
  app.run(main, flags_parser=console.parse_flags)
