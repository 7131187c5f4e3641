"""What a model is to both backends (`ModelSpec`), its weights by name, and its outputs.

A model is data plus a few functions: a `ModelSpec` whose `build` makes the Keras
model. Keras trains that model; the Estimator's model_fn calls the same `build` in
its graph, so both have the same layers, the same variable names and the same
initial weights. `build(config)` makes the model a run's `--model` names
(`trainers/model_registry.py` finds the spec).

Writing a spec (docs/MIGRATION.md, "Bring your model"):

    def build(seed, init, dropout=0.5):
      layers = tf_keras.layers
      image = tf_keras.Input(shape=(28, 28, 1), name="image")
      x = layers.Flatten(name="flatten")(image)
      x = layers.Dense(128, activation="relu", name="hidden",
                       kernel_initializer=init("hidden/kernel", GlorotUniform(seed)),
                       bias_initializer=init("hidden/bias", "zeros"))(x)
      ...
      return tf_keras.Model(image, logits)

    SPEC = ModelSpec(name="mlp", build=build, options={"dropout": 0.5})

`build(seed, init, **options)` returns an uncompiled Keras model from float images
(B, 28, 28, 1) to logits (B, 10); a build that takes `outputs` trains for every `--task`,
its logits then (B, outputs) (trainers/heads.py). Give every layer a fixed name (a weight's name,
"hidden/kernel", is then the same in Keras and in the Estimator's checkpoints) and
every weight the initializer `init(name, default)` returns: `default` when the run
starts from `--seed`, the given value when it starts from `--init_weights`.
"""

import dataclasses
import inspect
import warnings
from typing import (Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Set,
                    Tuple)

import numpy as np
import tensorflow as tf
# No public API in TF 2.15 for AutoGraph's skip list.
from tensorflow.python.autograph.core import config as autograph_config
import tf_keras

from trainers import heads
from trainers import model_registry
from trainers import v1_metrics
from trainers.config import MULTICLASS, Config

Weights = Dict[str, np.ndarray]
# init(weight_name, default_initializer) -> the initializer to give that weight.
Init = Callable[[str, object], tf_keras.initializers.Initializer]


def sparse_softmax_cross_entropy(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
  """Each example's cross-entropy of its integer label and the logits (the default loss)."""
  return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(labels, tf.int64),
                                                        logits=logits)


# How a spec's per-example losses make the training loss.
MEAN = "mean"  # The global batch's mean: Keras's default, and tf.compat.v1.losses'.
SUM = "sum"    # Its sum: tf.compat.v1.losses.Reduction.SUM, the v1 canned Estimators'.
REDUCTIONS = (MEAN, SUM)


@dataclasses.dataclass(frozen=True)
class Canned:
  """A canned Estimator: the Estimator backend runs the canned class itself, and the
  Keras backend the spec's `build` (its twin) with the optimizer the canned class builds.

  Attributes:
    estimator: `estimator(config, run_config, warm_start_from)` -> the canned
      Estimator with the run's settings (`Config.canned_settings`).
    keras_optimizer: `keras_optimizer(config)` -> the twin's optimizer.
    v1_scope: for a `tf.compat.v1.estimator` class (v1 optimizers, summed loss), the
      scope its model_fn minimizes in under a strategy, which prefixes its slots'
      names (`dnn/` for `dnn/dnn/hiddenlayer_0/kernel/Adagrad`, "" where it minimizes
      outside its parts' scopes); None for a TF2 one.
  """

  estimator: Callable[[Config, Any, Optional[Any]], Any]
  keras_optimizer: Callable[[Config], Any]
  v1_scope: Optional[str] = None

  @property
  def v1(self) -> bool:
    """Whether it is a `tf.compat.v1.estimator` class."""
    return self.v1_scope is not None


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """Everything both backends need to know about a model.

  Attributes:
    name: how runs and reports name it.
    build: `build(seed, init, **options)` -> an uncompiled `tf_keras.Model` from
      images to logits (see the module docstring); with `outputs=` the width of the
      run's head (trainers/heads.py) when it takes that keyword.
    options: the model's own settings (`--model_options=NAME=VALUE,...`) and their
      defaults, passed to `build` as keyword arguments.
    loss: `loss(labels, logits)` -> each example's loss, a (B,) float tensor.
    loss_reduction: how training reduces them over the global batch: `MEAN` or `SUM`
      (the gradient is then the sum's: as `tf.compat.v1.losses.Reduction.SUM` does
      under a strategy, and a Keras loss with `reduction="sum"`). Evaluation always
      reports the mean.
    deterministic_options: the options that take chance out of training (every
      dropout rate at 0), which launch.parity trains with: its reference cannot draw
      a backend's random masks.
    canned: for a canned Estimator's twin (trainers/models/canned.py), the canned
      Estimator; its `build` then takes the run's canned settings as keywords.
    signatures: for the port of a team's program that exports (docs/MIGRATION.md, "Prove
      your port"), `signatures(model)` -> {name: a tf.function with an input_signature},
      the program's export_outputs as Keras serves them (`tf.saved_model.save`'s
      signatures); None: the Estimator's canned contract (trainers/serving.py).
    metrics: the `eval_metric_ops` a model_fn reported besides the head's, by their keys:
      `v1_metrics.Metric`s, each a `tf.compat.v1.metrics` function with its arguments,
      which both backends evaluate and report alike (trainers/v1_metrics.py).
  """

  name: str
  build: Callable[..., tf_keras.Model]
  options: Mapping[str, float] = dataclasses.field(default_factory=dict)
  loss: Callable[[tf.Tensor, tf.Tensor], tf.Tensor] = sparse_softmax_cross_entropy
  loss_reduction: str = MEAN
  deterministic_options: Mapping[str, float] = dataclasses.field(default_factory=dict)
  canned: Optional[Canned] = None
  signatures: Optional[Callable[[tf_keras.Model], Mapping[str, Callable]]] = None
  metrics: Mapping[str, v1_metrics.Metric] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if self.loss_reduction not in REDUCTIONS:
      raise model_registry.SpecError(
          f"model {self.name}: loss_reduction={self.loss_reduction!r}; use one of "
          f"{', '.join(REDUCTIONS)} (trainers.model.MEAN or SUM).")
    for key, metric in self.metrics.items():
      if not isinstance(metric, v1_metrics.Metric):
        raise model_registry.SpecError(
            f"model {self.name}: metrics[{key!r}] is a {type(metric).__name__}; declare it "
            f"as trainers.v1_metrics.Metric(\"<tf.compat.v1.metrics function>\", ...).")
      if not isinstance(key, str) or not key or key in ("loss", "global_step"):
        raise model_registry.SpecError(
            f"model {self.name}: metrics[{key!r}]: name it as its eval_metric_ops key; "
            f"`loss` and `global_step` are the Estimator's own.")
    if self.metrics and self.canned:
      raise model_registry.SpecError(
          f"model {self.name}: a canned Estimator reports its head's metrics; take metrics "
          f"out of its spec.")


def batch_normalization(init: Init, name: str, momentum: float) -> tf_keras.layers.Layer:
  """A BatchNormalization layer `name` whose four weights take `init`'s initializers (for a
  spec's `build`)."""
  return tf_keras.layers.BatchNormalization(
      momentum=momentum, name=name,
      gamma_initializer=init(f"{name}/gamma", "ones"),
      beta_initializer=init(f"{name}/beta", "zeros"),
      moving_mean_initializer=init(f"{name}/moving_mean", "zeros"),
      moving_variance_initializer=init(f"{name}/moving_variance", "ones"))


def spec(config: Config) -> ModelSpec:
  """The spec `config.model` names (model_registry.load: SpecError if it cannot)."""
  return model_registry.load(config.model, ModelSpec)


def build(config: Config, initial_weights: Optional[Mapping[str, np.ndarray]] = None
          ) -> tf_keras.Model:
  """The model `config.model` names, with `config.model_options`, seeded by `config.seed`.

  Args:
    config: the run's model, options and seed.
    initial_weights: if given, every weight starts from this value instead, keyed by
      `weight_name`. Constant initializers (not a restore) make this work the same in
      eager Keras and in the Estimator's graph, and under any strategy.

  Raises:
    model_registry.SpecError: the spec cannot be loaded, an option is unknown, or its
      `build` gives a weight no `init` initializer, or asks for one it does not make.
  """
  return _build(config, initial_weights)[0]


def _build(config: Config, initial_weights: Optional[Mapping[str, np.ndarray]]
           ) -> Tuple[tf_keras.Model, List[tf.Variable]]:
  """`build`, and the weights it made."""
  skip_autograph_for_tf_keras()
  model_spec = spec(config)
  options = {**model_spec.options,
             **model_registry.parse_options(config.model_options, model_spec.options,
                                            f"model {model_spec.name}"),
             **(config.canned_settings() if model_spec.canned else {})}
  width = heads.head(config).logits_dimension
  if "outputs" in inspect.signature(model_spec.build).parameters:
    options["outputs"] = width
  elif config.task != MULTICLASS:
    raise model_registry.SpecError(
        f"--task={config.task} needs {width} output, and model {model_spec.name}'s build "
        f"takes no `outputs`: give it that keyword, the width of its last layer "
        f"(trainers/heads.py), or train --task=multiclass.")
  asked: Set[str] = set()

  def init(name: str, default) -> tf_keras.initializers.Initializer:
    asked.add(name)
    if initial_weights is None:
      return tf_keras.initializers.get(default)
    if name not in initial_weights:
      raise model_registry.SpecError(
          f"the initial weights have no {name}, which model {model_spec.name} asks for: "
          f"write them from this model (launch.parity does), or start from --seed.")
    return tf_keras.initializers.Constant(initial_weights[name])

  model, weights = _build_tracking_weights(lambda: model_spec.build(config.seed, init, **options))
  # Any width under the ten-class head: a port's logits are its program's.
  made = model.outputs[0].shape[-1] if len(model.outputs) == 1 else None
  if config.task != MULTICLASS and made != width:
    raise model_registry.SpecError(
        f"model {model_spec.name}'s build makes {len(model.outputs)} output(s) of shape "
        f"{[tuple(o.shape) for o in model.outputs]}; --task={config.task} needs one of "
        f"(batch, {width}): the logits.")
  names = {weight_name(w) for w in weights}
  missing = sorted(names - asked)
  if missing:
    raise model_registry.SpecError(
        f"model {model_spec.name}'s build gives {missing[0]} no init(...) initializer: pass "
        f"init(\"{missing[0]}\", default) as its initializer, so --init_weights reaches it.")
  extra = sorted(asked - names)
  if extra:
    raise model_registry.SpecError(
        f"model {model_spec.name}'s build asks init(...) for {extra[0]}, which is not one of "
        f"its weights ({', '.join(sorted(names))}): name the layer so the weight is called "
        f"{extra[0]}, or ask for the name it has.")
  # A graph's collection holds what tf.compat.v1.layers' regularizers add.
  if model.losses or (not tf.executing_eagerly()
                      and tf.compat.v1.losses.get_regularization_losses()):
    raise model_registry.SpecError(
        f"model {model_spec.name} adds losses of its own (a kernel_regularizer, an "
        f"activity_regularizer or add_loss), which the two backends do not yet train alike: "
        f"take them out of its build; the spec's loss is ModelSpec.loss.")
  return model, weights


def _build_tracking_weights(make: Callable[[], tf_keras.Model]
                            ) -> Tuple[tf_keras.Model, List[tf.Variable]]:
  """The model `make` builds, and the weights it made.

  In a graph (the Estimator's) those are the graph's new global variables: a Keras
  model built there does not track what tf.compat.v1.layers create in it (it does when
  eager, through track_tf1_style_variables).
  """
  if tf.executing_eagerly():
    model = make()
    return model, model.weights
  before = {id(v) for v in tf.compat.v1.global_variables()}
  model = make()
  return model, [v for v in tf.compat.v1.global_variables() if id(v) not in before]


class GraphModel(NamedTuple):
  """A model built in a graph of its own, and what a checkpoint of it holds."""
  model: tf_keras.Model
  shapes: Dict[str, Tuple[int, ...]]  # Every weight's, by name.
  trainable: List[str]  # The names of those the optimizer updates (and keeps slots for).


def graph_model(config: Config) -> GraphModel:
  """`config.model` built in a graph of its own, and its weights' names and shapes.

  What a checkpoint of the model holds, read without starting TensorFlow's runtime,
  which must wait for the strategy: built in the inference phase, as a BatchNorm
  called with the symbolic learning phase makes a function, and that starts it.

  Raises:
    model_registry.SpecError: as `build`, and if the spec's `build` raises.
  """
  with tf.Graph().as_default(), warnings.catch_warnings():
    warnings.filterwarnings("ignore", "`tf.keras.backend.learning_phase_scope` is deprecated")
    with tf_keras.backend.learning_phase_scope(0):
      try:
        model, weights = _build(config, None)
      except model_registry.SpecError:
        raise
      except Exception as e:  # The spec's own code: what it raises is for its author.
        raise model_registry.SpecError(
            f"model {config.model!r}: its build failed: {type(e).__name__}: {e}") from e
  return GraphModel(model, {weight_name(w): tuple(w.shape.as_list()) for w in weights},
                    [weight_name(w) for w in weights if w.trainable])


def check(config: Config) -> None:
  """Raises SpecError unless `config.model` loads and builds with `config.model_options`
  (`graph_model`: no eager state, nothing left behind) for the run's head, its loss is
  one the head can take (`example_loss`) and so are its metrics (`declared_metrics`), and
  each --log_tensors name is one of `LOGGED` or a layer's."""
  check_log_tensors(config, graph_model(config).model)
  example_loss(config)
  declared_metrics(config)


def check_log_tensors(config: Config, model: Optional[tf_keras.Model] = None) -> None:
  """Raises SpecError unless each --log_tensors name is one of `LOGGED` or a layer of the
  model (`model`, else `graph_model`'s)."""
  names = [name for name in config.logged_tensors() if name not in LOGGED]
  if not names:
    return
  model = model or graph_model(config).model
  layers = [layer.name for layer in model.layers
            if not isinstance(layer, tf_keras.layers.InputLayer)]
  for name in names:
    if name not in layers:
      raise model_registry.SpecError(
          f"--log_tensors: {name!r} is none of {', '.join(LOGGED)} nor a layer of model "
          f"{config.model!r}, whose layers are {', '.join(layers)}.")


# What --log_tensors names besides layers: the values a model_fn's LoggingTensorHook logs.
LOGGED = ("loss", "learning_rate", "global_step")


def layer_taps(model: tf_keras.Model, names: Sequence[str]) -> Optional[tf_keras.Model]:
  """The model giving `model`'s output and the output of each layer `names` names (others,
  `LOGGED`'s, skipped), the same layers and weights; None if none is a layer's."""
  layers = [name for name in names if name not in LOGGED]
  if not layers:
    return None
  return tf_keras.Model(model.inputs, [model.output, *(model.get_layer(name).output
                                                       for name in layers)])


def input_shapes(config: Config) -> Dict[str, Tuple[Optional[int], ...]]:
  """Each input of `config.model` by name, with its shape (the batch first)."""
  model = graph_model(config).model
  return {name: tuple(tensor.shape.as_list())
          for name, tensor in zip(model.input_names, model.inputs)}


def weight_name(variable: tf.Variable) -> str:
  """A weight's name in Keras ("conv/kernel:0") and in Estimator checkpoints ("conv/kernel").

  This is the one place the two backends' variables are mapped onto each other.
  """
  return variable.name.split(":")[0]


def build_holding(config: Config, weights: Mapping[str, np.ndarray]) -> tf_keras.Model:
  """The model `config.model` names, eagerly, each weight then set to its value in `weights`
  (by `weight_name`): what a SavedModel is written from.

  Its layers keep the spec's initializers: tf_keras writes every layer's config into an
  export's keras_metadata.pb, and `build`'s Constant initializers would put each weight
  there as JSON text (23 MB and seconds of encoding for the default model).
  """
  model = build(config)
  missing = sorted({weight_name(w) for w in model.weights} - set(weights))
  if missing:
    raise model_registry.SpecError(
        f"the weights given have no {missing[0]}, which model {spec(config).name} has.")
  for variable in model.weights:
    variable.assign(weights[weight_name(variable)])
  return model


def get_weights(model: tf_keras.Model) -> Weights:
  """Every weight by name: trainable ones and the rest (BatchNorm's moving statistics)."""
  return {weight_name(w): w.numpy() for w in model.weights}


def save_weights_npz(path: str, weights: Mapping[str, np.ndarray]) -> None:
  with open(path, "wb") as f:
    np.savez(f, **weights)


def load_weights_npz(path: str) -> Weights:
  with np.load(path) as data:
    return {name: data[name] for name in data.files}


def loss_reduction(config: Config) -> str:
  """How training reduces the examples' losses over the batch, `MEAN` or `SUM`: a canned
  model's --loss_reduction if given, else the spec's."""
  given = config.canned_settings().get("loss_reduction")
  if given:
    return SUM if given == "sum" else MEAN
  return spec(config).loss_reduction


def v1_loss(config: Config, labels: tf.Tensor, logits: tf.Tensor,
            reduction: Optional[str] = None) -> tf.Tensor:
  """The spec's loss over this replica's batch, reduced as the spec says (or `reduction`)
  by tf.compat.v1.losses: the Estimator's, and any v1 graph's.

  tf.compat.v1.losses tells the v1 optimizer how to scale it: under train_distribute
  it divides a mean by the number of replicas before their gradients are summed,
  giving the gradient of the global-batch mean, as in Keras, and leaves a sum as it
  is. Dividing by the global batch here would halve the mean at 2 workers.
  """
  return tf.compat.v1.losses.compute_weighted_loss(
      example_loss(config)(labels, logits),
      reduction=(tf.compat.v1.losses.Reduction.SUM
                 if (reduction or loss_reduction(config)) == SUM
                 else tf.compat.v1.losses.Reduction.SUM_BY_NONZERO_WEIGHTS))


def example_loss(config: Config) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
  """Each example's loss: the spec's own (`ModelSpec.loss`), or the run's head's.

  Raises:
    model_registry.SpecError: the spec has its own loss and the task is not multiclass.
  """
  model_spec = spec(config)
  if model_spec.loss is sparse_softmax_cross_entropy:
    return heads.head(config).loss
  if config.task != MULTICLASS:
    raise model_registry.SpecError(
        f"model {model_spec.name} has a loss of its own (ModelSpec.loss), and --task="
        f"{config.task} trains with its head's: take the loss out of the spec, or train "
        f"--task={MULTICLASS}.")
  return model_spec.loss


def metric_keys(config: Config) -> Tuple[str, ...]:
  """What evaluation reports: the head's metrics, without `average_loss` (the head's loss,
  not the spec's) for a spec with a loss of its own, and the spec's declared metrics."""
  keys, model_spec = heads.head(config).metric_keys, spec(config)
  if model_spec.loss is not sparse_softmax_cross_entropy:
    keys = tuple(k for k in keys if k != "average_loss")
  return tuple(sorted((*keys, *model_spec.metrics)))


def declared_metrics(config: Config) -> Mapping[str, v1_metrics.Metric]:
  """The spec's metrics (`ModelSpec.metrics`); SpecError, naming the metric, for one the
  run's head cannot feed or one named as a metric of the head's."""
  model_spec, head = spec(config), heads.head(config)
  for key, metric in model_spec.metrics.items():
    if key in head.metric_keys:
      raise model_registry.SpecError(
          f"model {model_spec.name}: metrics[{key!r}] is the --task={head.task} head's own "
          f"metric, which both backends report already: take it out, or name it otherwise.")
    try:
      metric.check(head)
    except v1_metrics.MetricError as e:
      raise model_registry.SpecError(f"model {model_spec.name}: metrics[{key!r}]: {e}") from None
  return model_spec.metrics


def eval_sums(model: tf_keras.Model, loss: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
              images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
  """[summed `loss` (the spec's), correct predictions, examples] of one test batch.

  Summed over batches and divided by the example count, these give the same
  per-example mean loss and accuracy as Keras `evaluate`.
  """
  logits = model(images, training=False)
  losses = loss(labels, logits)
  correct = tf.cast(tf.equal(tf.argmax(logits, -1), labels), tf.float32)
  return tf.stack([tf.reduce_sum(losses), tf.reduce_sum(correct),
                   tf.cast(tf.size(labels), tf.float32)])


def initial_weights(path: Optional[str]) -> Optional[Weights]:
  """The weights in the `.npz` file at `path` (--init_weights), or None to initialize
  from the seed."""
  return load_weights_npz(path) if path else None


def skip_autograph_for_tf_keras() -> None:
  """Stops AutoGraph from converting tf_keras's own code, as TF does for `keras`.

  TF 2.15 lists `DoNotConvert('keras')` but not `tf_keras`, so every
  tf.function that calls a model (Model.fit's train function, `evaluate`, the
  reference loop) transpiles tf_keras's functions first: seconds at each first
  trace. tf_keras is Keras 2's code, written to run unconverted. `build` calls
  this, so it holds in every process before any of its models is traced.
  """
  rule = autograph_config.DoNotConvert("tf_keras")
  if not any(getattr(r, "_prefix", None) == "tf_keras"
             for r in autograph_config.CONVERSION_RULES):
    autograph_config.CONVERSION_RULES = (rule,) + tuple(autograph_config.CONVERSION_RULES)
