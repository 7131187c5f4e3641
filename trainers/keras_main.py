r"""Trains the MNIST CNN with Keras Model.fit under MultiWorkerMirroredStrategy.

  python -m trainers.keras_main --workers=2 [--model_dir=DIR] [--data_dir=DIR]

See --helpfull for every flag. The last line on stdout is the run's summary JSON.
"""

import sys
from typing import Sequence

from absl import app

from launch import console
from trainers import flags as trainer_flags
from trainers import runner

trainer_flags.define_flags()


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}", exitcode=2)
  config = trainer_flags.config_from_flags()
  options = trainer_flags.run_options_from_flags("trainers.keras_main")
  sys.exit(runner.run("keras", config, options))


if __name__ == "__main__":
  app.run(main, flags_parser=console.parse_flags)
