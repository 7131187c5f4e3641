"""trainers.program: --estimator_program names a team's program; each way it can be wrong is
named with its fix, before TensorFlow is imported."""

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO
from trainers import program
from trainers.config import Config
from trainers.program import EstimatorProgram, ProgramError


def model_fn(features, labels, mode):
  raise AssertionError("not called here")


@pytest.mark.parametrize("settings, said", [
    ({"model_fn": 3}, "EstimatorProgram(model_fn=...) is a int, not a function"),
    ({"input_fn": "input.py"}, "input_fn=...) is a str"),
    ({"run_config": {"save_checkpoints_steps": 100}},
     "sets save_checkpoints_steps from --checkpoint_every_steps"),
    ({"run_config": {"session_config": None}}, "strategy, which configures the session"),
    ({"run_config": {"keep_checkpoint_max": 0}}, "give a positive number"),
    ({"run_config": {"keep_checkpoint_max": True}}, "give a positive number"),
    ({"run_config": {"protocol": "grpc"}}, "it takes keep_checkpoint_max, "
                                           "keep_checkpoint_every_n_hours"),
    ({"params": {"dropout": 0.5}, "deterministic_params": {"droput": 0.0}},
     "sets 'droput', which params does not have: name one of its keys ('dropout')"),
])
def test_a_program_that_cannot_run_here_says_what_to_change(settings, said):
  with pytest.raises(ProgramError, match=re.escape(said)):
    EstimatorProgram(**{"model_fn": model_fn, **settings})


def test_params_take_program_params_over_them_and_refuse_a_key_they_lack():
  the_program = EstimatorProgram(model_fn, params={"dropout": 0.5, "units": 64, "name": "x"})
  assert the_program.params_with("") == {"dropout": 0.5, "units": 64, "name": "x"}
  assert the_program.params_with("dropout=0,units=32") == {"dropout": 0.0, "units": 32,
                                                           "name": "x"}
  assert isinstance(the_program.params_with("units=32")["units"], int)
  with pytest.raises(ProgramError, match="--program_params: the program's params has no "
                                         "option 'depth'"):
    the_program.params_with("depth=3")


def test_a_name_that_finds_no_program_says_which_form_works(tmp_path, monkeypatch):
  (tmp_path / "team_programs.py").write_text(
      "from trainers.program import EstimatorProgram\n"
      "PROGRAM = EstimatorProgram(model_fn=lambda features, labels, mode: None)\n"
      "OTHER = 3\n")
  (tmp_path / "broken_program.py").write_text(
      "from trainers.program import EstimatorProgram\n"
      "PROGRAM = EstimatorProgram(model_fn=print, run_config={'model_dir': '/tmp'})\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  assert isinstance(program.load("team_programs:PROGRAM"), EstimatorProgram)
  for name, said in [("team_programs", "--estimator_program takes package.module:NAME"),
                     ("no_such_team.programs:PROGRAM", "no module no_such_team.programs"),
                     ("team_programs:MISSING", "team_programs has no MISSING. Define MISSING "
                                               "= EstimatorProgram"),
                     ("team_programs:OTHER", "is a int, not a trainers.program.EstimatorProgram"),
                     ("broken_program:PROGRAM", "sets model_dir from --model_dir")]:
    with pytest.raises(ProgramError, match=re.escape(said)):
      program.load(name)


def test_the_flags_are_checked_together_without_importing_tensorflow(tmp_path):
  # In a fresh process: this one may have imported TensorFlow already.
  code = ("import sys\nfrom trainers.config import Config\n"
          "Config(estimator_program='team_programs:PROGRAM', program_params='dropout=0')"
          ".validate()\nprint('tensorflow' in sys.modules)")
  (tmp_path / "team_programs.py").write_text("raise ImportError('never imported by a check')\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False,
                          env={"PYTHONPATH": f"{REPO}:{tmp_path}", "PATH": "/usr/bin:/bin"})
  assert result.stdout.strip() == "False", result.stderr[-2000:]
  for settings, said in [({"program_params": "dropout=0"}, "give --estimator_program too"),
                         ({"estimator_program": "x:P", "model": "dnn"}, "--model=dnn is a "
                                                                        "canned Estimator"),
                         ({"estimator_program": "x:P", "program_params": "dropout"},
                          "--program_params='dropout': 'dropout' is not NAME=NUMBER")]:
    with pytest.raises(ValueError, match=re.escape(said)):
      Config(**settings).validate(find_model=False)
