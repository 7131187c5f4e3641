"""The docs name tests that exist: every `tests/<path>.py` (and `::test_name`) a page cites."""

import ast
import re

import pytest

from tests.conftest import REPO

PAGES = [REPO / "README.md", REPO / "WORKSPACE.md", *sorted((REPO / "docs").glob("*.md"))]


def _defines(path, name) -> bool:
  return any(isinstance(n, ast.FunctionDef) and n.name == name
             for n in ast.walk(ast.parse(path.read_text())))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_test_a_page_cites_exists(page):
  missing = [m.group(0) for m in re.finditer(r"(tests/[\w/]+\.py)(?:::(\w+))?", page.read_text())
             if not (REPO / m.group(1)).exists()
             or m.group(2) and not _defines(REPO / m.group(1), m.group(2))]
  assert not missing, f"{page.name} cites tests that do not exist: {missing}"


def _top_level_names(path) -> set:
  tree = ast.parse(path.read_text())
  names = set()
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      names |= {t.id for t in targets if isinstance(t, ast.Name)}
  return names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_code_name_a_page_cites_by_path_exists(page):
  """`trainers/keras_trainer.py:StepsCallback`: the module exists and defines the name."""
  cited = re.finditer(r"((?:trainers|launch|data)/[\w/]+\.py):([A-Za-z_]\w*)", page.read_text())
  missing = [m.group(0) for m in cited
             if not (REPO / m.group(1)).exists()
             or m.group(2) not in _top_level_names(REPO / m.group(1))]
  assert not missing, f"{page.name} cites code that does not exist: {missing}"


def _marked_extended(decorators) -> bool:
  """Whether a decorator list (or a pytestmark value) holds `pytest.mark.extended` itself,
  not only inside one of its parameters' marks."""
  return any(isinstance(d, ast.Attribute) and d.attr == "extended" for d in decorators)


def _extended_only(path, name) -> bool:
  """Whether the default run (`-m 'not extended'`, pyproject.toml) deselects test `name`."""
  tree = ast.parse(path.read_text())
  for node in tree.body:
    if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark"
                                            for t in node.targets):
      value = node.value
      if _marked_extended(value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]):
        return True
  return any(isinstance(n, ast.FunctionDef) and n.name == name
             and _marked_extended(n.decorator_list) for n in ast.walk(tree))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_test_a_page_cites_runs_in_ci_or_is_said_to_be_extended(page):
  """A test CI deselects (marked extended) is cited only beside the words "extended run"."""
  text = page.read_text()
  unrun = [m.group(0) for m in re.finditer(r"(tests/[\w/]+\.py)::(\w+)", text)
           if (REPO / m.group(1)).exists() and _extended_only(REPO / m.group(1), m.group(2))
           and "extended run" not in text[max(0, m.start() - 300):m.end() + 300]]
  assert not unrun, (f"{page.name} cites tests the CI run deselects (pytest.mark.extended), "
                     f"without saying \"extended run\" beside them: {unrun}")
