"""launch.proofs.runs: one command line for a trainer run, and the records read back."""

import json
import sys

import pytest
from absl import app
from absl import flags as absl_flags

from data import mnist
from data.mnist import store
from launch.proofs import runs
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


def test_tools_prepare_missing_data_before_any_run_or_exit_naming_the_fixes(
    tiny_idx_dir, tmp_path, monkeypatch):
  monkeypatch.delenv(mnist.IDX_DIR_ENV, raising=False)
  for name in ("HTTPS_PROXY", "https_proxy"):  # Offline: the download's proxy refuses.
    monkeypatch.setenv(name, "http://127.0.0.1:9")
  monkeypatch.delenv("NO_PROXY", raising=False)
  monkeypatch.delenv("no_proxy", raising=False)
  config = Config(data_dir=str(tmp_path / "none"))
  with pytest.raises(SystemExit) as e:
    runs.check_or_exit(config, 1, None, backends=["keras"])
  assert "Tried: cannot reach" in str(e.value.code) and "--mnist_idx_dir" in str(e.value.code)
  with pytest.raises(app.UsageError):  # A bad config is a usage error, before any data step.
    runs.check_or_exit(Config(data_dir=str(tmp_path / "none"), train_steps=0), 1, None,
                       backends=["keras"])
  config = Config(data_dir=str(tmp_path / "tfds"))
  runs.check_or_exit(config, 2, str(tiny_idx_dir), backends=["keras"])
  assert store.is_prepared(config.data_dir)
  # The Estimator, where this install has none, is refused before any of that.
  monkeypatch.setattr(runs.runner, "estimator_unavailable", lambda: "no tf.estimator here")
  with pytest.raises(app.UsageError, match="no tf.estimator here"):
    runs.check_or_exit(config, 2, str(tiny_idx_dir))


def test_a_running_trainer_is_said_where_it_is_from_its_progress_records(tmp_path,
                                                                          monkeypatch):
  assert runs.where(str(tmp_path)) == "starting its tasks"
  records = [{"event": "start", "from_step": 0, "to_step": 40}]
  progress = tmp_path / "progress.jsonl"
  progress.write_text(json.dumps(records[0]) + "\n")
  assert runs.where(str(tmp_path)) == "started, from step 0"
  progress.write_text(progress.read_text() + json.dumps({"event": "step", "step": 10}) + "\n")
  assert runs.where(str(tmp_path)) == "step 10 of 40"
  progress.write_text(progress.read_text() + json.dumps({"event": "step", "step": 40}) + "\n")
  assert runs.where(str(tmp_path)) == "trained to step 40: evaluating and exporting"
  # A run that outlasts the interval is said, and its exit code returned.
  monkeypatch.setattr(runs, "PROGRESS_SECONDS", 0.2)
  said = []  # What it logs, whatever absl's verbosity another test left.
  monkeypatch.setattr(runs.logging, "info", lambda msg, *args: said.append(msg % args))
  import subprocess  # noqa: PLC0415
  with subprocess.Popen(
      [sys.executable, "-c", "import time, sys; time.sleep(1); sys.exit(3)"]) as process:
    assert runs._wait_saying_where(process, str(tmp_path), "short/keras") == 3  # pylint: disable=protected-access
  assert said and said[0].startswith("short/keras: trained to step 40"), said
