r"""The benchmark's bare loops: the ceiling run, or the step-cost probe.

  python -m launch.bare [--model_dir=DIR] [--data_dir=DIR] [--train_steps=N]
  python -m launch.local --workers=N -- python -m launch.bare [--model_dir=DIR]
  [python -m launch.local --workers=N --] python -m launch.bare --probe_out=FILE

Without --probe_out it trains with the ceiling's loop, K steps (Keras's steps
per execution) per tf.function call on the shared input pipeline: no strategy
alone, the bare MultiWorkerMirroredStrategy step as a TF_CONFIG task
(launch.bench's ceiling run); the chief's last line on stdout is the summary
JSON. With --probe_out it times input, compute, all-reduce and the ceiling's
loops (one or K steps per call, on the pipeline or on a batch held in memory)
as this task, and the chief writes them to FILE. Takes the trainers' flags
(one per Config field); --workers must be 1: a cluster comes from TF_CONFIG.
"""

import sys
from typing import Sequence

from absl import app
from absl import flags

from launch import console
from launch.bench import bare
from trainers import flags as trainer_flags

trainer_flags.define_flags()
_PROBE_OUT = flags.DEFINE_string("probe_out", None, "Time the parts of a step instead of "
                                 "training; the chief writes them to this JSON file.")


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}", exitcode=2)
  if flags.FLAGS.workers not in (None, 1):
    raise app.UsageError("--workers must be 1: a cluster comes from TF_CONFIG (python -m "
                         "launch.local --workers=N -- python -m launch.bare ...).",
                         exitcode=2)
  config = trainer_flags.config_from_flags()
  try:
    config.validate(1)
  except ValueError as e:
    raise app.UsageError(str(e), exitcode=2) from e
  sys.exit(bare.run_bare(config, flags.FLAGS.model_dir, _PROBE_OUT.value,
                        flags.FLAGS.mnist_idx_dir))


if __name__ == "__main__":
  app.run(main, flags_parser=console.parse_flags)
