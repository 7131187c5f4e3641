"""The one set of hyperparameters both backends train with."""

import dataclasses
import math
from typing import Optional

AUTO_STEPS_PER_EXECUTION_MAX = 10


@dataclasses.dataclass(frozen=True)
class Config:
  """Hyperparameters and run settings shared by the Keras and Estimator trainers.

  The defaults reach >= 98% test accuracy on the 22,699-image offline MNIST
  subset with either backend at 1 or 2 workers.

  Attributes:
    train_steps: optimizer steps; each consumes one global batch.
    global_batch_size: examples per step summed over all replicas; must be
      divisible by the number of replicas (96 divides 1, 2, 3 and 4).
    learning_rate: initial SGD learning rate, cosine-decayed to 0 over
      train_steps.
    momentum: SGD momentum.
    seed: seeds the initial weights and the shuffle order.
    data_dir: TFDS data directory; None means TFDS's default.
    eval_batch_size: evaluation batch; a divisor of the 10,000 test images
      keeps the mean-of-batch-means loss of the Estimator equal to the
      per-example mean of Keras.
    log_every_steps: steps between progress logs and loss summaries.
    checkpoint_every_steps: steps between checkpoints (and so between the
      Estimator evaluator's evaluations); the Estimator resumes from them.
    backup_every_steps: steps between Keras BackupAndRestore backups, which
      Keras resumes from after a failure.
    init_weights: a .npz of initial weights by variable name (as written by
      `model.save_weights_npz`); None initializes from `seed`.
    deterministic: turn on TensorFlow op determinism.
    record_dir: if set, the chief writes each step's loss there and every
      training pipeline writes the fingerprints of its shard (for launch.parity).
    steps_per_execution: Keras only: training steps per call of the compiled
      train function. Keras calls batch callbacks once per call, so the step
      count and the log, checkpoint and backup intervals must be multiples of
      it, and per-step records need 1. 0 (auto) picks the largest that fits,
      up to 10.
  """

  train_steps: int = 1500
  global_batch_size: int = 96
  learning_rate: float = 0.1
  momentum: float = 0.9
  seed: int = 1
  data_dir: Optional[str] = None
  eval_batch_size: int = 500
  log_every_steps: int = 100
  checkpoint_every_steps: int = 500
  backup_every_steps: int = 100
  init_weights: Optional[str] = None
  deterministic: bool = False
  record_dir: Optional[str] = None
  steps_per_execution: int = 0

  def keras_steps_per_execution(self) -> int:
    """steps_per_execution with auto (0) resolved: the largest value up to 10 that
    divides train_steps and the log, checkpoint and backup intervals; 1 with record_dir."""
    if self.steps_per_execution:
      return self.steps_per_execution
    if self.record_dir:
      return 1
    divides = math.gcd(self.train_steps, self.log_every_steps, self.checkpoint_every_steps,
                       self.backup_every_steps)
    return max(k for k in range(1, AUTO_STEPS_PER_EXECUTION_MAX + 1) if divides % k == 0)

  def validate(self, num_replicas: int = 1) -> None:
    """Raises ValueError naming the bad setting and its fix."""
    for name in ("train_steps", "global_batch_size", "eval_batch_size", "log_every_steps",
                 "checkpoint_every_steps", "backup_every_steps"):
      if getattr(self, name) <= 0:
        raise ValueError(f"--{name} must be positive, got {getattr(self, name)}.")
    if self.learning_rate <= 0:
      raise ValueError(f"--learning_rate must be positive, got {self.learning_rate}.")
    if not 0 <= self.momentum < 1:
      raise ValueError(f"--momentum must be in [0, 1), got {self.momentum}.")
    if self.steps_per_execution < 0:
      raise ValueError(f"--steps_per_execution must be >= 0 (0 = auto), got "
                       f"{self.steps_per_execution}.")
    for name in ("train_steps", "log_every_steps", "checkpoint_every_steps",
                 "backup_every_steps"):
      if self.steps_per_execution and getattr(self, name) % self.steps_per_execution:
        raise ValueError(
            f"--{name}={getattr(self, name)} is not a multiple of --steps_per_execution="
            f"{self.steps_per_execution}: Keras runs callbacks only between executions.")
    if self.record_dir and self.steps_per_execution > 1:
      raise ValueError("--record_dir records every step's loss: it needs "
                       "--steps_per_execution=1.")
    if self.global_batch_size % num_replicas:
      raise ValueError(
          f"--global_batch_size={self.global_batch_size} is not divisible by the "
          f"{num_replicas} replicas; use a multiple of {num_replicas}."
      )
