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
