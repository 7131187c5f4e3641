"""trainers.estimator_program: a team's model_fn called as the Estimator calls it, its
failures named at their line, and the recipe read off its update ops."""

import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf

from trainers import estimator_program
from trainers.program import EstimatorProgram, ProgramError

pytestmark = pytest.mark.estimator


def input_fn(mode, input_context=None):
  images = np.linspace(0, 1, 8 * 4, dtype=np.float32).reshape(8, 4)
  return tf.data.Dataset.from_tensor_slices(({"x": images}, np.arange(8) % 2)).batch(4)


def model_fn(features, labels, mode, params):
  logits = tf.compat.v1.layers.dense(features["x"], 2, name="logits")
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  if mode != tf.estimator.ModeKeys.TRAIN:
    return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={
        "accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, -1))})
  rate = tf.compat.v1.train.exponential_decay(params["rate"], tf.compat.v1.train.get_global_step(),
                                              2, 0.5, staircase=True)
  optimizer = tf.compat.v1.train.MomentumOptimizer(rate, 0.8)
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(
      loss, tf.compat.v1.train.get_global_step()))


def test_the_model_fn_gets_what_it_declares_as_the_estimator_gives_it():
  seen = {}

  def declares_two(features, mode):
    seen["two"] = (features, mode)

  def takes_all(features, **kwargs):
    seen["all"] = sorted(kwargs)

  estimator_program.call_model_fn(declares_two, "f", None, "train", {"a": 1}, "config")
  estimator_program.call_model_fn(takes_all, "f", "l", "train", {"a": 1}, "config")
  assert seen == {"two": ("f", "train"), "all": ["config", "labels", "mode", "params"]}
  with pytest.raises(ProgramError, match="takes no labels, but its input_fn gives them"):
    estimator_program.call_model_fn(declares_two, "f", "labels", "train", {}, None)


@pytest.mark.parametrize("make, name, settings", [
    (lambda: tf.compat.v1.train.GradientDescentOptimizer(0.5), "sgd", {}),
    (lambda: tf.compat.v1.train.MomentumOptimizer(0.5, 0.7), "momentum", {"momentum": 0.7}),
    (lambda: tf.compat.v1.train.MomentumOptimizer(0.5, 0.7, use_nesterov=True),
     "momentum (nesterov)", {"momentum": 0.7}),
    (lambda: tf.compat.v1.train.AdagradOptimizer(0.5), "adagrad", {}),
    (lambda: tf.compat.v1.train.AdamOptimizer(0.5, 0.8, 0.99, 1e-7), "adam",
     {"beta1": 0.8, "beta2": 0.99, "epsilon": 1e-7}),
    (lambda: tf.compat.v1.train.FtrlOptimizer(0.5, l1_regularization_strength=0.01), "ftrl",
     {"l1": 0.01, "l2": 0.0, "learning_rate_power": -0.5}),
    (lambda: tf.compat.v1.train.RMSPropOptimizer(0.5, decay=0.8, epsilon=1e-6), "rmsprop",
     {"rho": 0.8, "momentum": 0.0, "epsilon": 1e-6}),
    (lambda: tf.compat.v1.train.AdadeltaOptimizer(0.5), "ResourceApplyAdadelta",
     {"rho": 0.95, "epsilon": 1e-8}),
])
def test_the_recipe_names_each_v1_optimizer_and_reads_its_settings(make, name, settings):
  with tf.Graph().as_default():
    weight = tf.compat.v1.get_variable("w", initializer=[1.0, 2.0], use_resource=True)
    make().minimize(tf.reduce_sum(weight ** 2))
    recipe = estimator_program.find_recipe(tf.compat.v1.get_default_graph().get_operations())
    with tf.compat.v1.Session() as session:
      rate, found = session.run((recipe.rate, recipe.hyperparameters))
  assert (recipe.optimizer, recipe.others) == (name, [])
  assert rate == np.float32(0.5)
  assert found == {k: np.float32(v) for k, v in settings.items()}


def test_the_recipe_reads_each_steps_rate_off_the_train_graph():
  the_program = EstimatorProgram(model_fn, params={"rate": 0.4}, input_fn=input_fn)
  built = estimator_program.build_graph(the_program, the_program.params, input_fn, "train",
                                        "team:PROGRAM")
  assert sorted(built.variables) == ["global_step", "logits/bias", "logits/bias/Momentum",
                                     "logits/kernel", "logits/kernel/Momentum"]
  found = estimator_program.recipe_values(built, range(5))
  assert found["optimizer"] == "momentum"
  assert found["hyperparameters"] == {"momentum": pytest.approx(0.8)}
  assert found["rates"] == [pytest.approx(r) for r in (0.4, 0.4, 0.2, 0.2, 0.1)]


def broken_model_fn(features, labels, mode):
  hidden = tf.compat.v1.layers.dense(features["x"], 3)
  return hidden @ tf.ones([4, 2])  # A (4, 3) by (4, 2) product: the line this test names.


def test_a_model_fn_that_fails_is_named_at_its_own_line():
  the_program = EstimatorProgram(broken_model_fn, input_fn=input_fn)
  with pytest.raises(ProgramError) as e:
    estimator_program.build_graph(the_program, {}, input_fn, "train", "team:PROGRAM")
  message = str(e.value)
  assert message.startswith("--estimator_program=team:PROGRAM: its model_fn built the train "
                            "graph and failed: ValueError: ")
  source = pathlib.Path(__file__).read_text().splitlines()
  line = next(i for i, text in enumerate(source, 1) if "the line this test names" in text)
  assert re.search(rf"\(at {re.escape(__file__)}:{line}, in broken_model_fn\)\. Fix it there",
                   message), message


@pytest.mark.parametrize("the_model_fn, said", [
    (lambda features, labels, mode: {"loss": 1.0}, "returned a dict in train mode, not a "
                                                   "tf.estimator.EstimatorSpec"),
    (lambda features, labels, mode: tf.estimator.EstimatorSpec(
        mode, loss=tf.reduce_sum(tf.compat.v1.get_variable("w", [1]) * 0), train_op=tf.no_op()),
     "its model_fn's train op updates no variable with a tf.compat.v1.train optimizer"),
])
def test_a_model_fn_the_project_cannot_train_says_why(the_model_fn, said):
  the_program = EstimatorProgram(the_model_fn, input_fn=input_fn)
  with pytest.raises(ProgramError, match=re.escape(said)):
    estimator_program.build_graph(the_program, {}, input_fn, "train", "team:PROGRAM")


def embedding_model_fn(features, labels, mode, params):
  """An embedding looked up by ids: its gradient is rows (IndexedSlices)."""
  ids = tf.cast(features["x"][:, 0] * 3, tf.int64)
  table = tf.compat.v1.get_variable("table", [4, 2], use_resource=True)
  logits = tf.compat.v1.layers.dense(tf.nn.embedding_lookup(table, ids), 2, name="logits")
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  optimizer = params["optimizer"]()
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(
      loss, tf.compat.v1.train.get_global_step()))


@pytest.mark.parametrize("make", [
    # A sparse apply of each row, and a scatter of each row into Adam's slots.
    lambda: tf.compat.v1.train.AdagradOptimizer(0.5),
    lambda: tf.compat.v1.train.AdamOptimizer(0.5),
])
def test_a_variable_updated_by_rows_is_found_and_refused_on_two_workers(make):
  the_program = EstimatorProgram(embedding_model_fn, params={"optimizer": make},
                                 input_fn=input_fn)
  built = estimator_program.build_graph(the_program, the_program.params, input_fn, "train",
                                        "p:P")
  assert estimator_program.sparse_updates(built) == ["table"]
  estimator_program.check_workers(built, "p:P", 1)
  with pytest.raises(ProgramError, match=re.escape(
      "--estimator_program=p:P: its train op updates table by rows") + ".*tensorflow#24003"):
    estimator_program.check_workers(built, "p:P", 2)
  dense = EstimatorProgram(model_fn, params={"rate": 0.4}, input_fn=input_fn)
  assert estimator_program.sparse_updates(estimator_program.build_graph(
      dense, dense.params, input_fn, "train", "p:P")) == []
