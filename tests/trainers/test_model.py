"""trainers.model: a spec's build checked, initial weights by name, the export's outputs."""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.autograph.core import config as autograph_config
import tf_keras

from trainers import model as model_lib
from trainers import v1_metrics
from trainers.config import Config
from trainers.model_registry import SpecError

NAMES = ["conv/kernel", "conv/bias", "hidden/kernel", "hidden/bias", "logits/kernel",
         "logits/bias"]
# A user's spec module, each build wrong in one way.
SPECS = """
import tf_keras
from trainers import v1_metrics as v1
from trainers.model import ModelSpec

def build(seed, init, skip="", extra="", regularizer=None, width=10):
  kernel = init("dense/kernel", "glorot_uniform") if skip != "kernel" else "zeros"
  if extra:
    init(extra, "zeros")
  image = tf_keras.Input((28, 28, 1), name="image")
  x = tf_keras.layers.Flatten(name="flatten")(image)
  logits = tf_keras.layers.Dense(width, name="dense", kernel_initializer=kernel,
                                 bias_initializer=init("dense/bias", "zeros"),
                                 kernel_regularizer=regularizer)(x)
  return tf_keras.Model(image, logits)

def failing(seed, init):
  raise RuntimeError("no GPU here")

GOOD = ModelSpec(name="good", build=build)
UNSEEDED = ModelSpec(name="unseeded", build=lambda seed, init: build(seed, init, skip="kernel"))
TYPO = ModelSpec(name="typo", build=lambda seed, init: build(seed, init, extra="dense/kernal"))
FAILING = ModelSpec(name="failing", build=failing)
REGULARIZED = ModelSpec(name="regularized", build=lambda seed, init: build(seed, init,
                                                                           regularizer="l2"))
WIDE = ModelSpec(name="wide", build=lambda seed, init, outputs: build(seed, init))
OWN_LOSS = ModelSpec(name="own_loss",
                     build=lambda seed, init, outputs=10: build(seed, init, width=outputs),
                     loss=lambda labels, logits: logits[:, 0])
METERED = ModelSpec(name="metered",
                    build=lambda seed, init, outputs=10: build(seed, init, width=outputs),
                    metrics={"auc_pr": v1.Metric("auc", curve="PR"),
                             "p3": v1.Metric("precision_at_k", k=3)})
CLASHING = ModelSpec(name="clashing", build=build, metrics={"accuracy": v1.Metric("accuracy")})
"""


@pytest.fixture
def user_specs(tmp_path, monkeypatch):
  (tmp_path / "user_specs.py").write_text(SPECS)
  monkeypatch.syspath_prepend(str(tmp_path))


def test_a_user_spec_builds_and_takes_initial_weights_by_name(user_specs):
  config = Config(model="user_specs:GOOD")
  weights = model_lib.get_weights(model_lib.build(config))
  assert sorted(weights) == ["dense/bias", "dense/kernel"]
  given = {name: np.full_like(value, 0.5) for name, value in weights.items()}
  rebuilt = model_lib.get_weights(model_lib.build(config, given))
  assert all(np.array_equal(rebuilt[n], given[n]) for n in given)
  with pytest.raises(SpecError, match="the initial weights have no dense/bias"):
    model_lib.build(config, {"dense/kernel": given["dense/kernel"]})
  # What an export is written from: the same values, the spec's own initializers.
  held = model_lib.build_holding(config, given)
  assert all(np.array_equal(value, given[n]) for n, value in model_lib.get_weights(held).items())
  assert held.get_layer("dense").get_config()["kernel_initializer"]["class_name"] != "Constant"
  with pytest.raises(SpecError, match="the weights given have no dense/bias"):
    model_lib.build_holding(config, {"dense/kernel": given["dense/kernel"]})


@pytest.mark.parametrize("name, said", [
    ("UNSEEDED", r"gives dense/kernel no init\(...\) initializer"),
    ("TYPO", r"asks init\(...\) for dense/kernal, which is not one of its weights"),
    ("FAILING", "its build failed: RuntimeError: no GPU here"),
    ("REGULARIZED", "adds losses of its own .a kernel_regularizer"),
])
def test_a_spec_whose_build_is_wrong_is_named_before_any_training(user_specs, name, said):
  with pytest.raises(SpecError, match=said):
    model_lib.check(Config(model=f"user_specs:{name}"))


@pytest.mark.parametrize("name, task, said", [
    ("GOOD", "binary:3", "--task=binary:3 needs 1 output, and model good's build takes no "
     "`outputs`: give it that keyword"),
    ("WIDE", "regression", r"model wide's build makes 1 output\(s\) of shape \[\(None, 10\)\]; "
     r"--task=regression needs one of \(batch, 1\)"),
    ("OWN_LOSS", "regression", "model own_loss has a loss of its own .* trains with its head's"),
    ("METERED", "regression", r"model metered: metrics\['auc_pr'\]: tf.compat.v1.metrics.auc "
     r"is fed scores \(multiclass, binary tasks\), and --task=regression has none"),
    ("METERED", "binary:3", r"metrics\['p3'\]: tf.compat.v1.metrics.precision_at_k is fed top k"),
    ("CLASHING", "multiclass", r"metrics\['accuracy'\] is the --task=multiclass head's own"),
])
def test_a_spec_that_cannot_take_the_task_is_named_before_any_training(user_specs, name, task,
                                                                        said):
  with pytest.raises(SpecError, match=said):
    model_lib.check(Config(model=f"user_specs:{name}", task=task))


@pytest.mark.parametrize("model", ["cnn", "cnn_bn"])
def test_the_built_in_models_make_the_heads_width(model):
  assert model_lib.build(Config(model=model)).output_shape == (None, 10)
  assert model_lib.build(Config(model=model, task="binary:0")).output_shape == (None, 1)
  assert model_lib.build(Config(model=model, task="regression")).output_shape == (None, 1)


def test_a_loss_reduction_is_mean_or_sum():
  with pytest.raises(SpecError, match="loss_reduction='sum_over_batch_size'; use one of mean, sum"):
    model_lib.ModelSpec(name="x", build=lambda seed, init: None,
                        loss_reduction="sum_over_batch_size")


@pytest.mark.parametrize("metrics, said", [
    ({"auc": "auc"}, r"metrics\['auc'\] is a str; declare it as trainers.v1_metrics.Metric"),
    ({"loss": v1_metrics.Metric("mean", of=lambda y, z: z)}, "`loss` and `global_step` are"),
])
def test_declared_metrics_are_v1_metrics_under_keys_of_their_own(metrics, said):
  with pytest.raises(SpecError, match=said):
    model_lib.ModelSpec(name="x", build=lambda seed, init: None, metrics=metrics)


def test_the_declared_metrics_are_reported_beside_the_heads(user_specs):
  config = Config(model="user_specs:METERED")
  assert model_lib.metric_keys(config) == ("accuracy", "auc_pr", "average_loss", "loss", "p3")
  assert sorted(model_lib.declared_metrics(config)) == ["auc_pr", "p3"]


def test_building_a_model_makes_autograph_leave_tf_keras_alone_once():
  model_lib.build(Config(seed=0))
  model_lib.build(Config(seed=0))
  rules = [r for r in autograph_config.CONVERSION_RULES
           if getattr(r, "_prefix", None) == "tf_keras"]
  assert len(rules) == 1
  assert rules[0].matches(tf_keras.layers.Dense.__module__)


def test_initial_weights_round_trip_through_npz(tmp_path):
  weights = model_lib.get_weights(model_lib.build(Config(seed=3)))
  path = str(tmp_path / "init.npz")
  model_lib.save_weights_npz(path, weights)
  rebuilt = model_lib.get_weights(model_lib.build(Config(seed=0), model_lib.load_weights_npz(path)))
  assert all(np.array_equal(rebuilt[n], weights[n]) for n in NAMES)


def test_eval_sums():
  model = model_lib.build(Config(seed=1))
  images = tf.random.stateless_uniform((5, 28, 28, 1), seed=(1, 2))
  labels = tf.constant([0, 1, 2, 3, 4], tf.int64)
  loss_sum, correct, count = model_lib.eval_sums(
      model, model_lib.sparse_softmax_cross_entropy, images, labels).numpy()
  logits = model(images)
  want = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
  np.testing.assert_allclose(loss_sum, float(tf.reduce_sum(want)), rtol=1e-5)
  assert count == 5 and correct == int(tf.reduce_sum(tf.cast(
      tf.argmax(logits, -1) == labels, tf.int32)))


def test_a_logged_tensor_is_a_known_value_or_a_layer_of_the_model():
  model_lib.check_log_tensors(Config(log_tensors="loss,learning_rate,global_step,conv,hidden"))
  with pytest.raises(SpecError,
                     match=r"--log_tensors: 'dense' is none of loss, learning_rate, "
                           r"global_step nor a layer of model 'cnn', whose layers are conv, "
                           r"pool, flatten, hidden, logits\."):
    model_lib.check(Config(log_tensors="loss,dense"))
  model = model_lib.build(Config())
  taps = model_lib.layer_taps(model, ["loss", "hidden"])
  assert [t.shape.as_list() for t in taps.outputs] == [[None, 10], [None, 64]]
  assert model_lib.layer_taps(model, ["loss"]) is None
