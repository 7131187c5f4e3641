"""team_program.py's program as a module the newest TensorFlow imports (tf.estimator is gone
from TF 2.16), for `launch.version_parity` and `launch.migrate --keras_python`: Keras on the
newest TF reads the program's input_fn, so its module must load there.

    PYTHONPATH=docs/examples python -m launch.version_parity \\
        --keras_python=.venv-tf221/bin/python --workers=1,2 \\
        --estimator_program=team_landing:PROGRAM --model=team_port:SPEC \\
        --assignment_map=docs/examples/team_map.json \\
        --optimizer=adam --learning_rate=1e-4 --learning_rate_schedule=constant

team_estimator.py defines a SessionRunHook as it is imported and its input_fn compares
`mode` with tf.estimator.ModeKeys: the two things a team moves. Here the Estimator's parts
(model_fn, receiver) are imported only when the Estimator calls them, on TF 2.15.1, and the
input_fn is team_estimator's with `mode` read as the string it is. docs/MIGRATION.md,
"Landing on TF 2.16+", walks through it.
"""

import tensorflow as tf
import tensorflow_datasets as tfds

from trainers.program import EstimatorProgram

BATCH_PER_WORKER = 100


def input_fn(mode, input_context=None):
  """team_estimator.input_fn, with no tf.estimator: `mode` is "train" or "eval"."""
  training = mode == "train"
  dataset = tfds.load("mnist", split="train" if training else "test", as_supervised=True)
  if input_context is not None:
    dataset = dataset.shard(input_context.num_input_pipelines,
                            input_context.input_pipeline_id)
  dataset = dataset.map(lambda image, label: ({"pixels": tf.cast(image, tf.float32) / 255.0},
                                              label))
  if training:
    dataset = dataset.shuffle(10_000, seed=7).repeat()
  return dataset.batch(BATCH_PER_WORKER, drop_remainder=training).prefetch(2)


def model_fn(features, labels, mode, params, config):
  """team_estimator.model_fn, imported when the Estimator calls it (TF 2.15.1)."""
  import team_estimator  # noqa: PLC0415 -- it needs tf.estimator as it is imported.
  return team_estimator.model_fn(features, labels, mode, params, config)


def serving_input_receiver_fn():
  import team_estimator  # noqa: PLC0415 -- it needs tf.estimator as it is imported.
  return team_estimator.serving_input_receiver_fn()


PROGRAM = EstimatorProgram(
    model_fn=model_fn,
    params={"learning_rate": 1e-4, "dropout": 0.3},  # team_estimator.PARAMS
    input_fn=input_fn,
    serving_input_receiver_fn=serving_input_receiver_fn,
    run_config={"keep_checkpoint_max": 5},
    deterministic_params={"dropout": 0.0},
)
