"""The checkpoint a conversion reads: which one (`newest`), and whether its counters agree
with its step (`check_counters`, `check_part_steps`). The source is only ever read.
"""

import math
from typing import Any, List, Mapping, Tuple

import numpy as np
import tensorflow as tf
from absl import logging

from launch.convert.kinds import ConversionError, Ignored
from trainers import checkpoints
from trainers.config import Config


def read_checkpoint(path: str) -> Any:
  """A reader of the checkpoint at `path`; ConversionError if it cannot be read."""
  try:
    return tf.train.load_checkpoint(path)
  except (tf.errors.OpError, ValueError) as e:
    raise ConversionError(f"Cannot read the checkpoint {path}: {e}") from e


def newest(model_dir: str, backend: str, from_backup: bool = False
           ) -> Tuple[str, List[Ignored]]:
  """model_dir's newest checkpoint that loads, which must be `backend`'s
  (`checkpoints.newest_of`), and each newer one passed over, with why, logged."""
  try:
    path, passed_over = checkpoints.newest_of(model_dir, backend, from_backup)
  except checkpoints.NoCheckpointError as e:
    raise ConversionError(f"{e} Nothing was written.") from e
  for p, why in passed_over:
    logging.warning("Skipping %s, which does not load: %s", p, why)
  return path, [Ignored(p, f"does not load ({why})") for p, why in passed_over]


def check_counters(values: Mapping[str, np.ndarray], step: int, config: Config,
                   path: str) -> None:
  """Raises unless Adam's powers of beta are beta^(step + 1) (the power the next step
  uses: v1 starts them at beta, and multiplies after each step): they are counters of their own,
  and a checkpoint whose counters disagree has no one step to go on from. beta1_power
  reaches float32's zero after about 800 steps (beta1 0.9); from then on beta2_power
  (0.999: 0.22 at step 1500) alone is checked."""
  if config.optimizer != "adam":
    return
  hyperparameters = config.hyperparameters()
  for name, beta in zip(checkpoints.V1_OPTIMIZER_VARIABLES,
                        (hyperparameters["beta1"], hyperparameters["beta2"])):
    power = float(values[name])
    if power == 0.0 or beta in (0.0, 1.0):
      continue  # Underflowed, or no count to read.
    counted = math.log(power) / math.log(beta)
    # A float32 running product drifts by about step x 6e-8 relative: well under a step.
    if abs(counted - (step + 1)) > 0.5:
      raise ConversionError(
          f"{path}: {name} is {power:.6g}, {beta}^{counted:.1f}, but the step is {step} "
          f"(so {beta}^{step + 1}): "
          "Adam's counters disagree, so the run has no one step to go on from. Convert "
          "another checkpoint, or go on training with the backend that wrote it.")


def check_part_steps(part_steps: Mapping[str, int], step: int, path: str) -> None:
  """Raises unless each part's own count of steps (by its Keras key) is the model's `step`."""
  for key, counted in part_steps.items():
    if counted != step:
      raise ConversionError(f"{path}: {key} counted {counted} steps, the model's optimizer "
                            f"{step}: the Estimator keeps one step, so the run has no one step "
                            "to go on from. Convert another checkpoint.")
