"""launch.convert.report: the table a conversion prints."""

import numpy as np

from launch.convert.kinds import Conversion, Ignored, Kind, Mapped
from launch.convert.report import format_table, starts_at


def test_the_table_names_each_variable_and_what_was_not_carried():
  conversion = Conversion(
      "/src/model.ckpt-3", "/dst/ckpt-3", 3,
      [Mapped("conv/kernel", "model/layer_with_weights-0/kernel", Kind.WEIGHT),
       Mapped("global_step", "model/optimizer/_iterations", Kind.STEP)],
      [Ignored("extra", "dropped by --assignment_map (null)")],
      [Ignored("conv/kernel/Momentum", "starts at 0")],
      [Ignored("/src/model.ckpt-4", "does not load (DataLossError)")])
  lines = format_table(conversion).splitlines()
  assert lines[0] == "Converted /src/model.ckpt-3"
  assert "conv/kernel  ->  model/layer_with_weights-0/kernel  (weight)" in lines
  assert "global_step  ->  model/optimizer/_iterations  (step)" in lines
  assert "  extra: dropped by --assignment_map (null)" in lines
  assert "  conv/kernel/Momentum: starts at 0" in lines
  assert "  /src/model.ckpt-4: does not load (DataLossError)" in lines
  assert lines[-3:] == ["Step: 3", "Wrote: /dst/ckpt-3", "Output directory: /dst"]


def test_nothing_ignored_says_none_and_starts_at_tells_a_constant_from_values():
  conversion = Conversion("s", "/d/ckpt-1", 1, [Mapped("a", "b", Kind.WEIGHT)], [], [], [])
  table = format_table(conversion)
  assert "Ignored (not carried):\n  none" in table and "Reset" not in table
  assert starts_at(np.full((2, 2), 0.1, np.float32)) == "starts at 0.1"
  assert starts_at(np.arange(3.0)) == "starts at its initial values"
