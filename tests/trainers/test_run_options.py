"""trainers.run_options: how to run, declared once, and the flags made from it."""

import dataclasses

import pytest
from absl import flags

from launch import restarts
from trainers import flags as trainer_flags
from trainers import run_options
from trainers.run_options import RunOptions


def test_each_flag_has_one_default_the_flags_and_the_library_share():
  values = flags.FlagValues()
  trainer_flags.define_flags(values)
  values.mark_as_parsed()
  flags.DEFINE_integer("verbosity", 0, "absl's own, defined by absl in a binary.",
                       flag_values=values)
  from_flags = trainer_flags.run_options_from_flags("trainers.keras_main", values)
  defaults = RunOptions()
  for field in run_options.FLAG_FIELDS:
    assert getattr(from_flags, field.name) == getattr(defaults, field.name), field.name
    assert values[field.name].help == field.metadata["help"]
  assert from_flags.relaunch[1:3] == ["-m", "trainers.keras_main"]
  assert defaults.max_restarts == restarts.DEFAULT_MAX_RESTARTS
  assert defaults.workers is None  # Not given: TF_CONFIG decides, else 1.


def test_every_field_but_the_command_line_and_absls_is_a_flag():
  names = {f.name for f in dataclasses.fields(RunOptions)}
  assert names - {f.name for f in run_options.FLAG_FIELDS} == {"relaunch", "verbosity"}
  assert run_options.flag("mnist_idx_dir") == "--mnist_idx_dir"
  with pytest.raises(KeyError):
    run_options.flag("relaunch")
