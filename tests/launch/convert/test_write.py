"""launch.convert.write: a conversion's target appears whole, or not at all."""

import os
import pathlib

import numpy as np
import pytest

from launch.convert import write as convert_write
from trainers import checkpoints
from trainers import run_record
from trainers.config import Config

VALUES = {"conv/kernel": np.arange(6, dtype=np.float32).reshape(2, 3),
          checkpoints.ESTIMATOR_STEP_KEY: np.int64(7)}


def test_a_checkpoint_written_by_name_reads_back_as_written(tmp_path):
  saved = convert_write.write_name_based(VALUES, str(tmp_path), step=7)
  assert saved == str(tmp_path / f"{checkpoints.ESTIMATOR_PREFIX}-7")
  convert_write.read_back(saved, VALUES)
  with pytest.raises(convert_write.ConversionError, match="another value at conv/kernel"):
    convert_write.read_back(saved, {"conv/kernel": VALUES["conv/kernel"] + 1})
  with pytest.raises(convert_write.ConversionError, match="has no logits/bias"):
    convert_write.read_back(saved, {"logits/bias": np.zeros(1, np.float32)})


def test_a_non_empty_target_is_refused_and_left_untouched(tmp_path):
  (tmp_path / "run").mkdir()
  (tmp_path / "run" / "keep.txt").write_text("mine")
  with pytest.raises(convert_write.ConversionError, match="exists and is not empty"):
    convert_write.check_target(str(tmp_path / "run"))
  convert_write.check_target(str(tmp_path / "new"))  # Missing: fine, and not made.
  assert (tmp_path / "run" / "keep.txt").read_text() == "mine" and not (tmp_path / "new").exists()


def test_an_interrupted_conversion_leaves_nothing(tmp_path):
  (tmp_path / "empty").mkdir()
  for target in (tmp_path / "new", tmp_path / "empty"):
    with pytest.raises(KeyboardInterrupt), convert_write.staged_target(str(target)) as staging:
      pathlib.Path(staging, "ckpt-1.index").write_text("half")
      raise KeyboardInterrupt
    assert os.listdir(tmp_path) == ["empty"] and os.listdir(tmp_path / "empty") == []


def test_what_another_writer_put_in_the_target_meanwhile_is_kept_and_nothing_moved(tmp_path):
  target = tmp_path / "empty"
  target.mkdir()
  wrote_meanwhile = pytest.raises(convert_write.ConversionError, match="Something wrote into")
  with wrote_meanwhile, convert_write.staged_target(str(target)) as staging:
    pathlib.Path(staging, "ckpt-1.index").write_text("converted")
    (target / "theirs.txt").write_text("theirs")
  assert os.listdir(target) == ["theirs.txt"]


def test_the_index_files_move_last_so_a_reader_never_finds_half_a_checkpoint(tmp_path,
                                                                             monkeypatch):
  target = tmp_path / "empty"
  target.mkdir()
  names = ["checkpoint", "ckpt-1.index", "ckpt-1.data-00000-of-00001", "run.json"]
  moved = []
  rename = os.rename
  monkeypatch.setattr(os, "rename", lambda src, dst: (moved.append(os.path.basename(dst)),
                                                      rename(src, dst)))
  with convert_write.staged_target(str(target)) as staging:
    for name in names:
      pathlib.Path(staging, name).write_text(name)
  assert sorted(os.listdir(target)) == sorted(moved) == sorted(names)
  assert moved[-2:] == ["ckpt-1.index", "checkpoint"]


def test_the_record_is_carried_with_the_optimizer_the_slots_were_reset_for(tmp_path):
  source, staging = tmp_path / "source", tmp_path / "staging"
  source.mkdir()
  staging.mkdir()
  trained = run_record.settings("estimator", Config(optimizer="adam"), workers=2)
  run_record.write(str(source), trained)
  convert_write.carry_record(str(source), str(staging), "keras")
  assert run_record.read(str(staging)) == {**trained, "backend": "keras"}
  convert_write.carry_record(str(source), str(staging), "keras", Config(optimizer="momentum"))
  carried = run_record.read(str(staging))
  assert run_record.optimizer_of(carried) == "momentum" and "beta1" not in carried
  assert carried["momentum"] == Config(optimizer="momentum").hyperparameters()["momentum"]
