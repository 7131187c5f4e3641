"""trainers.checkpoints: whose a checkpoint is, its step, and whether a backend resumes it."""

import os

import pytest
import tensorflow as tf

from trainers import checkpoints
from trainers import failures
from trainers import model as model_lib
from trainers.config import Config


def test_a_checkpoint_is_recognised_by_backend_and_step(tmp_path):
  model = model_lib.build(Config(seed=0))
  model.compile(optimizer="sgd", loss="mse")
  tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(tmp_path), 1,
                             checkpoint_name="ckpt").save(checkpoint_number=4)
  path = tf.train.latest_checkpoint(str(tmp_path))
  assert checkpoints.checkpoint_step(path)[0] == "keras"
  assert checkpoints.resume_problem("keras", str(tmp_path), Config()) is None
  assert "checkpoint of the keras backend" in checkpoints.resume_problem(
      "estimator", str(tmp_path), Config())
  with pytest.raises(tf.errors.NotFoundError):
    checkpoints.checkpoint_step(str(tmp_path / "missing"))


def test_a_model_of_nested_layers_is_resumed_and_another_refused(tmp_path):
  """The tabular twin's tables sit in layers inside layers (columns/2/embedding_weights):
  each weight's key is found by its path, so its own checkpoint resumes and the image
  model's does not."""
  tabular = Config(model="wide_deep", hidden_units="8", features="tabular", seed=0)
  model = model_lib.build(tabular)
  model.compile(optimizer="sgd", loss="mse")
  tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(tmp_path), 1,
                             checkpoint_name="ckpt").save(checkpoint_number=4)
  assert checkpoints.resume_problem("keras", str(tmp_path), tabular) is None
  keys = dict(tf.train.list_variables(str(tmp_path / "ckpt-4")))
  assert any("/columns/" in key and "embedding_weights" in key for key in keys)
  problem = checkpoints.resume_problem("keras", str(tmp_path),
                                       Config(model="wide_deep", hidden_units="8"))
  # The fix names the settings, not only --model (the same --model, other --features).
  assert "it has no variable" in problem and "the --model and settings it was" in problem
  assert str(tmp_path / "run.json") in problem


def _keras_checkpoints(directory, steps):
  model = model_lib.build(Config(seed=0))
  model.compile(optimizer="sgd", loss="mse")
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(directory), 3,
                                       checkpoint_name="ckpt")
  return [manager.save(checkpoint_number=step) for step in steps]


@pytest.mark.parametrize("damage", ["missing", "unreadable", "stale"])
def test_checkpoints_are_found_on_disk_and_a_wrong_index_is_rewritten(tmp_path, damage):
  saved = _keras_checkpoints(tmp_path, [2, 4, 10])
  index = tmp_path / checkpoints.INDEX_FILE
  if damage == "missing":
    index.unlink()
  elif damage == "unreadable":
    index.write_text("model_checkpoint_path: ")
  else:  # Names a checkpoint that is gone.
    for name in tmp_path.glob("ckpt-10.*"):
      name.unlink()
    saved.pop()
  assert checkpoints.find(str(tmp_path)) == saved
  assert checkpoints.newest(str(tmp_path)) == saved[-1]
  message = checkpoints.repair_index(str(tmp_path))
  assert ("naming" if damage == "stale" else damage) in message
  assert tf.train.latest_checkpoint(str(tmp_path)) == saved[-1]
  assert f'model_checkpoint_path: "{os.path.basename(saved[-1])}"' in index.read_text()
  assert checkpoints.repair_index(str(tmp_path)) is None  # Right now: left alone.


def _keras_checkpoint_at(directory, step):
  """A Keras checkpoint whose optimizer has taken `step` steps."""
  model = model_lib.build(Config(seed=0))
  model.compile(optimizer="sgd", loss="mse")
  model.optimizer.iterations.assign(step)
  return tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(directory), 1,
                                    checkpoint_name="ckpt").save(checkpoint_number=step)


def test_newest_of_is_the_backends_newest_checkpoint_unless_a_backup_is_newer(tmp_path):
  final = _keras_checkpoint_at(tmp_path, 4)
  assert checkpoints.newest_of(str(tmp_path), "keras") == (final, [])
  with pytest.raises(checkpoints.NoCheckpointError, match="not a estimator one: convert it "
                     "with --from_keras"):
    checkpoints.newest_of(str(tmp_path), "estimator")
  backup = _keras_checkpoint_at(tmp_path / "backup" / "chief", 6)
  with pytest.raises(checkpoints.NoCheckpointError, match="backup at step 6, newer than its "
                     "newest checkpoint .* \\(step 4\\).*--from_backup"):
    checkpoints.newest_of(str(tmp_path), "keras")
  assert checkpoints.newest_of(str(tmp_path), "keras", from_backup=True) == (backup, [])
  interrupted = tmp_path / "interrupted"  # Before its first checkpoint.
  _keras_checkpoint_at(interrupted / "backup" / "chief", 2)
  with pytest.raises(checkpoints.NoCheckpointError, match="It holds only a Keras backup"):
    checkpoints.newest_of(str(interrupted), "keras")


def test_what_is_set_aside_never_replaces_what_was_set_aside_before(tmp_path):
  for _ in range(2):
    newest = _keras_checkpoints(tmp_path, [2, 4])[-1]
    (data,) = tf.io.gfile.glob(newest + ".data-*")
    with open(data, "r+b") as f:
      f.truncate(10)
    assert checkpoints.set_aside_damaged(str(tmp_path))
  aside = sorted(os.listdir(tmp_path / "corrupt"))
  assert "ckpt-4.index" in aside and "ckpt-4.index.1" in aside


def _keras_checkpoint_with_nan(directory, step):
  model = model_lib.build(Config(seed=0))
  model.compile(optimizer="sgd", loss="mse")
  model.trainable_variables[0].assign(tf.fill(model.trainable_variables[0].shape, float("nan")))
  return tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(directory), 3,
                                    checkpoint_name="ckpt").save(checkpoint_number=step)


def test_after_a_divergence_what_holds_nan_is_moved_aside_and_the_newest_finite_kept(
    tmp_path):
  finite = _keras_checkpoints(tmp_path, [2])[0]
  _keras_checkpoint_with_nan(tmp_path, 4)
  _keras_checkpoint_with_nan(tmp_path / "backup" / "chief", 5)
  error = checkpoints.set_aside_diverged(str(tmp_path), failures.diverged(5))
  assert isinstance(error, failures.DivergedError)
  assert str(error).startswith(str(failures.diverged(5)))
  aside = tmp_path / "diverged"
  assert f"Moved to {aside}: backup/: holds NaN or Inf in" in str(error)
  assert "ckpt-4: holds NaN or Inf in" in str(error)
  assert f"The newest finite checkpoint, {finite}, is kept." in str(error)
  assert {p.name.split(".")[0] for p in aside.iterdir()} == {"backup", "ckpt-4"}
  assert tf.train.latest_checkpoint(str(tmp_path)) == finite
  assert checkpoints.find(str(tmp_path)) == [finite]
  # Nothing left to move: said so, and nothing moved.
  again = checkpoints.set_aside_diverged(str(tmp_path), failures.diverged(5))
  assert "Nothing saved holds NaN or Inf." in str(again)
  assert checkpoints.find(str(tmp_path)) == [finite]


def test_a_checkpoint_removed_while_it_is_inspected_is_no_problem(tmp_path, monkeypatch):
  # A task starting beside a running chief: the newest backup is rotated away between
  # finding it and reading it.
  _keras_checkpoints(tmp_path / "backup" / "chief", [2])

  def rotated(path):
    raise tf.errors.NotFoundError(None, None, f"Failed to find any matching files for {path}")

  monkeypatch.setattr(tf.train, "list_variables", rotated)
  assert checkpoints.resume_problem("keras", str(tmp_path), Config()) is None


@pytest.mark.parametrize("name, slot", [
    ("dense/kernel/Momentum", ("dense/kernel", "Momentum")),
    # The v1 canned Estimators' forms: under a strategy, under their model_fn's scope...
    ("linear/linear/linear_model/pixels/weights/Ftrl_1",
     ("linear/linear_model/pixels/weights", "Ftrl_1")),
    ("dnn/dnn/hiddenlayer_0/kernel/Adagrad", ("dnn/hiddenlayer_0/kernel", "Adagrad")),
    # ... and without one, with the partitioned variable's part.
    ("linear/linear_model/bias_weights/part_0/Ftrl", ("linear/linear_model/bias_weights", "Ftrl")),
    ("dnn/logits/bias/t_0/Adagrad", ("dnn/logits/bias", "Adagrad")),
    ("dnn/logits/bias", None),  # A weight.
    ("other/kernel/Adam", None),  # The slot of nothing the checkpoint holds.
    ("training/Adagrad/dnn/logits/bias/accumulator", None),  # A Keras legacy optimizer's.
])
def test_v1_slots_are_found_in_every_form_the_canned_estimators_write(name, slot):
  variables = {"dense/kernel", "dnn/hiddenlayer_0/kernel", "dnn/logits/bias",
               "linear/linear_model/pixels/weights", "linear/linear_model/bias_weights"}
  assert checkpoints.v1_slot(name, variables) == slot
