"""trainers.progress: progress lines, and records on the chief only."""

from launch.proofs import runs
from trainers import progress


def test_progress_is_recorded_by_the_chief_only(tmp_path, caplog):
  caplog.set_level("INFO")
  caplog.set_level("INFO", logger="absl")  # Whatever an earlier test set absl's verbosity to.
  progress.mark_startup("imported")
  chief = progress.Progress(total=20, model_dir=str(tmp_path))
  chief.start(10)
  chief.log(15, 0.5)
  chief.log(20, 0.25)
  records = runs.read_progress(str(tmp_path))
  assert [r["event"] for r in records] == ["start", "step", "step"]
  assert records[0]["from_step"] == 10 and records[0]["to_step"] == 20
  assert "imported" in records[0]["startup"]
  assert [(r["step"], r["loss"]) for r in records[1:]] == [(15, 0.5), (20, 0.25)]
  assert "step 20/20: loss 0.2500" in caplog.text and "ETA 0 s" in caplog.text
  worker = progress.Progress(total=20, model_dir=None)
  worker.start(0)
  worker.log(5, 1.0)
  assert len(runs.read_progress(str(tmp_path))) == 3
