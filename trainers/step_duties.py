"""What both backends do as training steps end, written once; a Keras callback and an
Estimator hook each feed it and act on what it says (keras_trainer.StepsCallback,
estimator_trainer._Steps).

After each step (after each execution of K steps, in Keras) `StepDuties.stepped` records
the steps' global-batch loss (`step_losses`: parity reads them) and raises
failures.DivergedError on a NaN or Inf loss or weights, before anything of that step is
saved (each backend calls it ahead of its checkpoints and backups); every worker sees the
same all-reduced loss and holds the same weights, so all stop together; a team's program's
step hooks (program.StepHook) see each of those steps, and the chief's early-stopping
checks (trainers.early_stopping). `should_stop` says when the cluster's agreed preemption
or early-stop step is reached (trainers.preemption), where the backend ends training as at
its last step. `report_due` reports the window's mean loss
every `every` steps and at the last (progress.Progress): Keras calls it after its saves,
so a progress record at a backup's step means that backup exists.
"""

import math
from typing import Any, List, Mapping, NamedTuple, Optional, Sequence

import numpy as np
from absl import logging

from trainers import early_stopping
from trainers import failures
from trainers import preemption
from trainers import program
from trainers import progress


class Reported(NamedTuple):
  """A progress report: the window's mean loss and its steps per second."""
  loss: float
  steps_per_sec: float


class TensorLog:
  """--log_tensors: the values each training task logs at every `every`-th step (the steps of
  the progress lines), in LoggingTensorHook's words: `loss = 0.31, hidden = [[...]]`."""

  def __init__(self, names: Sequence[str], every: int):
    self.names, self._every = list(names), every

  def due(self, step: int) -> bool:
    """Whether the step `step` (counted from 1) logs."""
    return bool(self.names) and step % self._every == 0

  def log(self, step: int, values: Mapping[str, Any]) -> None:
    with np.printoptions(suppress=True):  # As LoggingTensorHook prints them.
      logging.info("Tensors at step %d: %s", step,
                   ", ".join(f"{name} = {np.asarray(values[name])}" for name in self.names))


class StepDuties:
  """The duties of one training run in this process (see the module's docstring)."""

  def __init__(self, every: int, total: int, model_dir: Optional[str],
               agreement: Optional[preemption.Agreement] = None,
               hooks: Sequence[program.StepHook] = (), program_name: str = "",
               early_stop: Optional[preemption.Agreement] = None,
               checks: Optional[early_stopping.Checks] = None,
               tensors: Optional[TensorLog] = None):
    """model_dir: where the chief records progress; None on other workers. hooks: the step
    hooks of the program `program_name`, which its errors name. early_stop: where an early
    stop ends training (every training task), decided by the chief's `checks`. tensors:
    what --log_tensors logs (Keras's loop logs it; a model_fn's hook, the Estimator's)."""
    self.tensors = tensors or TensorLog((), every)
    self._every, self._total, self._agreement = every, total, agreement
    self._early_stop, self._checks = early_stop, checks
    self._model_dir, self._hooks, self._program = model_dir, hooks, program_name
    self.report = progress.Progress(total, model_dir)
    self.step = 0  # The last step that ended.
    self._window = 0.0  # The losses summed since the last report,
    self._window_steps = 0  # over this many steps.
    self.step_losses: List[float] = []

  def start(self, step: int) -> None:
    """Training starts (or resumes) at `step`."""
    self.step = step
    self.report.start(step)
    self._call_hooks("begin", step, self._model_dir)

  def stepped(self, step: int, loss_sum: float, weights_finite: bool = True,
              steps: Optional[int] = None) -> None:
    """The steps up to `step` ended (one, or one Keras execution), their global-batch losses
    summing to `loss_sum`; `steps` of them were this task's (default: all since the last,
    but on parameter servers the other tasks step too).

    Raises:
      failures.DivergedError: the loss or (`weights_finite` False) the weights are NaN or Inf.
    """
    self.report.first_step_done()
    steps = step - self.step if steps is None else steps
    self.step = step
    self.step_losses.append(loss_sum)
    self._window += loss_sum
    self._window_steps += steps
    if not (math.isfinite(loss_sum) and weights_finite):
      raise failures.diverged(step)
    self._call_hooks("after_step", step, loss_sum / max(steps, 1))
    if self._checks:
      self._checks.after_step(step)

  def report_due(self) -> Optional[Reported]:
    """Reports the window that ends at the last step, if a report falls there (at a
    multiple of `every` or past one, as steps other tasks took may skip it, and at the
    last); returns what it reported, or None."""
    step, last = self.step, self.report.last_step
    if step == last or (step // self._every == last // self._every and step < self._total):
      return None
    loss = self._window / max(self._window_steps, 1)
    self._window, self._window_steps = 0.0, 0
    return Reported(loss, self.report.log(step, loss))

  def should_stop(self) -> bool:
    """Whether the cluster agreed to stop at the step that just ended, for a preemption or
    an early stop; between them, an attribute read each."""
    return any(agreement and agreement.pending and agreement.reached(self.step)
               for agreement in (self._agreement, self._early_stop))

  def end(self) -> None:
    self.report.end()
    self._call_hooks("end", self.step)

  def _call_hooks(self, method: str, *args) -> None:
    """Calls `method` of each step hook; what one raises becomes a ProgramError naming it."""
    for hook in self._hooks:
      try:
        getattr(hook, method)(*args)
      except Exception as e:  # Their code: what it raises is theirs to fix.
        raise program.ProgramError(
            f"--estimator_program={self._program}: its step hook {type(hook).__name__}."
            f"{method} failed: {type(e).__name__}: {e}. Fix it, then run again.") from e
