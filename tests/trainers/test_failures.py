"""trainers.failures: a full disk anywhere in an error's chain, and what it says."""

import tensorflow as tf

from trainers import failures


def test_a_full_disk_is_found_anywhere_in_an_errors_chain(tmp_path):
  enospc = OSError(28, "No space left on device")
  try:
    try:
      raise enospc
    except OSError as e:
      raise RuntimeError("writing the summary failed") from e
  except RuntimeError as e:
    assert failures.no_space_left(e) is enospc
  op_error = tf.errors.ResourceExhaustedError(None, None, "/x/ckpt-4.data; No space left on device")
  assert failures.no_space_left(op_error) is op_error
  assert failures.no_space_left(ValueError("no space for the batch")) is None
  assert failures.no_space_left(OSError(13, "Permission denied")) is None
  message = failures.disk_full_message(str(tmp_path), op_error)
  assert "No space left on device (/x/ckpt-4.data" in message and "No checkpoint" in message
  assert f"--model_dir={tmp_path}" in message and "run the same command again" in message
