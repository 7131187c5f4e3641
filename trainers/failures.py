"""The failures that end a run for good, how each is recognised, and what it says.

A divergence (exit_codes.DIVERGED) and a full disk (exit_codes.DISK_FULL):
a restart would fail the same way, so neither is retried.
"""

import errno
import os
from typing import Callable, Optional, Sequence

import tensorflow as tf


class DivergedError(RuntimeError):
  """The training loss or the weights became NaN or Inf; the last checkpoint saved before
  it is kept."""


def diverged(step: int) -> DivergedError:
  """The error both backends raise when the loss or the weights stop being finite at (or
  by) `step`."""
  return DivergedError(
      f"the training loss or the weights became NaN or Inf by step {step}: training stopped "
      "there. Lower --learning_rate, or check the input data; a restart with the same "
      "settings would diverge again.")


def weights_finite(variables: Sequence[tf.Variable]) -> tf.Tensor:
  """Whether every element of `variables` is finite (this worker's copy: no collective).

  The loss alone does not show a divergence on every CPU: where a fused
  Conv2D+ReLU or a max-pool turns NaN into 0 or -FLT_MAX (oneDNN on AMD EPYC),
  a NaN batch gives a finite loss and NaN gradients, and the loss stays
  finite while the kernel it updated is NaN.
  """
  return tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in variables])


def in_chain(error: Optional[BaseException],
             matches: Callable[[BaseException], bool]) -> Optional[BaseException]:
  """The first error in `error`'s chain (its causes and contexts) that `matches`, or None."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if matches(error):
      return error
    error = error.__cause__ or error.__context__
  return None


def no_space_left(error: BaseException) -> Optional[BaseException]:
  """The error in `error`'s chain that is a write finding no space left (ENOSPC), or None.

  Python raises OSError(ENOSPC); TensorFlow's file system maps ENOSPC to an
  OpError (RESOURCE_EXHAUSTED) whose message keeps strerror's text.
  """
  return in_chain(error, lambda e: (
      (isinstance(e, OSError) and e.errno == errno.ENOSPC) or
      (isinstance(e, tf.errors.OpError) and os.strerror(errno.ENOSPC) in e.message)))


def disk_full_message(model_dir: str, error: BaseException) -> str:
  """What a run that found no space left says: the write, what is kept, and the fix."""
  newest = tf.train.latest_checkpoint(model_dir)
  kept = (f"The newest complete checkpoint, {newest}, is kept; nothing was deleted." if newest
          else "No checkpoint was saved yet.")
  first_line = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
  return (f"a write failed: {os.strerror(errno.ENOSPC)} ({first_line}). {kept} Free space on "
          f"the filesystem of --model_dir={model_dir} (or of the temporary directory, if the "
          "write was there), then run the same command again: it resumes from the newest "
          "checkpoint. A restart before that would fail the same way.")
