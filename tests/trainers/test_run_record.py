"""trainers.run_record: a resume with other settings is refused, listing each, unless allowed."""

import dataclasses
import json

import pytest

from trainers import run_record
from trainers.config import Config

CONFIG = Config(train_steps=100)


def _start(model_dir, config=CONFIG, workers=2, backend="keras", has_checkpoint=True,
           allow_change=False):
  """What a writer does at start: check, then (its checkpoints repaired) record."""
  current = run_record.settings(backend, config, workers)
  changed = run_record.changes(str(model_dir), current, config,
                               has_checkpoint=has_checkpoint, allow_change=allow_change)
  run_record.record(str(model_dir), current, changed)
  return changed


def _progress(model_dir):
  path = model_dir / "progress.jsonl"
  return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_first_start_records_the_settings_and_the_same_settings_resume(tmp_path):
  assert _start(tmp_path, has_checkpoint=False) == []
  assert run_record.read(str(tmp_path)) == run_record.settings("keras", CONFIG, 2)
  assert _start(tmp_path) == [] and _progress(tmp_path) == []


@pytest.mark.parametrize("change, line", [
    ({"learning_rate": 0.05}, "--learning_rate: 0.1 in the run, 0.05 now"),
    ({"global_batch_size": 48}, "--global_batch_size: 96 in the run, 48 now"),
    ({"seed": 2}, "--seed: 1 in the run, 2 now"),
    ({"momentum": 0.5}, "--momentum: 0.9 in the run, 0.5 now"),
    ({"decay_steps": 300}, "--decay_steps: 100 in the run, 300 now"),
    ({"model_options": "dropout=0"}, "--model_options:  in the run, dropout=0 now"),
    ({"learning_rate_schedule": "constant"}, "--learning_rate_schedule: cosine in the run, "
     "constant now"),
    ({"warmup_steps": 10}, "--warmup_steps: 0 in the run, 10 now"),
])
def test_a_resume_with_other_settings_is_refused_and_nothing_is_written(change, line, tmp_path):
  _start(tmp_path, has_checkpoint=False)
  before = (tmp_path / run_record.RECORD_FILE).read_bytes()
  with pytest.raises(run_record.ConfigChangeError, match="--allow_config_change") as raised:
    _start(tmp_path, dataclasses.replace(CONFIG, **change))
  assert line in str(raised.value)
  assert (tmp_path / run_record.RECORD_FILE).read_bytes() == before
  assert _progress(tmp_path) == []


def test_the_other_backend_is_refused_too(tmp_path):
  _start(tmp_path, has_checkpoint=False)
  with pytest.raises(run_record.ConfigChangeError, match="the backend: keras in the run, "
                                                         "estimator now"):
    _start(tmp_path, backend="estimator")


def test_allow_config_change_goes_on_and_records_the_change(tmp_path):
  _start(tmp_path, has_checkpoint=False)
  changed = dataclasses.replace(CONFIG, learning_rate=0.05)
  assert _start(tmp_path, changed, allow_change=True) == [
      "--learning_rate: 0.1 in the run, 0.05 now"]
  [event] = _progress(tmp_path)
  assert event["event"] == "config_change" and event["changes"] == [
      "--learning_rate: 0.1 in the run, 0.05 now"]
  assert run_record.read(str(tmp_path))["learning_rate"] == 0.05
  assert _start(tmp_path, changed) == []  # The record now holds the new value.


def test_another_worker_count_with_the_same_global_batch_is_recorded(tmp_path):
  _start(tmp_path, has_checkpoint=False)
  [line] = _start(tmp_path, workers=3)
  assert line == "workers: 2 in the run, 3 now (the global batch stays 96)"
  assert _progress(tmp_path)[0]["changes"] == [line]
  assert run_record.read(str(tmp_path))["workers"] == 3


def test_a_longer_run_is_allowed_and_a_schedule_that_follows_it_is_said(tmp_path):
  _start(tmp_path, has_checkpoint=False)  # decay_steps=0: the schedule is 100 steps.
  assert _start(tmp_path, dataclasses.replace(CONFIG, train_steps=200, decay_steps=100)) == []
  [line] = _start(tmp_path, dataclasses.replace(CONFIG, train_steps=300))
  assert line.startswith("the learning-rate schedule: 100 steps in the run, 300 now")
  assert "give --decay_steps=100 to keep it" in line


def test_a_model_dir_without_a_checkpoint_takes_the_new_settings(tmp_path):
  _start(tmp_path, has_checkpoint=False)
  changed = dataclasses.replace(CONFIG, learning_rate=0.05)
  assert _start(tmp_path, changed, has_checkpoint=False) == []
  assert run_record.read(str(tmp_path))["learning_rate"] == 0.05


def test_only_the_settings_a_record_holds_are_compared(tmp_path):
  # A record without `workers` (the converter's, from a source without one).
  record = run_record.settings("keras", CONFIG, 2)
  del record["workers"]
  run_record.write(str(tmp_path), record)
  assert _start(tmp_path, workers=4) == []
  assert run_record.read(str(tmp_path))["workers"] == 4


def test_giving_an_optimizers_default_is_no_change(tmp_path):
  _start(tmp_path, has_checkpoint=False)
  assert _start(tmp_path, dataclasses.replace(CONFIG, learning_rate=0.1, momentum=0.9)) == []


def test_an_adam_hyperparameter_change_is_refused_then_allowed(tmp_path):
  adam = dataclasses.replace(CONFIG, optimizer="adam")
  _start(tmp_path, adam, has_checkpoint=False)
  with pytest.raises(run_record.ConfigChangeError, match="--beta2: 0.999 in the run, 0.99 now"):
    _start(tmp_path, dataclasses.replace(adam, beta2=0.99))
  assert _start(tmp_path, dataclasses.replace(adam, beta2=0.99), allow_change=True) == [
      "--beta2: 0.999 in the run, 0.99 now"]


def test_another_optimizer_is_refused_even_when_changes_are_allowed(tmp_path):
  _start(tmp_path, has_checkpoint=False)
  before = (tmp_path / run_record.RECORD_FILE).read_bytes()
  with pytest.raises(run_record.ConfigChangeError,
                     match="trained with --optimizer=momentum, .* asks for --optimizer=adam"):
    _start(tmp_path, dataclasses.replace(CONFIG, optimizer="adam"), allow_change=True)
  assert (tmp_path / run_record.RECORD_FILE).read_bytes() == before


def test_a_record_from_before_optimizers_were_chosen_resumes_as_momentum(tmp_path):
  old = {k: v for k, v in run_record.settings("keras", CONFIG, 2).items() if k != "optimizer"}
  run_record.write(str(tmp_path), old)
  assert _start(tmp_path) == []
  with pytest.raises(run_record.ConfigChangeError, match="--optimizer=momentum"):
    _start(tmp_path, dataclasses.replace(CONFIG, optimizer="sgd"))


def test_a_canned_model_records_its_settings_and_keeps_its_optimizer(tmp_path):
  dnn = dataclasses.replace(CONFIG, model="dnn", hidden_units="32")
  _start(tmp_path, dnn, has_checkpoint=False)
  record = run_record.read(str(tmp_path))
  assert record["optimizer"] == run_record.CANNED_OPTIMIZER
  assert (record["hidden_units"], record["dnn_optimizer"], record["dnn_learning_rate"]) == (
      "32", "adagrad", 0.05)
  assert "learning_rate" not in record  # --learning_rate is not a canned model's.
  assert _start(tmp_path, dataclasses.replace(dnn, dnn_learning_rate=0.01),
                allow_change=True) == ["--dnn_learning_rate: 0.05 in the run, 0.01 now"]
  with pytest.raises(run_record.ConfigChangeError, match="trained with --dnn_optimizer=adagrad, "
                     ".* asks for --dnn_optimizer=adam"):
    _start(tmp_path, dataclasses.replace(dnn, dnn_optimizer="adam"), allow_change=True)


def _resumable(model_dir, config, backend="keras"):
  """model_dir as a run of `config` leaves it: its record and a checkpoint's index file."""
  run_record.write(str(model_dir), run_record.settings(backend, config, 2))
  (model_dir / "ckpt-100.index").write_bytes(b"")


def test_a_resume_takes_every_setting_its_flags_leave_out_from_the_record(tmp_path):
  dnn = dataclasses.replace(CONFIG, model="dnn", hidden_units="32,16", dropout=0.1, seed=7,
                            task="binary:3", decay_steps=300)
  run_record.write(str(tmp_path), run_record.settings("keras", dnn, 2))
  assert run_record.resumed_settings(str(tmp_path), {}) == {}  # No checkpoint: a new run.
  _resumable(tmp_path, dnn)
  taken = run_record.resumed_settings(str(tmp_path), {"train_steps": 200})
  assert Config(**{"train_steps": 200, **taken}) == dataclasses.replace(
      dnn, train_steps=200, **{k: v for k, v in dnn.canned_settings().items()
                               if getattr(dnn, k) is None})
  assert _start(tmp_path, Config(**{"train_steps": 200, **taken})) == []
  # A schedule that follows --train_steps is taken as following it.
  _resumable(tmp_path, CONFIG)
  assert "decay_steps" not in run_record.resumed_settings(str(tmp_path), {})
  assert run_record.resumed_settings(None, {}) == {}


@pytest.mark.parametrize("given, left", [
    ({"model": "cnn"}, ("hidden_units", "dropout", "dnn_optimizer")),
    ({"optimizer": "adam"}, ("learning_rate", "momentum")),
])
def test_a_resume_giving_another_model_or_optimizer_takes_none_of_its_settings(given, left,
                                                                               tmp_path):
  # Their recorded settings would not fit: `changes` refuses the one given, naming it.
  _resumable(tmp_path, dataclasses.replace(CONFIG, model="dnn", dropout=0.1))
  if "optimizer" in given:
    _resumable(tmp_path, CONFIG)
  taken = run_record.resumed_settings(str(tmp_path), given)
  assert not set(left) & set(taken) and not set(given) & set(taken)
  assert taken["train_steps"] == 100
  with pytest.raises(run_record.ConfigChangeError, match=f"--{next(iter(given))}"):
    _start(tmp_path, Config(**{**taken, **given}))
