"""launch.proofs.harness: runs by name, the comparisons every verification tool makes, reports."""

import json

import numpy as np
import pytest
import tensorflow as tf

from launch.proofs import harness
from trainers import model as model_lib
from trainers.config import Config


def test_prepared_runs_start_from_one_weights_file_with_op_determinism(tmp_path):
  config = harness.prepare(Config(seed=3), str(tmp_path))
  assert config.deterministic and config.init_weights == str(tmp_path / harness.INIT_WEIGHTS_FILE)
  saved = model_lib.load_weights_npz(config.init_weights)
  built = model_lib.get_weights(model_lib.build(Config(seed=3)))
  assert saved.keys() == built.keys()
  assert all((saved[name] == built[name]).all() for name in saved)


def test_comparisons_pass_within_their_limits_and_name_the_worst_case():
  ones = {"w": np.ones(3), "b": np.zeros(1)}
  off = {"w": np.array([1.0, 1.5, 1.0]), "b": np.zeros(1)}
  checks = harness.compare_runs({"x": ones, "y": off, "z": ones},
                                {"x": [1.0, 2.0], "y": [1.0, 2.2], "z": [1.0, 2.0]},
                                weight_atol=1e-6, loss_rtol=1e-5)
  by_name = {c.name: c for c in checks}
  assert by_name["variable mapping"].passed
  assert by_name["max |weight diff| x vs z"].passed
  worst = by_name["max |weight diff| x vs y"]
  # Relative to 1.5: above 1 in magnitude.
  assert not worst.passed and worst.measured == 0.5 / 1.5 and worst.where == "variable w"
  loss = by_name["per-step loss rel diff x vs y"]
  assert not loss.passed and loss.where == "step 2"
  table = harness.format_checks("T", checks)
  assert table.endswith(f"Overall: FAIL ({sum(c.passed for c in checks)}/{len(checks)} checks)")
  # Every row keeps its five columns when rendered: the pipes in a name are escaped.
  assert "| max \\|weight diff\\| x vs y | FAIL |" in table
  for row in table.splitlines()[1:-1]:
    assert len(row.replace("\\|", "").split("|")) == 7, row
  renamed = harness.named(checks, lambda name: f"{name} at 2 worker(s)")
  assert renamed[0].name == "variable mapping at 2 worker(s)"


def test_unequal_step_counts_fail_the_loss_check():
  (check,) = harness.compare_losses({"a": [1.0, 2.0], "b": [1.0]}, 1e-5, "loss")
  assert not check.passed and check.where == "different or zero step counts"


def test_the_report_is_written_as_a_table_json_and_a_plot(tmp_path):
  import dataclasses  # noqa: PLC0415

  @dataclasses.dataclass
  class Report:
    checks: list
    losses: dict

    @property
    def passed(self):
      return all(c.passed for c in self.checks)

  report = Report([harness.Check("c", True, 0.0, 1.0)], {"run": [2.0, 1.0]})
  harness.write_report(str(tmp_path), "some_tool", report, "TABLE")
  assert (tmp_path / "some_tool_report.md").read_text() == "# Some tool report\n\nTABLE\n"
  assert json.loads((tmp_path / "some_tool_report.json").read_text())["passed"] is True
  assert (tmp_path / "loss_curves.png").stat().st_size > 1000
  assert sorted(p.name for p in tmp_path.iterdir()) == [
      "loss_curves.png", "some_tool_report.json", "some_tool_report.md"]


def test_a_report_is_replaced_whole_or_kept_as_it_was(tmp_path, monkeypatch):
  harness.write_files(str(tmp_path), {"a.md": "old"})
  harness.write_files(str(tmp_path), {"a.md": "new", "a.json": "{}"})
  assert (tmp_path / "a.md").read_text() == "new" and (tmp_path / "a.json").read_text() == "{}"

  def no_space(*args):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(harness.os, "replace", no_space)  # The write stops before the rename.
  with pytest.raises(OSError, match="No space"):
    harness.write_files(str(tmp_path), {"a.md": "newer"})
  assert (tmp_path / "a.md").read_text() == "new"


def test_an_extra_variable_on_either_side_fails_the_mapping(tmp_path):
  """backend_weights reads every variable of the Estimator checkpoint, not the reference's names."""
  with tf.Graph().as_default():
    model_lib.build(Config(seed=0))
    # A seed-free initializer: an earlier in-process test may have turned op determinism on.
    tf.compat.v1.get_variable("extra/kernel", shape=[2, 2],
                              initializer=tf.compat.v1.zeros_initializer())
    tf.compat.v1.train.get_or_create_global_step()
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      tf.compat.v1.train.Saver().save(session, str(tmp_path / "model.ckpt"), global_step=1)
  estimator = harness.backend_weights("estimator", {"model_dir": str(tmp_path)}, Config())
  assert "extra/kernel" in estimator and "global_step" not in estimator
  keras = model_lib.get_weights(model_lib.build(Config(seed=0)))
  for weights in ({"keras": keras, "estimator": estimator},
                  {"keras": {**keras, "extra/bias": np.zeros(2)}, "estimator": keras}):
    check = harness.check_mapping(weights)
    assert not check.passed and "extra/" in check.where


def test_weights_compare_absolutely_up_to_1_and_relatively_above():
  two_ulps_at_8 = np.nextafter(np.nextafter(np.float32(8), np.float32(9)), np.float32(9))
  base = {"variance": np.array([0.5, 8.0], np.float32)}
  rounded = {"variance": np.array([0.5, two_ulps_at_8], np.float32)}  # 1.9e-6 apart.
  moved = {"variance": np.array([0.5 + 2e-6, 8.0], np.float32)}
  (check,) = harness.compare_weights({"a": base, "b": rounded}, 1e-6)
  assert check.passed and check.measured < 3e-7, check
  (check,) = harness.compare_weights({"a": base, "b": moved}, 1e-6)
  assert not check.passed and check.where == "variable variance", check


def test_a_run_with_its_own_limit_is_held_to_it_against_every_other_run():
  base = {"w": np.array([0.0], np.float32)}
  off = {"w": np.array([5e-6], np.float32)}
  checks = {c.name: c for c in harness.compare_weights(
      {"reference": base, "keras": off, "estimator": off}, 1e-6, {"reference": 1e-5})}
  assert checks["max |weight diff| reference vs keras"].passed
  assert checks["max |weight diff| reference vs keras"].limit == 1e-5
  assert checks["max |weight diff| keras vs estimator"].limit == 1e-6
  # A run's own limit never loosens below the common one.
  (check,) = harness.compare_weights({"reference": base, "keras": off}, 1e-6, {"reference": 0.0})
  assert not check.passed and check.limit == 1e-6


def test_tables_on_the_terminal_fit_100_columns_and_keep_every_cell():
  checks = [harness.Check("max |weight diff| keras vs estimator", True, 0.0, 1e-6,
                          "variable conv/kernel"),
            harness.Check("signatures required", False, 3, 4, ", ".join(["'serving_default'"] * 9))]
  shown = harness.for_terminal(harness.format_checks("Title", checks))
  lines = shown.splitlines()
  assert lines[0] == "Title" and lines[-1] == "Overall: FAIL (1/2 checks)"
  assert lines[1] == ("PASS  max |weight diff| keras vs estimator: 0 (limit 1e-06), variable "
                      "conv/kernel")
  assert lines[2].startswith("FAIL  signatures required: 3 (limit 4), 'serving_default'")
  assert lines[3].startswith(" " * 6) and max(map(len, lines)) <= 100
  narrow = "| model | workers | ms |\n| --- | --- | --- |\n| keras | 2 | 10.5 |"
  assert harness.for_terminal(narrow).splitlines() == [
      "model  workers  ms", "-----  -------  ----", "keras  2        10.5"]
  wide = "| " + " | ".join(f"column {i}" for i in range(12)) + " |\n" + "| --- " * 12 + "|\n" \
      + "| " + " | ".join(f"value {i}" for i in range(12)) + " |"
  rows = harness.for_terminal(wide).splitlines()
  assert rows[0] == "value 0" and rows[1].startswith("    column 1: value 1; column 2: value 2")
  assert max(map(len, rows)) <= 100 and "column 11: value 11" in " ".join(rows)
