"""The layers of WORKSPACE.md: each module imports only its own layer and those below it."""

import ast
import json
import pathlib
import re

import pytest

from tests.conftest import REPO, run_module

# Lowest first. A module's layer is the first pattern its path matches.
LAYERS = (
    ("contracts", ("launch/exit_codes.py",)),
    ("data", ("data/",)),
    ("launcher core", ("launch/cluster.py", "launch/supervisor.py", "launch/console.py",
                       "launch/netns.py", "launch/local.py", "launch/rendezvous.py",
                       "launch/restarts.py", "launch/zygote.py")),
    ("trainers", ("trainers/",)),
    ("engines", ("launch/ray/",)),
    ("user tools", ("launch/convert/", "launch/kube/")),
    ("proofs", ("launch/proofs/",)),
    ("benchmark", ("launch/bench/",)),
    ("tool binaries", ("launch/",)),
    ("tests", ("tests/",)),
)
# The launcher core starts tasks at once: it must not import TensorFlow (2 to 3 s);
# nor must launch.tfjob, which only writes YAML.
TF_FREE = ("launch/exit_codes.py", "data/mnist/__init__.py", "data/mnist/store.py",
           "data/mnist/ready.py", "data/mnist/idx.py", "launch/cluster.py", "launch/supervisor.py",
           "launch/console.py", "launch/netns.py", "launch/local.py", "launch/restarts.py",
           "launch/kube/tfjob.py", "launch/ray/record.py",
           "trainers/run_lock.py", "trainers/run_record.py", "launch/rendezvous.py",
           "trainers/model_registry.py", "trainers/config.py", "trainers/preemption.py",
           "launch/zygote.py")


def _layer(path: str) -> int:
  return next(i for i, (_, prefixes) in enumerate(LAYERS) if path.startswith(prefixes))


def _module_path(name: str) -> str:
  """The repository path of an imported project module, or '' if it is not ours."""
  parts = name.split(".")
  if parts[0] not in ("data", "launch", "trainers", "tests"):
    return ""
  for candidate in ("/".join(parts) + ".py", "/".join(parts) + "/__init__.py"):
    if (REPO / candidate).exists():
      return candidate
  return "/".join(parts) + "/"


def _imports(path: pathlib.Path):
  tree = ast.parse(path.read_text(), str(path))
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      yield node.module
      yield from (f"{node.module}.{alias.name}" for alias in node.names)


SOURCES = sorted(str(p.relative_to(REPO)) for d in ("data", "launch", "trainers", "tests")
                 for p in (REPO / d).rglob("*.py"))


@pytest.mark.parametrize("source", SOURCES)
def test_no_import_runs_up_a_layer(source):
  mine = _layer(source)
  for name in _imports(REPO / source):
    target = _module_path(name)
    if target and not target.endswith("/__init__.py") and target != source:
      assert _layer(target) <= mine, (f"{source} ({LAYERS[mine][0]}) imports {name} "
                                      f"({LAYERS[_layer(target)][0]})")


@pytest.mark.parametrize("source", TF_FREE)
def test_the_launcher_core_imports_no_tensorflow(source):
  for name in _imports(REPO / source):
    assert name.split(".")[0] not in ("tensorflow", "tf_keras", "tensorflow_datasets"), name


@pytest.mark.parametrize("source", [s for s in SOURCES if not s.startswith("tests/")])
def test_library_code_uses_tf_keras_not_the_tf_keras_alias(source):
  # From TF 2.16, tf.keras and `import keras` are Keras 3, which cannot train under
  # MultiWorkerMirroredStrategy (docs/MIGRATION.md, "Landing on TF 2.16+").
  text = (REPO / source).read_text()
  tree = ast.parse(text, source)
  for node in ast.walk(tree):
    assert not (isinstance(node, ast.Attribute) and node.attr == "keras" and
                isinstance(node.value, ast.Name) and node.value.id == "tf"), \
        f"{source}:{node.lineno} uses tf.keras; import tf_keras"
  assert not any(name.split(".")[0] == "keras" for name in _imports(REPO / source)), source


BINARIES = ({"data/prepare.py", "trainers/keras_main.py", "trainers/estimator_main.py",
             "launch/local.py"}
            | {s for s in SOURCES if s.endswith("/__main__.py")}
            | {s for s in SOURCES if s.count("/") == 1 and s.startswith("launch/")
               and _layer(s) == len(LAYERS) - 2})
# Tests of what no one module holds.
CROSS_CUTTING = {"tests/test_layers.py", "tests/test_loss.py", "tests/test_keras3.py",
                 "tests/test_multihost.py", "tests/test_outside_programs.py",
                 "tests/test_my_model.py", "tests/test_docs.py",
                 "tests/test_optimizer_step.py", "tests/test_team_program.py",
                 "tests/test_metrics_model.py"}


def test_every_library_module_has_its_test_file():
  """The tests mirror the tree: <dir>/<module>.py is tested in tests/<dir>/test_<module>.py;
  binaries (*_main.py, launch/<tool>.py, a package's __main__.py, data/prepare.py) are
  tested through theirs, by running them as users do."""
  missing = [s for s in SOURCES
             if not s.startswith("tests/") and not s.endswith("__init__.py")
             and s not in BINARIES and not (REPO / "tests" / _test_path(s)).exists()]
  assert not missing, f"no tests/<dir>/test_<module>.py for {missing}"


def _test_path(source: str) -> pathlib.Path:
  path = pathlib.Path(source)
  return path.parent / f"test_{path.name}"


def test_every_test_file_mirrors_a_module():
  tests = {s for s in SOURCES if pathlib.Path(s).name.startswith("test_")}
  mirrors = {str(pathlib.Path("tests") / _test_path(s)) for s in SOURCES
             if not s.startswith("tests/")}
  strays = sorted(tests - mirrors - CROSS_CUTTING)
  assert not strays, (f"test files that mirror no module (move each, or name it in "
                      f"CROSS_CUTTING): {strays}")


def test_the_quick_tier_tests_every_library_module():
  """`pytest -m quick` (docs/testing.md) runs at least one test of each library module,
  from its mirrored test file."""
  collected = run_module("pytest", ["--collect-only", "-q", "-m", "quick", "-p", "no:xdist"],
                         timeout=300)
  assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
  files = {line.split("::")[0] for line in collected.stdout.splitlines() if "::" in line}
  untested = [s for s in SOURCES
              if not s.startswith("tests/") and not s.endswith("__init__.py")
              and s not in BINARIES and str(pathlib.Path("tests") / _test_path(s)) not in files]
  assert not untested, ("library modules whose test file has no quick test (one not "
                        f"marked slow, real_data, chaos, multihost or extended): {untested}")


def test_a_regular_install_ships_every_package():
  """pip install . (not -e) installs what pyproject.toml's package list finds."""
  setuptools = pytest.importorskip("setuptools")
  include = re.search(r"^include = (\[[^\]]*\])", (REPO / "pyproject.toml").read_text(), re.M)
  found = set(setuptools.find_packages(str(REPO), include=json.loads(include.group(1))))
  packages = {str(p.parent.relative_to(REPO)).replace("/", ".")
              for d in ("data", "launch", "trainers") for p in (REPO / d).rglob("__init__.py")}
  assert packages <= found, f"not installed: {sorted(packages - found)}"
