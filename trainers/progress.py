"""What both trainers report while training: start-up milestones, progress lines and, on the
chief, `progress.jsonl` records."""

import time
from typing import Dict, Optional

from absl import logging

from trainers import model_dir as layout

_STARTUP: Dict[str, float] = {}  # Unix times this process passed start-up milestones.


def mark_startup(milestone: str) -> None:
  """Notes when this process passed a start-up milestone ("imported", "strategy")."""
  _STARTUP[milestone] = time.time()


class Progress:
  """Progress lines and records, the same in both backends.

  `start` logs "Training from step S to T." and records a `start` record
  with the start-up milestones; `log` logs "step N/T: loss L, X steps/s, ETA
  Y s" and records a `step` record. `loss` is the mean global-batch training
  loss over the steps since the previous log, in both backends.
  """

  def __init__(self, total: int, model_dir: Optional[str]):
    """model_dir: where the chief records progress; None on other workers."""
    self._total, self._model_dir = total, model_dir
    self.first_step = self.last_step = 0
    self.start_time = self.end_time = self.first_step_time = self._last_time = 0.0

  def start(self, step: int) -> None:
    self.first_step = self.last_step = step
    self.start_time = self._last_time = time.time()
    logging.info("Training from step %d to %d.", step, self._total)
    if self._model_dir:
      layout.record_progress(self._model_dir, "start", from_step=int(step), to_step=self._total,
                             startup={k: round(v, 3) for k, v in _STARTUP.items()})

  def first_step_done(self) -> None:
    if not self.first_step_time:
      self.first_step_time = time.time()

  def log(self, step: int, loss: float) -> float:
    """Reports the window ending at `step`; returns its steps/s."""
    now = time.time()
    steps_per_sec = (step - self.last_step) / max(now - self._last_time, 1e-9)
    # Asynchronous steps (parameter servers) may end past the total.
    eta = max(self._total - step, 0) / max(steps_per_sec, 1e-9)
    logging.info("step %d/%d: loss %.4f, %.1f steps/s, ETA %.0f s", step, self._total, loss,
                 steps_per_sec, eta)
    if self._model_dir:
      layout.record_progress(self._model_dir, "step", step=int(step), loss=float(loss),
                             steps_per_sec=round(steps_per_sec, 3))
    self.last_step, self._last_time = step, now
    return steps_per_sec

  def end(self) -> None:
    self.end_time = time.time()

  @property
  def train_seconds(self) -> float:
    return self.end_time - self.start_time

  @property
  def trained_steps(self) -> int:
    return self.last_step - self.first_step
