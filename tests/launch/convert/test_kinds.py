"""launch.convert.kinds: the vocabulary prints, compares and serializes as its words."""

import json

from launch.convert.kinds import Kind


def test_a_kind_reads_as_its_word_in_tables_json_and_comparisons():
  assert f"({Kind.WEIGHT})" == "(weight)" and f"{Kind.SLOT:<6}|" == "slot  |"
  assert str(Kind.PART_STEP) == "part step" and Kind.COUNTER + " of" == "counter of"
  assert json.dumps({"kind": Kind.HYPERPARAMETER}) == '{"kind": "hyperparameter"}'
  assert Kind.STEP == "step" and Kind("unmapped") is Kind.UNMAPPED
  assert len({kind.value for kind in Kind}) == len(Kind)
