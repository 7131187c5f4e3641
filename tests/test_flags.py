"""trainers.flags: one help text per flag, and configs that survive the command line."""

from absl import flags as absl_flags

from tests.conftest import REPO
from trainers import flags as trainer_flags
from trainers.config import Config


def test_the_documented_flag_table_is_the_help_text():
  assert trainer_flags.help_table() in (REPO / "docs" / "training.md").read_text()


def test_a_config_round_trips_through_its_flags():
  config = Config(train_steps=7, learning_rate=0.25, data_dir="/d", deterministic=True)
  values = absl_flags.FlagValues()
  trainer_flags.define_flags(values)
  values(["prog", *trainer_flags.config_to_flags(config)])
  assert trainer_flags.config_from_flags(values) == config
  assert values["workers"].value == 1 and values["model_dir"].value is None
