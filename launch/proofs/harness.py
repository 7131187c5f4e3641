"""The verification harness parity, handoff and version_parity share.

Each of them proves a claim the same way: one initial-weights file and op
determinism (`prepare`), named runs of the trainer binaries that record every
step's loss (`Runs`), comparisons that each give a `Check` (the weights'
names and shapes, then their values, then the per-step losses), and a report:
a Markdown table of the checks, its JSON, and a plot of the losses
(`write_report`). A tool adds only the checks of its own claim.
"""

import dataclasses
import itertools
import json
import os
import re
import textwrap
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from absl import logging

from launch.convert import assign
from launch.convert.kinds import Kind
from launch.proofs import runs
from trainers import model as model_lib
from trainers import model_dir as layout
from trainers import model_registry
from trainers import program as program_lib
from trainers.config import Config

INIT_WEIGHTS_FILE = "init_weights.npz"


@dataclasses.dataclass
class Check:
  """One comparison: what was measured, its limit, and where the worst case is."""

  name: str
  passed: bool
  measured: float
  limit: float
  where: str = ""


def named(checks: Sequence[Check], name: Callable[[str], str]) -> List[Check]:
  """`checks` with each name rewritten by `name` (a tool says which run pair or size)."""
  return [dataclasses.replace(c, name=name(c.name)) for c in checks]


def deterministic(config: Config) -> Config:
  """`config` with its model's `deterministic_options` where --model_options sets none (a
  canned model's --dropout at 0 unless given), and a team's program's
  `deterministic_params` where --program_params sets none: the proofs' settings. A
  reference loop cannot draw a backend's dropout masks, and one backend draws the other's
  only where the dropout has an op seed (a canned model's has none)."""
  if config.estimator_program:
    the_program = program_lib.load(config.estimator_program)
    given = model_registry.parse_options(config.program_params, the_program.params,
                                         "the program's params", "--program_params")
    params = {**the_program.deterministic_params, **given}
    config = dataclasses.replace(config, program_params=_settings(params))
  model_spec = model_lib.spec(config)
  if "dropout" in config.canned_settings() and config.dropout is None:
    config = dataclasses.replace(config, dropout=0.0)
  given = model_registry.parse_options(config.model_options, model_spec.options,
                                       f"model {model_spec.name}")
  return dataclasses.replace(config, model_options=_settings(
      {**model_spec.deterministic_options, **given}))


def _settings(values: Mapping[str, Any]) -> str:
  """NAME=VALUE,... as --model_options and --program_params take them."""
  return ",".join(f"{k}={v}" for k, v in values.items())


def prepare(config: Config, out_dir: str) -> Config:
  """Writes `out_dir/init_weights.npz` (the model built from config.seed) and returns
  `config` starting every run from it, with op determinism."""
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, INIT_WEIGHTS_FILE)
  model_lib.save_weights_npz(path, model_lib.get_weights(model_lib.build(config)))
  return dataclasses.replace(config, init_weights=path, deterministic=True)


def headline(summary: Dict[str, Any]) -> Tuple[str, float]:
  """What a run's summary.json says first of its test: its accuracy, or a regression's
  loss."""
  if summary["test_accuracy"] is None:
    return "test loss", summary["test_loss"]
  return "test accuracy", summary["test_accuracy"]


class Runs:
  """Trainer runs by name, each in `<out_dir>/<name>/`: `model/`, `run.log` and `losses.json`.

  A run trains in its model_dir, resuming whatever it holds; each start and
  end is logged, so a tool that trains for minutes says what it is doing.
  """

  def __init__(self, config: Config, out_dir: str, timeout: float):
    self.config, self.out_dir, self.timeout = config, out_dir, timeout

  def run_dir(self, name: str) -> str:
    return os.path.join(self.out_dir, name)

  def model_dir(self, name: str) -> str:
    return os.path.join(self.run_dir(name), "model")

  def train(self, name: str, backend: str, workers: int, *, python: str = runs.PYTHON,
            extra_flags: Sequence[str] = (), record: bool = True, engine: str = "local",
            **changes: Any) -> Dict[str, Any]:
    """Trains `backend` on `workers` as run `name`; `changes` override the config's fields.

    Args:
      record: keep every step's loss and each worker's shard (`losses`); a run without
        them is not slowed to one step per execution.
      engine: what runs the workers (runs.ENGINES).

    Returns:
      The run's summary.json.
    """
    os.makedirs(self.run_dir(name), exist_ok=True)
    config = dataclasses.replace(self.config, record_dir=self.run_dir(name) if record else None,
                                 **changes)
    logging.info("Training %s: %s, %d worker(s)%s, to step %d.", name, backend, workers,
                 " on Ray" if engine == "ray" else "", config.train_steps)
    started = time.monotonic()
    summary = runs.run_trainer(backend, config, workers=workers, model_dir=self.model_dir(name),
                               log_path=os.path.join(self.run_dir(name), "run.log"),
                               timeout=self.timeout, extra_flags=extra_flags, python=python,
                               engine=engine, name=name)
    logging.info("Trained %s in %.0f s: step %d, %s %.4g.", name, time.monotonic() - started,
                 summary["global_step"], *headline(summary))
    return summary

  def losses(self, name: str) -> List[float]:
    """Every step's global-batch training loss of run `name`."""
    return self._recorded(name)["losses"]

  def learning_rates(self, name: str) -> List[float]:
    """The learning rate each step of run `name` trained with ([] for a canned model)."""
    return self._recorded(name).get("learning_rates", [])

  def _recorded(self, name: str) -> Dict[str, Any]:
    with open(os.path.join(self.run_dir(name), layout.LOSSES_FILE)) as f:
      return json.load(f)


def backend_weights(backend: str, summary: Mapping[str, Any], config: Config,
                    assignment_map: Optional[Mapping[str, Optional[str]]] = None
                    ) -> model_lib.Weights:
  """Every final weight of `config.model` by name, trainable or not (BatchNorm's moving
  statistics): Keras from its SavedModel, Estimator from its checkpoint (a team's program's
  under the model's names, through `assignment_map`).

  All of them, not only the names another run has: check_mapping must see a
  variable one run has and another has not.
  """
  if backend == "keras":
    return export_weights(tf.saved_model.load(summary["export_dir"]))
  reader = tf.train.load_checkpoint(summary["model_dir"])
  # Weights, and whatever the conversion could not place (an extra variable); a program's
  # optimizer state is the recipe's business, not a weight.
  entries = assign.classify(reader.get_variable_to_shape_map(), config,
                            dict(assignment_map or {}), reset_slots=bool(config.estimator_program))
  return {e.weight or e.name: reader.get_tensor(e.name) for e in entries
          if e.kind in (Kind.WEIGHT, Kind.UNMAPPED)}


def export_weights(loaded: Any) -> model_lib.Weights:
  """Every weight of a loaded Keras export by name, trainable or not."""
  return {model_lib.weight_name(v): v.numpy() for v in loaded.variables}


def check_mapping(weights: Mapping[str, model_lib.Weights]) -> Check:
  """Same variable count, names and shapes in every run, before any number is compared."""
  signatures = {run: sorted((n, tuple(w.shape)) for n, w in ws.items())
                for run, ws in weights.items()}
  first_run, first = next(iter(signatures.items()))
  for run, signature in signatures.items():
    if signature != first:
      return Check("variable mapping", False, float(len(signature)), float(len(first)),
                   f"{run}: {signature} vs {first_run}: {first}")
  return Check("variable mapping", True, float(len(first)), float(len(first)),
               ", ".join(f"{n}{list(s)}" for n, s in first))


def compare_weights(weights: Mapping[str, model_lib.Weights], atol: float,
                    limits: Mapping[str, float] = {}) -> List[Check]:
  """The max |weight difference| of every pair of runs, worst variable named.

  Relative where a value exceeds 1 in magnitude: float32's spacing there grows past
  the limit (4.8e-7 at 4 to 8, where BatchNorm's moving variances are), so an absolute
  limit would fail values the same to a few roundings.

  Args:
    weights: each run's weights by name.
    atol: the limit of every pair.
    limits: a run's own limit, which applies to its pairs where it exceeds `atol`.
  """
  checks = []
  for a, b in itertools.combinations(weights, 2):
    diffs = {n: float(np.max(np.abs(weights[a][n] - weights[b][n])
                             / np.maximum(1.0, np.abs(weights[b][n]))))
             for n in weights[a]}
    worst = max(diffs, key=diffs.get)
    limit = max(atol, limits.get(a, atol), limits.get(b, atol))
    checks.append(Check(f"max |weight diff| {a} vs {b}", diffs[worst] <= limit, diffs[worst],
                        limit, f"variable {worst}"))
  return checks


def relative_diff(x: Sequence[float], y: Sequence[float]) -> np.ndarray:
  """|x - y| / |y| step by step (y near 0 counted as 1e-12)."""
  x, y = np.asarray(x), np.asarray(y)
  return np.abs(x - y) / np.maximum(np.abs(y), 1e-12)


def compare_losses(losses: Mapping[str, Sequence[float]], rtol: float, name: str,
                   start: int = 0) -> List[Check]:
  """The max per-step relative loss difference of every pair of runs, from `start`."""
  checks = []
  for a, b in itertools.combinations(losses, 2):
    x, y = np.asarray(losses[a][start:]), np.asarray(losses[b][start:])
    if len(x) != len(y) or not len(x):
      checks.append(Check(f"{name} {a} vs {b}", False, float(len(x)), float(len(y)),
                          "different or zero step counts"))
      continue
    rel = relative_diff(x, y)
    worst = int(np.argmax(rel))
    checks.append(Check(f"{name} {a} vs {b}", bool(rel[worst] <= rtol), float(rel[worst]), rtol,
                        f"step {start + worst + 1}"))
  return checks


def compare_runs(weights: Mapping[str, model_lib.Weights],
                 losses: Mapping[str, Sequence[float]], weight_atol: float, loss_rtol: float,
                 loss_name: str = "per-step loss rel diff",
                 weight_limits: Mapping[str, float] = {}) -> List[Check]:
  """The variable mapping, then (if it holds) the weights (`compare_weights`), then
  the per-step losses."""
  mapping = check_mapping(weights)
  checks = [mapping]
  if mapping.passed:
    checks += compare_weights(weights, weight_atol, weight_limits)
  return checks + compare_losses(losses, loss_rtol, loss_name)


def md_cell(text: str) -> str:
  """`text` for a Markdown table's cell: its pipes escaped (`max |weight diff|`), so the row
  keeps its columns when rendered."""
  return text.replace("|", "\\|")


TERMINAL_WIDTH = 100
_CHECK_COLUMNS = ["check", "result", "measured", "limit", "where"]


def for_terminal(text: str, width: int = TERMINAL_WIDTH) -> str:
  """`text` with each Markdown table in it laid out for a terminal `width` columns wide (the
  reports keep the Markdown). A table of checks: a check a line, wrapped
  (`PASS  name: measured (limit L), where`); another table in aligned columns, its last
  wrapped, or, when even that does not fit, each row a block. Other lines as they are."""
  out: List[str] = []
  table: List[str] = []
  for line in [*text.splitlines(), ""]:
    if line.startswith("|"):
      table.append(line)
      continue
    if table:
      out += _terminal_table([_cells(row) for row in table if not row.startswith("| ---")],
                             width)
      table = []
    out.append(line)
  return "\n".join(out[:-1])


def _cells(row: str) -> List[str]:
  """A Markdown row's cells, their escaped pipes unescaped."""
  return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def _terminal_table(rows: List[List[str]], width: int) -> List[str]:
  header, body = rows[0], rows[1:]
  if header == _CHECK_COLUMNS:
    return [line for name, result, measured, limit, where in body
            for line in textwrap.wrap(f"{name}: {measured} (limit {limit})"
                                      + (f", {where}" if where else ""), width,
                                      initial_indent=f"{result:<4}  ", subsequent_indent=" " * 6)]
  widths = [max(len(c) for c in column) for column in zip(*rows)]
  lead = sum(widths[:-1]) + 2 * (len(widths) - 1)
  if width - lead >= 24:  # The last column wrapped beside the others.
    lines = []
    for row in [header, ["-" * w for w in widths], *body]:
      first = "  ".join(c.ljust(w) for c, w in zip(row[:-1], widths))
      wrapped = textwrap.wrap(row[-1], width - lead) or [""]
      lines += [f"{first}  {wrapped[0]}".rstrip()] + [" " * (lead + 2) + w for w in wrapped[1:]]
    return lines
  return [line for row in body for line in [row[0], *textwrap.wrap(
      "; ".join(f"{h}: {c}" for h, c in zip(header[1:], row[1:])), width,
      initial_indent=" " * 4, subsequent_indent=" " * 4)]]


def format_checks(title: str, checks: Sequence[Check]) -> str:
  """A Markdown table of checks under `title`, then the overall verdict."""
  rows = [title, "| check | result | measured | limit | where |", "| --- | --- | --- | --- | --- |"]
  for c in checks:
    rows.append(f"| {md_cell(c.name)} | {'PASS' if c.passed else 'FAIL'} | {c.measured:.3g} | "
                f"{c.limit:.3g} | {md_cell(c.where)} |")
  rows.append(overall([c.passed for c in checks], "checks"))
  return "\n".join(rows)


def overall(passed: Sequence[bool], what: str) -> str:
  """The verdict line under a table: `Overall: PASS (5/5 checks)`."""
  return (f"Overall: {'PASS' if all(passed) else 'FAIL'} ({sum(passed)}/{len(passed)} "
          f"{what})")


def write_report(out_dir: str, name: str, report: Any, table: str,
                 plot: Optional[Callable[[Any, Any], None]] = None) -> None:
  """`<name>_report.md` (the table), `<name>_report.json` and `loss_curves.png` in out_dir,
  each written whole (write_files).

  Args:
    report: a dataclass with a `passed` property and a `losses` mapping of run
      name to per-step losses.
    plot: draws the figure (`plot(report, figure)`) instead of one line per
      run of `report.losses` on a log scale.
  """
  write_files(out_dir, {
      f"{name}_report.md": f"# {name.replace('_', ' ').capitalize()} report\n\n{table}\n",
      f"{name}_report.json": json.dumps({"passed": report.passed, **dataclasses.asdict(report)},
                                        indent=2)})
  path = os.path.join(out_dir, "loss_curves.png")
  _plot(report, plot, path + ".tmp.png")
  os.replace(path + ".tmp.png", path)


def write_files(out_dir: str, texts: Mapping[str, str]) -> None:
  """Writes each text to its file name in out_dir, each whole (through a rename): a reader
  never finds half a report, and a run stopped while writing leaves the last one."""
  for name, text in texts.items():
    path = os.path.join(out_dir, name)
    with open(path + ".tmp", "w") as f:
      f.write(text)
    os.replace(path + ".tmp", path)


def _plot(report: Any, plot: Optional[Callable[[Any, Any], None]], path: str) -> None:
  import matplotlib  # noqa: PLC0415 -- loaded only when a plot is drawn.
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # noqa: PLC0415 -- after matplotlib.use.

  fig = plt.figure(figsize=(9, 5))
  if plot is None:
    ax = fig.subplots()
    for run, values in report.losses.items():
      ax.plot(range(1, len(values) + 1), values, label=run)
    ax.set(yscale="log", xlabel="step", ylabel="training loss (global batch)")
    ax.legend(fontsize="small")
  else:
    plot(report, fig)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
