"""launch.proofs.tool_flags: one spelling per flag across the tools; old spellings still work."""

import sys

import pytest
from absl import app
from absl import flags

from launch.proofs import tool_flags


def _parse(*argv):
  values = flags.FlagValues()
  holders = {"workers": tool_flags.define_workers([1, 2], "w", values),
             "train_steps": tool_flags.define_train_steps(10, "s", values),
             "timeout": tool_flags.define_timeout(values),
             "engine": tool_flags.define_engine("e", values)}
  values(["tool", *argv])
  return holders


def test_defaults_and_the_new_spellings():
  holders = _parse()
  assert tool_flags.worker_counts(holders["workers"]) == [1, 2]
  assert tool_flags.train_steps(holders["train_steps"]) == 10
  assert tool_flags.timeout(holders["timeout"]) == tool_flags.TIMEOUT_SECONDS
  holders = _parse("--workers=3", "--train_steps=7")
  assert tool_flags.worker_counts(holders["workers"]) == [3]
  assert tool_flags.train_steps(holders["train_steps"]) == 7


def test_the_deprecated_steps_still_works_and_says_so(capsys):
  assert tool_flags.train_steps(_parse("--steps=4")["train_steps"]) == 4
  assert "--steps is deprecated; use --train_steps" in capsys.readouterr().err
  assert tool_flags.train_steps(_parse("--steps=4", "--train_steps=4")["train_steps"]) == 4


@pytest.mark.parametrize("argv, name, message", [
    (["--workers=1,x"], "workers", "--workers must be integers"),
    (["--workers=0"], "workers", "--workers must be at least 1"),
    (["--train_steps=0"], "train_steps", "--train_steps must be at least 1"),
    (["--steps=3", "--train_steps=4"], "train_steps", "disagree"),
    (["--timeout=0"], "timeout", "--timeout must be positive"),
])
def test_bad_values_are_usage_errors(argv, name, message):
  read = {"workers": tool_flags.worker_counts, "train_steps": tool_flags.train_steps,
          "timeout": tool_flags.timeout}[name]
  with pytest.raises(app.UsageError, match=message) as raised:
    read(_parse(*argv)[name])
  assert raised.value.exitcode == 2


def test_the_engine_is_local_unless_given_and_ray_needs_its_extra(monkeypatch):
  assert tool_flags.engine(_parse()["engine"]) == "local"
  monkeypatch.setitem(sys.modules, "ray", None)  # As if not installed: import fails.
  monkeypatch.delitem(sys.modules, "ray.train", raising=False)
  monkeypatch.delitem(sys.modules, "ray.train.tensorflow", raising=False)
  with pytest.raises(app.UsageError, match=r'--engine=ray: .*pip install -e "\.\[tf215,ray\]"'):
    tool_flags.engine(_parse("--engine=ray")["engine"])


@pytest.mark.parametrize("passed", [True, False])
def test_a_temporary_out_keeps_only_the_reports_when_every_check_passes(passed, tmp_path,
                                                                         monkeypatch, capsys):
  monkeypatch.setattr(tool_flags.tempfile, "tempdir", str(tmp_path))
  values = flags.FlagValues()
  holder = tool_flags.define_out("parity_report.{md,json}", values)
  values(["prog"])
  output = tool_flags.Output(holder, "parity", ("parity_*", "loss_curves.png"))
  out = output.path
  assert out.startswith(str(tmp_path / "parity-")) and f"Writing to {out}" in (
      capsys.readouterr().out)
  for name in ("parity_report.md", "cell/parity_report.json", "cell/loss_curves.png",
               "short/keras/model/ckpt-1.index", "short/keras/model/logs/chief-0.log"):
    (tmp_path / out / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / out / name).write_text("x")
  output.finish(passed)
  left = sorted(str(p.relative_to(out)) for p in (tmp_path / out).rglob("*") if p.is_file())
  if passed:
    assert left == ["cell/loss_curves.png", "cell/parity_report.json", "parity_report.md"]
    assert "the runs in" in capsys.readouterr().out and not (tmp_path / out / "short").exists()
  else:
    assert len(left) == 5 and "The runs are kept in" in capsys.readouterr().out


def test_a_given_out_keeps_everything(tmp_path):
  values = flags.FlagValues()
  holder = tool_flags.define_out(flag_values=values)
  values(["prog", f"--out={tmp_path}"])
  (tmp_path / "run.log").write_text("x")
  tool_flags.Output(holder, "chaos").finish(True)
  assert (tmp_path / "run.log").exists()
