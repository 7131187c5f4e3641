"""launch.proofs.migration: the steps planned, each tool run and its reports read, the verdict
and the report. The whole command on the example program: tests/test_team_program.py."""

import dataclasses
import html.parser
import json
import os
import re
import sys

import pytest

from launch.proofs import migration
from tests.conftest import run_module

pytestmark = pytest.mark.quick

RECIPE = ["--estimator_program=team_program:PROGRAM", "--model=team_port:SPEC"]


def test_the_plan_runs_what_applies_in_order():
  inputs = migration.Inputs(RECIPE, [1, 2], data_dir="/d", estimator_program="team_program:PROGRAM")
  assert [s.name for s in migration.plan(inputs)] == ["parity", "handoff"]
  parity, handoff = migration.plan(inputs)
  assert parity.args == ["--workers=1,2", *RECIPE, "--train_steps=10", "--data_dir=/d"]
  assert "--split_at=10" in handoff.args and "--train_steps=20" in handoff.args
  assert parity.runs == 8  # Each backend's short and long run, at each worker count.
  short = migration.plan(dataclasses.replace(inputs, long_steps=0))[0]
  assert "--long_steps=0" in short.args and short.runs == 4
  theirs = migration.Inputs(RECIPE, [1], export_dir="/theirs",
                            estimator_program="team_program:PROGRAM")
  steps = migration.plan(theirs)
  assert [s.name for s in steps] == ["parity", "serving", "handoff"]
  assert steps[1].port_export and steps[1].args == [
      "--first=/theirs", "--estimator_program=team_program:PROGRAM", "--contract_only"]
  newest = migration.plan(dataclasses.replace(theirs, keras_python="/new/python"))
  assert [s.name for s in newest] == ["parity", "serving", "handoff", "version parity"]
  assert newest[-1].module == "launch.version_parity" and newest[-1].args == [
      "--keras_python=/new/python", "--workers=1", *RECIPE, "--train_steps=10"]


def test_a_model_dir_is_inspected_first_with_the_ports_flags(tmp_path):
  given = tmp_path / "map.json"
  given.write_text("{}")
  inputs = migration.Inputs([*RECIPE, "--optimizer=adam", f"--assignment_map={given}"], [1],
                            model_dir="/theirs", estimator_program="team_program:PROGRAM")
  inspect, *rest = migration.plan(inputs)
  assert [s.name for s in rest] == ["parity", "handoff"]
  # The handoff from their newest checkpoint, at its own step.
  assert rest[1].args == ["--workers=1", *inputs.recipe, "--from_model_dir=/theirs"]
  assert inspect.inspects and inspect.given_map == str(given) and inspect.args == [
      "--inspect=/theirs", "--inspect_format=json", *RECIPE]


FOUND = {"assignment_map": {"dense/kernel": "hidden/kernel", "dense/bias": "hidden/bias"},
         "matched_by": {"dense/kernel": "shape (guess)", "dense/bias": "name"}, "unfilled": []}


@pytest.mark.parametrize("given, passed, where", [
    (None, False, "guessed by shape: dense/kernel: review {}/proposed_map.json and give it as "
     "--assignment_map"),
    ({"dense/kernel": "hidden/kernel", "dense/bias": "hidden/bias"}, True, "it is the proposal"),
    ({"dense/kernel": "other/kernel", "dense/bias": "hidden/bias"}, True,
     "it differs from the proposal at dense/kernel"),
    ({"dense/kernel": "hidden/kernel"}, False, "not in {}/map.json: dense/bias"),
])
def test_an_inspection_passes_only_with_every_name_placed(given, passed, where, tmp_path):
  (tmp_path / migration.INSPECTION).write_text(json.dumps(FOUND))
  if given is not None:
    (tmp_path / "map.json").write_text(json.dumps(given))
  migration.write_inspection_report(str(tmp_path), given and str(tmp_path / "map.json"))
  report = json.loads((tmp_path / "inspect_report.json").read_text())
  assert report["passed"] == passed and report["guessed"] == ["dense/kernel"]
  assert report["checks"][0]["passed"] and report["checks"][1]["where"] == where.format(tmp_path)
  assert json.loads((tmp_path / migration.PROPOSED_MAP).read_text()) == FOUND["assignment_map"]


# A tool as the migration runs it: writes a report with one check per --check flag (name=ok),
# and exits 1 if one failed.
FAKE_TOOL = '''
import json, os, sys
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if "=" in a)
checks = [{"name": n, "passed": ok == "ok", "limit": 1.0, "measured": 0.5, "where": "a|b"}
          for n, ok in (a[8:].split(":") for a in sys.argv[1:] if a.startswith("--check="))]
os.makedirs(os.path.join(args["out"], "workers-1"))
with open(os.path.join(args["out"], "workers-1", "fake_report.json"), "w") as f:
  json.dump({"passed": all(c["passed"] for c in checks), "checks": checks}, f)
with open(os.path.join(args["out"], "workers-1", "loss_curves.png"), "wb") as f:
  f.write(b"\\x89PNG not really")
print("I1129 13:32:09.101493 140503740128128 harness.py:127] Training short/keras.")
print("I1129 13:32:19.101493 140503740128128 harness.py:134] Trained short/keras in 10 s.")
print("line one\\nthe last line")
sys.exit(0 if all(c["passed"] for c in checks) else 1)
'''


def _run(tmp_path, name, *checks, said=None, runs=0):
  (tmp_path / "fake_tool.py").write_text(FAKE_TOOL)
  step = migration.Step(name, "proves it", "fake_tool", [f"--check={c}" for c in checks],
                        runs=runs)
  return migration.run_step(step, str(tmp_path / "out"), timeout=60,
                            env={"PYTHONPATH": str(tmp_path)},
                            say=(said if said is not None else []).append)


class _Page(html.parser.HTMLParser):
  """What a browser would need besides the page (none may be remote), and whether every
  element that must close does."""

  VOID = {"meta", "img", "br", "hr", "link", "input"}

  def __init__(self):
    super().__init__()
    self.open, self.sources, self.text, self.headings = [], [], [], []

  def handle_starttag(self, tag, attrs):
    self.sources += [v for k, v in attrs if k in ("src", "href")]
    self.headings += [""] if tag == "h1" else []
    if tag not in self.VOID:
      self.open.append(tag)

  def handle_endtag(self, tag):
    assert self.open and self.open.pop() == tag, (tag, self.open)

  def handle_data(self, data):
    self.text.append(data)
    if "h1" in self.open:
      self.headings[-1] += data


def test_each_step_is_its_tools_exit_code_and_checks(tmp_path):
  (tmp_path / "out").mkdir()
  said = []
  passed = _run(tmp_path, "parity", "weights:ok", "losses:ok", said=said, runs=4)
  assert passed.passed and passed.exit_code == 0 and passed.said == ""
  # Its log lines, as they come, and after each run it finished, its progress.
  assert said[:2] == ["    parity: Training short/keras.",
                      "    parity: Trained short/keras in 10 s."]
  assert len(said) == 3 and re.fullmatch(
      r"    parity: \[#####---------------\] 1/4 runs, \d+ s", said[2]), said
  assert [c["name"] for c in passed.checks] == ["weights", "losses"]
  assert passed.checks[0]["report"] == "workers-1" and passed.command[:3] == [
      sys.executable, "-m", "fake_tool"]
  assert (tmp_path / "out" / "parity" / "log.txt").read_text().endswith("the last line\n")
  failed = _run(tmp_path, "handoff", "weights:ok", "resumed weights:bad")
  assert not failed.passed and failed.failed_checks == ["resumed weights"]
  assert failed.said.endswith("the last line")  # The end of its log, in the report.
  skipped = migration.Outcome("serving", "proves it", [])
  judged = migration.write_report([passed, failed, skipped], str(tmp_path / "out"),
                                  migration.Inputs(RECIPE, [1]))
  assert judged == {"verdict": migration.NOT_YET, "why": [
      "handoff: 1 check(s) failed: resumed weights",
      "serving: not run (a step before it failed)"]}
  record = json.loads((tmp_path / "out" / "migration_report.json").read_text())
  assert record["verdict"] == migration.NOT_YET
  assert [(s["step"], s["passed"]) for s in record["steps"]] == [
      ("parity", True), ("handoff", False), ("serving", False)]
  markdown = (tmp_path / "out" / "migration_report.md").read_text()
  assert markdown.startswith("# Migration check: **do not switch yet**\n\nWhy not yet:")
  # A cell's pipes escaped, so the table keeps its columns.
  assert "| workers-1 | resumed weights | 1 | 0.5 | a\\|b | NO |" in markdown
  assert "| serving | not run | 0 | 0 |" in markdown
  # The page: the verdict first, every element closed, nothing fetched but inline images
  # (and in a real browser: test_the_page_renders_in_a_headless_browser_...).
  page = _Page()
  page.feed((tmp_path / "out" / "migration_report.html").read_text())
  page.close()
  assert page.open == [] and page.headings == ["Migration check: do not switch yet"]
  assert page.sources and all(src.startswith("data:image/png;base64,") for src in page.sources)
  text = "".join(page.text)
  assert "resumed weightsa|b" not in text and "a|b" in text  # Cells, not escaped.
  assert migration.verdict([passed])["verdict"] == migration.SWITCH
  assert migration.verdict([])["verdict"] == migration.NOT_YET  # Nothing proved.


def test_the_ports_export_is_found_in_paritys_short_run(tmp_path):
  model_dir = tmp_path / "parity" / "workers-1" / "short" / "keras" / "model"
  model_dir.mkdir(parents=True)
  (model_dir / "summary.json").write_text(json.dumps({"export_dir": "/x/export/1"}))
  parity = migration.Outcome("parity", "", [], exit_code=0, out_dir=str(tmp_path / "parity"))
  assert migration.port_export([parity]) == "/x/export/1"
  assert migration.port_export([migration.Outcome("parity", "", [])]) is None


@pytest.mark.parametrize("args, message", [
    (["--model=team_port:SPEC"], "--estimator_program is the program to migrate from"),
    (["--estimator_program=team_program:PROGRAM"], "--model is the Keras port to migrate to"),
    (["--estimator_program=p:P", "--model=m:S", "--export_dir=/no/such/export"],
     "--export_dir=/no/such/export is not a directory: give the export your clients call"),
    (["--estimator_program=p:P", "--model=m:S", "--keras_python=/no/python"],
     "--keras_python=/no/python is not a program: give the python of your newest-TF install"),
    (["--estimator_program=p:P", "--model=m:S"], "is not empty: give a new directory"),
])
def test_cli_refuses_bad_flags_naming_the_fix_and_writes_nothing(args, message, tmp_path):
  out = tmp_path / "out"
  out.mkdir()
  kept = out / "earlier_report.md"
  kept.write_text("kept")
  result = run_module("launch.migrate", [*args, f"--out={out}"])
  assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
  assert "Traceback" not in result.stderr
  assert os.listdir(out) == ["earlier_report.md"] and kept.read_text() == "kept"


def test_the_report_names_the_newest_stack_version_parity_ran_the_port_in(tmp_path):
  (tmp_path / "version_parity").mkdir()
  (tmp_path / "version_parity" / "version_parity_report.json").write_text(json.dumps(
      {"versions": {"new": "TensorFlow 2.21.0, tf-keras 2.21.0", "2.15": "..."}}))
  migration.write_report([], str(tmp_path), migration.Inputs(RECIPE, [1]))
  record = json.loads((tmp_path / "migration_report.json").read_text())
  assert record["versions"]["newest stack (version parity)"] == (
      "TensorFlow 2.21.0, tf-keras 2.21.0")
  assert "<td>TensorFlow 2.21.0, tf-keras 2.21.0</td>" in (
      tmp_path / "migration_report.html").read_text()


def _browser():
  """Headless Chromium through Selenium; skipped, saying how to install it, where it is not
  installed (CI installs it and sets REQUIRE_BROWSER=1: there it must run)."""
  import shutil  # noqa: PLC0415
  why = ("needs Debian's chromium and chromium-driver (apt-get install chromium "
         "chromium-driver) and selenium (pip install -e \".[test]\")")
  try:
    from selenium import webdriver  # noqa: PLC0415
  except ImportError:
    webdriver = None
  if webdriver is None or not shutil.which("chromedriver") or not shutil.which("chromium"):
    (pytest.fail if os.environ.get("REQUIRE_BROWSER") == "1" else pytest.skip)(why)
  options = webdriver.ChromeOptions()
  for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
    options.add_argument(arg)
  options.binary_location = shutil.which("chromium")
  return webdriver.Chrome(options=options, service=webdriver.ChromeService(
      executable_path=shutil.which("chromedriver")))


def test_the_page_renders_in_a_headless_browser_with_its_plots_and_prints(tmp_path):
  import base64  # noqa: PLC0415
  import matplotlib  # noqa: PLC0415
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # noqa: PLC0415

  browser = _browser()
  (tmp_path / "out" / "parity").mkdir(parents=True)
  fig = plt.figure(figsize=(4, 3))
  fig.subplots().plot([1, 2, 3], [2.0, 1.5, 1.2])
  fig.savefig(tmp_path / "out" / "parity" / "loss_curves.png")
  plt.close(fig)
  parity = migration.Outcome("parity", "proves it", ["python", "-m", "launch.parity"],
                             exit_code=0, seconds=3.0, out_dir=str(tmp_path / "out" / "parity"),
                             checks=[{"name": "weights", "passed": True, "report": "",
                                      "limit": 1e-6, "measured": 0.0, "where": "conv/kernel"}])
  migration.write_report([parity], str(tmp_path / "out"), migration.Inputs(RECIPE, [1]))
  try:
    browser.get((tmp_path / "out" / "migration_report.html").as_uri())
    assert browser.title == "Migration check: switch"
    assert browser.find_element("tag name", "h1").text == "Migration check: switch"
    # Every plot decoded and drawn; nothing fetched from anywhere (the page is one file).
    images = browser.execute_script(
        "return Array.from(document.images, i => [i.complete, i.naturalWidth, i.alt])")
    assert images == [[True, 400, "loss_curves.png"]]
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    pdf = base64.b64decode(browser.print_page())  # As printed, by the browser.
    assert pdf.startswith(b"%PDF") and b"/Type /Page" in pdf
  finally:
    browser.quit()
