"""trainers.keras_trainer in this process: an injected strategy and input_fn, v1 momentum."""

import dataclasses
import logging
import os
import shutil
import textwrap
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from data import mnist
from launch.proofs import runs
from tests.conftest import memory_input_fn, run_in_local_cluster, tamper_keras_checkpoint
from trainers import checkpoints
from trainers import evaluation
from trainers import failures
from trainers import keras_trainer
from trainers import loop
from trainers import model as model_lib
from trainers import model_dir as layout
from trainers import optimizers
from trainers.config import Config

CONFIG = Config(train_steps=6, global_batch_size=32, eval_batch_size=50, log_every_steps=2,
                checkpoint_every_steps=3, backup_every_steps=2)


def test_trains_evaluates_exports_and_resumes_with_injected_seams(tmp_path):
  strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
  input_fn = memory_input_fn(CONFIG.global_batch_size)
  summary = loop.train_and_evaluate(keras_trainer.Backend, CONFIG, str(tmp_path),
                                    strategy=strategy, input_fn=input_fn)
  assert summary["global_step"] == 6 and summary["workers"] == 1
  assert os.path.exists(os.path.join(summary["export_dir"], "saved_model.pb"))
  assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-6")
  records = runs.read_progress(str(tmp_path))
  assert [r.get("step") for r in records] == [None, 2, 4, 6]
  assert not os.path.exists(tmp_path / "backup")
  # A larger --train_steps goes on from the final checkpoint, not from 0.
  longer = loop.train_and_evaluate(
      keras_trainer.Backend, Config(**{**CONFIG.__dict__, "train_steps": 8}), str(tmp_path),
      strategy=strategy, input_fn=input_fn)
  assert longer["global_step"] == 8
  starts = [r for r in runs.read_progress(str(tmp_path)) if r["event"] == "start"]
  assert [r["from_step"] for r in starts] == [0, 6]


def _scalar_optimizer_variables(model_dir):
  """The scalars a Keras checkpoint's optimizer keeps in its variables (V1Adam's powers)."""
  reader = tf.train.load_checkpoint(model_dir)
  return sorted(float(reader.get_tensor(key)) for key, shape in
                reader.get_variable_to_shape_map().items()
                if key.startswith("model/optimizer/_variables/") and shape == [])


def test_adams_powers_of_beta_are_checkpointed_and_go_on_after_a_resume(tmp_path):
  config = dataclasses.replace(CONFIG, optimizer="adam")
  strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
  input_fn = memory_input_fn(config.global_batch_size)
  loop.train_and_evaluate(keras_trainer.Backend, config, str(tmp_path), strategy=strategy,
                          input_fn=input_fn)
  # Each starts at beta and is multiplied by it once a step.
  np.testing.assert_allclose(_scalar_optimizer_variables(str(tmp_path)),
                             [0.9 ** 7, 0.999 ** 7], rtol=1e-6)
  loop.train_and_evaluate(keras_trainer.Backend, dataclasses.replace(config, train_steps=8),
                          str(tmp_path), strategy=strategy, input_fn=input_fn)
  np.testing.assert_allclose(_scalar_optimizer_variables(str(tmp_path)),
                             [0.9 ** 9, 0.999 ** 9], rtol=1e-6)


class _Crash(tf_keras.callbacks.Callback):
  """Stops the process's fit after `step`, as a killed worker would, past its saves."""

  def __init__(self, step):
    super().__init__()
    self._step = step

  def on_train_batch_end(self, batch, logs=None):
    if int(self.model.optimizer.iterations.numpy()) == self._step:
      raise KeyboardInterrupt(f"crash at step {self._step}")


def test_an_interrupted_run_resumes_from_its_backup_past_a_newer_checkpoint(tmp_path,
                                                                             monkeypatch):
  # Checkpoints every 3 steps, backups every 2: a crash at step 5 leaves ckpt-3
  # and a backup at step 4. The resumed fit must run the 2 steps left, not
  # stop at once (as when its step count came from ckpt-3) nor overshoot.
  config = Config(**{**CONFIG.__dict__, "steps_per_execution": 1, "train_steps": 8})
  strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
  input_fn = memory_input_fn(config.global_batch_size)
  real_fit = tf_keras.Model.fit

  def crashing_fit(self, *args, callbacks=(), **kwargs):
    return real_fit(self, *args, callbacks=[*callbacks, _Crash(5)], **kwargs)

  monkeypatch.setattr(tf_keras.Model, "fit", crashing_fit)
  try:
    loop.train_and_evaluate(keras_trainer.Backend, config, str(tmp_path), strategy=strategy,
                          input_fn=input_fn)
  except KeyboardInterrupt:
    pass
  monkeypatch.setattr(tf_keras.Model, "fit", real_fit)
  assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-3")
  assert keras_trainer.backup_origin(str(tmp_path / "backup")) == 0
  summary = loop.train_and_evaluate(keras_trainer.Backend, config, str(tmp_path),
                                    strategy=strategy, input_fn=input_fn)
  assert summary["global_step"] == 8
  starts = [r for r in runs.read_progress(str(tmp_path)) if r["event"] == "start"]
  assert [r["from_step"] for r in starts] == [0, 4]  # Resumed at the backup's step.
  assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-8")


def test_weights_gone_nan_under_a_finite_loss_stop_the_run_at_that_step(tmp_path):
  # A NaN momentum slot: step 4's forward pass (finite weights) gives a finite
  # loss, and its update makes the weights NaN. The loss shows it a step
  # later at best (on some CPUs never: see failures.weights_finite).
  config = Config(**{**CONFIG.__dict__, "steps_per_execution": 1, "train_steps": 3,
                     "decay_steps": 6})
  strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
  input_fn = memory_input_fn(config.global_batch_size)
  loop.train_and_evaluate(keras_trainer.Backend, config, str(tmp_path), strategy=strategy,
                          input_fn=input_fn)

  def nan_slot(model, config):
    del config
    slot = model.optimizer.variables[1]
    slot.assign(tf.fill(slot.shape, float("nan")))

  tamper_keras_checkpoint(str(tmp_path), config, nan_slot)
  with pytest.raises(failures.DivergedError, match="weights became NaN or Inf by step 4:"
                     ) as raised:
    loop.train_and_evaluate(keras_trainer.Backend,
                            Config(**{**config.__dict__, "train_steps": 6}),
                            str(tmp_path), strategy=strategy, input_fn=input_fn)
  # The checkpoint holding NaN is moved aside, not deleted, and the message says so.
  aside = tmp_path / layout.DIVERGED_SUBDIR
  assert {p.name.split(".")[0] for p in aside.iterdir()} == {"ckpt-3"}
  assert f"Moved to {aside}: ckpt-3: holds NaN or Inf in" in str(raised.value)
  assert "No finite checkpoint is left." in str(raised.value)
  assert checkpoints.find(str(tmp_path)) == []


# In each task of a 2-worker cluster: the trainer's model and Keras's own
# train_step on the same model, compiled alike; the collectives in fit's
# train function, and what one execution of each logs and leaves.
ONE_COLLECTIVE_SCRIPT = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf
    from trainers import distribute, keras_trainer, model as model_lib
    from trainers.config import Config

    config = Config(global_batch_size=32, steps_per_execution=5)
    strategy = distribute.create_strategy()
    images = tf.random.stateless_uniform((320, 28, 28, 1), (1, 2))
    # Repeated, as the trainers' is: on a finite dataset every step would also
    # all-reduce whether each worker has a next batch.
    data = tf.data.Dataset.from_tensor_slices((images, np.arange(320) % 10)).repeat().batch(16)
    with strategy.scope():
      ours = keras_trainer.compile_model(config)
      stock = model_lib.build(config)
      stock.compile(optimizer=keras_trainer.make_optimizer(config),
                    loss=keras_trainer.make_loss(config), steps_per_execution=5)
      stock.distribute_reduction_method = "first"
    for name, model in (("ours", ours), ("stock", stock)):
      model.make_train_function()
      graph = model.train_tf_function.get_concrete_function(
          iter(strategy.experimental_distribute_dataset(data))).graph.as_graph_def()
      ops = [n.op for n in graph.node] + [n.op for f in graph.library.function
                                          for n in f.node_def]
      loss = model.fit(data, epochs=1, steps_per_epoch=10, verbose=0).history["loss"][-1]
      kernel = float(np.abs(model.get_layer("hidden").kernel.numpy()).sum())
      print(f"{name}: collectives {sum(op.startswith('Collective') for op in ops)} "
            f"loss {loss:.9g} kernel {kernel:.9g}", flush=True)
""")


@pytest.mark.slow
def test_a_training_step_makes_one_collective_where_keras_makes_three(tmp_path):
  # Keras's own train_step reads its loss metric after every step, which under
  # MultiWorkerMirroredStrategy all-reduces the metric's total and count.
  rc, log = run_in_local_cluster(ONE_COLLECTIVE_SCRIPT, tmp_path)
  assert rc == 0, log[-3000:]
  lines = dict(line.split(": ", 1) for line in log.splitlines()
               if line.startswith(("ours: ", "stock: ")))
  ours, stock = (lines[name].split() for name in ("ours", "stock"))
  assert (ours[1], stock[1]) == ("1", "3")
  # The same mean loss over the 10 steps, and the same weights after them.
  np.testing.assert_allclose(float(ours[3]), float(stock[3]), rtol=1e-6)
  np.testing.assert_allclose(float(ours[5]), float(stock[5]), rtol=1e-6)


def test_v1_momentum_steps_as_the_v1_optimizer_under_a_changing_rate():
  schedule = tf_keras.optimizers.schedules.PiecewiseConstantDecay([0, 1], [0.5, 0.1, 0.05])
  optimizer = optimizers.V1MomentumSGD(schedule, momentum=0.9)
  var = tf.Variable([1.0])
  accum, want = 0.0, 1.0
  for rate, grad in zip([0.5, 0.1, 0.05], [1.0, 2.0, -1.0]):
    optimizer.apply_gradients([(tf.constant([grad]), var)])
    accum = 0.9 * accum + grad
    want -= rate * accum
  np.testing.assert_allclose(var.numpy(), [want], rtol=1e-6)


@pytest.mark.slow
def test_the_evaluator_skips_a_checkpoint_deleted_under_it(tmp_path, caplog):
  # The chief keeps 3 checkpoints: one it deletes between the evaluator reading
  # the checkpoint state and restoring it must be skipped, not end the evaluator.
  src, model_dir = tmp_path / "src", tmp_path / "model"
  input_fn = memory_input_fn(CONFIG.global_batch_size)
  loop.train_and_evaluate(keras_trainer.Backend, CONFIG, str(src),
                          strategy=tf.distribute.MirroredStrategy(["/cpu:0"]), input_fn=input_fn)
  model_dir.mkdir()
  # The state names ckpt-3, whose data the chief deleted after its index was seen.
  shutil.copy(src / "ckpt-3.index", model_dir)
  tf.compat.v1.train.update_checkpoint_state(str(model_dir), str(model_dir / "ckpt-3"))

  def write_final_checkpoint():
    time.sleep(3)  # The evaluator has failed to restore ckpt-3 by now and waits.
    for path in src.glob("ckpt-6.*"):
      shutil.copy(path, model_dir)
    tf.compat.v1.train.update_checkpoint_state(str(model_dir), str(model_dir / "ckpt-6"))

  writer = threading.Thread(target=write_final_checkpoint)
  writer.start()
  caplog.set_level(logging.INFO, logger="tensorflow")
  keras_trainer.run_evaluator(CONFIG, str(model_dir), input_fn=input_fn)
  writer.join()
  assert any("error when loading the checkpoint at " + str(model_dir / "ckpt-3") in r.getMessage()
             for r in caplog.records)
  results = evaluation.read_results(str(model_dir / layout.EVAL_SUBDIR))
  assert sorted(results) == [6]
  assert results[6] == evaluation.read_results(str(src / layout.EVAL_SUBDIR))[6]


def test_the_export_loads_in_keras_compiled_and_evaluates_as_the_trainer_does(tmp_path):
  # Weights of another seed: the export holds what it is given, not its initializers' draw.
  weights = model_lib.get_weights(model_lib.build(dataclasses.replace(CONFIG, seed=9)))
  export_dir = str(tmp_path / "export")
  keras_trainer.servable_saver(CONFIG, weights)(export_dir)
  loaded = tf_keras.models.load_model(export_dir)
  for name, value in model_lib.get_weights(loaded).items():
    np.testing.assert_array_equal(value, weights[name], err_msg=name)
  # Its layers' configs are the spec's, with no weight written out as a Constant's value.
  assert loaded.get_layer("conv").get_config()["kernel_initializer"]["class_name"] == (
      "GlorotUniform")
  assert os.path.getsize(os.path.join(export_dir, "keras_metadata.pb")) < 100_000
  input_fn = memory_input_fn(CONFIG.global_batch_size)
  want = keras_trainer.evaluate_weights(CONFIG, weights, input_fn)
  got = loaded.evaluate(input_fn(mnist.EVAL), verbose=0, return_dict=True)
  assert got["loss"] == pytest.approx(want["loss"], rel=1e-6)
  assert got["accuracy"] == want["accuracy"]
