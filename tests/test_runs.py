"""launch.tools.runs: one command line for a trainer run, and the records read back."""

import json
import sys

from absl import flags as absl_flags

from launch.tools import runs
from trainers import flags as trainer_flags
from trainers.config import Config


def test_the_command_is_the_binary_with_the_config_as_flags():
  config = Config(train_steps=9, data_dir="/d")
  cmd = runs.trainer_command("estimator", config, workers=2, model_dir="/m", timeout=60,
                             extra_flags=["--learning_rate=0.05"])
  assert cmd[:3] == [sys.executable, "-m", "trainers.estimator_main"]
  values = absl_flags.FlagValues()
  trainer_flags.define_flags(values)
  values(["prog", *cmd[3:]])
  assert (values.workers, values.model_dir, values.timeout) == (2, "/m", 60)
  # The extra flag comes last, so it wins over the config's.
  assert trainer_flags.config_from_flags(values) == Config(train_steps=9, data_dir="/d",
                                                           learning_rate=0.05)


def test_records_are_read_whole(tmp_path):
  assert runs.read_progress(str(tmp_path)) == []
  (tmp_path / "progress.jsonl").write_text('{"event": "start"}\n{"event": "st')
  assert runs.read_progress(str(tmp_path)) == [{"event": "start"}]
  logs = tmp_path / "logs"
  logs.mkdir()
  (logs / "tasks.json").write_text(json.dumps({"restarts": 1, "tasks": [{"name": "chief-0",
                                                                            "pid": 7}]}))
  assert runs.read_tasks(runs.task_log_dir(str(tmp_path)))["restarts"] == 1
