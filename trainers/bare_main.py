r"""The benchmark's reference: a bare tf.function training loop, one process, no strategy.

  python -m trainers.bare_main [--model_dir=DIR] [--data_dir=DIR] [--train_steps=N]

Takes the trainers' flags (one per Config field) so launch.bench runs it as it
runs the backends; --workers must be 1. The last line on stdout is the summary JSON.
"""

import sys
from typing import Sequence

from absl import app
from absl import flags

from trainers import bench
from trainers import flags as trainer_flags

trainer_flags.define_flags()


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}", exitcode=2)
  if flags.FLAGS.workers != 1:
    raise app.UsageError("The reference runs in one process: --workers must be 1.", exitcode=2)
  config = trainer_flags.config_from_flags()
  try:
    config.validate(1)
  except ValueError as e:
    raise app.UsageError(str(e), exitcode=2)
  sys.exit(bench.run_bare(config, flags.FLAGS.model_dir))


if __name__ == "__main__":
  app.run(main)
