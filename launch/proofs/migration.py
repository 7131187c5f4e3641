"""The migration check: the proof tools run one after the other on a team's program and its
Keras port, and one report of what they found, with a verdict (launch.migrate).

  steps = plan(Inputs(...))
  for step in steps:
    outcome = run_step(step, out_dir, timeout)   # The tool's own command, its JSON report.
  write_report(outcomes, out_dir, inputs)       # migration_report.{md,json}

Each step is a tool a team could run alone (`launch.parity`, `launch.handoff`,
`launch.serving_check`, `launch.version_parity`), run as a subprocess with its own --out
under the migration's; the report reads the JSON report each writes, so it says what the
tool said, check by check. It trains nothing itself.
"""

import dataclasses
import glob
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from launch.proofs import harness
from trainers import model_dir as layout

REPORT = "migration_report"
SWITCH = "switch"
NOT_YET = "do not switch yet"


@dataclasses.dataclass(frozen=True)
class Inputs:
  """What the team gives: its program and port, the flags every training tool takes (the
  recipe, the map; `--name=value` each), and what of its own to check besides."""

  recipe: Sequence[str]  # --estimator_program, --model, --assignment_map, the optimizer's...
  workers: Sequence[int]
  data_dir: Optional[str] = None
  estimator_program: Optional[str] = None
  export_dir: Optional[str] = None  # Their export, which clients call today.
  keras_python: Optional[str] = None  # The newest-TF install's Python.
  train_steps: int = 10  # Of each run of parity's and the handoff's split.


@dataclasses.dataclass(frozen=True)
class Step:
  """One tool's run: what it proves, its command's module and flags (its --out added)."""

  name: str
  proves: str
  module: str
  args: Sequence[str]
  port_export: bool = False  # Also give it --second=<the port's export> (port_export()).


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

  @property
  def passed(self) -> bool:
    return self.exit_code == 0 and all(c["passed"] for c in self.checks)

  @property
  def failed_checks(self) -> List[str]:
    return [c["name"] for c in self.checks if not c["passed"]]


def plan(inputs: Inputs) -> List[Step]:
  """The steps that apply to `inputs`, in their order."""
  data = [f"--data_dir={inputs.data_dir}"] if inputs.data_dir else []
  workers = "--workers=" + ",".join(map(str, inputs.workers))
  steps = [
      Step("parity", "The port trains as the program does: from the same weights, step by "
           "step, the same losses, learning rates, weights, evaluations and every declared "
           "metric, and the two exports answer alike, at each worker count.",
           "launch.parity", [workers, *inputs.recipe, f"--train_steps={inputs.train_steps}",
                             *data]),
      Step("handoff", "A run stopped in one backend goes on in the other: the program's "
           "model_dir converts to the port's and back, and each resumed run ends where an "
           "unbroken run does.", "launch.handoff",
           [workers, *inputs.recipe, f"--split_at={inputs.train_steps}",
            f"--train_steps={2 * inputs.train_steps}", "--nomeasure_uninterrupted", *data]),
  ]
  if inputs.export_dir:  # After parity, whose short run exports the port.
    program = ([f"--estimator_program={inputs.estimator_program}"]
               if inputs.estimator_program else [])
    steps.insert(1, Step("serving", "The port's export answers the requests the program's "
                         "export answers today, through the same signatures, alike.",
                         "launch.serving_check", [f"--first={inputs.export_dir}", *program,
                                                  *data], port_export=True))
  if inputs.keras_python:
    steps.append(Step(
        "version parity", "The port on the newest TensorFlow trains as on 2.15.1, and each "
        "serves the other's export.", "launch.version_parity",
        [workers, f"--keras_python={inputs.keras_python}", *inputs.recipe,
         f"--train_steps={inputs.train_steps}", *data]))
  return steps


def port_export(outcomes: Sequence["Outcome"]) -> Optional[str]:
  """The port's export of the parity step's short run at the fewest workers, if it made one."""
  for o in outcomes:
    if o.step == "parity" and o.out_dir:
      for path in sorted(glob.glob(os.path.join(o.out_dir, "**", "short", "keras", "model",
                                                layout.SUMMARY_FILE), recursive=True)):
        with open(path) as f:
          return json.load(f).get("export_dir")
  return None


def run_step(step: Step, out_dir: str, timeout: float,
             env: Optional[Dict[str, str]] = None) -> Outcome:
  """Runs the step's tool with --out=out_dir/<step> (its output in log.txt there) and reads
  every `*_report.json` it wrote."""
  where = os.path.join(out_dir, step.name.replace(" ", "_"))
  os.makedirs(where)
  command = [sys.executable, "-m", step.module, *step.args, f"--out={where}"]
  outcome = Outcome(step.name, step.proves, command, out_dir=where)
  started = time.monotonic()
  log_path = os.path.join(where, "log.txt")
  with open(log_path, "w") as log:
    try:
      outcome.exit_code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, **(env or {})},
                                         timeout=timeout).returncode
    except subprocess.TimeoutExpired:
      outcome.exit_code = -1
      log.write(f"\nlaunch.migrate: stopped after {timeout:.0f} s (--timeout).\n")
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


def verdict(outcomes: Sequence[Outcome]) -> Dict[str, Any]:
  """Switch only if every step ran and passed; else why not, step by step."""
  reasons = []
  for o in outcomes:
    if o.exit_code is None:
      reasons.append(f"{o.step}: not run (a step before it failed)")
    elif not o.passed:
      failed = o.failed_checks
      reasons.append(f"{o.step}: " + (f"{len(failed)} check(s) failed: " + "; ".join(failed[:3])
                                      + (" ..." if len(failed) > 3 else "") if failed else
                                      f"exit {o.exit_code}, see {o.out_dir}/log.txt"))
  return {"verdict": NOT_YET if reasons or not outcomes else SWITCH, "why": reasons}


def _cell(value: Any) -> str:
  """A Markdown table cell: a float to 3 figures, None as "-"."""
  return harness.md_cell(f"{value:.3g}" if isinstance(value, float) else "-" if value is None
                         else str(value))


def format_markdown(outcomes: Sequence[Outcome], inputs: Inputs, judged: Dict[str, Any]) -> str:
  """The report a person reads: the verdict first, then each step and its checks."""
  lines = [f"# Migration check: **{judged['verdict']}**", ""]
  if judged["why"]:
    lines += ["Why not yet:", ""] + [f"- {reason}" for reason in judged["why"]] + [""]
  else:
    lines += ["Every step passed: the port trains, resumes and serves as the program does, "
              "on the evidence below.", ""]
  lines += ["| step | result | checks | time (s) |", "| --- | --- | ---: | ---: |"]
  for o in outcomes:
    result = ("not run" if o.exit_code is None else "PASS" if o.passed else "FAIL")
    lines.append(f"| {o.step} | {result} | {len(o.checks)} | {o.seconds:.0f} |")
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
      lines += ["| report | check | limit | measured | where | pass |",
                "| --- | --- | ---: | ---: | --- | --- |"]
      for c in o.checks:
        cells = [c["report"] or o.step, c["name"], c.get("limit"), c.get("measured"),
                 c.get("where"), "yes" if c["passed"] else "NO"]
        lines.append("| " + " | ".join(map(_cell, cells)) + " |")
  lines += ["", "## Reproduce", "", "Each step's command is above; its full report and runs are "
            "in its folder beside this file."]
  return "\n".join(lines) + "\n"


def write_report(outcomes: Sequence[Outcome], out_dir: str, inputs: Inputs) -> Dict[str, Any]:
  """migration_report.md and .json in out_dir, each written whole; returns the verdict."""
  judged = verdict(outcomes)
  record = {**judged, "inputs": dataclasses.asdict(inputs),
            "steps": [{**dataclasses.asdict(o), "passed": o.passed} for o in outcomes]}
  harness.write_files(out_dir, {f"{REPORT}.json": json.dumps(record, indent=2),
                                f"{REPORT}.md": format_markdown(outcomes, inputs, judged)})
  return judged
