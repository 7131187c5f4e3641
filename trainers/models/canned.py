"""The canned Estimators, run as they are, and their Keras twins.

    python -m trainers.estimator_main --model=dnn --hidden_units=256,128
    python -m trainers.keras_main --model=dnn --hidden_units=256,128

- `dnn`: `tf.estimator.DNNClassifier`;
- `linear`: `tf.estimator.LinearClassifier`;
- `wide_deep`: `tf.estimator.DNNLinearCombinedClassifier`, the sum of the two, each
  part with its own optimizer;
- `dnn_v1`, `linear_v1`, `wide_deep_v1`: the `tf.compat.v1.estimator` classes (a summed
  loss, tf.compat.v1.train optimizers), whose twins train with the v1-exact tf_keras
  optimizers;

each over one `numeric_column` of the image (`--feature_name`), or with `--features=tabular`
over feature columns of the tabular features (`trainers/models/tabular.py`'s, or a team's
`--feature_columns`; the twin's input layers are `trainers/columns.py`'s), of the run's --task
(trainers/heads.py): a classifier of the ten digits (multiclass, the default), of two
classes (`--task=binary:D`, `n_classes=2`), or the class's regressor (`--task=regression`:
`DNNRegressor`, `LinearRegressor`, `DNNLinearCombinedRegressor`), with the head's
arguments the flags give (`--weight_column`, `--label_vocabulary`, `--loss_reduction`). The
Estimator backend constructs the canned class itself (`Canned.estimator`) with the
run's settings (`Config.canned_settings`); the Keras backend trains the twin that
`build` makes: the same layers, with weights of the canned names
(`dnn/hiddenlayer_0/kernel`, ..., `dnn/logits/bias`,
`linear/linear_model/<feature>/weights`, `linear/linear_model/bias_weights`), and
the optimizer the canned Estimator builds, tf_keras's legacy one of the same kind at
the same constant rate (`Canned.keras_optimizer`). Started from the same weights
(`--init_weights`, which the Estimator takes as a warm start), the two train alike
(launch.parity).
"""

import functools
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import tensorflow as tf
import tf_keras

from data import mnist
from data.mnist import tabular
from trainers import columns as columns_lib
from trainers import config as config_lib
from trainers import model
from trainers import model_registry
from trainers import optimizers
from trainers.config import Config

# The canned Estimators' names of the optimizers (tensorflow_estimator's
# canned/optimizers.py), and the tf_keras legacy classes the twins use.
_CANNED_NAMES = {"adagrad": "Adagrad", "adam": "Adam", "ftrl": "Ftrl", "rmsprop": "RMSProp",
                 "sgd": "SGD"}
_LEGACY = {"adagrad": "Adagrad", "adam": "Adam", "ftrl": "Ftrl", "rmsprop": "RMSprop",
           "sgd": "SGD"}
# DNNClassifier's BatchNormalization momentum (canned/dnn.py).
BN_MOMENTUM = 0.999


def _dnn_logits(x: tf.Tensor, seed: int, init: model.Init, hidden_units: str, dropout: float,
                batch_norm: bool, activation: str, outputs: int) -> tf.Tensor:
  """DNNClassifier's network on flat features: [Dense, Dropout while training,
  BatchNormalization] per hidden layer, then `outputs` logits."""
  layers = tf_keras.layers
  units = config_lib.widths(hidden_units)

  def dense(name: str, width: int, offset: int, **kwargs):
    # The canned kernels are glorot_uniform, drawn from the Estimator's graph seed:
    # a twin's own draws differ, so parity starts both from --init_weights.
    return layers.Dense(width, name=name, **kwargs,
                        kernel_initializer=init(f"{name}/kernel", tf_keras.initializers.
                                                GlorotUniform(seed=seed + offset)),
                        bias_initializer=init(f"{name}/bias", "zeros"))

  for i, width in enumerate(units):
    name = f"dnn/hiddenlayer_{i}"
    x = dense(name, width, i, activation=activation)(x)
    if dropout:
      x = layers.Dropout(dropout, seed=seed + i, name=f"{name}/dropout")(x)
    if batch_norm:
      x = model.batch_normalization(init, f"{name}/batchnorm_{i}", BN_MOMENTUM)(x)
  return dense("dnn/logits", outputs, len(units))(x)


class _LinearModel(tf_keras.layers.Layer):
  """LinearClassifier's model over one numeric feature: flat features @ weights + bias,
  both zeros at first, named as the canned ones; `outputs` logits."""

  def __init__(self, feature_name: str, init: model.Init, outputs: int, **kwargs):
    super().__init__(name="linear/linear_model", **kwargs)
    self._feature, self._init, self._outputs = feature_name, init, outputs

  def build(self, input_shape):
    prefix = f"{self.name}/"
    self.weights_ = self.add_weight(
        f"{self._feature}/weights", shape=(input_shape[-1], self._outputs),
        initializer=self._init(f"{prefix}{self._feature}/weights", "zeros"))
    self.bias = self.add_weight(
        "bias_weights", shape=(self._outputs,),
        initializer=self._init(f"{prefix}bias_weights", "zeros"))

  def call(self, features):
    return tf.nn.bias_add(tf.matmul(features, self.weights_), self.bias)


PARTS = ("dnn", "linear")
# The canned parts' input layers, as their variables are named.
_DNN_INPUT = "dnn/input_from_feature_columns/input_layer"
_LINEAR_MODEL = "linear/linear_model"


def _inputs(features: str, columns: str, parts: Tuple[str, ...]):
  """The twin's inputs, and each part's columns (None for the image): the image, or the
  tabular features the --feature_columns read, as Keras inputs of the columns' parse spec
  (a VarLenFeature a sparse input)."""
  settings = {"features": features, "feature_columns": columns}
  if not config_lib.columns_path(settings):
    return tf_keras.Input(shape=mnist.IMAGE_SHAPE, name="image"), None
  by_part = {part: feature_columns(settings, part) for part in parts}
  return columns_lib.keras_inputs(
      tf.feature_column.make_parse_example_spec(sum(by_part.values(), []))), by_part


def _flat(inputs, by_part):
  """The flat image, where the model reads it (DenseFeatures reshapes a numeric column to
  (B, 784), row-major as Flatten)."""
  return tf_keras.layers.Flatten(name="flatten")(inputs) if by_part is None else None


def _dnn_input(inputs, by_part, flat, init: model.Init) -> tf.Tensor:
  """The DNN's input layer: the flat image, or its columns' DenseFeatures twin."""
  if by_part is None:
    return flat
  return columns_lib.DenseFeaturesTwin(by_part["dnn"], name=_DNN_INPUT, init=init)(inputs)


def _linear_logits(inputs, by_part, flat, feature_name: str, init: model.Init,
                   outputs: int) -> tf.Tensor:
  """The linear model's logits: over the flat image, or its columns' LinearModel twin."""
  if by_part is None:
    return _LinearModel(feature_name, init, outputs)(flat)
  return columns_lib.LinearModelTwin(by_part["linear"], outputs, name=_LINEAR_MODEL,
                                 init=init)(inputs)


def build_dnn(seed: int, init: model.Init, hidden_units: str, dropout: float,
              batch_norm: bool, activation: str, outputs: int = mnist.NUM_CLASSES,
              features: str = "image", feature_columns: str = "", **_: Any) -> tf_keras.Model:
  """The twin of DNNClassifier, or of DNNRegressor (the optimizer settings it is also given
  are not the model's); `outputs`: the head's logits (trainers/heads.py)."""
  inputs, by_part = _inputs(features, feature_columns, ("dnn",))
  x = _dnn_input(inputs, by_part, _flat(inputs, by_part), columns_lib.seeded(init, seed))
  return tf_keras.Model(inputs, _dnn_logits(x, seed, init, hidden_units, dropout, batch_norm,
                                            activation, outputs), name="dnn")


def build_linear(seed: int, init: model.Init, feature_name: str,
                 outputs: int = mnist.NUM_CLASSES, features: str = "image",
                 feature_columns: str = "", **_: Any) -> tf_keras.Model:
  """The twin of LinearClassifier, or of LinearRegressor."""
  del seed  # Zeros, as the canned weights start.
  inputs, by_part = _inputs(features, feature_columns, ("linear",))
  logits = _linear_logits(inputs, by_part, _flat(inputs, by_part), feature_name, init, outputs)
  return tf_keras.Model(inputs, logits, name="linear")


def build_wide_deep(seed: int, init: model.Init, hidden_units: str, dropout: float,
                    batch_norm: bool, activation: str, feature_name: str,
                    outputs: int = mnist.NUM_CLASSES, features: str = "image",
                    feature_columns: str = "", **_: Any) -> tf_keras.Model:
  """The twin of DNNLinearCombinedClassifier, or of its regressor: the DNN's logits plus
  the linear model's."""
  inputs, by_part = _inputs(features, feature_columns, PARTS)
  flat = _flat(inputs, by_part)
  dnn = _dnn_logits(_dnn_input(inputs, by_part, flat, columns_lib.seeded(init, seed)), seed,
                    init, hidden_units, dropout, batch_norm, activation, outputs)
  logits = tf_keras.layers.Add(name="logits")(
      [dnn, _linear_logits(inputs, by_part, flat, feature_name, init, outputs)])
  return tf_keras.Model(inputs, logits, name="wide_deep")


def part_of(weight: str) -> str:
  """"linear" or "dnn": which part of DNNLinearCombinedClassifier, and so which of its
  optimizers, has the weight (or variable) of this name."""
  return "linear" if weight.startswith("linear/") else "dnn"


class PartOptimizers(tf_keras.optimizers.legacy.Optimizer):
  """DNNLinearCombinedClassifier's two optimizers as the one `Model.fit` takes: the linear
  part's updates the `linear/` weights, the DNN part's the others. Its iterations are the
  DNN part's, as the canned Estimator's global step is; the linear part counts its own.
  The parts are tf_keras legacy optimizers (the TF2 class's twin) or the v1-exact ones of
  trainers/optimizers.py (the tf.compat.v1 class's); each aggregates its own gradients.
  """

  def __init__(self, dnn: Any, linear: Any, name: str = "PartOptimizers"):
    super().__init__(name)
    self.dnn, self.linear = dnn, linear
    self._track_trackable(dnn, "dnn")
    self._track_trackable(linear, "linear")
    # Also as this optimizer's own `iter`, the shortest path to it, under which a
    # checkpoint keeps it: where a single legacy optimizer keeps its step.
    self._track_trackable(dnn.iterations, "iter")

  @property
  def iterations(self) -> tf.Variable:
    return self.dnn.iterations

  def apply_gradients(self, grads_and_vars, name=None, experimental_aggregate_gradients=True):
    parts: Dict[str, list] = {"dnn": [], "linear": []}
    for gradient, variable in grads_and_vars:
      parts[part_of(variable.name)].append((gradient, variable))
    return tf.group(*(getattr(self, part).apply_gradients(
        pairs, experimental_aggregate_gradients=experimental_aggregate_gradients)
                      for part, pairs in parts.items() if pairs))

  def get_config(self) -> Dict[str, Any]:
    return {**super().get_config(),
            **{part: tf_keras.optimizers.serialize(getattr(self, part))
               for part in ("dnn", "linear")}}


def v1_train_op(config: Config, loss: tf.Tensor, variables: Sequence[tf.Variable]
                ) -> tf.Operation:
  """In a graph, the train op of a tf.compat.v1.estimator canned class (`config.model` one
  of the `*_v1` models): each part's tf.compat.v1.train optimizer, at its constant rate,
  minimizing `loss` over that part's `variables` (`part_of`, with two parts)."""
  settings = config.canned_settings()
  own = [part for part in ("dnn", "linear") if f"{part}_optimizer" in settings]
  parts: Dict[str, list] = {}
  for variable in variables:
    parts.setdefault(part_of(variable.name) if len(own) > 1 else own[0], []).append(variable)
  return tf.group(*(_v1_canned_optimizer(settings[f"{part}_optimizer"],
                                         settings[f"{part}_learning_rate"])().minimize(
                                             loss, var_list=part_variables)
                    for part, part_variables in parts.items()))


def legacy_optimizer(name: str, learning_rate: float) -> tf_keras.optimizers.legacy.Optimizer:
  """The tf_keras legacy optimizer `name` (a key of config.CANNED_OPTIMIZERS) at a constant
  `learning_rate`: the class the canned Estimator builds from the same name."""
  return getattr(tf_keras.optimizers.legacy, _LEGACY[name])(learning_rate=learning_rate)


def _canned_optimizer(name: str, learning_rate: float):
  """What the canned Estimator takes as its optimizer: a callable (an instance cannot be
  used twice: its iterations become the global step of the graph it first trains in)
  making the optimizer its own code makes from `name` at `learning_rate`, of the Keras
  it runs on."""
  # Imported here: tensorflow_estimator exists up to TF 2.15; the twin runs on later ones.
  from tensorflow_estimator.python.estimator.canned import optimizers  # noqa: PLC0415
  return lambda: _dense_across_workers(optimizers.get_optimizer_instance_v2(
      _CANNED_NAMES[name], learning_rate=learning_rate))


def _v1_hyperparameters(name: str) -> Dict[str, float]:
  """A v1 optimizer's defaults but the rate: what a v1 canned class builds from its name
  (tf.compat.v1.train's defaults, which Config's are)."""
  return {k: v for k, v in config_lib.OPTIMIZER_DEFAULTS[name].items() if k != "learning_rate"}


def _v1_canned_optimizer(name: str, learning_rate: float):
  """What a `tf.compat.v1.estimator` canned class takes as its optimizer: a callable
  making the tf.compat.v1.train optimizer it makes from `name`, at `learning_rate`."""
  return lambda: _dense_across_workers(optimizers.PAIRS[name].v1(
      learning_rate, **_v1_hyperparameters(name)))


def dense_gradients(grads_and_vars):
  """The (gradient, variable) pairs with an embedding's or a linear column's rows
  (tf.IndexedSlices) made a dense gradient."""
  return [(tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g, v)
          for g, v in grads_and_vars]


def _dense_across_workers(optimizer):
  """The canned Estimator's optimizer, all-reducing a column's rows as a dense gradient
  when replicas sum gradients: MultiWorkerMirroredStrategy's all-gather of rows that differ
  in number between workers fails in the Estimator's graph ("Shape mismatch in the
  collective instance"; tensorflow#24003, #33339), so a canned model with categorical
  columns could not train on two workers at all. Rows no example touched are zeros, which
  the canned optimizers leave as a sparse update leaves them; the twin does the same
  (keras_trainer._OneCollectiveModel)."""
  if tf.distribute.get_strategy().num_replicas_in_sync == 1:
    return optimizer
  if hasattr(optimizer, "gradient_aggregator"):  # A Keras legacy optimizer (TF2 classes).
    aggregate = optimizer.gradient_aggregator
    optimizer.gradient_aggregator = lambda pairs: aggregate(dense_gradients(pairs))
  else:  # A tf.compat.v1.train optimizer (the v1 classes), which aggregates as it applies.
    apply = optimizer.apply_gradients
    optimizer.apply_gradients = lambda pairs, *args, **kwargs: apply(
        dense_gradients(pairs), *args, **kwargs)
  return optimizer


def _v1_twin_optimizer(part: str):
  """The twin's optimizer of a v1 canned class's `part`: the tf_keras optimizer that
  updates as its v1 optimizer does (trainers/optimizers.py), at its constant rate."""
  def make(config: Config) -> tf_keras.optimizers.Optimizer:
    settings = config.canned_settings()
    name = settings[f"{part}_optimizer"]
    return optimizers.PAIRS[name].keras(settings[f"{part}_learning_rate"],
                                             **_v1_hyperparameters(name))
  return make


def feature_columns(settings: Dict[str, Any], part: str) -> list:
  """The feature columns of a canned model's `part` (`dnn` or `linear`): the image's one
  numeric column (--feature_name), or under --features=tabular the --feature_columns a
  module holds: a list (every part's), a dict of lists by part, or a function making
  either. Raises model_registry.SpecError naming what is wrong with them."""
  path = config_lib.columns_path(settings)
  if not path:
    return [tf.feature_column.numeric_column(settings["feature_name"],
                                             shape=mnist.IMAGE_SHAPE)]
  found = _columns(path)
  if isinstance(found, dict):
    if part not in found:
      raise model_registry.SpecError(
          f"--feature_columns={path} has no {part!r} list, which the model's {part} part "
          f"reads; give it one, or give one list for every part")
    found = found[part]
  if not isinstance(found, (list, tuple)) or not found or not all(
      isinstance(c, tf.__internal__.feature_column.FeatureColumn) for c in found):
    raise model_registry.SpecError(
        f"--feature_columns={path} is not a non-empty list of tf.feature_column columns "
        f"(nor a dict of such lists by part, linear and dnn); make it one")
  for column in found:
    try:
      tabular.check_spec(column.parse_example_spec)
    except ValueError as e:
      raise model_registry.SpecError(
          f"--feature_columns={path}: column {column.name!r} reads what the data cannot give: "
          f"{e}") from e
  return list(found)


def _columns(path: str) -> Any:
  """What --feature_columns=`path` names, its function called."""
  found = model_registry.load(path, object, model_registry.COLUMNS)
  return found() if callable(found) else found


def columns_spec(path: str) -> Dict[str, Any]:
  """The parse_example spec of every part's columns `path` names (--feature_columns; ""
  for the built-in ones): what an export of any canned model over them parses requests by,
  and more (a part's model ignores the other part's features)."""
  path = path or config_lib.TABULAR_COLUMNS
  found = _columns(path)
  parts = [p for p in PARTS if p in found] if isinstance(found, dict) else PARTS[:1]
  settings = {"features": "tabular", "feature_columns": path}
  return tf.feature_column.make_parse_example_spec(
      sum((feature_columns(settings, part) for part in parts), []))


def parse_spec(settings: Dict[str, Any]) -> Optional[Dict[str, Any]]:
  """What a canned model reads of the tabular features, the parse_example spec of every
  part's columns (the input parses its tf.Examples, and the export its requests, by it);
  None for the image."""
  if not config_lib.columns_path(settings):
    return None
  parts = [part for part in PARTS if f"{part}_optimizer" in settings]
  return tf.feature_column.make_parse_example_spec(
      sum((feature_columns(settings, part) for part in parts), []))


def _of_task(config: Config, api: Any, family: str) -> Tuple[Any, Dict[str, Any]]:
  """The canned class of `family` (`DNN`, `Linear`, `DNNLinearCombined`) in `api` for the
  run's --task, with its head's arguments: the run's weight_column and loss_reduction,
  and a classifier's n_classes (2 for a binary task; a regressor's label_dimension is 1, its
  default) and label_vocabulary."""
  kind, _ = config_lib.parse_task(config.task)
  settings = config.canned_settings()
  head = {"weight_column": settings["weight_column"] or None}
  if settings["loss_reduction"]:
    reductions = (tf.compat.v1.losses.Reduction if api is tf.compat.v1.estimator
                  else tf_keras.losses.Reduction)
    head["loss_reduction"] = getattr(reductions, settings["loss_reduction"].upper())
  if kind == config_lib.REGRESSION:
    return getattr(api, f"{family}Regressor"), head
  n_classes = mnist.NUM_CLASSES if kind == config_lib.MULTICLASS else 2
  return getattr(api, f"{family}Classifier"), {
      **head, "n_classes": n_classes, "label_vocabulary": list(config.class_names()) or None}


def _api(v1: bool) -> Tuple[Any, Callable[[str, float], Any]]:
  """tf.estimator or tf.compat.v1.estimator, and what its canned classes take as an
  optimizer."""
  return ((tf.compat.v1.estimator, _v1_canned_optimizer) if v1
          else (tf.estimator, _canned_optimizer))


def dnn_estimator(config: Config, run_config: Any, warm_start_from: Optional[Any],
                  v1: bool = False) -> Any:
  """tf.estimator.DNNClassifier (DNNRegressor for --task=regression) with the run's
  settings (`v1`: tf.compat.v1.estimator's)."""
  settings = config.canned_settings()
  api, optimizer = _api(v1)
  canned_class, head = _of_task(config, api, "DNN")
  return canned_class(
      hidden_units=config.hidden_units_list(), feature_columns=feature_columns(settings, "dnn"),
      **head,
      optimizer=optimizer(settings["dnn_optimizer"], settings["dnn_learning_rate"]),
      activation_fn=getattr(tf.nn, settings["activation"]),
      dropout=settings["dropout"] or None, batch_norm=settings["batch_norm"],
      config=run_config, warm_start_from=warm_start_from)


def linear_estimator(config: Config, run_config: Any, warm_start_from: Optional[Any],
                     v1: bool = False) -> Any:
  """tf.estimator.LinearClassifier (LinearRegressor for --task=regression) with the run's
  settings (`v1`: tf.compat.v1.estimator's)."""
  settings = config.canned_settings()
  api, optimizer = _api(v1)
  canned_class, head = _of_task(config, api, "Linear")
  return canned_class(
      feature_columns=feature_columns(settings, "linear"), **head,
      optimizer=optimizer(settings["linear_optimizer"], settings["linear_learning_rate"]),
      config=run_config, warm_start_from=warm_start_from)


def wide_deep_estimator(config: Config, run_config: Any, warm_start_from: Optional[Any],
                        v1: bool = False) -> Any:
  """tf.estimator.DNNLinearCombinedClassifier (its regressor for --task=regression) with the
  run's settings, both parts over the image (`v1`: tf.compat.v1.estimator's)."""
  settings = config.canned_settings()
  api, optimizer = _api(v1)
  canned_class, head = _of_task(config, api, "DNNLinearCombined")
  return canned_class(
      linear_feature_columns=feature_columns(settings, "linear"),
      linear_optimizer=optimizer(settings["linear_optimizer"], settings["linear_learning_rate"]),
      dnn_feature_columns=feature_columns(settings, "dnn"),
      dnn_optimizer=optimizer(settings["dnn_optimizer"], settings["dnn_learning_rate"]),
      dnn_hidden_units=config.hidden_units_list(),
      dnn_activation_fn=getattr(tf.nn, settings["activation"]),
      dnn_dropout=settings["dropout"] or None, batch_norm=settings["batch_norm"],
      **head, config=run_config, warm_start_from=warm_start_from)


def _part_optimizer(config: Config, part: str) -> tf_keras.optimizers.legacy.Optimizer:
  settings = config.canned_settings()
  return legacy_optimizer(settings[f"{part}_optimizer"], settings[f"{part}_learning_rate"])


def _twin_optimizer(part: str):
  return lambda config: _part_optimizer(config, part)


DNN = model.ModelSpec(
    name="dnn", build=build_dnn,
    canned=model.Canned(estimator=dnn_estimator, keras_optimizer=_twin_optimizer("dnn")))
LINEAR = model.ModelSpec(
    name="linear", build=build_linear,
    canned=model.Canned(estimator=linear_estimator, keras_optimizer=_twin_optimizer("linear")))
WIDE_DEEP = model.ModelSpec(
    name="wide_deep", build=build_wide_deep,
    canned=model.Canned(estimator=wide_deep_estimator, keras_optimizer=lambda config: (
        PartOptimizers(_part_optimizer(config, "dnn"), _part_optimizer(config, "linear")))))

# The tf.compat.v1.estimator classes: their heads sum the loss over the batch
# (tf.compat.v1.losses.Reduction.SUM), and they train with tf.compat.v1.train optimizers.
DNN_V1 = model.ModelSpec(
    name="dnn_v1", build=build_dnn, loss_reduction=model.SUM,
    canned=model.Canned(estimator=functools.partial(dnn_estimator, v1=True),
                        keras_optimizer=_v1_twin_optimizer("dnn"), v1_scope="dnn/"))
LINEAR_V1 = model.ModelSpec(
    name="linear_v1", build=build_linear, loss_reduction=model.SUM,
    canned=model.Canned(estimator=functools.partial(linear_estimator, v1=True),
                        keras_optimizer=_v1_twin_optimizer("linear"), v1_scope="linear/"))
# Its model_fn minimizes outside the parts' scopes: its slots are `<weight>/<slot>`.
WIDE_DEEP_V1 = model.ModelSpec(
    name="wide_deep_v1", build=build_wide_deep, loss_reduction=model.SUM,
    canned=model.Canned(estimator=functools.partial(wide_deep_estimator, v1=True),
                        keras_optimizer=lambda config: PartOptimizers(
                            _v1_twin_optimizer("dnn")(config),
                            _v1_twin_optimizer("linear")(config)),
                        v1_scope=""))
