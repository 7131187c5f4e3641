"""launch.convert.keras_state: what a Keras checkpoint of a compiled model holds, key by key."""

import tensorflow as tf

from launch.convert import keras_state
from launch.convert.kinds import Kind
from trainers import checkpoints
from trainers import keras_trainer
from trainers.config import Config


def test_the_state_of_an_adam_model_is_its_weights_slots_counters_and_step(tmp_path):
  config = Config(optimizer="adam")
  model = keras_trainer.compile_model(config)
  state, derived = keras_state.state(model, config)
  by_kind = {}
  for s in state:
    by_kind.setdefault(s.kind, []).append(s)
  assert [s.key for s in by_kind[Kind.STEP]] == [checkpoints.KERAS_STEP_KEY]
  assert len(by_kind[Kind.WEIGHT]) == 6 and not derived
  assert sorted({s.slot for s in by_kind[Kind.SLOT]}) == ["Adam", "Adam_1"]
  assert len(by_kind[Kind.SLOT]) == 12
  assert [s.slot for s in by_kind[Kind.COUNTER]] == ["beta1_power", "beta2_power"]
  # The keys are the ones the checkpoint holds, and the optimizer is told by its slots.
  saved = checkpoints.saved_names(tf.train.load_checkpoint(
      keras_trainer.save_checkpoint(model, str(tmp_path), 0)))
  assert {s.key for s in state} <= set(saved)
  assert set(saved) - {s.key for s in state} <= set(keras_state.KERAS_DERIVED)
  assert keras_state.holds_state_of(saved, model, config)
  momentum = Config(optimizer="momentum")
  other = keras_trainer.compile_model(momentum)
  keras_state.state(other, momentum)
  assert not keras_state.holds_state_of(saved, other, momentum)
  assert keras_state.trained_with(saved, momentum) == "--optimizer=adam"


def test_plain_sgds_last_update_is_derived_not_state():
  config = Config(optimizer="sgd")
  model = keras_trainer.compile_model(config)
  state, derived = keras_state.state(model, config)
  assert not [s for s in state if s.kind == Kind.SLOT]
  assert derived and all("momentum of 0 never reads" in why for why in derived.values())
  assert all(keras_state.optimizer_variable(key) for key in derived)
