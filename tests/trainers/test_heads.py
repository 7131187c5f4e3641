"""trainers.heads: each task's head computes in Keras what the canned Estimator's head does:
its loss, predictions, export outputs and every metric, under the same keys."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from trainers import heads
from trainers.config import Config

estimator = pytest.importorskip("tensorflow_estimator", reason="tf.estimator (TF 2.15)")

TASKS = ("multiclass", "binary:3", "regression")


def _batches(head: heads.Head, count: int = 3, size: int = 64):
  """Random (labels, logits) batches as the input and the model give them, (B,) labels."""
  rng = np.random.default_rng(0)
  for _ in range(count):
    logits = rng.normal(size=(size, head.logits_dimension)).astype(np.float32) * 3
    if head.kind == "regression":
      labels = rng.uniform(size=size).astype(np.float32)
    else:
      labels = rng.integers(0, head.logits_dimension if head.kind == "multiclass" else 2,
                            size=size).astype(np.int64)
    yield tf.constant(labels), tf.constant(logits)


@pytest.mark.parametrize("task", TASKS)
def test_every_metric_is_the_canned_heads_under_its_key(task):
  head = heads.head(Config(task=task))
  canned = head.estimator_head()
  theirs = canned.metrics()
  ours = head.keras_metrics()
  for labels, logits in _batches(head):
    canned.update_metrics(theirs, {"image": logits}, logits, labels)
    for metric in ours:
      metric.update_state(labels, logits)
  got = {m.name: float(m.result()) for m in ours}
  want = {k: float(m.result()) for k, m in theirs.items()}
  assert sorted([*got, "loss"]) == sorted([*want, "loss"]) == list(head.metric_keys)
  assert got == pytest.approx(want, abs=1e-7, rel=0)


@pytest.mark.parametrize("task", TASKS)
def test_the_loss_and_the_predictions_are_the_canned_heads(task):
  head = heads.head(Config(task=task))
  canned = head.estimator_head()
  labels, logits = next(_batches(head))
  want_loss = canned.loss(labels, logits, features={"image": logits})
  assert float(tf.reduce_mean(head.loss(labels, logits))) == pytest.approx(
      float(want_loss), rel=1e-7)
  loss = head.keras_loss(tf_keras.losses.Reduction.SUM_OVER_BATCH_SIZE)
  assert float(loss(labels, logits)) == pytest.approx(float(want_loss), rel=1e-6)
  got, want = head.predictions(logits), canned.predictions(logits)
  assert sorted(got) == sorted(want)
  for key in want:
    np.testing.assert_array_equal(got[key].numpy(), want[key].numpy(), err_msg=key)


def _v1_head(head: heads.Head):
  """The head a tf.compat.v1.estimator canned class of the task builds (summed loss)."""
  from tensorflow_estimator.python.estimator.canned import head as v1_heads  # noqa: PLC0415
  if head.kind == "regression":
    return v1_heads._regression_head(loss_reduction=tf.compat.v1.losses.Reduction.SUM)
  return v1_heads._binary_logistic_or_multi_class_head(
      n_classes=max(2, head.logits_dimension), weight_column=None, label_vocabulary=None,
      loss_reduction=tf.compat.v1.losses.Reduction.SUM)


def _v1_metrics(head: heads.Head, batches, v1_head=None) -> dict:
  """The v1 head's eval_metric_ops over `batches` of (labels, logits) or (labels, logits,
  weights), run in a graph as the Estimator runs them."""
  with tf.Graph().as_default():
    labels = tf.compat.v1.placeholder(batches[0][0].dtype, [None])
    logits = tf.compat.v1.placeholder(tf.float32, [None, head.logits_dimension])
    weights = tf.compat.v1.placeholder(tf.float32, [None])
    spec = (v1_head or _v1_head(head)).create_estimator_spec(
        features={"image": logits, "w": weights}, mode=tf.estimator.ModeKeys.EVAL,
        logits=logits, labels=labels)
    ops = {k: v for k, v in spec.eval_metric_ops.items() if k != "loss"}
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.local_variables_initializer())
      for y, z, *w in batches:
        session.run([update for _, update in ops.values()],
                    {labels: y, logits: z, weights: w[0] if w else np.ones(len(y))})
      return {k: float(v) for k, v in session.run({k: v for k, (v, _) in ops.items()}).items()}


@pytest.mark.parametrize("task", TASKS)
def test_a_v1_canned_models_metrics_are_its_v1_heads(task):
  head = heads.head(Config(task=task, model="dnn_v1"))
  assert head.v1
  batches = [(y.numpy(), z.numpy()) for y, z in _batches(head, size=500)]
  want = _v1_metrics(head, batches)
  ours = head.keras_metrics()
  for labels, logits in batches:
    for metric in ours:
      metric.update_state(tf.constant(labels), tf.constant(logits))
  got = {m.name: float(m.result()) for m in ours}
  assert sorted([*got, "loss"]) == list(head.metric_keys) == sorted([*want, "loss"])
  assert got == pytest.approx(want, abs=1e-7, rel=0)
  if head.kind == "binary":
    # Keras's own AUC (a TF2 head's) interpolates the PR curve: not v1's trapezoids.
    tf2 = heads.head(Config(task=task)).keras_metrics()
    pr = next(m for m in tf2 if m.name == "auc_precision_recall")
    for labels, logits in batches:
      pr.update_state(tf.constant(labels), tf.constant(logits))
    assert abs(float(pr.result()) - want["auc_precision_recall"]) > 1e-4


def _weighted_head(head: heads.Head, v1: bool):
  """The canned head of the task with a weight_column "w" (TF2's, or a v1 class's)."""
  if v1:
    from tensorflow_estimator.python.estimator.canned import head as v1_heads  # noqa: PLC0415
    if head.kind == "regression":
      return v1_heads._regression_head(weight_column="w",
                                       loss_reduction=tf.compat.v1.losses.Reduction.SUM)
    return v1_heads._binary_logistic_or_multi_class_head(
        n_classes=max(2, head.logits_dimension), weight_column="w", label_vocabulary=None,
        loss_reduction=tf.compat.v1.losses.Reduction.SUM)
  if head.kind == "multiclass":
    return tf.estimator.MultiClassHead(10, weight_column="w")
  if head.kind == "binary":
    return tf.estimator.BinaryClassHead(weight_column="w")
  return tf.estimator.RegressionHead(weight_column="w")


@pytest.mark.parametrize("v1", [False, True], ids=["tf2", "v1"])
@pytest.mark.parametrize("task", TASKS)
def test_weighted_metrics_are_the_canned_heads_with_a_weight_column(task, v1):
  head = heads.head(Config(task=task, model="dnn_v1" if v1 else "dnn"))
  rng = np.random.default_rng(1)
  batches = [(y.numpy(), z.numpy(), rng.choice([0.0, 0.5, 1.0, 3.0], size=len(y)))
             for y, z in _batches(head, size=300)]
  ours = head.keras_metrics()
  for labels, logits, weights in batches:
    for metric in ours:
      metric.update_state(tf.constant(labels), tf.constant(logits),
                          sample_weight=tf.constant(weights, tf.float32))
  got = {m.name: float(m.result()) for m in ours}
  canned = _weighted_head(head, v1)
  if v1:
    want = _v1_metrics(head, batches, canned)
  else:
    theirs = canned.metrics()
    for labels, logits, weights in batches:
      canned.update_metrics(theirs, {"image": logits, "w": tf.constant(weights, tf.float32)},
                            tf.constant(logits), tf.constant(labels))
    want = {k: float(m.result()) for k, m in theirs.items() if k != "loss"}
  assert sorted(got) == sorted(want)
  assert got == pytest.approx(want, abs=1e-6, rel=0)
  unweighted = head.keras_metrics()
  for labels, logits, _ in batches:
    for metric in unweighted:
      metric.update_state(tf.constant(labels), tf.constant(logits))
  assert float(unweighted[0].result()) != pytest.approx(got[unweighted[0].name], abs=1e-4)


VOCABULARIES = {"multiclass": ("zero", "one", "two", "three", "four", "five", "six", "seven",
                               "eight", "nine"),
                "binary:3": ("other", "three")}


@pytest.mark.parametrize("task", VOCABULARIES)
def test_a_label_vocabulary_is_the_canned_heads(task):
  vocabulary = VOCABULARIES[task]
  head = heads.head(Config(task=task, model="dnn", label_vocabulary=",".join(vocabulary)))
  assert head.vocabulary == vocabulary
  canned = (tf.estimator.MultiClassHead(10, label_vocabulary=list(vocabulary))
            if task == "multiclass" else
            tf.estimator.BinaryClassHead(label_vocabulary=list(vocabulary)))
  theirs, ours = canned.metrics(), head.keras_metrics()
  ids = heads.head(Config(task=task))
  for labels, logits in _batches(ids):
    names = tf.gather(tf.constant(vocabulary), labels)
    canned.update_metrics(theirs, {"image": logits}, logits, names)
    for metric in ours:
      metric.update_state(names, logits)
    assert float(tf.reduce_mean(head.loss(names, logits))) == pytest.approx(
        float(canned.loss(names, logits, features={"image": logits})), rel=1e-7)
    assert float(head.keras_loss("auto")(names, logits)) == pytest.approx(
        float(tf.reduce_mean(ids.loss(labels, logits))), rel=1e-7)
  got = {m.name: float(m.result()) for m in ours}
  assert got == pytest.approx({k: float(m.result()) for k, m in theirs.items() if k != "loss"},
                              abs=1e-7, rel=0)
  predicted, want = head.predictions(logits), canned.predictions(logits)
  for key in ("classes", "all_classes", "class_ids"):
    np.testing.assert_array_equal(predicted[key].numpy(), want[key].numpy(), err_msg=key)
  assert set(predicted["classes"].numpy().ravel()) <= {v.encode() for v in vocabulary}
  # The labels the input derives are the vocabulary's strings.
  image = tf.zeros((28, 28, 1))
  assert head.label(image, tf.constant(3, tf.int64)).numpy() == b"three"
  with pytest.raises(tf.errors.InvalidArgumentError, match="outside --label_vocabulary"):
    head.loss(tf.constant(["three", "ten"]), logits[:2])


@pytest.mark.parametrize("task,signatures", [
    ("multiclass", {"serving_default": "classify", "classification": "classify",
                    "predict": "predict"}),
    ("binary:3", {"serving_default": "classify", "classification": "classify",
                  "regression": "regress", "predict": "predict"}),
    ("regression", {"serving_default": "regress", "regression": "regress",
                    "predict": "predict"}),
])
def test_each_head_exports_the_canned_heads_signatures(task, signatures):
  head = heads.head(Config(task=task))
  assert head.signatures == signatures
  labels, logits = next(_batches(head))
  spec = head.estimator_head().create_estimator_spec(
      features={"image": logits}, mode=tf.estimator.ModeKeys.PREDICT, logits=logits)
  assert sorted(spec.export_outputs) == sorted(signatures)
  predicted = head.predictions(logits)
  for key, method in signatures.items():
    want = _outputs(spec.export_outputs[key])
    got = head.signature_outputs(predicted, method)
    assert sorted(got) == sorted(want), key
    for name in want:
      np.testing.assert_array_equal(got[name].numpy(), want[name].numpy(), err_msg=key)


def _outputs(export_output):
  """An Estimator export output's tensors, as its signature names them."""
  if isinstance(export_output, tf.estimator.export.ClassificationOutput):
    return {"classes": export_output.classes, "scores": export_output.scores}
  if isinstance(export_output, tf.estimator.export.RegressionOutput):
    return {"outputs": export_output.value}
  return export_output.outputs


def test_labels_are_the_tasks():
  image = tf.constant(np.linspace(0, 1, 784, dtype=np.float32).reshape(28, 28, 1))
  seven, three = tf.constant(7, tf.int64), tf.constant(3, tf.int64)
  assert int(heads.head(Config()).label(image, seven)) == 7
  binary = heads.head(Config(task="binary:3"))
  assert [int(binary.label(image, digit)) for digit in (seven, three)] == [0, 1]
  assert float(heads.head(Config(task="regression")).label(image, seven)) == pytest.approx(0.5)


@pytest.mark.parametrize("vocabulary", [None, "other,three"])
def test_a_compiled_export_loads_its_head_metrics_by_name(vocabulary, tmp_path):
  inputs = tf_keras.Input((4,))
  model = tf_keras.Model(inputs, tf_keras.layers.Dense(1)(inputs))
  head = heads.head(Config(task="binary:3", model="dnn", label_vocabulary=vocabulary))
  model.compile(loss=head.keras_loss("auto"), metrics=head.keras_metrics())
  x, y = np.ones((8, 4), np.float32), np.array([0, 1] * 4)
  if vocabulary:  # The labels as strings, the loss a HeadLoss.
    y = np.array(vocabulary.split(","))[y]
  want = model.evaluate(x, y, verbose=0, return_dict=True)
  model.save(str(tmp_path / "m"), save_format="tf")
  loaded = tf_keras.models.load_model(str(tmp_path / "m"))
  assert loaded.evaluate(x, y, verbose=0, return_dict=True) == pytest.approx(want)
