"""trainers.checkpoints: whose a checkpoint is, its step, and whether a backend resumes it."""

import pytest
import tensorflow as tf

from trainers import checkpoints
from trainers import model as model_lib


def test_a_checkpoint_is_recognised_by_backend_and_step(tmp_path):
  model = model_lib.build_model(0)
  model.compile(optimizer="sgd", loss="mse")
  tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(tmp_path), 1,
                             checkpoint_name="ckpt").save(checkpoint_number=4)
  path = tf.train.latest_checkpoint(str(tmp_path))
  assert checkpoints.checkpoint_step(path)[0] == "keras"
  assert checkpoints.resume_problem("keras", str(tmp_path)) is None
  assert "checkpoint of the keras backend" in checkpoints.resume_problem("estimator",
                                                                         str(tmp_path))
  with pytest.raises(tf.errors.NotFoundError):
    checkpoints.checkpoint_step(str(tmp_path / "missing"))
