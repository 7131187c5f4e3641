"""Proves that two SavedModels serve alike, as a model server's clients would see it.

The contract is trainers/serving.py's: the signatures a canned Estimator's export has.
For two exports of the same weights (the Estimator's and Keras's, or one written by
another TensorFlow), `compare` checks

- the definitions, signature by signature: method name, and each input and output
  with its dtype and shape;
- the answers to the requests a client sends, built with `tensorflow-serving-api`'s
  request protos: Classify requests (tf.Examples in an example list) to `serving_default`
  and `classification`, read back as TF Serving's Classify response holds them (each
  example's labels and scores); Predict requests to `predict` (serialized tf.Examples)
  and `image:predict` (the image tensor). Labels, classes and class ids must be equal,
  scores, probabilities and logits within a tolerance;
- bad requests: a tf.Example without the image feature, one holding it as integers, and
  bytes that are no tf.Example must fail in both, with the same kind of error.

Under --features=tabular (`spec`, the columns' parse spec) each image is sent as the
tf.Example of its tabular features (data/mnist/tabular.py), and also, for the first
EDGE_EXAMPLES, without its lists, with every string out of vocabulary and with empty lists
(answers keyed `<case> <signature>/<output>`); the bad requests lack, or hold as integers,
the first feature the spec requires.

A model server feeds a signature the request's examples and tensors as they are; this
check feeds them to the loaded signatures the same way (no model server runs here).

A team's program exports its own signatures, and its port the same ones
(`ModelSpec.signatures`): `compare_exports` holds two such exports to each other, the
signatures as above (the first export's are required) and every output of each on batches
of the program's features, each input fed by its name (a lone string input the batch as
serialized tf.Examples, as a parsing receiver takes it).
"""

import dataclasses
import functools
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence,
                    Tuple)

import numpy as np
import tensorflow as tf
from absl import logging
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import classification_pb2
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import regression_pb2

from data import mnist
from data.mnist import tabular
from launch.convert import source
from launch.proofs.harness import Check
from trainers import heads
from trainers import inputs
from trainers import keras_trainer
from trainers import model as model_lib
from trainers import serving
from trainers.config import Config
from trainers.models import canned

Answers = Dict[str, np.ndarray]  # "<signature>/<output>" -> every test image's answer.
Spec = Optional[Mapping[str, Any]]  # The tabular features' parse spec, or None: the image.
# Bad requests, each with the phrase that TensorFlow's tf.Example parser puts in its error.
BAD_REQUESTS = {
    "missing feature": "is required but could not be found",
    "wrong dtype": "Data types don't match",
    "malformed proto": "Could not parse example input",
}


@dataclasses.dataclass(frozen=True)
class Signature:
  """What a client relies on in one signature: its method and typed, shaped keys."""

  method: str
  inputs: Tuple[Tuple[str, str, Tuple[int, ...]], ...]
  outputs: Tuple[Tuple[str, str, Tuple[int, ...]], ...]

  def __str__(self) -> str:
    """`classify: inputs string [-1] -> classes string [-1, 10], scores float32 [-1, 10]`."""
    def keys(entries):
      return ", ".join(f"{key} {dtype} {list(shape)}" for key, dtype, shape in entries)
    return f"{self.method.rsplit('/', 1)[-1]}: {keys(self.inputs)} -> {keys(self.outputs)}"


def signatures(export_dir: str) -> Dict[str, Signature]:
  """The serving signatures of the SavedModel in `export_dir`, read from saved_model.pb."""
  saved = saved_model_pb2.SavedModel()
  with tf.io.gfile.GFile(f"{export_dir}/{tf.saved_model.SAVED_MODEL_FILENAME_PB}", "rb") as f:
    saved.ParseFromString(f.read())
  [meta_graph] = [m for m in saved.meta_graphs
                  if tf.saved_model.SERVING in m.meta_info_def.tags]

  def keys(infos) -> Tuple[Tuple[str, str, Tuple[int, ...]], ...]:
    return tuple(sorted((key, tf.dtypes.as_dtype(info.dtype).name,
                         tuple(d.size for d in info.tensor_shape.dim))
                        for key, info in infos.items()))

  return {name: Signature(d.method_name, keys(d.inputs), keys(d.outputs))
          for name, d in meta_graph.signature_def.items() if not name.startswith("__")}


def test_images(config: Config) -> Iterator[np.ndarray]:
  """The whole test split of `config.data_dir`, in batches of `config.eval_batch_size` (the
  images, under --features=tabular too: requests are made of them)."""
  images_of = dataclasses.replace(config, features=None, feature_columns=None)
  return (images.numpy() for images, *_ in inputs.default_input_fn(images_of)(mnist.EVAL,
                                                                             None))


def test_features(config: Config) -> Iterator[Any]:
  """The features of the whole test split as the run's input gives them (a team's
  program's: a dict of arrays, say), batch by batch."""
  def value(t):  # A VarLenFeature parsed gives a SparseTensor: its rows, as lists.
    if isinstance(t, tf.SparseTensor):
      rows = t.indices.numpy()[:, 0]
      return [t.values.numpy()[rows == i] for i in range(int(t.dense_shape[0]))]
    return t.numpy()

  return ({k: value(t) for k, t in features.items()} if isinstance(features, Mapping)
          else features.numpy()
          for features, *_ in inputs.default_input_fn(config)(mnist.EVAL, None))


def export_keras_checkpoint(model_dir: str, config: Config, out_dir: str) -> str:
  """Exports the model of the newest Keras checkpoint in `model_dir` (one `launch.convert`
  wrote, say) as the Keras backend exports it, under `out_dir/export/`; returns its path."""
  model = model_lib.build(config)
  path, _ = source.newest(model_dir, "keras")
  # The model only: the checkpoint's optimizer state is not needed to serve.
  tf.train.Checkpoint(model=model).restore(path).expect_partial().assert_existing_objects_matched()
  return keras_trainer.export_model(config, model, out_dir)


def examples(images: np.ndarray, feature: str, spec: Spec = None) -> List[tf.train.Example]:
  """Each image as the tf.Example an Estimator's client sends: `feature`, 784 floats; with
  `spec` (tabular), the image's tabular features."""
  if spec:  # In a dataset's graph: eagerly each image took 15 ms, 2.5 min for the split.
    records = tf.data.Dataset.from_tensor_slices(
        np.reshape(images, (-1, *mnist.IMAGE_SHAPE)).astype(np.float32)).map(
            _tabular_record()).batch(max(len(images), 1))  # One read; none of size 0.
    return [tf.train.Example.FromString(record) for batch in records.as_numpy_iterator()
            for record in batch]
  return [tf.train.Example(features=tf.train.Features(feature={
      feature: tf.train.Feature(float_list=tf.train.FloatList(value=image.ravel()))}))
      for image in images]


@functools.lru_cache(maxsize=None)
def _tabular_record() -> Callable[[tf.Tensor], tf.Tensor]:
  """An image's tabular features as a serialized tf.Example, traced once a process (a
  dataset's map of a plain function traces its graph again for every batch of requests)."""
  return tf.function(lambda image: tabular.serialize(tabular.features(image)),
                     input_signature=[tf.TensorSpec(mnist.IMAGE_SHAPE, tf.float32)])


def requests(images: np.ndarray, batch: List[tf.train.Example], loaded: Any) -> List[object]:
  """A client's requests for `images` (as tf.Examples: `batch`) to each signature of the
  contract an export (`loaded`) has, by what it takes and gives: a Classify request to one
  of `inputs` giving `classes` and `scores`, a Regress request to one of `inputs` giving
  `outputs`, a Predict request to `predict` (serialized tf.Examples) and to
  `image:predict`."""
  made: List[object] = []
  for name in serving.CONTRACT_ORDER:
    if name not in loaded.signatures:  # compare_signatures reports it.
      continue
    _, takes = loaded.signatures[name].structured_input_signature
    gives = set(loaded.signatures[name].structured_outputs)
    if set(takes) == {serving.CLASSIFY_INPUT}:
      request = (regression_pb2.RegressionRequest() if gives == {"outputs"}
                 else classification_pb2.ClassificationRequest())
      request.input.example_list.examples.extend(batch)
    else:
      request = predict_pb2.PredictRequest()
      key = serving.IMAGE if set(takes) == {serving.IMAGE} else serving.PREDICT_INPUT
      request.inputs[key].CopyFrom(tf.make_tensor_proto(
          images if key == serving.IMAGE else [e.SerializeToString() for e in batch]))
    request.model_spec.signature_name = name
    made.append(request)
  return made


def respond(loaded: object, request: object) -> object:
  """Answers `request` from a loaded SavedModel as TF Serving would: the request's examples
  or tensors fed to the signature it names, and the response a client reads."""
  signature = loaded.signatures[request.model_spec.signature_name]
  if isinstance(request, (classification_pb2.ClassificationRequest,
                          regression_pb2.RegressionRequest)):
    serialized = [e.SerializeToString() for e in request.input.example_list.examples]
    out = call(signature, **{serving.CLASSIFY_INPUT: tf.constant(serialized)})
    if isinstance(request, regression_pb2.RegressionRequest):
      response = regression_pb2.RegressionResponse()
      for value in out["outputs"].numpy().reshape(-1):
        response.result.regressions.add(value=value)
      return response
    response = classification_pb2.ClassificationResponse()
    for labels, scores in zip(out["classes"].numpy(), out["scores"].numpy()):
      classification = response.result.classifications.add()
      for label, score in zip(labels, scores):
        classification.classes.add(label=label.decode(), score=score)
    return response
  out = call(signature, **{key: tf.constant(tf.make_ndarray(proto))
                     for key, proto in request.inputs.items()})
  response = predict_pb2.PredictResponse()
  for key, value in out.items():
    response.outputs[key].CopyFrom(tf.make_tensor_proto(value.numpy()))
  return response


def call(signature: Any, **inputs: tf.Tensor) -> Dict[str, tf.Tensor]:
  """`signature(**inputs)`, numpy's printing summarized meanwhile: TF 2.15 formats every
  argument into an error message each time a loaded TF1 signature (an Estimator's export)
  fails its structured binding, before its flat call answers
  (function_type_utils.bind_function_inputs); printing a batch of serialized tf.Examples
  whole took half of a comparison's time."""
  with np.printoptions(threshold=1, edgeitems=1):
    return signature(**inputs)


def read_response(name: str, response: object) -> Answers:
  """What a client reads from a response to signature `name`, by `<name>/<output>`."""
  if isinstance(response, regression_pb2.RegressionResponse):
    return {f"{name}/outputs": np.array([r.value for r in response.result.regressions],
                                        np.float32)}
  if isinstance(response, classification_pb2.ClassificationResponse):
    classifications = response.result.classifications
    return {f"{name}/labels": np.array([[c.label for c in r.classes] for r in classifications]),
            f"{name}/scores": np.array([[c.score for c in r.classes] for r in classifications],
                                       np.float32)}
  read = {f"{name}/{key}": tf.make_ndarray(proto) for key, proto in response.outputs.items()}
  # Strings as fixed-width bytes, not objects: they compare alike and save without pickle.
  return {key: value.astype(np.bytes_) if value.dtype == object else value
          for key, value in read.items()}


def answers(loaded: Any, image_batches: Iterable[np.ndarray], feature: str,
            spec: Spec = None) -> Answers:
  """The answers of an export (`loaded`: tf.saved_model.load's) to a client's requests for
  every image."""
  return _answers(loaded, _with_examples(image_batches, feature, spec))


def _with_examples(image_batches: Iterable[np.ndarray], feature: str, spec: Spec = None
                   ) -> List[Tuple[np.ndarray, List[tf.train.Example]]]:
  """Each batch of images, and as the tf.Examples a client sends (`examples`)."""
  return [(images, examples(images, feature, spec))
          for images in (np.asarray(batch) for batch in image_batches)]


EDGE_EXAMPLES = 100  # Of the first batch, sent again as each edge case.


def _tabular_edges(batch: Tuple[np.ndarray, List[tf.train.Example]], spec: Mapping[str, Any]
                   ) -> Dict[str, Tuple[np.ndarray, List[tf.train.Example]]]:
  """The first EDGE_EXAMPLES of a batch of tabular requests again, as a client may also
  send them: without their lists (every VarLenFeature of `spec`), with every string out of
  vocabulary, and with empty lists."""
  images, examples_ = batch[0][:EDGE_EXAMPLES], batch[1][:EDGE_EXAMPLES]
  lists = [name for name, kind in spec.items() if isinstance(kind, tf.io.VarLenFeature)]
  strings = [name for name, kind in spec.items() if kind.dtype == tf.string]

  def edited(edit: Callable[[tf.train.Example], None]) -> List[tf.train.Example]:
    made = []
    for example in examples_:
      copy = tf.train.Example()
      copy.CopyFrom(example)
      edit(copy)
      made.append(copy)
    return made

  def without_lists(example):
    for name in lists:
      del example.features.feature[name]

  def out_of_vocabulary(example):
    for name in strings:
      values = example.features.feature[name].bytes_list.value
      unseen = [b"unseen-" + value for value in values]
      del values[:]
      values.extend(unseen)

  def empty_lists(example):
    for name in lists:
      feature = example.features.feature[name]
      kind = feature.WhichOneof("kind") or "bytes_list"
      feature.Clear()
      getattr(feature, kind).SetInParent()

  return {case: (images, edited(edit)) for case, edit in (
      ("lists missing", without_lists), ("strings out of vocabulary", out_of_vocabulary),
      ("lists empty", empty_lists))}


def tabular_edge_answers(loaded: Any, batch: Tuple[np.ndarray, List[tf.train.Example]],
                         spec: Mapping[str, Any]) -> Answers:
  """An export's answers to `_tabular_edges` of a batch, keyed `<case> <signature>/<output>`."""
  return {f"{case} {key}": value for case, edited in _tabular_edges(batch, spec).items()
          for key, value in _answers(loaded, [edited]).items()}


def _answers(loaded: Any, batches: Iterable[Tuple[np.ndarray, List[tf.train.Example]]]
             ) -> Answers:
  """`answers`, to batches of images with their tf.Examples (`_with_examples`)."""
  parts: Dict[str, List[np.ndarray]] = {}
  for images, batch in batches:
    for request in requests(images, batch, loaded):
      name = request.model_spec.signature_name
      for key, value in read_response(name, respond(loaded, request)).items():
        parts.setdefault(key, []).append(value)
  return {key: np.concatenate(values) for key, values in parts.items()}


def bad_request_errors(loaded: Any, feature: str, spec: Spec = None) -> Dict[str, str]:
  """What each bad request (BAD_REQUESTS) to each tf.Example signature of an export
  (`loaded`: tf.saved_model.load's) raises: `<error class>: <the parser's message>`, or
  `answered` if it did not fail. With `spec` (tabular), the requests are a blank image's
  tabular features without, or with integers for, the first one the spec requires."""
  width = 784
  if spec:
    feature = min(name for name, kind in spec.items()
                  if isinstance(kind, tf.io.FixedLenFeature) and kind.default_value is None)
    width = int(np.prod(spec[feature].shape))
  whole = examples(np.zeros((1, 784)), feature, spec)[0]
  missing, wrong = tf.train.Example(), tf.train.Example()
  missing.CopyFrom(whole)
  del missing.features.feature[feature]
  wrong.CopyFrom(whole)
  wrong.features.feature[feature].CopyFrom(
      tf.train.Feature(int64_list=tf.train.Int64List(value=[0] * width)))
  bad = {
      "missing feature": missing.SerializeToString(),
      "wrong dtype": wrong.SerializeToString(),
      # ASCII: the parser's error quotes the bytes, and TF 2.15's Python binding raises
      # UnicodeDecodeError instead of the error when they are not UTF-8.
      "malformed proto": b"this is not a tf.Example",
  }
  errors = {}
  for case, serialized in bad.items():
    for name in (serving.SERVING_DEFAULT, serving.PREDICT):
      key = serving.CLASSIFY_INPUT if name in serving.CLASSIFY_SIGNATURES else serving.PREDICT_INPUT
      if name not in loaded.signatures:
        errors[f"{case} to {name}"] = "no such signature"
        continue
      try:
        loaded.signatures[name](**{key: tf.constant([serialized])})
        errors[f"{case} to {name}"] = "answered"
      except tf.errors.OpError as e:
        errors[f"{case} to {name}"] = f"{type(e).__name__}: {_kernel_message(e.message)}"
  return errors


def _kernel_message(message: str) -> str:
  """The failing op's own message, from an error of a graph run: the line above the node's
  name, after the graph's stack trace."""
  lines = [line for line in message.splitlines() if line.strip()]
  for above, line in zip(lines, lines[1:]):
    if line.startswith("\t [[{{node"):
      return above
  return lines[-1] if lines else message


def compare_signatures(first: Mapping[str, Signature], second: Mapping[str, Signature],
                       names: Tuple[str, str], required: Sequence[str] = serving.SIGNATURES
                       ) -> List[Check]:
  """One check per signature of either export: present in both and defined alike; and
  that both have the `required` ones (the contract's)."""
  both = set(required) & set(first) & set(second)
  checks = [Check(f"signatures required, in the {names[0]} and {names[1]} exports",
                  both == set(required), float(len(both)), float(len(required)),
                  f"{names[0]}: {sorted(first)}; {names[1]}: {sorted(second)}")]
  for name in sorted(set(first) | set(second)):
    a, b = first.get(name), second.get(name)
    checks.append(Check(f"signature {name}: method, inputs and outputs, {names[0]} vs "
                        f"{names[1]}", a == b, float(a != b), 0.0,
                        f"{a}" if a == b else f"{names[0]}: {a}; {names[1]}: {b}"))
  return checks


def compare_answers(first: Answers, second: Answers, names: Tuple[str, str], atol: float,
                    where: str) -> List[Check]:
  """Per signature output: equal (labels, classes, ids), or within `atol` (the floats:
  scores, probabilities, logits)."""
  checks = []
  for key in sorted(set(first) | set(second)):
    label = f"answers {key}, {names[0]} vs {names[1]}"
    if key not in first or key not in second or first[key].shape != second[key].shape:
      shapes = [a[key].shape if key in a else "missing" for a in (first, second)]
      checks.append(Check(label, False, float("nan"), 0.0, f"shapes {shapes[0]}, {shapes[1]}"))
    elif np.issubdtype(first[key].dtype, np.floating):
      diff = float(np.max(np.abs(first[key] - second[key]))) if first[key].size else 0.0
      checks.append(Check(f"max |diff|, {label}", diff <= atol, diff, atol, where))
    else:
      differing = int(np.sum(np.any((first[key] != second[key]).reshape(len(first[key]), -1),
                                    axis=1)))
      checks.append(Check(f"images answered differently, {label}", differing == 0,
                          float(differing), 0.0, where))
  return checks


def compare_structure(first: Answers, second: Answers, names: Tuple[str, str],
                      where: str) -> List[Check]:
  """The contract of the answers without their values: each export answers the same
  requests with the same outputs, of the same dtypes and shapes."""
  def structure(answers: Answers) -> Dict[str, str]:
    return {key: f"{value.dtype} {list(value.shape)}" for key, value in answers.items()}

  ours, theirs = structure(first), structure(second)
  differing = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
  return [Check(f"answers' outputs, dtypes and shapes, {names[0]} vs {names[1]}",
                bool(ours) and not differing, float(len(differing)), 0.0,
                "; ".join(f"{k}: {ours.get(k, 'missing')} vs {theirs.get(k, 'missing')}"
                          for k in differing) or f"{len(ours)} outputs, {where}")]


def compare_errors(first: Mapping[str, str], second: Mapping[str, str],
                   names: Tuple[str, str]) -> List[Check]:
  """Each bad request fails in both exports, with the same error class and parser phrase."""
  checks = []
  for request in sorted(first):
    phrase = BAD_REQUESTS[request.split(" to ")[0]]
    kinds = [errors[request].split(":")[0] for errors in (first, second)]
    passed = (kinds[0] == kinds[1] != "answered"
              and all(phrase in errors[request] for errors in (first, second)))
    checks.append(Check(f"bad request, {request}: same error, {names[0]} and {names[1]}",
                        passed, float(not passed), 0.0,
                        f"{names[0]}: {first[request]}; {names[1]}: {second[request]}"))
  return checks


def compare(first_dir: str, second_dir: str, image_batches: Callable[[], Iterable[np.ndarray]],
            feature: str, atol: float, names: Tuple[str, str] = ("estimator", "keras"),
            required: Sequence[str] = serving.SIGNATURES, spec: Spec = None,
            values: bool = True) -> List[Check]:
  """Every check of the module docstring, for the exports in `first_dir` and `second_dir`.

  Args:
    image_batches: returns the images to request answers for, in batches (called once:
      both exports answer them).
    feature: the tf.Example feature holding the image (serving.feature_name).
    atol: the limit on |difference| of scores, probabilities and logits.
    names: how the report names the two exports.
    required: the signatures both must have (by default the contract's).
    spec: the tabular features' parse spec, if the exports read them (the images are sent
      as their tabular features).
    values: hold the answers to each other (the same model's two exports); False: only
      their outputs, dtypes and shapes (the contract, for exports of different weights).
  """
  logging.info("Serving: loading %s and %s, then asking both every signature of the test "
               "split's images.", first_dir, second_dir)
  loaded = [tf.saved_model.load(d) for d in (first_dir, second_dir)]
  batches = _with_examples(image_batches(), feature, spec)  # Built once, asked of both.
  first, second = (_answers(export, batches) for export in loaded)
  count = len(next(iter(first.values()))) if first else 0
  compared = (compare_answers if values else
              lambda a, b, n, _, where: compare_structure(a, b, n, where))
  edges: List[Check] = []
  if spec:  # The tabular requests a client may also send: each answered alike.
    edges = compared(*(tabular_edge_answers(export, batches[0], spec) for export in loaded),
                     names, atol, f"{EDGE_EXAMPLES} test images' requests, edited")
  return (compare_signatures(signatures(first_dir), signatures(second_dir), names, required)
          + compared(first, second, names, atol, f"{count} test images") + edges
          + compare_errors(*(bad_request_errors(export, feature, spec) for export in loaded),
                           names))


def compare_models(first_dir: str, second_dir: str, config: Config, atol: float,
                   names: Tuple[str, str] = ("estimator", "keras")) -> List[Check]:
  """`compare` for two exports of `config`'s model (its feature, its head's signatures,
  and over --features=tabular the parse spec of its columns)."""
  spec = canned.parse_spec(config.canned_settings())
  return compare(first_dir, second_dir, lambda: test_images(config),
                 serving.feature_name(config), atol, names,
                 required=serving.signature_keys(heads.head(config), spec), spec=spec)


def feed(signature: Any, features: Any) -> Optional[Dict[str, tf.Tensor]]:
  """A loaded signature's arguments from a batch of features (a dict by name, or one
  array), or None if it takes what they do not hold: each input by its name, in its dtype
  (one array for a lone input); a lone string input the batch as serialized tf.Examples of
  every feature (a parsing receiver's input)."""
  specs = signature.structured_input_signature[1]
  if isinstance(features, Mapping) and all(name in features for name in specs):
    return {name: tf.cast(features[name], spec.dtype) for name, spec in specs.items()}
  if len(specs) != 1:
    return None
  [(name, spec)] = specs.items()
  if spec.dtype != tf.string:
    return None if isinstance(features, Mapping) else {name: tf.cast(features, spec.dtype)}
  named = features if isinstance(features, Mapping) else {name: features}
  batch = len(next(iter(named.values())))
  return {name: tf.constant([_example(named, i).SerializeToString() for i in range(batch)])}


def _example(features: Mapping[str, Any], i: int) -> tf.train.Example:
  """Example `i` of a batch of features (arrays, or lists of each example's values) as a
  tf.Example: floats, integers and strings by name; an empty list is a missing feature."""
  def feature(value: np.ndarray) -> tf.train.Feature:
    if np.issubdtype(value.dtype, np.integer):
      return tf.train.Feature(int64_list=tf.train.Int64List(value=value.ravel()))
    if value.dtype == object or np.issubdtype(value.dtype, np.bytes_):
      return tf.train.Feature(bytes_list=tf.train.BytesList(value=value.ravel()))
    return tf.train.Feature(float_list=tf.train.FloatList(value=value.ravel()))
  return tf.train.Example(features=tf.train.Features(
      feature={name: feature(np.asarray(values[i])) for name, values in features.items()
               if np.size(values[i])}))


def export_answers(loaded: Any, feature_batches: Iterable[Any]
                   ) -> Tuple[Answers, Dict[str, str]]:
  """Every output of every signature of an export on each batch of features, by
  `<signature>/<output>`; and why each signature the features could not feed was not."""
  parts: Dict[str, List[np.ndarray]] = {}
  unfed: Dict[str, str] = {}
  for features in feature_batches:
    for name, signature in loaded.signatures.items():
      arguments = None if name in unfed else feed(signature, features)
      if arguments is None:
        unfed.setdefault(name, "an input the features do not hold")
        continue
      try:
        outputs = call(signature, **arguments)
      except tf.errors.OpError as e:  # A parsing receiver that wants other features.
        unfed[name] = f"{type(e).__name__}: {_kernel_message(e.message)}"
        continue
      for key, value in outputs.items():
        value = value.numpy()
        parts.setdefault(f"{name}/{key}", []).append(
            value.astype(np.bytes_) if value.dtype == object else value)
  return {key: np.concatenate(values) for key, values in parts.items()}, unfed


def compare_exports(first_dir: str, second_dir: str,
                    feature_batches: Callable[[], Iterable[Any]],
                    atol: float, names: Tuple[str, str], values: bool = True) -> List[Check]:
  """Two exports of a team's program's signatures (the module docstring): the first's
  signatures, defined alike in the second, and every output on every batch (`values`
  False: its dtype and shape only)."""
  logging.info("Serving: loading %s and %s, then asking both every signature of the test "
               "split's examples.", first_dir, second_dir)
  loaded = [tf.saved_model.load(d) for d in (first_dir, second_dir)]
  (first, unfed), (second, _) = (export_answers(export, feature_batches()) for export in loaded)
  first_signatures = signatures(first_dir)
  count = len(next(iter(first.values()))) if first else 0
  checks = compare_signatures(first_signatures, signatures(second_dir), names,
                              required=sorted(first_signatures))
  fed = sorted(set(first_signatures) - set(unfed))
  checks.append(Check(f"signatures fed the test split, {names[0]} export", not unfed,
                      float(len(fed)), float(len(first_signatures)),
                      "; ".join(f"{n} not fed: {why}" for n, why in sorted(unfed.items()))
                      or f"{', '.join(fed)}: {count} examples"))
  if not values:
    return checks + compare_structure(first, second, names, f"{count} test examples")
  return checks + compare_answers(first, second, names, atol, f"{count} test examples")
