"""launch.convert.parts: a model's optimizers as the converter carries them."""

import pytest

from launch.convert import parts
from launch.convert.kinds import ConversionError
from trainers.config import Config


def test_a_model_of_one_optimizer_is_one_part_named_by_optimizer():
  config = Config(optimizer="adam")
  assert parts.parts(config) == {"": config} and parts.v1_parts(config) is None
  assert parts.part_of(parts.parts(config), "conv/kernel") == ""
  assert parts.optimizer_flag("") == "--optimizer"
  assert parts.single_or_v1(config, None) is config and parts.adam_part(config) is config
  assert parts.v1_slot_name(config, "conv/kernel", "Adam") == "conv/kernel/Adam"
  assert parts.v1_counter_name(config, "beta1_power") == "beta1_power"
  assert not parts.is_tf2_canned(config)


def test_a_v1_canned_model_has_a_part_per_optimizer_named_under_its_scope():
  config = Config(model="wide_deep_v1", linear_optimizer="adam")
  model_parts = parts.parts(config)
  assert sorted(model_parts) == ["dnn", "linear"]
  assert (model_parts["dnn"].optimizer, model_parts["linear"].optimizer) == ("adagrad", "adam")
  assert parts.adam_part(config) == model_parts["linear"]
  assert parts.optimizer_flag("linear") == "--linear_optimizer"
  assert parts.single_or_v1(config, None) is config and not parts.is_tf2_canned(config)
  # As tf.compat.v1.estimator's DNNLinearCombinedClassifier and DNNClassifier name them.
  assert parts.v1_slot_name(config, "dnn/hiddenlayer_0/kernel", "Adagrad") == (
      "dnn/hiddenlayer_0/kernel/Adagrad")
  assert parts.v1_counter_name(config, "beta1_power") == "head/beta1_power"
  dnn = Config(model="dnn_v1", dnn_optimizer="adam")
  assert list(parts.parts(dnn)) == ["dnn"] and parts.single_or_v1(dnn, None).optimizer == "adam"
  assert parts.v1_slot_name(dnn, "dnn/logits/bias", "Adam") == "dnn/dnn/logits/bias/Adam"
  assert parts.v1_counter_name(dnn, "beta2_power") == "dnn/head/dnn/beta2_power"


def test_adam_in_both_parts_and_a_map_for_a_tf2_canned_model_are_refused():
  with pytest.raises(ConversionError, match="with Adam in both parts is not carried"):
    parts.single_or_v1(Config(model="wide_deep_v1", dnn_optimizer="adam",
                              linear_optimizer="adam"), None)
  dnn = Config(model="dnn")
  assert parts.is_tf2_canned(dnn) and parts.single_or_v1(dnn, None) is dnn
  with pytest.raises(ConversionError, match="no --assignment_map applies"):
    parts.single_or_v1(dnn, {"a": "b"})
