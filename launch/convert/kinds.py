"""The converter's vocabulary: what each variable of a checkpoint is (`Kind`), and what a
conversion reports (`Entry`, `Mapped`, `Ignored`, `Conversion`, `ConversionError`).

The same words in the converter's table, `--inspect`'s listing and its JSON. TensorFlow-free.
"""

import dataclasses
import enum
from typing import List, Mapping, NamedTuple, Optional, Tuple

AssignmentMap = Mapping[str, Optional[str]]  # Old checkpoint name -> model weight, or None.


class Kind(str, enum.Enum):
  """What a checkpoint's variable is; prints (and serializes to JSON) as its value."""
  WEIGHT = "weight"  # A value of the model: a kernel, a bias, a moving statistic.
  SLOT = "slot"  # An optimizer's value for one weight (`conv/kernel/Momentum`).
  STEP = "step"  # `global_step`, or a Keras optimizer's `iterations`.
  PART_STEP = "part step"  # canned.PartOptimizers's linear part's own count of steps.
  COUNTER = "counter"  # An optimizer's own state, not a slot: Adam's powers of beta.
  HYPERPARAMETER = "hyperparameter"  # A Keras legacy optimizer's scalar (`learning_rate`).
  IGNORED = "ignored"  # Not carried, with why (dropped by the map, never read).
  UNMAPPED = "unmapped"  # No place in the model: an error naming the map entry that fixes it.
  OTHER = "other"  # `--inspect`: none of these (an EMA, a metric, the program's own).

  def __str__(self) -> str:
    return self.value

  def __format__(self, spec: str) -> str:  # Python 3.9 to 3.11 format mixins differently.
    return format(self.value, spec)


class ConversionError(ValueError):
  """A checkpoint cannot be converted as asked; the message names the variable and the fix."""


class Entry(NamedTuple):
  """One variable of a source Estimator checkpoint and what the conversion does with it."""
  name: str  # In the source checkpoint.
  shape: Tuple[int, ...]
  kind: Kind  # WEIGHT, SLOT, STEP, COUNTER, IGNORED or UNMAPPED.
  weight: Optional[str]  # The model weight it is (WEIGHT) or belongs to (SLOT).
  note: str = ""  # Why it is ignored or unmapped.
  slot: str = ""  # SLOT: the v1 slot's name (`Momentum`); COUNTER: the variable's.
  part: str = ""  # SLOT, COUNTER: the part whose optimizer keeps it (`parts.parts`).


class Mapped(NamedTuple):
  source: str  # Variable name or key in the source checkpoint.
  destination: str  # Variable name or key in the written checkpoint.
  kind: Kind


class Ignored(NamedTuple):
  name: str
  reason: str


@dataclasses.dataclass
class Conversion:
  """What a conversion read, wrote and carried."""
  source: str  # The checkpoint read.
  output: str  # The checkpoint written, at its final path.
  step: int
  mapped: List[Mapped]
  ignored: List[Ignored]
  reset: List[Ignored]  # --reset_slots: each slot of the target's optimizer, as it starts.
  skipped: List[Ignored]  # Newer checkpoints than `source` that do not load.
