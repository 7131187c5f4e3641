"""trainers.models.tabular: the built-in columns read only the tabular features, every
kind a census model has, and each part's columns have Keras twins."""

from data.mnist import tabular as table
from trainers import columns
from trainers.models import tabular


def test_the_columns_read_the_tabular_features_and_have_twins():
  kinds = set()
  for part, part_columns in tabular.COLUMNS.items():
    assert part in ("linear", "dnn")
    for column in part_columns:
      kinds.add(type(column).__name__)
      assert set(column.parse_example_spec) <= set(table.FEATURES), column.name
      (columns.ids if part == "linear" and hasattr(column, "num_buckets")
       and type(column).__name__ != "NumericColumn" else columns.dense)(column)
  assert {"BucketizedColumn", "VocabularyListCategoricalColumn", "HashedCategoricalColumn",
          "CrossedColumn", "WeightedCategoricalColumn", "NumericColumn", "IndicatorColumn",
          "EmbeddingColumn"} <= kinds
