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


def test_flags_left_out_on_a_model_dir_holding_a_run_take_its_record(tmp_path, monkeypatch):
  from trainers import run_record  # noqa: PLC0415
  trained = Config(model="dnn", hidden_units="32", train_steps=40, seed=3)
  run_record.write(str(tmp_path), run_record.settings("keras", trained, 1))
  (tmp_path / "model.ckpt-40.index").write_bytes(b"")
  values = absl_flags.FlagValues()
  trainer_flags.define_flags(values)
  values(["prog", f"--model_dir={tmp_path}", "--train_steps=80"])
  logged = []  # What it logs, whatever absl's verbosity another test left.
  monkeypatch.setattr(trainer_flags.logging, "info", lambda msg, *args: logged.append(msg % args))
  config = trainer_flags.config_from_flags(values)
  assert (config.model, config.hidden_units, config.seed, config.train_steps) == (
      "dnn", "32", 3, 80)
  said = " ".join(logged)
  assert f"settings {tmp_path}/run.json records: --model=dnn" in said and "--seed=3" in said
  assert "--train_steps" not in said  # Given: not taken.
