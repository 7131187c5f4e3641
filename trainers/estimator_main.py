r"""Trains the MNIST CNN with tf.estimator.train_and_evaluate,
with RunConfig(train_distribute=MultiWorkerMirroredStrategy()) and, with
--workers > 1, an "evaluator" task that evaluates every checkpoint.

  python -m trainers.estimator_main --workers=2 [--model_dir=DIR] [--data_dir=DIR]

See --helpfull for every flag. The last line on stdout is the run's summary JSON.
"""

import sys
from typing import Sequence

from absl import app

from trainers import flags as trainer_flags
from trainers import runner

trainer_flags.define_flags()


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}", exitcode=2)
  FLAGS = trainer_flags.FLAGS
  sys.exit(runner.run(
      "estimator",
      trainer_flags.config_from_flags(),
      workers=FLAGS.workers if FLAGS["workers"].present else None,
      model_dir=FLAGS.model_dir,
      relaunch=[sys.executable, "-m", "trainers.estimator_main", *sys.argv[1:]],
      log_dir=FLAGS.task_log_dir,
      timeout=FLAGS.timeout,
  ))


if __name__ == "__main__":
  app.run(main)
