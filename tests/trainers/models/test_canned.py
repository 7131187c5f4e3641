"""trainers.models.canned: the twins carry the canned names, and both backends (the canned
Estimator itself, and the twin in Keras) train as the reference loop does."""

import dataclasses

import numpy as np
import pytest

from tests.conftest import ESTIMATOR_MISSING
from tests.conftest import assert_ends_where_the_reference_ends
from tests.conftest import trained_weights
from tests.conftest import with_initial_weights
from trainers import keras_trainer
from trainers import model as model_lib
from trainers import model_registry
from trainers.config import Config
from trainers.models import canned

CONFIG = Config(train_steps=6, global_batch_size=32, eval_batch_size=50, log_every_steps=2,
                checkpoint_every_steps=3, deterministic=True)


def _weights(config):
  return {name: value.shape for name, value in model_lib.get_weights(
      model_lib.build(config)).items()}


def test_the_twins_carry_the_canned_names():
  assert _weights(dataclasses.replace(CONFIG, model="dnn", hidden_units="32,16")) == {
      "dnn/hiddenlayer_0/kernel": (784, 32), "dnn/hiddenlayer_0/bias": (32,),
      "dnn/hiddenlayer_1/kernel": (32, 16), "dnn/hiddenlayer_1/bias": (16,),
      "dnn/logits/kernel": (16, 10), "dnn/logits/bias": (10,)}
  with_bn = _weights(dataclasses.replace(CONFIG, model="dnn", hidden_units="8", batch_norm=True))
  assert {n for n in with_bn if "batchnorm" in n} == {
      f"dnn/hiddenlayer_0/batchnorm_0/{w}" for w in ("gamma", "beta", "moving_mean",
                                                     "moving_variance")}
  linear = {"linear/linear_model/pixels/weights": (784, 10),
            "linear/linear_model/bias_weights": (10,)}
  assert _weights(dataclasses.replace(CONFIG, model="linear", feature_name="pixels")) == linear
  assert _weights(dataclasses.replace(CONFIG, model="wide_deep", hidden_units="8",
                                      feature_name="pixels")) == {
      **linear, "dnn/hiddenlayer_0/kernel": (784, 8), "dnn/hiddenlayer_0/bias": (8,),
      "dnn/logits/kernel": (8, 10), "dnn/logits/bias": (10,)}


@pytest.mark.parametrize("task, canned_class", [
    ("multiclass", "Classifier"), ("binary:3", "Classifier"), ("regression", "Regressor")])
@pytest.mark.parametrize("model, family", [
    ("dnn", "DNN"), ("linear", "Linear"), ("wide_deep", "DNNLinearCombined"),
    ("dnn_v1", "DNN"), ("linear_v1", "Linear"), ("wide_deep_v1", "DNNLinearCombined")])
def test_each_task_is_its_canned_class_and_a_twin_of_the_heads_width(task, canned_class,
                                                                     model, family):
  config = dataclasses.replace(CONFIG, model=model, hidden_units="8", task=task)
  width = 10 if task == "multiclass" else 1
  shapes = _weights(config)
  assert {shapes[n] for n in ("dnn/logits/bias", "linear/linear_model/bias_weights")
          if n in shapes} == {(width,)}
  if ESTIMATOR_MISSING:
    return
  import tensorflow as tf  # noqa: PLC0415
  made = model_lib.spec(config).canned.estimator(config, tf.estimator.RunConfig(), None)
  api = tf.compat.v1.estimator if model.endswith("_v1") else tf.estimator
  assert type(made) is getattr(api, family + canned_class)


def test_the_twin_trains_with_the_legacy_optimizer_the_canned_estimator_builds():
  optimizer = keras_trainer.make_optimizer(
      dataclasses.replace(CONFIG, model="dnn", dnn_optimizer="rmsprop", dnn_learning_rate=0.02))
  assert type(optimizer).__module__.startswith("tf_keras.src.optimizers.legacy")
  assert type(optimizer).__name__ == "RMSprop"
  assert float(optimizer.learning_rate) == pytest.approx(0.02)
  linear = keras_trainer.make_optimizer(dataclasses.replace(CONFIG, model="linear"))
  assert type(linear).__name__ == "Ftrl" and float(linear.learning_rate) == pytest.approx(0.2)
  # wide_deep: one per part, at DNNLinearCombinedClassifier's rates, counting the DNN's steps.
  parts = keras_trainer.make_optimizer(dataclasses.replace(CONFIG, model="wide_deep"))
  assert (type(parts.dnn).__name__, float(parts.dnn.learning_rate)) == ("Adagrad",
                                                                        pytest.approx(0.001))
  assert (type(parts.linear).__name__, float(parts.linear.learning_rate)) == (
      "Ftrl", pytest.approx(0.005))
  assert parts.iterations is parts.dnn.iterations


BACKENDS = ["keras"] + ([] if ESTIMATOR_MISSING else ["estimator"])
# BatchNorm (its moving statistics start from the warm start too), a feature of another
# name, each legacy optimizer's rule, and wide_deep's two optimizers.
CASES = {
    "dnn-bn-adagrad": {"model": "dnn", "hidden_units": "16,8", "batch_norm": True,
                       "dnn_learning_rate": 0.05},
    "linear-ftrl": {"model": "linear", "feature_name": "pixels"},
    "dnn-sgd": {"model": "dnn", "hidden_units": "16", "dnn_optimizer": "sgd",
                "activation": "tanh"},
    "wide_deep": {"model": "wide_deep", "hidden_units": "16"},
    "wide_deep-adam-rmsprop": {"model": "wide_deep", "hidden_units": "16",
                               "dnn_optimizer": "adam", "dnn_learning_rate": 0.01,
                               "linear_optimizer": "rmsprop"},
    # The tf.compat.v1.estimator classes: a summed loss, tf.compat.v1.train optimizers.
    "dnn_v1-bn-adagrad": {"model": "dnn_v1", "hidden_units": "16,8", "batch_norm": True},
    "linear_v1-ftrl": {"model": "linear_v1", "feature_name": "pixels"},
    "dnn_v1-adam": {"model": "dnn_v1", "hidden_units": "16", "dnn_optimizer": "adam",
                    "dnn_learning_rate": 0.01},
    "wide_deep_v1": {"model": "wide_deep_v1", "hidden_units": "16"},
    "wide_deep_v1-rmsprop-adam": {"model": "wide_deep_v1", "hidden_units": "16",
                                  "dnn_optimizer": "rmsprop", "dnn_learning_rate": 0.01,
                                  "linear_optimizer": "adam"},
    # Each task's head: two classes, or the regressor (its v1 class sums the loss).
    "dnn-binary": {"model": "dnn", "hidden_units": "16", "task": "binary:3"},
    "wide_deep_v1-binary": {"model": "wide_deep_v1", "hidden_units": "16", "task": "binary:3"},
    "wide_deep-regression": {"model": "wide_deep", "hidden_units": "16", "task": "regression"},
    "linear_v1-regression": {"model": "linear_v1", "task": "regression"},
    # The loss reduction each class does not default to.
    "dnn-sum": {"model": "dnn", "hidden_units": "16", "loss_reduction": "sum"},
    "linear_v1-mean": {"model": "linear_v1", "loss_reduction": "sum_over_batch_size"},
    # A weight_column: each example's loss weighted by its digit's weight.
    "dnn-binary-weighted": {"model": "dnn", "hidden_units": "16", "task": "binary:3",
                            "weight_column": "w", "digit_weights": "1,1,1,4,1,1,1,1,1,0"},
    "wide_deep_v1-weighted": {"model": "wide_deep_v1", "hidden_units": "16",
                              "weight_column": "w", "digit_weights": "0,1,2,3,4,5,6,7,8,9"},
    # The tabular features through every kind of column (trainers/models/tabular.py):
    # sparse rows of embeddings and linear weights, both parts' optimizers.
    "wide_deep-tabular": {"model": "wide_deep", "hidden_units": "16", "features": "tabular"},
    "linear_v1-tabular-weighted": {"model": "linear_v1", "features": "tabular",
                                   "weight_column": "w", "digit_weights": "0,1,2,3,4,5,6,7,8,9"},
}


@pytest.mark.parametrize("case", [
    # Over the tabular features a case costs 20 to 24 CPU-s (three times a pixel one's):
    # the whole suite's, not the quick tier's (docs/testing.md).
    pytest.param(case, marks=pytest.mark.slow) if CASES[case].get("features") == "tabular"
    else case for case in CASES])
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_both_backends_train_as_the_reference(case, backend_name, tmp_path):
  config = with_initial_weights(dataclasses.replace(CONFIG, **CASES[case]), tmp_path)
  if "batch_norm" in CASES[case]:
    # Not the initializer's values: the warm start must carry the moving statistics.
    weights = model_lib.load_weights_npz(config.init_weights)
    for name in weights:
      if name.endswith("moving_variance"):
        weights[name] = np.full_like(weights[name], 2.0)
    model_lib.save_weights_npz(config.init_weights, weights)
  if backend_name == "keras":
    backend = keras_trainer.Backend
  else:
    from trainers import estimator_trainer  # noqa: PLC0415 -- absent after TF 2.15.
    backend = estimator_trainer.Backend
  trained = trained_weights(backend, config, tmp_path / "model")
  assert_ends_where_the_reference_ends(config, trained)
  if config.weight_column:  # The weights count: unweighted, the reference ends elsewhere.
    with pytest.raises(AssertionError):
      assert_ends_where_the_reference_ends(
          dataclasses.replace(config, weight_column=None, digit_weights=None), trained)




TEAM_COLUMNS = """
import tensorflow as tf
fc = tf.feature_column
ink = fc.numeric_column("ink")
LIST = [ink, fc.indicator_column(fc.categorical_column_with_hash_bucket("grid", 7))]
BY_PART = {"linear": [fc.bucketized_column(ink, [0.1])], "dnn": [ink]}
def made():
  return [fc.numeric_column("width")]
NO_DNN = {"linear": [ink]}
MISSING = [fc.numeric_column("age")]
WRONG_TYPE = [fc.categorical_column_with_hash_bucket("pixels", 3)]
NOT_COLUMNS = ["ink"]
"""


@pytest.mark.parametrize("name, part, want", [
    ("LIST", "dnn", ["ink", "grid_indicator"]), ("LIST", "linear", ["ink", "grid_indicator"]),
    ("BY_PART", "linear", ["ink_bucketized"]), ("BY_PART", "dnn", ["ink"]),
    ("made", "dnn", ["width"]),
    ("NO_DNN", "dnn", "has no 'dnn' list"),
    ("MISSING", "dnn", "column 'age' reads what the data cannot give: the tabular MNIST "
                       "features have no 'age'"),
    ("WRONG_TYPE", "linear", "column 'pixels' reads what the data cannot give: the tabular "
                             "feature 'pixels' is int64; the columns parse it as string"),
    ("NOT_COLUMNS", "dnn", "is not a non-empty list of tf.feature_column columns"),
    ("NOPE", "dnn", "team_columns has no NOPE")])
def test_a_teams_columns_are_found_by_import_path(tmp_path, monkeypatch, name, part, want):
  (tmp_path / "team_columns.py").write_text(TEAM_COLUMNS)
  monkeypatch.syspath_prepend(str(tmp_path))
  settings = dataclasses.replace(CONFIG, model="wide_deep", features="tabular",
                                 feature_columns=f"team_columns:{name}").canned_settings()
  if isinstance(want, list):
    assert [c.name for c in canned.feature_columns(settings, part)] == want
  else:
    with pytest.raises(model_registry.SpecError, match=want):
      canned.feature_columns(settings, part)
