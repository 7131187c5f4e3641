"""trainers.model_dir: the summary, and a worker's scratch directory."""

import json
import os

from launch import cluster
from launch.proofs import runs
from trainers import model_dir as layout
from trainers.config import Config


def test_write_summary_writes_the_summary_and_prints_it(tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path.parent)  # A relative model_dir is named absolute.
  summary = layout.write_summary("keras", Config(), tmp_path.name, workers=2, global_step=30,
                          metrics={"accuracy": 0.5, "loss": 1.25}, train_seconds=3.0,
                          trained_steps=30, export_dir=f"{tmp_path.name}/export/1",
                          first_step_time=1.5)
  assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == summary
  assert runs.read_summary(str(tmp_path)) == summary
  assert (summary["model_dir"], summary["export_dir"]) == (str(tmp_path),
                                                           str(tmp_path / "export" / "1"))
  assert summary["examples_per_second"] == round(30 * 96 / 3.0, 1)
  assert not list(tmp_path.glob("*.tmp"))


def test_a_workers_scratch_dir_is_its_own_and_emptied_on_reuse(tmp_path):
  task = cluster.Task(type="worker", index=0, num_workers=2, address="localhost:1")
  path = layout.worker_scratch_dir(str(tmp_path / "model"), task)
  open(f"{path}/left-by-a-killed-task", "w").close()
  assert layout.worker_scratch_dir(str(tmp_path / "model"), task) == path
  assert os.listdir(path) == []  # A restarted task clears what a killed one left.
  other = layout.worker_scratch_dir(str(tmp_path / "other"), task)
  assert other != path
  for p in (path, other):
    os.rmdir(p)


def test_a_record_after_a_torn_line_is_read_whole(tmp_path):
  """A full disk or a crash mid-append leaves a line without its end: the next record
  (a resumed run's start) must not be appended to it, and lost."""
  layout.record_progress(str(tmp_path), "start", from_step=0)
  with open(tmp_path / layout.PROGRESS_FILE, "a") as f:
    f.write('{"event": "step", "st')  # Cut short by ENOSPC.
  layout.record_progress(str(tmp_path), "start", from_step=150)
  layout.record_progress(str(tmp_path), "step", step=155)
  records = runs.read_progress(str(tmp_path))
  assert [(r["event"], r.get("from_step", r.get("step"))) for r in records] == [
      ("start", 0), ("start", 150), ("step", 155)]
