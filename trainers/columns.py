"""A team's feature columns as Keras preprocessing: the same ids, the same dense tensors,
and weights laid out as the Estimator lays them out.

    dense = columns.DenseFeaturesTwin(feature_columns)     # tf.keras.layers.DenseFeatures
    logits = columns.LinearModelTwin(feature_columns, units=10)   # the canned LinearModel
    x = dense(features)  # features: what the input_fn gives, tensors and SparseTensors
    inputs = columns.keras_inputs(tf.feature_column.make_parse_example_spec(feature_columns))

Each column becomes the Keras layers that replace it (`ids` for a categorical column,
`dense` for a dense one). Where no Keras layer gives the column's answer, a small layer
written here does, for the reason given (each proved in tests/trainers/test_columns.py
against the column itself; docs/MIGRATION.md has the table):

- `numeric_column`: a cast and a reshape, its `normalizer_fn` first, as the column.
- `bucketized_column`: `Discretization` (a value on a boundary goes up in both); the ids of
  a d-wide source are offset by `i * (len(boundaries) + 1)`, as the column's.
- `categorical_column_with_hash_bucket`: `Hashing` (integers hashed as decimal strings in
  both).
- `..._with_vocabulary_list` / `_file`: `StringLookup`, in `_Lookup`: the column puts
  out-of-vocabulary buckets after the vocabulary, StringLookup before it; with no OOV
  bucket the column gives `default_value` (-1: no id) where StringLookup raises; integer
  vocabularies go through StringLookup as strings, since IntegerLookup hashes OOV integers
  otherwise.
- `..._with_identity`: `_Identity`: no Keras layer puts out-of-range ids at a default.
- `crossed_column`: `_Cross`, the column's own hashed cross: HashedCrossing takes one dense
  value per feature, the column crosses every value, sparse inputs first.
- `weighted_categorical_column`: the ids with their weights (a dense zero is missing).
- `indicator_column`: `CategoryEncoding(output_mode="count")`, ids below 0 (no id) dropped
  first: the column gives them a zero row.
- `embedding_column`, `shared_embeddings`: `_Embedding`: Keras's `Embedding` looks up one id
  per position; the column combines (`mean`, `sqrtn`, `sum`) any number of weighted ids per
  row, an empty row giving zeros; shared columns look up one table.

Raw features are read as the columns read them: a rank-1 feature gains a second axis, and
for a categorical column the empty string and -1 are missing values, dropped
(`_present`); no Keras layer drops them.
"""

import math
import zlib
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf
import tf_keras

from trainers import model_registry

Features = Dict[str, object]
# init(weight_name, default_initializer) -> the initializer to give it (trainers/model.py).
Init = Callable[[str, object], object]


class Ids(NamedTuple):
  """A categorical column's ids (int64, batch x values) and their weights, or None."""
  ids: tf.SparseTensor
  weights: Optional[tf.SparseTensor]


class ColumnError(model_registry.SpecError):
  """A column this module cannot twin, or whose data is not there; its message names the
  column (the trainers exit 2 with it, before training)."""


def _kind(column) -> str:
  return type(column).__name__


def raw(features: Features, key: str):
  """A raw feature as a column reads it: a tensor or SparseTensor, rank 1 made rank 2."""
  if key not in features:
    raise ColumnError(f"the features have no {key!r}, which a column reads; they have "
                      f"{sorted(features)}")
  value = features[key]
  if not isinstance(value, (tf.SparseTensor, tf.RaggedTensor)):
    value = tf.convert_to_tensor(value)
  if isinstance(value, tf.RaggedTensor):
    value = value.to_sparse()
  if value.shape.rank == 1:
    if isinstance(value, tf.SparseTensor):
      return tf.sparse.reshape(value, [tf.shape(value, out_type=tf.int64)[0], 1])
    return tf.expand_dims(value, -1)
  return value


def _present(value, missing=None) -> tf.SparseTensor:
  """A categorical feature as a SparseTensor without its missing values: the empty string
  or -1 (or `missing`) in a dense tensor; a SparseTensor is kept whole, as the column keeps
  it."""
  if isinstance(value, tf.SparseTensor):
    return value
  if missing is None:
    missing = "" if value.dtype == tf.string else -1
  indices = tf.where(tf.not_equal(value, tf.cast(missing, value.dtype)))
  return tf.SparseTensor(indices, tf.gather_nd(value, indices),
                         tf.shape(value, out_type=tf.int64))


def _with_values(sparse: tf.SparseTensor, values: tf.Tensor) -> tf.SparseTensor:
  return tf.SparseTensor(sparse.indices, values, sparse.dense_shape)


def _check_dtype(column, value) -> None:
  if column.dtype.is_integer != value.dtype.is_integer:
    raise ColumnError(f"{_kind(column)} {column.name!r} takes {column.dtype.name} values; "
                      f"the feature {column.key!r} is {value.dtype.name}")


# Categorical columns: each twin's `pair(features)` gives the column's Ids (and so does
# calling it eagerly). The twins that hold one call `pair`: a layer called in a graph may
# not give None, which Ids.weights mostly is.

class _Categorical(tf_keras.layers.Layer):
  """A categorical column's twin: `pair(features)` gives its Ids."""

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.built = True  # No weights to build; a SavedModel keeps the built ones whole.

  def call(self, features):
    return self.pair(features)

  def pair(self, features) -> Ids:
    raise NotImplementedError


class _Hashed(_Categorical):
  """categorical_column_with_hash_bucket: Hashing."""

  def __init__(self, column, **kwargs):
    super().__init__(name=f"{column.name}_hashed", **kwargs)
    self.column = column
    self.hashing = tf_keras.layers.Hashing(column.hash_bucket_size)

  def pair(self, features) -> Ids:
    value = _present(raw(features, self.column.key))
    _check_dtype(self.column, value)
    return Ids(_with_values(value, self.hashing(value.values)), None)


class _Lookup(_Categorical):
  """categorical_column_with_vocabulary_list or _file: StringLookup, its out-of-vocabulary
  ids moved after the vocabulary (or to default_value) as the column's table puts them."""

  def __init__(self, column, vocabulary: Sequence, **kwargs):
    super().__init__(name=f"{column.name}_lookup", **kwargs)
    self.column, self.size = column, len(vocabulary)
    self.oov = column.num_oov_buckets
    self.default = -1 if column.default_value is None else column.default_value
    # Integers as strings: the column's table hashes an OOV integer's decimal string.
    self.lookup = tf_keras.layers.StringLookup(
        vocabulary=[v if isinstance(v, str) else str(v) for v in vocabulary],
        num_oov_indices=max(self.oov, 1), mask_token=None)

  def pair(self, features) -> Ids:
    value = _present(raw(features, self.column.key))
    _check_dtype(self.column, value)
    keys = value.values if value.dtype == tf.string else tf.strings.as_string(value.values)
    found = self.lookup(keys)
    buckets = max(self.oov, 1)
    oov = found < buckets
    ids = tf.where(oov, (found + self.size) if self.oov else tf.fill(
        tf.shape(found), tf.constant(self.default, found.dtype)), found - buckets)
    return Ids(_with_values(value, tf.cast(ids, tf.int64)), None)


def _vocabulary(column) -> List:
  """A vocabulary file's first vocabulary_size entries, as the column's table reads them."""
  if column.file_format not in (None, "text"):
    raise ColumnError(f"{column.name!r}: a vocabulary file of format {column.file_format!r} "
                      f"has no twin here; give a text file, one entry per line")
  if not tf.io.gfile.exists(column.vocabulary_file):
    raise ColumnError(f"{column.name!r}: the vocabulary file {column.vocabulary_file} does "
                      f"not exist; give the path the Estimator program reads")
  with tf.io.gfile.GFile(column.vocabulary_file) as f:
    lines = f.read().splitlines()[:column.vocabulary_size]
  return lines if column.dtype == tf.string else [int(line) for line in lines]


class _Identity(_Categorical):
  """categorical_column_with_identity: the value is the id; out of [0, num_buckets) it is
  default_value (if the column has one)."""

  def __init__(self, column, **kwargs):
    super().__init__(name=f"{column.name}_identity", **kwargs)
    self.column = column

  def pair(self, features) -> Ids:
    value = _present(raw(features, self.column.key))
    if not value.dtype.is_integer:
      raise ColumnError(f"identity column {self.column.name!r} takes integers; the feature "
                        f"is {value.dtype.name}")
    ids = tf.cast(value.values, tf.int64)
    if self.column.default_value is not None:
      outside = (ids < 0) | (ids >= self.column.num_buckets)
      ids = tf.where(outside, tf.constant(self.column.default_value, tf.int64), ids)
    return Ids(_with_values(value, ids), None)


class _Bucketized(_Categorical):
  """bucketized_column: Discretization of its numeric source; a d-wide source's i-th value
  has ids offset by i * (len(boundaries) + 1)."""

  def __init__(self, column, **kwargs):
    super().__init__(name=f"{column.name}_buckets", **kwargs)
    self.column, self.width = column, len(column.boundaries) + 1
    self.source = _Numeric(column.source_column)
    self.discretize = tf_keras.layers.Discretization(bin_boundaries=list(column.boundaries))

  def buckets(self, features) -> tf.Tensor:
    return tf.cast(self.discretize(self.source.value(features)), tf.int64)

  def pair(self, features) -> Ids:
    buckets = self.buckets(features)
    dims = self.column.source_column.shape[0]
    batch = tf.shape(buckets, out_type=tf.int64)[0]
    rows = tf.repeat(tf.range(batch), dims)
    cols = tf.tile(tf.range(dims, dtype=tf.int64), [batch])
    values = tf.reshape(buckets, [-1]) + self.width * cols
    return Ids(tf.SparseTensor(tf.stack([rows, cols], 1), values, [batch, dims]), None)


class _Cross(_Categorical):
  """crossed_column: the column's hashed cross of every value of its inputs (raw features
  as they are, categorical columns' ids), in the column's order."""

  def __init__(self, column, **kwargs):
    super().__init__(name=f"{column.name}_cross", **kwargs)
    self.column = column
    self.leaves = [key if isinstance(key, str) else ids(key) for key in _leaves(column)]

  def pair(self, features) -> Ids:
    inputs = []
    for leaf in self.leaves:
      if isinstance(leaf, str):
        inputs.append(raw(features, leaf))
        continue
      pair = leaf.pair(features)
      if pair.weights is not None:
        raise ColumnError(f"crossed_column {self.column.name!r} crosses a weighted column, "
                          f"which the column refuses too")
      inputs.append(pair.ids)
    return Ids(tf.sparse.cross_hashed(inputs, num_buckets=self.column.hash_bucket_size,
                                      hash_key=self.column.hash_key), None)


def _leaves(column) -> list:
  """A cross's inputs, nested crosses flattened, as the column collects them."""
  leaves = []
  for key in column.keys:
    leaves.extend(_leaves(key) if _kind(key) == "CrossedColumn" else [key])
  return leaves


class _Weighted(_Categorical):
  """weighted_categorical_column: its column's ids with the weight feature (a dense weight
  of zero is a missing one)."""

  def __init__(self, column, **kwargs):
    super().__init__(name=f"{column.name}_weighted", **kwargs)
    self.column = column
    self.inner = ids(column.categorical_column)

  def pair(self, features) -> Ids:
    weights = raw(features, self.column.weight_feature_key)
    if weights.dtype != self.column.dtype:
      raise ColumnError(f"{self.column.name!r}: the weight feature "
                        f"{self.column.weight_feature_key!r} is {weights.dtype.name}; the "
                        f"column takes {self.column.dtype.name}")
    if not isinstance(weights, tf.SparseTensor):
      weights = _present(weights, missing=0.0)
    return Ids(self.inner.pair(features).ids, weights)


def ids(column) -> _Categorical:
  """The twin of a categorical column: a layer giving its Ids from the raw features."""
  kind = _kind(column)
  if kind == "HashedCategoricalColumn":
    return _Hashed(column)
  if kind == "VocabularyListCategoricalColumn":
    return _Lookup(column, column.vocabulary_list)
  if kind == "VocabularyFileCategoricalColumn":
    return _Lookup(column, _vocabulary(column))
  if kind == "IdentityCategoricalColumn":
    return _Identity(column)
  if kind == "BucketizedColumn":
    return _Bucketized(column)
  if kind == "CrossedColumn":
    return _Cross(column)
  if kind == "WeightedCategoricalColumn":
    return _Weighted(column)
  raise ColumnError(_unsupported(column))


def _unsupported(column) -> str:
  if _kind(column).startswith("Sequence"):
    return (f"{_kind(column)} {column.name!r} is a sequence column, which needs "
            f"SequenceFeatures and an RNN, not a canned model; it has no twin here")
  return (f"{_kind(column)} {getattr(column, 'name', column)!r} has no Keras twin here; the "
          f"kinds that do are numeric, bucketized, hash bucket, vocabulary list and file, "
          f"identity, crossed, weighted, indicator, embedding and shared embeddings")


# Dense columns: each twin's call(features) gives the column's dense tensor, batch first.

class _Numeric(tf_keras.layers.Layer):
  """numeric_column: its normalizer_fn, float32, flattened as DenseFeatures flattens it."""

  def __init__(self, column, **kwargs):
    super().__init__(name=f"{column.name}_numeric", **kwargs)
    self.column, self.built = column, True

  def value(self, features) -> tf.Tensor:
    value = raw(features, self.column.key)
    if isinstance(value, tf.SparseTensor):
      raise ColumnError(f"numeric_column {self.column.name!r} takes a dense feature; "
                        f"{self.column.key!r} is sparse (a VarLenFeature): parse it with a "
                        f"FixedLenFeature of shape {self.column.shape}")
    if self.column.normalizer_fn is not None:
      value = self.column.normalizer_fn(value)
    return tf.cast(value, tf.float32)

  def call(self, features):
    return tf.reshape(self.value(features), [-1, math.prod(self.column.shape)])


class _OneHot(tf_keras.layers.Layer):
  """bucketized_column as a dense column: one-hot buckets, one block per source value."""

  def __init__(self, column, **kwargs):
    super().__init__(name=f"{column.name}_one_hot", **kwargs)
    self.buckets = _Bucketized(column)
    self.size = column.source_column.shape[0] * self.buckets.width

  def call(self, features):
    one_hot = tf.one_hot(self.buckets.buckets(features), self.buckets.width)
    return tf.reshape(one_hot, [-1, self.size])


class _Indicator(tf_keras.layers.Layer):
  """indicator_column: CategoryEncoding's counts (summed weights, for a weighted column)."""

  def __init__(self, column, **kwargs):
    super().__init__(name=f"{column.name}_indicator", **kwargs)
    self.ids = ids(column.categorical_column)
    self.count = tf_keras.layers.CategoryEncoding(
        num_tokens=column.categorical_column.num_buckets, output_mode="count")

  def call(self, features):
    pair = self.ids.pair(features)
    keep = pair.ids.values >= 0
    found = tf.sparse.retain(pair.ids, keep)
    if pair.weights is None:
      return self.count(found)
    return self.count(found, count_weights=tf.sparse.retain(pair.weights, keep))


class _Embedding(tf_keras.layers.Layer):
  """An embedding table (`embedding_weights`, num_buckets x dimension, the column's
  initializer) and the lookup of a categorical column's weighted ids, combined per row as
  the column combines them (an empty row gives zeros)."""

  def __init__(self, name: str, num_buckets: int, dimension: int, initializer, **kwargs):
    super().__init__(name=name, **kwargs)
    self.shape_, self.initializer = (num_buckets, dimension), initializer

  def build(self, input_shape):
    self.table = self.add_weight("embedding_weights", shape=self.shape_,
                                 initializer=self.initializer)

  def call(self, ids, weights=None, combiner="mean", max_norm=None):
    return self.lookup(Ids(ids, weights), combiner, max_norm)

  def lookup(self, pair: Ids, combiner: str, max_norm: Optional[float]) -> tf.Tensor:
    return tf.nn.safe_embedding_lookup_sparse(self.table, pair.ids, pair.weights,
                                              combiner=combiner, max_norm=max_norm)


class _Embedded(_Embedding):
  """embedding_column: its ids looked up in its own table."""

  def __init__(self, column, initializer, **kwargs):
    super().__init__(column.name, column.categorical_column.num_buckets, column.dimension,
                     initializer, **kwargs)
    self.column, self.ids = column, ids(column.categorical_column)

  def call(self, features):
    return self.lookup(self.ids.pair(features), self.column.combiner, self.column.max_norm)


class _SharedEmbedded(tf_keras.layers.Layer):
  """One of shared_embeddings: its ids looked up in the table the columns share."""

  def __init__(self, column, table: _Embedding, **kwargs):
    super().__init__(name=column.name, **kwargs)
    self.column, self.ids, self.table = column, ids(column.categorical_column), table

  def call(self, features):
    pair = self.ids.pair(features)
    return self.table(pair.ids, pair.weights, combiner=self.column.combiner,
                      max_norm=self.column.max_norm)


def seeded(init: Init, seed: int) -> Init:
  """`init`, giving a default initializer that draws without a seed (a column's own: an
  embedding's truncated normal) a seed from `seed` and the weight's name, so that the run's
  --seed fixes it and op determinism lets it draw."""

  def with_seed(name: str, default):
    settings = default.get_config() if hasattr(default, "get_config") else {}
    if "seed" in settings and settings["seed"] is None:
      default = type(default).from_config(
          {**settings, "seed": seed + zlib.crc32(name.encode()) % 10_000})
    return init(name, default)

  return with_seed


def _initializer(init: Optional[Init], name: str, default):
  return default if init is None else init(name, default)


def dense(column, tables: Optional[Dict[str, _Embedding]] = None, init: Optional[Init] = None,
          scope: str = "") -> tf_keras.layers.Layer:
  """The twin of a dense column: a layer giving its dense tensor (batch x elements).
  `tables`: the shared embedding tables by name, filled as shared columns are met; `init`
  gives a table's initializer by its weight's name, under `scope` (the layer's name)."""
  kind = _kind(column)
  if kind == "NumericColumn":
    return _Numeric(column)
  if kind == "BucketizedColumn":
    return _OneHot(column)
  if kind == "IndicatorColumn":
    return _Indicator(column)
  if kind == "EmbeddingColumn":
    return _Embedded(column, _initializer(init, f"{scope}/{column.name}/embedding_weights",
                                          column.initializer))
  if kind == "SharedEmbeddingColumn":
    if init is not None:
      raise ColumnError(f"{column.name!r}: shared embeddings are twinned (the same answers) "
                        f"but not yet in a canned model's twin, whose weights are set by "
                        f"name; give each column an embedding_column of its own there")
    # The creator keeps the shared table's settings private; its name is the variable's,
    # `<sorted columns' names>_shared_embedding` unless the program named it.
    creator = column.shared_embedding_column_creator
    tables = {} if tables is None else tables
    if creator._name not in tables:
      tables[creator._name] = _Embedding(creator._name, creator._num_buckets,
                                         creator.dimension, creator._initializer)
    return _SharedEmbedded(column, tables[creator._name])
  raise ColumnError(_unsupported(column))


def _sorted(columns) -> list:
  """Columns in the order DenseFeatures and LinearModel take them: by name."""
  columns = list(columns)
  if not columns:
    raise ColumnError("no feature columns were given")
  return sorted(columns, key=lambda c: c.name)


def keras_inputs(spec: Dict[str, object]) -> Dict[str, tf_keras.Input]:
  """A model's inputs for the features a parse_example `spec` gives (make_parse_example_spec
  of its columns): a VarLenFeature a sparse input, a FixedLenFeature a dense one, by name."""
  inputs = {}
  for name, feature in sorted(spec.items()):
    if isinstance(feature, tf.io.VarLenFeature):
      inputs[name] = tf_keras.Input(shape=(None,), sparse=True, dtype=feature.dtype, name=name)
    else:
      inputs[name] = tf_keras.Input(shape=tuple(feature.shape), dtype=feature.dtype, name=name)
  return inputs


class DenseFeaturesTwin(tf_keras.layers.Layer):
  """The twin of tf.keras.layers.DenseFeatures (a canned DNN's input layer): each column's
  dense tensor, in order of the columns' names, concatenated."""

  def __init__(self, feature_columns, name: str = "input_layer", init: Optional[Init] = None,
               **kwargs):
    super().__init__(name=name, **kwargs)
    self.tables: Dict[str, _Embedding] = {}
    self.columns = [dense(c, self.tables, init, name) for c in _sorted(feature_columns)]

  def call(self, features):
    return tf.concat([column(features) for column in self.columns], axis=1)


class LinearModelTwin(tf_keras.layers.Layer):
  """The twin of the canned LinearModel: per column (in order of names) a `weights`
  variable of (num_buckets or elements) x units, zeros at first; a categorical column's ids
  look up rows, summed (`sparse_combiner`) with their weights, a dense column's tensor is
  multiplied; all summed, plus `bias_weights`."""

  def __init__(self, feature_columns, units: int, sparse_combiner: str = "sum",
               name: str = "linear_model", init: Optional[Init] = None, **kwargs):
    super().__init__(name=name, **kwargs)
    self.units, self.combiner, self.init = units, sparse_combiner, init
    self.tables: Dict[str, _Embedding] = {}
    self.parts: List[Tuple[object, tf_keras.layers.Layer, bool]] = []
    for column in _sorted(feature_columns):
      categorical = _kind(column) in _CATEGORICAL
      self.parts.append((column, ids(column) if categorical else dense(
          column, self.tables, init, name), categorical))

  def build(self, input_shape):
    def weight(name: str, shape):
      return self.add_weight(name, shape=shape, initializer=_initializer(
          self.init, f"{self.name}/{name}", "zeros"))

    self.column_weights = [
        weight(f"{_scope_name(column.name)}/weights",
               (column.num_buckets if categorical else _elements(column), self.units))
        for column, _, categorical in self.parts]
    self.bias = weight("bias_weights", (self.units,))

  def call(self, features):
    sums = []
    for (_, layer, categorical), weights in zip(self.parts, self.column_weights):
      if categorical:
        pair = layer.pair(features)
        sums.append(tf.nn.safe_embedding_lookup_sparse(
            weights, _rows(pair.ids), None if pair.weights is None else _rows(pair.weights),
            combiner=self.combiner))
      else:
        sums.append(tf.matmul(layer(features), weights))
    return tf.nn.bias_add(tf.add_n(sums), self.bias)


_CATEGORICAL = ("HashedCategoricalColumn", "VocabularyListCategoricalColumn",
                "VocabularyFileCategoricalColumn", "IdentityCategoricalColumn",
                "BucketizedColumn", "CrossedColumn", "WeightedCategoricalColumn")


def _rows(sparse: tf.SparseTensor) -> tf.SparseTensor:
  """A SparseTensor as batch x values (LinearModel's reshape before the lookup)."""
  return tf.sparse.reshape(sparse, [tf.shape(sparse, out_type=tf.int64)[0], -1])


def _elements(column) -> int:
  if _kind(column) == "IndicatorColumn":
    return column.categorical_column.num_buckets
  if _kind(column) in ("EmbeddingColumn", "SharedEmbeddingColumn"):
    return column.dimension
  if _kind(column) == "BucketizedColumn":
    return column.source_column.shape[0] * (len(column.boundaries) + 1)
  return math.prod(column.shape)


def _scope_name(name: str) -> str:
  """A column's name as a variable scope, as feature_column_v2 sanitizes it."""
  return name.replace(":", "_")
