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
