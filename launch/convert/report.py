"""What a conversion prints: the table of what went where, what was not carried, what was
reset or skipped, the step and the output."""

import os

import numpy as np

from launch.convert.kinds import Conversion


def starts_at(value: np.ndarray) -> str:
  """What a reset slot starts at, for the table."""
  flat = np.ravel(value)
  return (f"starts at {flat[0]:.6g}" if flat.size and np.all(flat == flat[0])
          else "starts at its initial values")


def format_table(conversion: Conversion) -> str:
  """The mapping (source -> destination, kind), the ignore list, the step and the output."""
  width = max(len(m.source) for m in conversion.mapped)
  lines = [f"Converted {conversion.source}", "",
           f"{'source variable':<{width}}  ->  destination  (kind)"]
  lines += [f"{m.source:<{width}}  ->  {m.destination}  ({m.kind})" for m in conversion.mapped]
  lines += ["", "Ignored (not carried):"]
  lines += [f"  {i.name}: {i.reason}" for i in conversion.ignored] or ["  none"]
  if conversion.reset:
    lines += ["", "Reset (--reset_slots: the optimizer's slots start afresh):"]
    lines += [f"  {r.name}: {r.reason}" for r in conversion.reset]
  if conversion.skipped:
    lines += ["", "Skipped (newer checkpoints that do not load):"]
    lines += [f"  {s.name}: {s.reason}" for s in conversion.skipped]
  lines += ["", f"Step: {conversion.step}", f"Wrote: {conversion.output}",
            f"Output directory: {os.path.dirname(conversion.output)}"]
  return "\n".join(lines)
