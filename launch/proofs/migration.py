"""The migration check: the proof tools run one after the other on a team's program and its
Keras port, and one report of what they found, with a verdict (launch.migrate).

  steps = plan(Inputs(...))
  for step in steps:
    outcome = run_step(step, out_dir, timeout)   # The tool's own command, its JSON report.
  write_report(outcomes, out_dir, inputs)       # migration_report.{html,md,json}

Each step is a tool a team could run alone (`launch.convert --inspect`, `launch.parity`,
`launch.serving_check`, `launch.handoff`), run as a subprocess with its own --out under the
migration's; the report reads the JSON report each writes, so it says what the tool said,
check by check. It trains nothing itself.
"""

import base64
import contextlib
import dataclasses
import glob
import html
import importlib.metadata
import json
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, TextIO

from launch.proofs import harness
from trainers import model_dir as layout

REPORT = "migration_report"
INSPECTION, PROPOSED_MAP = "inspection.json", "proposed_map.json"  # In the inspect step's.
# The flags of launch.convert --inspect, of those every step is given.
_INSPECT_FLAGS = tuple(f"--{name}=" for name in ("model", "model_options", "estimator_program",
                                                  "program_params"))
SWITCH = "switch"
NOT_YET = "do not switch yet"
ALL_PASSED = ("Every step passed: the port trains, resumes and serves as the program does, on "
              "the evidence below.")
CHECK_COLUMNS = ["report", "check", "limit", "measured", "where", "pass"]


class Stopped(Exception):
  """SIGINT or SIGTERM to the migration (launch.migrate raises it from its handlers): the
  running step's tool is stopped, and the step reports it."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum


@dataclasses.dataclass(frozen=True)
class Inputs:
  """What the team gives: its program and port, the flags every training tool takes (the
  recipe, the map; `--name=value` each), and what of its own to check besides."""

  recipe: Sequence[str]  # --estimator_program, --model, --assignment_map, the optimizer's...
  workers: Sequence[int]
  data_dir: Optional[str] = None
  estimator_program: Optional[str] = None
  export_dir: Optional[str] = None  # Their export, which clients call today.
  model_dir: Optional[str] = None  # A model_dir their program wrote.
  train_steps: int = 10  # Of each run of parity's and the handoff's split.
  long_steps: Optional[int] = None  # Of parity's long run; None: parity's default, 0: none.
  keras_python: Optional[str] = None  # The newest-TF install's python: version parity.


@dataclasses.dataclass(frozen=True)
class Step:
  """One tool's run: what it proves, its command's module and flags (its --out added)."""

  name: str
  proves: str
  module: str
  args: Sequence[str]
  port_export: bool = False  # Also give it --second=<the port's export> (port_export()).
  inspects: bool = False  # launch.convert --inspect: its JSON on stdout, no --out.
  runs: int = 0  # The trainer runs its tool starts (its progress bar's length), if any.
  given_map: Optional[str] = None  # With `inspects`: the --assignment_map given, if any.


@dataclasses.dataclass
class Outcome:
  """What a step did: its command, exit code and time, and its reports' checks."""

  step: str
  proves: str
  command: List[str]
  exit_code: Optional[int] = None  # None: not run (an earlier step failed).
  seconds: float = 0.0
  checks: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
  said: str = ""  # Its last lines of output, when it failed.
  out_dir: str = ""
  stopped_by: Optional[str] = None  # The signal that stopped the migration during it.

  @property
  def passed(self) -> bool:
    return self.exit_code == 0 and all(c["passed"] for c in self.checks)

  @property
  def failed_checks(self) -> List[str]:
    return [c["name"] for c in self.checks if not c["passed"]]

  @property
  def result(self) -> str:
    return "not run" if self.exit_code is None else "PASS" if self.passed else "FAIL"

  def check_rows(self) -> List[List[Any]]:
    """Each check as a table row: report, check, limit, measured, where, pass."""
    return [[c["report"] or self.step, c["name"], c.get("limit"), c.get("measured"),
             c.get("where"), "yes" if c["passed"] else "NO"] for c in self.checks]


def _handoff(inputs: Inputs, workers: str, data: Sequence[str]) -> Step:
  """From the newest checkpoint of their model_dir if given, else of a run of the program."""
  if inputs.model_dir:
    return Step("handoff", "Your run goes on in either backend: the newest checkpoint of your "
                "model_dir, converted to the port's, and converted back, each resumed 10 steps "
                "and held to the program's own resume of it (weights, per-step losses); the "
                "converted checkpoint serves as yours does.", "launch.handoff",
                [workers, *inputs.recipe, f"--from_model_dir={inputs.model_dir}", *data],
                runs=3 * len(inputs.workers))
  return Step("handoff", "A run stopped in one backend goes on in the other: the program's "
              "model_dir converts to the port's and back, and the other backend's resume of "
              "each checkpoint ends where the backend's own resume does.", "launch.handoff",
              [workers, *inputs.recipe, f"--split_at={inputs.train_steps}",
               f"--train_steps={2 * inputs.train_steps}", "--nomeasure_uninterrupted", *data],
              runs=6 * len(inputs.workers))  # Two to the split, four resumes.


def plan(inputs: Inputs) -> List[Step]:
  """The steps that apply to `inputs`, in their order."""
  data = [f"--data_dir={inputs.data_dir}"] if inputs.data_dir else []
  workers = "--workers=" + ",".join(map(str, inputs.workers))
  steps = [] if not inputs.model_dir else [Step(
      "inspect", "Every variable of the model_dir your program wrote has a place in the port: "
      "the converter's proposed map, by name and then by shape, against the map given.",
      "launch.convert", [f"--inspect={inputs.model_dir}", "--inspect_format=json",
                         *[f for f in inputs.recipe if f.startswith(_INSPECT_FLAGS)]],
      inspects=True, given_map=_flag(inputs, "assignment_map"))]
  steps += [
      Step("parity", "The port trains as the program does: from the same weights, step by "
           "step, the same losses, learning rates, weights, evaluations and every declared "
           "metric, and the two exports answer alike, at each worker count.",
           "launch.parity", [workers, *inputs.recipe, f"--train_steps={inputs.train_steps}",
                             *([] if inputs.long_steps is None
                               else [f"--long_steps={inputs.long_steps}"]), *data],
           # Each backend's short run and its long one.
           runs=(2 if inputs.long_steps == 0 else 4) * len(inputs.workers)),
      _handoff(inputs, workers, data),
  ]
  if inputs.export_dir:  # After parity, whose short run exports the port.
    program = ([f"--estimator_program={inputs.estimator_program}"]
               if inputs.estimator_program else [])
    serving = Step("serving", "The port's export serves the contract the export your clients "
                   "call today serves: the same signatures, methods, inputs and outputs, "
                   "dtypes and shapes (the two hold other weights: parity compares answers, "
                   "from the same ones).", "launch.serving_check",
                   [f"--first={inputs.export_dir}", *program, *data, "--contract_only"],
                   port_export=True)
    steps.insert(len(steps) - 1, serving)  # Before the handoff.
  if inputs.keras_python:
    steps.append(Step(
        "version parity", "The port on the newest TensorFlow trains as the program does on "
        "2.15.1: from the same weights, the same losses and weights, and each version serves "
        "both exports alike.", "launch.version_parity",
        [f"--keras_python={inputs.keras_python}", workers, *inputs.recipe,
         f"--train_steps={inputs.train_steps}", *data], runs=3 * len(inputs.workers)))
  return steps


def port_export(outcomes: Sequence[Outcome]) -> Optional[str]:
  """The port's export of the parity step's short run at the fewest workers, if it made one."""
  for o in outcomes:
    if o.step == "parity" and o.out_dir:
      for path in sorted(glob.glob(os.path.join(o.out_dir, "**", "short", "keras", "model",
                                                layout.SUMMARY_FILE), recursive=True)):
        with open(path) as f:
          return json.load(f).get("export_dir")
  return None


def run_step(step: Step, out_dir: str, timeout: float, env: Optional[Dict[str, str]] = None,
             say: Callable[[str], None] = print) -> Outcome:
  """Runs the step's tool with --out=out_dir/<step>, its output in log.txt there and its
  log messages (what it trains, where each run is) passed to `say` as they come, and reads
  every `*_report.json` it wrote."""
  where = os.path.join(out_dir, step.name.replace(" ", "_"))
  os.makedirs(where)
  command = [sys.executable, "-m", step.module, *step.args,
             *([] if step.inspects else [f"--out={where}"])]
  outcome = Outcome(step.name, step.proves, command, out_dir=where)
  started = time.monotonic()
  log_path = os.path.join(where, "log.txt")
  with open(log_path, "w") as log, (open(os.path.join(where, INSPECTION), "w")
                                    if step.inspects else contextlib.nullcontext()) as stdout:
    try:
      outcome.exit_code = _run_tool(command, log, {**os.environ, **(env or {})}, timeout,
                                    _Progress(step, say, started).say, stdout)
    except Stopped as e:
      outcome.exit_code, outcome.stopped_by = 128 + e.signum, str(e)
  if step.inspects and outcome.exit_code == 0:
    write_inspection_report(where, step.given_map)
  outcome.seconds = time.monotonic() - started
  for path in sorted(glob.glob(os.path.join(where, "**", "*_report.json"), recursive=True)):
    with open(path) as f:
      report = json.load(f)
    at = os.path.relpath(os.path.dirname(path), where)
    for check in report.get("checks", []):
      outcome.checks.append({**check, "report": at if at != "." else ""})
  if not outcome.passed:
    with open(log_path, errors="replace") as f:
      outcome.said = "".join(f.readlines()[-15:]).strip()
  return outcome


class _Progress:
  """A step's tool's log messages, each said as `    <step>: <message>`, and after each run
  it finished (its harness logs "Trained <run> ..."), its progress bar."""

  def __init__(self, step: Step, say: Callable[[str], None], started: float):
    self.step, self.out, self.started, self.done = step, say, started, 0

  def say(self, message: str) -> None:
    self.out(f"    {self.step.name}: {message}")
    if self.step.runs and message.startswith("Trained "):
      self.done += 1
      self.out(f"    {self.step.name}: {progress_bar(self.done, self.step.runs)} runs, "
               f"{time.monotonic() - self.started:.0f} s")


def progress_bar(done: int, total: int, width: int = 20) -> str:
  """`[#####---------------] 1/4`: `done` of `total`, the bar full past it."""
  filled = min(width, round(width * done / total))
  return f"[{'#' * filled}{'-' * (width - filled)}] {done}/{total}"


# An absl log line of a tool: I1129 13:32:09.101493 140503740128128 harness.py:127] Training ...
_LOG_LINE = re.compile(r"^[IE]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] (.*)$")
STOP_SECONDS = 30  # A tool stopped (timeout, Ctrl-C) has this long to stop its runs.


def _run_tool(command: List[str], log: TextIO, env: Dict[str, str], timeout: float,
              say: Callable[[str], None], stdout: Optional[TextIO] = None) -> int:
  """The tool's exit code (-1: stopped at `timeout`); its lines into `log` (its standard
  output into `stdout` instead, if given), its log messages to `say`. In a process group of
  its own, so that a stop reaches its runs too."""
  process = subprocess.Popen(command, stdout=stdout or subprocess.PIPE,
                             stderr=subprocess.PIPE if stdout else subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env=env, text=True, errors="replace",
                             start_new_session=True)

  def relay() -> None:
    for line in process.stderr if stdout else process.stdout:
      log.write(line)
      log.flush()
      match = _LOG_LINE.match(line.rstrip("\n"))
      if match:
        say(match.group(1))

  reader = threading.Thread(target=relay, daemon=True)
  reader.start()
  try:
    code = process.wait(timeout=timeout)
  except subprocess.TimeoutExpired:
    _stop(process)
    code = -1
  except BaseException:  # Stopped, KeyboardInterrupt: its runs end with it.
    _stop(process)
    raise
  reader.join()
  if code == -1:
    log.write(f"\nlaunch.migrate: stopped after {timeout:.0f} s (--timeout).\n")
  return code


def _stop(process: subprocess.Popen) -> None:
  """SIGTERM to the tool's process group (the tool and the runs it started stop, saving what
  they save on a preemption), SIGKILL to whatever of it lingers past STOP_SECONDS."""
  try:
    os.killpg(process.pid, signal.SIGTERM)
  except ProcessLookupError:
    return
  deadline = time.monotonic() + STOP_SECONDS
  while time.monotonic() < deadline:
    process.poll()  # Reaps the tool; its runs are its own children to reap.
    try:
      os.killpg(process.pid, 0)
    except ProcessLookupError:
      break
    time.sleep(0.2)
  else:
    try:
      os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  process.wait()


def verdict(outcomes: Sequence[Outcome]) -> Dict[str, Any]:
  """Switch only if every step ran and passed; else why not, step by step."""
  reasons = []
  for o in outcomes:
    if o.exit_code is None:
      reasons.append(f"{o.step}: not run (a step before it failed)")
    elif o.stopped_by:
      reasons.append(f"{o.step}: stopped by {o.stopped_by} before it finished")
    elif not o.passed:
      failed = o.failed_checks
      reasons.append(f"{o.step}: " + (f"{len(failed)} check(s) failed: " + "; ".join(failed[:3])
                                      + (" ..." if len(failed) > 3 else "") if failed else
                                      f"exit {o.exit_code}, see {o.out_dir}/log.txt"))
  return {"verdict": NOT_YET if reasons or not outcomes else SWITCH, "why": reasons}


def _text(value: Any) -> str:
  """A table cell's text: a float to 3 figures, None as "-"."""
  return f"{value:.3g}" if isinstance(value, float) else "-" if value is None else str(value)


def format_markdown(outcomes: Sequence[Outcome], inputs: Inputs, judged: Dict[str, Any]) -> str:
  """The report a person reads: the verdict first, then each step and its checks."""
  lines = [f"# Migration check: **{judged['verdict']}**", ""]
  if judged["why"]:
    lines += ["Why not yet:", ""] + [f"- {reason}" for reason in judged["why"]] + [""]
  else:
    lines += [ALL_PASSED, ""]
  lines += ["| step | result | checks | time (s) |", "| --- | --- | ---: | ---: |"]
  for o in outcomes:
    lines.append(f"| {o.step} | {o.result} | {len(o.checks)} | {o.seconds:.0f} |")
  for o in outcomes:
    lines += ["", f"## {o.step}", "", o.proves, ""]
    if o.exit_code is None:
      lines.append("Not run: a step before it failed (give --keep_going to run every step).")
      continue
    lines.append("Command: `" + " ".join(o.command) + "`")
    lines.append("")
    if o.said:
      lines += ["It said (the end of its log):", "", "```", o.said, "```", ""]
    if o.checks:
      lines += ["| " + " | ".join(CHECK_COLUMNS) + " |", "| --- | --- | ---: | ---: | --- | --- |"]
      lines += ["| " + " | ".join(harness.md_cell(_text(cell)) for cell in row) + " |"
                for row in o.check_rows()]
  lines += ["", "## Reproduce", "", "Each step's command is above; its full report and runs are "
            "in its folder beside this file."]
  return "\n".join(lines) + "\n"


def versions() -> Dict[str, str]:
  """What this install runs: the program and the port alike."""
  found = {"python": platform.python_version()}
  for package in ("tensorflow", "tf-keras", "tensorflow-estimator"):
    try:
      found[package] = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
      found[package] = "not installed"
  return found


def _flag(inputs: Inputs, name: str) -> Optional[str]:
  """The value of --name among the flags every step is given, if it is."""
  return next((f.split("=", 1)[1] for f in inputs.recipe if f.startswith(f"--{name}=")), None)


def map_used(inputs: Inputs) -> Optional[Dict[str, Optional[str]]]:
  """The --assignment_map the steps were given (program name -> port weight), if any."""
  path = _flag(inputs, "assignment_map")
  if path is None:
    return None
  with open(path) as f:
    return json.load(f)


def write_inspection_report(where: str, given_map: Optional[str]) -> None:
  """From launch.convert --inspect's JSON in `where`: the proposed map, and the inspect
  step's checks (inspect_report.json): every variable has a place in the port; without a
  map given, no name was guessed (else: review the proposal, give it); with one, it places
  every variable the proposal does (and where it differs from the proposal)."""
  with open(os.path.join(where, INSPECTION)) as f:
    found = json.load(f)
  proposed = found.get("assignment_map") or {}
  guessed = sorted(k for k, how in (found.get("matched_by") or {}).items() if "guess" in how)
  unfilled = found.get("unfilled") or []
  checks = [{"name": "every port weight has a variable of the model_dir", "passed": not unfilled,
             "measured": len(unfilled), "limit": 0,
             "where": ", ".join(unfilled) or f"{len(proposed)} mapped"}]
  if given_map is None:
    checks.append({
        "name": "every name matched by name (no map given)", "passed": not guessed,
        "measured": len(guessed), "limit": 0,
        "where": (f"guessed by shape: {', '.join(guessed)}: review "
                  f"{os.path.join(where, PROPOSED_MAP)} and give it as --assignment_map"
                  if guessed else "every name")})
  else:
    with open(given_map) as f:
      given = json.load(f)
    missing = sorted(set(proposed) - set(given))
    differs = sorted(k for k in proposed if k in given and given[k] != proposed[k])
    checks.append({
        "name": "the map given places every variable the proposal does", "passed": not missing,
        "measured": len(missing), "limit": 0,
        "where": (f"not in {given_map}: {', '.join(missing)}" if missing else
                  f"it differs from the proposal at {', '.join(differs)}" if differs else
                  "it is the proposal")})
  harness.write_files(where, {
      PROPOSED_MAP: json.dumps(proposed, indent=2),
      "inspect_report.json": json.dumps({"passed": all(c["passed"] for c in checks),
                                         "checks": checks, "guessed": guessed}, indent=2)})


_STYLE = """body{font:15px/1.45 system-ui,sans-serif;margin:2em auto;max-width:70em;color:#111}
h1 .switch{color:#05640f}h1 .not-yet{color:#a40000}
table{border-collapse:collapse;margin:.6em 0;font-size:13px}td,th{border:1px solid #bbb;
padding:2px 6px;text-align:left;vertical-align:top}tr.fail td{background:#fde4e4}
code,pre{font:12px ui-monospace,monospace;white-space:pre-wrap;word-break:break-all}
img{max-width:100%;border:1px solid #ddd}
@media print{body{margin:0;max-width:none}section{break-inside:avoid-page}a{color:#111}}"""


def _html_table(header: Sequence[str], rows: Sequence[Sequence[Any]],
                failed: Sequence[bool] = ()) -> str:
  cells = "".join(f"<th>{html.escape(h)}</th>" for h in header)
  body = "".join(
      ("<tr class=fail>" if i < len(failed) and failed[i] else "<tr>")
      + "".join(f"<td>{html.escape(_text(v))}</td>" for v in row)
      + "</tr>" for i, row in enumerate(rows))
  return f"<table><tr>{cells}</tr>{body}</table>"


def _plots(o: Outcome) -> str:
  """Each plot the step's tool drew, inline: the page needs no other file and no network."""
  parts = []
  for path in sorted(glob.glob(os.path.join(o.out_dir, "**", "*.png"), recursive=True)):
    with open(path, "rb") as f:
      data = base64.b64encode(f.read()).decode()
    name = html.escape(os.path.relpath(path, o.out_dir))
    parts.append(f"<figure><img alt='{name}' src='data:image/png;base64,{data}'>"
                 f"<figcaption>{name}</figcaption></figure>")
  return "".join(parts)


def _map_section(outcomes: Sequence[Outcome], inputs: Inputs) -> str:
  """The variable map the steps used (else the one the inspection proposed), each name the
  inspection matched by shape, not by name, marked as its guess."""
  inspected = next((o for o in outcomes if o.step == "inspect" and o.exit_code == 0), None)
  found: Dict[str, Any] = {}
  if inspected:
    with open(os.path.join(inspected.out_dir, "inspect_report.json")) as f:
      found = json.load(f)
  mapping, title = map_used(inputs), "The variable map used"
  if mapping is None and inspected:
    with open(os.path.join(inspected.out_dir, PROPOSED_MAP)) as f:
      mapping, title = json.load(f), "The map the inspection proposed (no --assignment_map)"
  if not mapping:
    return ""
  guessed = set(found.get("guessed", []))
  return f"<h2>{title}</h2>" + _html_table(
      ["program variable", "port weight", "the inspection matched it"],
      [[k, "(not carried)" if v is None else v,
        "by shape: a guess to review" if k in guessed else "by name" if inspected else "-"]
       for k, v in mapping.items()], [k in guessed for k in mapping])


def format_html(outcomes: Sequence[Outcome], inputs: Inputs, judged: Dict[str, Any],
                found: Mapping[str, str]) -> str:
  """The report as one self-contained page: the verdict first, printable."""
  switch = judged["verdict"] == SWITCH
  parts = [f"<h1>Migration check: <span class={'switch' if switch else 'not-yet'}>"
           f"{html.escape(judged['verdict'])}</span></h1>"]
  parts.append("<ul>" + "".join(f"<li>{html.escape(w)}</li>" for w in judged["why"]) + "</ul>"
               if judged["why"] else f"<p>{ALL_PASSED}</p>")
  parts.append(_html_table(["step", "result", "checks", "failed", "time (s)"], [
      [o.step, o.result, len(o.checks), len(o.failed_checks), round(o.seconds)]
      for o in outcomes],
      [not o.passed for o in outcomes]))
  parts.append("<h2>What was checked</h2>" + _html_table(["", ""], [
      ["program", inputs.estimator_program], ["flags", " ".join(inputs.recipe)],
      ["workers", ",".join(map(str, inputs.workers))],
      ["their export", inputs.export_dir],
      *[[name, version] for name, version in found.items()]]))
  parts.append(_map_section(outcomes, inputs))
  for o in outcomes:
    section = [f"<h2>{html.escape(o.step)}</h2><p>{html.escape(o.proves)}</p>"]
    if o.exit_code is None:
      section.append("<p>Not run: a step before it failed (--keep_going runs every step).</p>")
    else:
      section.append(f"<p>{o.seconds:.0f} s, exit {o.exit_code}: "
                     f"<code>{html.escape(' '.join(o.command))}</code></p>")
      if o.said:
        section.append(f"<pre>{html.escape(o.said)}</pre>")
      metrics = [c for c in o.checks if c["name"].startswith("eval ")]
      section.append(_html_table(CHECK_COLUMNS, o.check_rows(),
                                 [not c["passed"] for c in o.checks]))
      if metrics:
        section.append("<h3>Metrics</h3>" + _html_table(
            ["metric check", "limit", "measured", "pass"],
            [[c["name"], c.get("limit"), c.get("measured"), "yes" if c["passed"] else "NO"]
             for c in metrics], [not c["passed"] for c in metrics]))
      section.append(_plots(o))
    parts.append("<section>" + "".join(section) + "</section>")
  return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>Migration check: "
          f"{html.escape(judged['verdict'])}</title><style>{_STYLE}</style></head><body>"
          + "\n".join(parts) + "</body></html>\n")


def write_report(outcomes: Sequence[Outcome], out_dir: str, inputs: Inputs) -> Dict[str, Any]:
  """migration_report.md, .html and .json in out_dir, each written whole; returns the
  verdict."""
  judged, found = verdict(outcomes), versions()
  newest = os.path.join(out_dir, "version_parity", "version_parity_report.json")
  if os.path.exists(newest):  # The install version parity ran the port in.
    with open(newest) as f:
      found["newest stack (version parity)"] = json.load(f)["versions"]["new"]
  record = {**judged, "inputs": dataclasses.asdict(inputs), "versions": found,
            "steps": [{**dataclasses.asdict(o), "passed": o.passed} for o in outcomes]}
  harness.write_files(out_dir, {
      f"{REPORT}.json": json.dumps(record, indent=2),
      f"{REPORT}.md": format_markdown(outcomes, inputs, judged),
      f"{REPORT}.html": format_html(outcomes, inputs, judged, found)})
  return judged
