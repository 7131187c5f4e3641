"""trainers.model_registry: --model names a built-in or a user's spec; bad ones say the fix."""

import subprocess
import sys
from fractions import Fraction

import pytest

from tests.conftest import REPO, run_module
from trainers import model_registry
from trainers.model_registry import SpecError


@pytest.mark.parametrize("name, said", [
    ("resnet", "unknown model 'resnet'"),
    ("my_pkg.models", "unknown model 'my_pkg.models'"),
    ("my_pkg.models:", "unknown model"),
    ("no_such_package_here.models:SPEC", "no module no_such_package_here.models"),
])
def test_a_name_that_finds_no_spec_says_which_forms_work(name, said):
  with pytest.raises(SpecError, match=said) as e:
    model_registry.check(name, "")
  assert "cnn, cnn_bn" in str(e.value) or "PYTHONPATH" in str(e.value)


def test_the_built_in_names_are_found_without_importing_tensorflow():
  # In a fresh process: this one may have imported TensorFlow already.
  code = ("import sys\nfrom trainers import model_registry\n"
          "for name in model_registry.BUILT_IN:\n  model_registry.check(name, '')\n"
          "print('tensorflow' in sys.modules)")
  result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)
  assert result.stdout.strip() == "False", result.stderr[-2000:]


def test_a_users_spec_loads_and_each_way_it_can_be_wrong_is_named(tmp_path, monkeypatch):
  (tmp_path / "team_models.py").write_text(
      "import fractions\nSPEC = fractions.Fraction(1, 2)\nOTHER = 3\n")
  (tmp_path / "broken_models.py").write_text("import not_installed_anywhere\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  # A Fraction stands in for trainers.model.ModelSpec: load only checks the type.
  assert model_registry.load("team_models:SPEC", Fraction) == Fraction(1, 2)
  with pytest.raises(SpecError, match="team_models has no MISSING"):
    model_registry.load("team_models:MISSING", Fraction)
  with pytest.raises(SpecError, match="is a int, not a trainers.model.ModelSpec"):
    model_registry.load("team_models:OTHER", Fraction)
  with pytest.raises(SpecError, match="importing broken_models failed: ModuleNotFoundError"):
    model_registry.load("broken_models:SPEC", Fraction)


def test_options_are_numbers_by_name_and_keep_their_defaults_type():
  known = {"dropout": 0.25, "width": 64}
  assert model_registry.parse_options("dropout=0, width=32", known, "model m") == {
      "dropout": 0.0, "width": 32}
  assert isinstance(model_registry.parse_options("width=32", known, "model m")["width"], int)
  assert model_registry.parse_options("", known, "model m") == {}
  with pytest.raises(SpecError, match="model m has no option 'depth'; its options are "
                                      "dropout=0.25, width=64"):
    model_registry.parse_options("depth=2", known, "model m")
  with pytest.raises(SpecError, match="width of model m is a whole number"):
    model_registry.parse_options("width=2.5", known, "model m")
  for bad in ("dropout", "dropout=high", "=1"):
    with pytest.raises(SpecError, match="is not NAME=NUMBER"):
      model_registry.check("cnn", bad)


@pytest.mark.parametrize("args, said", [
    (["--model=resnet"], "unknown model 'resnet'"),
    (["--model=cnn_bn", "--model_options=depth=3"], "model cnn_bn has no option 'depth'"),
])
def test_the_trainer_binary_exits_2_naming_the_fix(args, said, tmp_path):
  result = run_module("trainers.keras_main", [*args, "--train_steps=2",
                                              f"--model_dir={tmp_path / 'run'}"])
  assert result.returncode == 2, result.stderr[-2000:]
  assert said in result.stderr and "Traceback" not in result.stderr
  assert not (tmp_path / "run").exists()
