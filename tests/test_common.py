"""trainers.common: progress records (chief only), the summary, checkpoint inspection."""

import json
import os

import pytest
import tensorflow as tf

from launch import cluster
from launch.tools import runs
from trainers import common
from trainers import model as model_lib
from trainers.config import Config


def test_progress_is_recorded_by_the_chief_only(tmp_path, caplog):
  caplog.set_level("INFO")
  caplog.set_level("INFO", logger="absl")  # Whatever an earlier test set absl's verbosity to.
  common.mark_startup("imported")
  chief = common.Progress(total=20, model_dir=str(tmp_path))
  chief.start(10)
  chief.log(15, 0.5)
  chief.log(20, 0.25)
  records = runs.read_progress(str(tmp_path))
  assert [r["event"] for r in records] == ["start", "step", "step"]
  assert records[0]["from_step"] == 10 and records[0]["to_step"] == 20
  assert "imported" in records[0]["startup"]
  assert [(r["step"], r["loss"]) for r in records[1:]] == [(15, 0.5), (20, 0.25)]
  assert "step 20/20: loss 0.2500" in caplog.text and "ETA 0 s" in caplog.text
  worker = common.Progress(total=20, model_dir=None)
  worker.start(0)
  worker.log(5, 1.0)
  assert len(runs.read_progress(str(tmp_path))) == 3


def test_finish_writes_the_summary_and_prints_it(tmp_path, capsys):
  summary = common.finish("keras", Config(), str(tmp_path), workers=2, global_step=30,
                          metrics={"accuracy": 0.5, "loss": 1.25}, train_seconds=3.0,
                          trained_steps=30, export_dir="/x", first_step_time=1.5)
  assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == summary
  assert runs.read_summary(str(tmp_path)) == summary
  assert summary["examples_per_second"] == round(30 * 96 / 3.0, 1)
  assert not list(tmp_path.glob("*.tmp"))


def test_a_checkpoint_is_recognised_by_backend_and_step(tmp_path):
  model = model_lib.build_model(0)
  model.compile(optimizer="sgd", loss="mse")
  tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(tmp_path), 1,
                             checkpoint_name="ckpt").save(checkpoint_number=4)
  path = tf.train.latest_checkpoint(str(tmp_path))
  assert common.checkpoint_step(path)[0] == "keras"
  assert common.checkpoint_problem("keras", str(tmp_path)) is None
  assert "checkpoint of the keras backend" in common.checkpoint_problem("estimator",
                                                                         str(tmp_path))
  with pytest.raises(tf.errors.NotFoundError):
    common.checkpoint_step(str(tmp_path / "missing"))


def test_a_full_disk_is_found_anywhere_in_an_errors_chain(tmp_path):
  enospc = OSError(28, "No space left on device")
  try:
    try:
      raise enospc
    except OSError as e:
      raise RuntimeError("writing the summary failed") from e
  except RuntimeError as e:
    assert common.no_space_left(e) is enospc
  op_error = tf.errors.ResourceExhaustedError(None, None, "/x/ckpt-4.data; No space left on device")
  assert common.no_space_left(op_error) is op_error
  assert common.no_space_left(ValueError("no space for the batch")) is None
  assert common.no_space_left(OSError(13, "Permission denied")) is None
  message = common.disk_full_message(str(tmp_path), op_error)
  assert "No space left on device (/x/ckpt-4.data" in message and "No checkpoint" in message
  assert f"--model_dir={tmp_path}" in message and "run the same command again" in message


def test_a_workers_scratch_dir_is_its_own_and_emptied_on_reuse(tmp_path):
  task = cluster.Task(type="worker", index=0, num_workers=2, address="localhost:1")
  path = common.worker_scratch_dir(str(tmp_path / "model"), task)
  open(f"{path}/left-by-a-killed-task", "w").close()
  assert common.worker_scratch_dir(str(tmp_path / "model"), task) == path
  assert os.listdir(path) == []  # A restarted task clears what a killed one left.
  other = common.worker_scratch_dir(str(tmp_path / "other"), task)
  assert other != path
  for p in (path, other):
    os.rmdir(p)
