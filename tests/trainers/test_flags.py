"""trainers.flags: one help text per flag, and configs that survive the command line."""

import pytest
from absl import app
from absl import flags as absl_flags

from tests.conftest import REPO
from trainers import flags as trainer_flags
from trainers.config import Config


def test_the_documented_flag_table_is_the_help_text():
  assert trainer_flags.help_table() in (REPO / "docs" / "training.md").read_text()


def test_a_config_round_trips_through_its_flags():
  config = Config(train_steps=7, learning_rate=0.25, data_dir="/d", deterministic=True,
                  optimizer="adam", beta2=0.99)
  values = absl_flags.FlagValues()
  trainer_flags.define_flags(values)
  values(["prog", *trainer_flags.config_to_flags(config)])
  assert trainer_flags.config_from_flags(values) == config
  assert values["workers"].value is None and values["model_dir"].value is None


def test_a_tool_reads_the_optimizer_flags_and_refuses_one_its_optimizer_does_not_take():
  values = absl_flags.FlagValues()
  holders = trainer_flags.define_config_flags(trainer_flags.TRAINING_FIELDS, values)
  values(["prog", "--optimizer=ftrl", "--l1=0.01"])
  settings = trainer_flags.config_settings(holders)
  assert Config(**settings).hyperparameters()["l1"] == 0.01
  assert settings["model"] == "cnn" and settings["beta1"] is None
  with pytest.raises(app.UsageError, match="--l1 is not a setting of --optimizer=adam") as e:
    trainer_flags.config_settings(holders, optimizer="adam")
  assert e.value.exitcode == 2
