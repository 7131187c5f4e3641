"""launch.proofs.program_probe: before parity trains, a team's program and its port are held
to each other (names, recipe, input, chance), and each difference is refused naming the fix."""

import dataclasses
import re

import pytest

from launch.proofs import program_probe
from launch.proofs.program_probe import ProbeError
from trainers.config import Config

pytestmark = pytest.mark.estimator

TEAM = '''
import numpy as np
import tensorflow as tf
import tf_keras

from trainers.model import ModelSpec
from trainers.program import EstimatorProgram


def input_fn(mode, input_context=None, seed=3):
  images = np.linspace(0, 1, 64 * 4, dtype=np.float32).reshape(64, 4)
  dataset = tf.data.Dataset.from_tensor_slices(({"x": images}, np.arange(64) % 2))
  if input_context is not None:
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
  return dataset.shuffle(64, seed=seed).repeat().batch(4)


def model_fn(features, labels, mode, params):
  hidden = tf.compat.v1.layers.dense(features["x"], 3, tf.nn.relu, name="hidden")
  hidden = tf.compat.v1.layers.dropout(hidden, params["dropout"],
                                       training=mode == tf.estimator.ModeKeys.TRAIN)
  logits = tf.compat.v1.layers.dense(hidden, 2, name="logits")
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits}, export_outputs={
        "serving_default": tf.estimator.export.PredictOutput({"logits": logits})})
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  if mode != tf.estimator.ModeKeys.TRAIN:
    metrics = {"auc": tf.compat.v1.metrics.auc(labels, tf.nn.softmax(logits)[:, 1])}
    if params.get("accuracy", 1):
      metrics["accuracy"] = tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, -1))
    return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)
  optimizer = tf.compat.v1.train.MomentumOptimizer(params["rate"], 0.8)
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(
      loss, tf.compat.v1.train.get_global_step()))


PARAMS = {"rate": 0.1, "dropout": 0.5}
PROGRAM = EstimatorProgram(model_fn, PARAMS, input_fn, deterministic_params={"dropout": 0.0})
RANDOM = EstimatorProgram(model_fn, PARAMS, input_fn)
NO_ACCURACY = EstimatorProgram(model_fn, {**PARAMS, "accuracy": 1}, input_fn)
UNSEEDED = EstimatorProgram(model_fn, PARAMS, lambda mode, context: input_fn(mode, context, None),
                            deterministic_params={"dropout": 0.0})


def receiver(name="x"):
  x = tf.compat.v1.placeholder(tf.float32, [None, 4], name=name)
  return tf.estimator.export.ServingInputReceiver({name: x}, {name: x})


EXPORTS = EstimatorProgram(model_fn, PARAMS, input_fn, receiver,
                           deterministic_params={"dropout": 0.0})
OTHER_RECEIVER = EstimatorProgram(model_fn, PARAMS, input_fn, lambda: receiver("y"),
                                  deterministic_params={"dropout": 0.0})


def build(seed, init, output="logits"):
  x = tf_keras.Input(shape=(4,), name="x")
  dense = {f"{layer}": {"kernel_initializer": init(f"{layer}/kernel", "glorot_uniform"),
                        "bias_initializer": init(f"{layer}/bias", "zeros")}
           for layer in ("hidden", output)}
  hidden = tf_keras.layers.Dense(3, "relu", name="hidden", **dense["hidden"])(x)
  return tf_keras.Model(x, tf_keras.layers.Dense(2, name=output, **dense[output])(hidden))


def signatures(model):
  @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
  def serve(x):
    return {"logits": model(x, training=False)}
  return {"serving_default": serve}


PORT = ModelSpec("port", build)
SERVED = ModelSpec("served", build, signatures=signatures)
RENAMED = ModelSpec("renamed", lambda seed, init: build(seed, init, "out"))
'''


@pytest.fixture
def config(tmp_path, monkeypatch) -> Config:
  (tmp_path / "team.py").write_text(TEAM)
  monkeypatch.syspath_prepend(str(tmp_path))
  return Config(estimator_program="team:PROGRAM", program_params="dropout=0", model="team:PORT",
                optimizer="momentum", learning_rate=0.1, momentum=0.8,
                learning_rate_schedule="constant")


def test_a_faithful_port_passes_every_probe(config):
  probed = program_probe.probe(config, 2, 4)
  assert [c.name for c in probed.checks] == [
      "recipe: optimizer, hyperparameters and rate, program vs port",
      "names: every program variable mapped, every port weight given one",
      "no chance in a step of the program (its loss draws nothing)",
      "input: worker 0's batches the same in a graph and eagerly",
      "input: worker 1's batches the same in a graph and eagerly"]
  assert all(c.passed for c in probed.checks)
  assert probed.to_port == {n: n for n in ("hidden/kernel", "hidden/bias", "logits/kernel",
                                           "logits/bias")}
  assert (probed.batch, probed.metrics, probed.own_input, probed.exports) == (
      4, ["accuracy", "auc"], True, False)


@pytest.mark.parametrize("changes, said", [
    ({"optimizer": "adam", "momentum": None},
     "trains with momentum (its train op's update ops), the port with --optimizer=adam: give "
     "the port --optimizer=momentum and the hyperparameters below. Its settings: "
     "--learning_rate=0.1 --momentum=0.8."),
    ({"momentum": 0.9}, "'s momentum has momentum=0.8, the port --momentum=0.9: give the port "
                        "--momentum=0.8."),
    ({"learning_rate": 0.2}, "trains step 1 at the rate 0.1, the port at 0.2 "
                             "(--learning_rate_schedule=constant, --learning_rate=0.2)"),
    ({"learning_rate_schedule": "cosine", "decay_steps": 4},
     "trains step 2 at the rate 0.1, the port at 0.0853553"),
    ({"estimator_program": "team:RANDOM", "program_params": ""},
     "'s model_fn draws randomness every step with params {'rate': 0.1, 'dropout': 0.5} "
     "(dropout/dropout/random_uniform/RandomUniform: a dropout, say)"),
    ({"estimator_program": "team:UNSEEDED"},
     "'s input_fn gives worker 0 another batch 1 in the Estimator's graph than eagerly "
     "(Keras): an op in it draws randomness without a seed of its own (ShuffleDatasetV3)"),
    ({"estimator_program": "team:NO_ACCURACY", "program_params": "dropout=0,accuracy=0"},
     "its eval_metric_ops have no `accuracy`, which parity holds to the port's (its metrics: "
     "auc)"),
    ({"model": "team:RENAMED"},
     "2 variable(s) map to no model weight: logits/bias [2], logits/kernel [3, 2]. Add to the "
     "--assignment_map JSON object (old name -> model weight, or null to drop it):\n{\n  "
     "\"logits/bias\": \"out/bias\",\n  \"logits/kernel\": \"out/kernel\"\n}"),
])
def test_each_difference_is_refused_naming_the_fix(config, changes, said):
  with pytest.raises(ProbeError, match=re.escape(said)):
    program_probe.probe(dataclasses.replace(config, **changes), 1, 4)


def test_a_program_that_exports_needs_a_port_that_serves_its_receivers_features(config):
  exports = dataclasses.replace(config, estimator_program="team:EXPORTS")
  probed = program_probe.probe(dataclasses.replace(exports, model="team:SERVED"), 1, 4)
  assert probed.exports and probed.checks[-1].where == (
      "the program's export_outputs {'serving_default': ['logits']}")
  with pytest.raises(ProbeError, match=re.escape(
      "exports through its serving_input_receiver_fn (export_outputs {'serving_default': "
      "['logits']}), and --model=team:PORT has no signatures of its own to serve them")):
    program_probe.probe(exports, 1, 4)
  with pytest.raises(ProbeError, match=re.escape(
      "its serving_input_receiver_fn gives features {'y': (None, 4)}, which "
      "--model=team:SERVED does not take: its inputs are {'x': (None, 4)}")):
    program_probe.probe(dataclasses.replace(exports, estimator_program="team:OTHER_RECEIVER",
                                            model="team:SERVED"), 1, 4)


def test_the_converters_map_gives_the_programs_names_their_place(config):
  renamed = dataclasses.replace(config, model="team:RENAMED")
  probed = program_probe.probe(renamed, 1, 4, {"logits/kernel": "out/kernel",
                                               "logits/bias": "out/bias"})
  assert probed.to_port["logits/kernel"] == "out/kernel"
  assert probed.checks[1].where == "logits/bias -> out/bias, logits/kernel -> out/kernel"


def test_a_port_weight_the_map_leaves_without_a_value_is_refused(config):
  renamed = dataclasses.replace(config, model="team:RENAMED")
  with pytest.raises(ProbeError, match=re.escape(
      "--estimator_program=team:PROGRAM's variables: no variable gives the model weight "
      "out/bias its value; map one to it in --assignment_map.")):
    program_probe.probe(renamed, 1, 4, {"logits/kernel": "out/kernel", "logits/bias": None})
