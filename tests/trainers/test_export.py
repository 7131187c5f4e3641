"""trainers.export: an export appears whole under its final name, or leaves nothing."""

import os

import pytest

from trainers import export
from trainers import model_dir as layout


def test_a_staged_export_is_renamed_into_place(tmp_path):
  def save(directory):
    with open(os.path.join(directory, "saved_model.pb"), "w") as f:
      f.write("x")

  export_dir = export.write_staged(str(tmp_path), save)
  assert os.path.dirname(export_dir) == str(tmp_path / layout.EXPORT_SUBDIR)
  assert os.listdir(tmp_path / layout.EXPORT_SUBDIR) == [os.path.basename(export_dir)]
  assert os.listdir(export_dir) == ["saved_model.pb"]


def test_a_failed_save_leaves_no_export_under_a_final_name(tmp_path):
  def save(directory):
    raise OSError(28, "No space left on device")

  with pytest.raises(OSError):
    export.write_staged(str(tmp_path), save)
  assert os.listdir(tmp_path / layout.EXPORT_SUBDIR) == []
