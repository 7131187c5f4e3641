"""The serving contract: the signatures both backends' SavedModels answer, named and shaped as
a canned Estimator's export has them, so that the clients of an Estimator keep working on
the Keras export.

A canned classifier exported with the parsing receiver its users serve it with
(`build_parsing_serving_input_receiver_fn`) answers serialized `tf.Example`s holding the
image feature (784 floats); every model here, in both backends, exports:

- `serving_default` and `classification`, Classify (`tensorflow/serving/classify`): input
  `inputs`, string [N]; outputs `classes`, string [N, 10], and `scores`, float [N, 10].
- `predict`, Predict (`tensorflow/serving/predict`): input `examples`, string [N]; outputs
  `class_ids`, int64 [N, 1], `classes`, string [N, 1], `all_class_ids`, int32 [N, 10],
  `all_classes`, string [N, 10], `logits` and `probabilities`, float [N, 10].
- `image:predict`, Predict: input `image`, float [N, 28, 28, 1]; outputs as `predict`.

That is the multiclass head's (`--task=multiclass`); each head exports its own
(trainers/heads.py, `Head.signatures`): a binary head's classes are "0" and "1" and it adds
`regression`, Regress (`tensorflow/serving/regress`): input `inputs`, output `outputs`, the
logistic, float [N, 1]; a regression head's `serving_default` and `regression` are Regress
(`outputs`, the prediction) and its `predict` gives `predictions`.

`image:predict` takes the image tensor, for clients that send no tf.Example; the
Estimator names the signatures of an alternative receiver `<receiver>:<output>`.

Under `--features=tabular` the tf.Examples hold a canned model's raw features, parsed by its
columns' spec (`make_parse_example_spec`, as the canned parsing receiver parses them), and
there is no `image:predict`.

The Estimator builds these from `estimator_export_outputs` and `estimator_receiver_fn`; Keras
from `keras_signatures`, then `mark_methods` on the written SavedModel
(`tf.saved_model.save` gives every signature the Predict method name).

A team's program (--estimator_program) exports its own `export_outputs` through its own
receiver instead; its port's spec gives the same signatures (`ModelSpec.signatures`), which
`mark_methods` gives the same methods.
"""

import os
from typing import Any, Callable, Dict, Optional, Tuple

import tensorflow as tf
import tf_keras
from tensorflow.core.protobuf import saved_model_pb2
# Private, and the same in TF 2.15 and 2.21: nothing public rewrites a fingerprint.
from tensorflow.python.saved_model import fingerprinting_utils

from data import mnist
from trainers import heads
from trainers.config import Config

SERVING_DEFAULT = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
CLASSIFICATION = "classification"
PREDICT = "predict"
IMAGE = "image"  # The float signature's input, and its receiver's name.
IMAGE_PREDICT = f"{IMAGE}:{PREDICT}"
REGRESSION = "regression"
CLASSIFY_SIGNATURES = (SERVING_DEFAULT, CLASSIFICATION)
SIGNATURES = (SERVING_DEFAULT, CLASSIFICATION, PREDICT, IMAGE_PREDICT)  # The ten digits'.
# Every signature a head's export may have, in the order a client's requests go.
CONTRACT_ORDER = (SERVING_DEFAULT, CLASSIFICATION, REGRESSION, PREDICT, IMAGE_PREDICT)
CLASSIFY_INPUT = "inputs"  # tf.saved_model.CLASSIFY_INPUTS: Classify's one input.
PREDICT_INPUT = "examples"  # The parsing receiver's name for the serialized protos.


def signature_keys(head: heads.Head, spec: Optional[Dict[str, Any]] = None
                   ) -> Tuple[str, ...]:
  """The signatures an export for `head` has: the head's, and `image:predict` unless the
  requests hold tabular features (`spec`, their parse spec)."""
  return (*head.signatures, *([] if spec else [IMAGE_PREDICT]))


def feature_name(config: Config) -> str:
  """The tf.Example feature holding the image: a canned model's `--feature_name`, else
  `image`."""
  return config.canned_settings().get("feature_name", IMAGE)


def feature_spec(feature: str) -> Dict[str, tf.io.FixedLenFeature]:
  """The parsing spec of the served tf.Examples: `feature`, 784 floats."""
  return {feature: tf.io.FixedLenFeature(mnist.IMAGE_SHAPE, tf.float32)}


def parse_images(serialized: tf.Tensor, feature: str) -> tf.Tensor:
  """Images (N, 28, 28, 1) from N serialized tf.Examples."""
  return tf.io.parse_example(serialized, feature_spec(feature))[feature]


def predictions(logits: tf.Tensor, head: heads.Head = heads.DIGITS
                ) -> Dict[str, tf.Tensor]:
  """The head's predictions (a canned classifier's, without a label vocabulary, by default),
  by the ops it uses (tensorflow_estimator's head/*_head.py predictions)."""
  return head.predictions(logits)


def classify_outputs(predicted: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
  """Classify's outputs: every class's label and score, as the head's ClassificationOutput."""
  return heads.DIGITS.signature_outputs(predicted, heads.CLASSIFY)


def estimator_export_outputs(predicted: Dict[str, tf.Tensor],
                             head: heads.Head = heads.DIGITS) -> Dict[str, object]:
  """A model_fn's `export_outputs` (tf.estimator.export.ExportOutputs): the head's."""
  export = tf.estimator.export
  made = {heads.CLASSIFY: lambda o: export.ClassificationOutput(scores=o["scores"],
                                                                classes=o["classes"]),
          heads.REGRESS: lambda o: export.RegressionOutput(value=o["outputs"]),
          heads.PREDICT: export.PredictOutput}
  return {key: made[method](head.signature_outputs(predicted, method))
          for key, method in head.signatures.items()}


def estimator_receiver_fn(feature: str, as_dict: bool, spec: Optional[Dict[str, Any]] = None
                          ) -> Callable[[], object]:
  """The Estimator's serving input: serialized tf.Examples, parsed as
  `build_parsing_serving_input_receiver_fn` parses them, and the parsed images as the
  alternative receiver `image` (signature `image:predict`).

  Args:
    feature: the tf.Example feature holding the image.
    as_dict: the model_fn takes a dict of features (a canned Estimator), not the tensor.
    spec: the tabular features' parse spec (a canned model's columns'); then the examples
      parsed by it are the features, and there is no alternative receiver.
  """

  def receiver():
    serialized = tf.compat.v1.placeholder(tf.string, [None], name="input_example_tensor")
    inputs = {PREDICT_INPUT: serialized}
    if spec:
      return tf.estimator.export.ServingInputReceiver(
          tf.io.parse_example(serialized, spec), inputs)
    # Fed directly, it replaces the parsed images: the float signature's input.
    images = tf.compat.v1.placeholder_with_default(parse_images(serialized, feature),
                                                   (None,) + mnist.IMAGE_SHAPE, name=IMAGE)
    alternatives = {IMAGE: {IMAGE: images}}
    if as_dict:
      return tf.estimator.export.ServingInputReceiver({feature: images}, inputs, alternatives)
    return tf.estimator.export.TensorServingInputReceiver(images, inputs, alternatives)

  return receiver


def keras_signatures(model: tf_keras.Model, feature: str, head: heads.Head = heads.DIGITS,
                     spec: Optional[Dict[str, Any]] = None) -> Dict[str, Callable]:
  """The signatures of the contract for the run's head, for `tf.saved_model.save` (then run
  `mark_methods` on what it wrote): Classify and Regress take `inputs`, Predict `examples`;
  with `spec`, the tabular features' parse spec, the examples are parsed by it."""

  def serve(features, method: str) -> Dict[str, tf.Tensor]:
    return head.signature_outputs(head.predictions(model(features, training=False)), method)

  def signature(method: str) -> Callable:
    name = PREDICT_INPUT if method == heads.PREDICT else CLASSIFY_INPUT

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name)])
    def answer(serialized):
      features = (tf.io.parse_example(serialized, spec) if spec
                  else parse_images(serialized, feature))
      return serve(features, method)

    return answer

  by_method = {method: signature(method) for method in set(head.signatures.values())}
  answers = {key: by_method[method] for key, method in head.signatures.items()}
  if spec:
    return answers

  @tf.function(input_signature=[tf.TensorSpec((None,) + mnist.IMAGE_SHAPE, tf.float32, IMAGE)])
  def predict_image(image):
    return serve(image, heads.PREDICT)

  return {**answers, IMAGE_PREDICT: predict_image}


def _method(signature) -> str:
  """The method the Estimator gives a signature of this shape: Classify or Regress for one
  string input `inputs` (its ClassificationOutput's `classes` and `scores`, its
  RegressionOutput's `outputs`), else Predict."""
  takes_examples = (set(signature.inputs) == {CLASSIFY_INPUT}
                    and signature.inputs[CLASSIFY_INPUT].dtype == tf.string.as_datatype_enum)
  if takes_examples and set(signature.outputs) and set(signature.outputs) <= {"classes",
                                                                             "scores"}:
    return tf.saved_model.CLASSIFY_METHOD_NAME
  if takes_examples and set(signature.outputs) == {"outputs"}:
    return tf.saved_model.REGRESS_METHOD_NAME
  return signature.method_name


def mark_methods(export_dir: str) -> None:
  """Gives the Classify and Regress signatures of a SavedModel written by
  `tf.saved_model.save` their method names, as the Estimator's export has them (TF
  Serving's Classify and Regress APIs require them), and rewrites the fingerprint of the
  changed `saved_model.pb`. Call it before the export is published: the rewrite is not
  atomic."""
  path = os.path.join(export_dir, tf.saved_model.SAVED_MODEL_FILENAME_PB)
  saved = saved_model_pb2.SavedModel()
  with tf.io.gfile.GFile(path, "rb") as f:
    saved.ParseFromString(f.read())
  for meta_graph in saved.meta_graphs:
    for signature in meta_graph.signature_def.values():
      signature.method_name = _method(signature)
  with tf.io.gfile.GFile(path, "wb") as f:
    f.write(saved.SerializeToString())
  fingerprinting_utils.write_fingerprint(export_dir)
