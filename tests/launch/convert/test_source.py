"""launch.convert.source: the checkpoint a conversion reads, and its counters."""

import os

import numpy as np
import pytest
import tensorflow as tf

from launch.convert import source
from launch.convert.kinds import ConversionError
from trainers.config import Config


def _estimator_checkpoint(model_dir: str, step: int) -> str:
  """A name-based checkpoint holding only a global_step, as an Estimator's Saver writes it."""
  with tf.Graph().as_default():
    global_step = tf.compat.v1.Variable(np.int64(step), name="global_step")
    with tf.compat.v1.Session() as session:
      session.run(global_step.initializer)
      return tf.compat.v1.train.Saver([global_step]).save(
          session, os.path.join(model_dir, "model.ckpt"), global_step=step,
          write_meta_graph=False)


def test_newest_reads_the_newest_that_loads_and_refuses_saying_nothing_was_written(tmp_path):
  older = _estimator_checkpoint(str(tmp_path), 3)
  newer = _estimator_checkpoint(str(tmp_path), 5)
  assert source.newest(str(tmp_path), "estimator") == (newer, [])
  with open(newer + ".index", "wb") as f:
    f.write(b"torn")
  path, skipped = source.newest(str(tmp_path), "estimator")
  assert path == older and [s.name for s in skipped] == [newer]
  assert skipped[0].reason.startswith("does not load (")
  with pytest.raises(ConversionError, match="not a keras one: convert it with "
                     "--from_estimator. Nothing was written.$"):
    source.newest(str(tmp_path), "keras")
  with pytest.raises(ConversionError, match=f"No checkpoint in {tmp_path / 'empty'} "):
    source.newest(str(tmp_path / "empty"), "estimator")


def test_adams_counters_must_agree_with_the_step():
  config = Config(optimizer="adam")
  values = {"beta1_power": np.float32(0.9 ** 4), "beta2_power": np.float32(0.999 ** 4)}
  source.check_counters(values, 3, config, "ckpt")  # beta^(step + 1): the next step's.
  with pytest.raises(ConversionError, match="beta1_power is .* but the step is 7"):
    source.check_counters(values, 7, config, "ckpt")
  # beta1_power underflowed long ago: beta2_power alone is read.
  underflowed = {**values, "beta1_power": np.float32(0)}
  source.check_counters(underflowed, 3, config, "ckpt")
  with pytest.raises(ConversionError, match="beta2_power is .* but the step is 7"):
    source.check_counters(underflowed, 7, config, "ckpt")
  source.check_counters({}, 7, Config(optimizer="momentum"), "ckpt")  # Nothing to count.


def test_each_parts_own_count_of_steps_must_be_the_models():
  source.check_part_steps({"linear/_iterations": 7}, 7, "ckpt")
  with pytest.raises(ConversionError, match="counted 6 steps, the model's optimizer 7"):
    source.check_part_steps({"linear/_iterations": 6}, 7, "ckpt")
