"""trainers.columns: each feature column's Keras twin gives the column's own ids, dense
tensor and linear logits on the same raw batches: missing values, out-of-vocabulary
strings, empty rows, negative and out-of-range ids, values on bucket boundaries,
multivalent features.

The columns are computed as the Estimator computes them, in a graph and a session
(shared embeddings exist only there); the twins eagerly, as Keras runs them.
"""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.feature_column import feature_column_v2 as fc_v2

from trainers import columns

estimator = pytest.importorskip("tensorflow_estimator", reason="the canned LinearModel")

fc = tf.feature_column
VOCABULARY = ["red", "green", "blue"]
BOUNDARIES = [0.0, 1.0, 2.5]


def _features():
  """Six rows of every kind of raw feature, each edge somewhere."""
  tags = tf.SparseTensor(  # Multivalent strings; row 2 empty; row 4 repeats a tag.
      [[0, 0], [0, 1], [1, 0], [3, 0], [3, 1], [3, 2], [4, 0], [4, 1], [5, 0]],
      ["red", "teal", "blue", "green", "red", "", "blue", "blue", "plum"], [6, 3])
  return {
      "num": tf.constant([[-1.0], [0.0], [1.0], [2.5], [3.0], [0.5]]),  # On boundaries.
      "pair": tf.constant([[0.2, 0.7], [0.5, 0.5], [1.0, -2.0], [0.0, 9.0], [0.6, 0.4],
                           [0.5, 0.49]]),
      "colour": tf.constant([["red"], [""], ["teal"], ["blue"], ["green"], ["plum"]]),
      "code": tf.constant([[3], [-1], [12], [-4], [0], [7]], tf.int64),  # -1: missing.
      "tags": tags,
      "tag_weight": tf.SparseTensor(tags.indices, [1.0, 2.0, 0.5, 0.0, -1.0, 3.0, 1.5, 0.5,
                                                   4.0], [6, 3]),
      "codes": tf.SparseTensor([[0, 0], [0, 1], [2, 0], [3, 0], [5, 0], [5, 1]],
                               tf.constant([1, 4, 9, 4, 0, 6], tf.int64), [6, 2]),
  }


def _vocabulary_file(tmp_path):
  path = tmp_path / "colours.txt"
  path.write_text("\n".join(VOCABULARY + ["plum", "not read"]) + "\n")
  return str(path)


def _categorical(tmp_path):
  """One categorical column of every kind, with the settings that move ids."""
  num = fc.numeric_column("num")
  tags = fc.categorical_column_with_vocabulary_list("tags", VOCABULARY, num_oov_buckets=2)
  return [
      fc.categorical_column_with_hash_bucket("colour", 7),
      fc.categorical_column_with_hash_bucket("code", 5, dtype=tf.int64),
      fc.categorical_column_with_hash_bucket("tags", 11),
      fc.categorical_column_with_vocabulary_list("colour", VOCABULARY, num_oov_buckets=3),
      fc.categorical_column_with_vocabulary_list("colour", VOCABULARY),  # OOV: -1.
      fc.categorical_column_with_vocabulary_list("colour", VOCABULARY, default_value=1),
      fc.categorical_column_with_vocabulary_list("code", [3, 12, 0], dtype=tf.int64,
                                                 num_oov_buckets=4),
      tags,
      fc.categorical_column_with_vocabulary_file("colour", _vocabulary_file(tmp_path),
                                                 vocabulary_size=4, num_oov_buckets=2),
      fc.categorical_column_with_vocabulary_file("tags", _vocabulary_file(tmp_path),
                                                 vocabulary_size=3),
      fc.categorical_column_with_identity("codes", 10),
      fc.categorical_column_with_identity("code", 10, default_value=0),
      fc.bucketized_column(num, BOUNDARIES),
      fc.bucketized_column(fc.numeric_column("pair", shape=2), [0.5]),
      fc.crossed_column(["colour", fc.bucketized_column(num, BOUNDARIES)], 50),
      fc.crossed_column(["colour", "tags"], 40),  # Sparse first: the order changes.
      fc.crossed_column([tags, "colour"], 40, hash_key=7),
      fc.crossed_column([fc.crossed_column(["colour", "code"], 9), "tags"], 30),
      fc.weighted_categorical_column(tags, "tag_weight"),
  ]


def _run(build, before=()):
  """What `build(features)` gives in a graph and session, as the Estimator runs it (after
  the ops `before` holds by then, run first), and the graph's variables."""
  with tf.Graph().as_default() as graph:
    graph.seed = 0  # Other tests may have turned op determinism on, which asks for one.
    features = _features()
    result = build(features)
    with tf.compat.v1.Session(graph=graph) as session:
      session.run([tf.compat.v1.global_variables_initializer(),
                   tf.compat.v1.tables_initializer()])
      session.run(list(before))
      return session.run(result), {v.name: session.run(v) for v in
                                   tf.compat.v1.global_variables()}


def _column_ids(column, features):
  pair = column.get_sparse_tensors(fc_v2.FeatureTransformationCache(features), None)
  return {"ids": pair.id_tensor, **({} if pair.weight_tensor is None else
                                    {"weights": pair.weight_tensor})}


def _same_sparse(twin, column, what):
  np.testing.assert_array_equal(twin.indices.numpy(), column.indices, err_msg=what)
  np.testing.assert_array_equal(twin.values.numpy(), column.values, err_msg=what)
  np.testing.assert_array_equal(twin.dense_shape.numpy(), column.dense_shape, err_msg=what)


def test_each_categorical_twin_gives_the_columns_ids(tmp_path):
  for column in _categorical(tmp_path):
    want, _ = _run(lambda features, c=column: _column_ids(c, features))
    twin = columns.ids(column)(_features())
    _same_sparse(twin.ids, want["ids"], column.name)
    if "weights" in want:
      _same_sparse(twin.weights, want["weights"], column.name)
    else:
      assert twin.weights is None, column.name


def test_the_twins_move_what_keras_layers_place_elsewhere(tmp_path):
  """The cases the twins exist for, spelled out: OOV after the vocabulary, -1 where a
  column has no OOV bucket, the empty string missing, sparse inputs crossed first."""
  features = _features()
  oov = columns.ids(fc.categorical_column_with_vocabulary_list(
      "colour", VOCABULARY, num_oov_buckets=3))(features).ids.values.numpy()
  # "" is missing; red, blue and green keep their places; teal and plum go after them.
  assert list(oov[[0, 2, 3]]) == [0, 2, 1] and min(oov[[1, 4]]) >= len(VOCABULARY)
  no_oov = columns.ids(fc.categorical_column_with_vocabulary_list(
      "colour", VOCABULARY))(features).ids.values.numpy()
  assert list(no_oov) == [0, -1, 2, 1, -1]

  def cross(keys):
    return columns.ids(fc.crossed_column(keys, 40))(features).ids.values.numpy()

  # Both sparse, the op keeps the order given: colour first, as HashedCrossing would take it.
  colour = tf.SparseTensor([[i, 0] for i in range(6)], tf.reshape(features["colour"], [-1]),
                           [6, 1])
  as_given = tf.sparse.cross_hashed([colour, features["tags"]], 40).values
  assert list(cross(["colour", "tags"])) == list(cross(["tags", "colour"]))
  assert list(cross(["colour", "tags"])) != list(as_given.numpy())


def _dense_groups(tmp_path, dimension, combiner):
  """Groups of dense columns, each group's names unique as DenseFeatures insists: every
  indicator and embedding alone, the shared embeddings together, and a group out of order
  of names (DenseFeatures sorts them)."""
  categorical = _categorical(tmp_path)
  groups = [[fc.indicator_column(c)] for c in categorical]
  groups += [[fc.embedding_column(c, dimension, combiner=combiner)]
             for c in categorical[:4] + categorical[7:]]
  tags = fc.categorical_column_with_vocabulary_list("tags", VOCABULARY, num_oov_buckets=3)
  groups.append(fc.shared_embeddings([categorical[3], tags], dimension, combiner=combiner))
  groups.append([fc.numeric_column("pair", shape=2, normalizer_fn=lambda x: x * 2 - 1),
                 fc.bucketized_column(fc.numeric_column("pair", shape=2), [0.5]),
                 fc.embedding_column(categorical[10], dimension, combiner=combiner),
                 fc.numeric_column("num")])
  return groups


@pytest.mark.parametrize("dimension,combiner", [(3, "mean"), (2, "sqrtn"), (4, "sum")])
def test_the_dense_twin_is_dense_features(tmp_path, dimension, combiner):
  made = []

  def dense_features(features):
    # Shared embeddings exist only in a graph: every column is made in it.
    made.extend(_dense_groups(tmp_path, dimension, combiner))
    results = []
    for group in made:
      before = set(tf.compat.v1.global_variables())
      dense = tf.keras.layers.DenseFeatures(group)(features)
      # A shared table is the graph's, not the layer's: found as what the call made.
      results.append((dense, sorted(set(tf.compat.v1.global_variables()) - before,
                                    key=lambda v: v.name)))
    return results

  want, _ = _run(dense_features)
  tf.random.set_seed(0)  # The tables' initializers draw; their values are then set.
  features = _features()
  for group, (dense, tables) in zip(made, want):
    twin = columns.DenseFeaturesTwin(group)
    twin(features)
    assert len(twin.weights) == len(tables), group
    for mine, value in zip(sorted(twin.weights, key=lambda v: v.name), tables):
      mine.assign(value)  # Both sorted by the columns' names.
    np.testing.assert_allclose(twin(features).numpy(), dense, rtol=1e-6, atol=1e-7,
                               err_msg=str([c.name for c in group]))


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_the_linear_twin_is_the_canned_linear_model(tmp_path, combiner):
  from tensorflow_estimator.python.estimator.canned import linear  # noqa: PLC0415
  categorical = _categorical(tmp_path)
  # Every kind once, names unique as LinearModel insists.
  model_columns = [categorical[i] for i in (3, 6, 7, 10, 12, 13, 14, 15, 17, 18)] + [
      fc.numeric_column("pair", shape=2), fc.indicator_column(categorical[0]),
      fc.embedding_column(categorical[2], 3, combiner="mean")]
  rng = np.random.default_rng(0)

  assigned = []

  def canned(features):
    model = linear.LinearModel(model_columns, units=4, sparse_combiner=combiner)
    logits = model(features)
    assigned.extend(v.assign(rng.normal(size=v.shape).astype(np.float32))
                    for v in model.variables)
    return logits

  want, variables = _run(canned, assigned)
  tf.random.set_seed(0)
  twin = columns.LinearModelTwin(model_columns, units=4, sparse_combiner=combiner)
  features = _features()
  twin(features)
  mine = {v.name: v for v in twin.weights}
  assert sorted(mine) == sorted(variables)
  for name, value in variables.items():
    mine[name].assign(value)
  np.testing.assert_allclose(twin(features).numpy(), want, rtol=1e-6, atol=1e-6)


def test_a_column_without_a_twin_or_its_data_is_named(tmp_path):
  sequence = fc.sequence_categorical_column_with_identity("codes", 10)
  with pytest.raises(columns.ColumnError, match="sequence column"):
    columns.ids(sequence)
  missing = fc.categorical_column_with_vocabulary_file("colour", str(tmp_path / "none.txt"),
                                                       vocabulary_size=3)
  with pytest.raises(columns.ColumnError, match="none.txt does not exist"):
    columns.ids(missing)
  with pytest.raises(columns.ColumnError, match="no 'size'"):
    columns.ids(fc.categorical_column_with_hash_bucket("size", 3))(_features())
