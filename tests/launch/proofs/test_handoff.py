"""launch.handoff: each backend's own resume equals the other backend's resume of the same
checkpoint, on real data; tampered conversions fail."""

import dataclasses
import json
import os

import pytest
import tensorflow as tf

from launch.convert import carry
from launch.proofs import handoff
from launch.proofs import runs
from tests.conftest import run_module, tamper_keras_checkpoint
from trainers.config import Config

pytestmark = pytest.mark.estimator  # Both backends, side by side.

# 1e-6 weight limits hold on real MNIST (tests/launch/proofs/test_parity.py): this runs on it.
SPLIT, STEPS, RESUME = 20, 60, 10
SCHEDULE_FLAGS = ["--learning_rate_schedule=exponential", "--decay_rate=0.5", "--staircase",
                  f"--decay_steps={SPLIT}", f"--warmup_steps={SPLIT}"]


def _zero_slots(model, config):
  del config
  for slot in model.optimizer.variables[1:]:
    slot.assign(tf.zeros_like(slot))


def _reset_step(model, config):
  del config
  model.optimizer.iterations.assign(0)


@pytest.mark.real_data
def test_cli_passes_every_check_and_tampering_fails(real_data_dir, tmp_path):
  # One worker, for CI's time: each run is one process. The 2-worker figures in
  # docs/parity.md were measured with the same command at --workers=1,2. Adam: two slots
  # a weight and its powers of beta, which the converter checks against the step. A
  # schedule whose staircase steps down, and whose warm-up ends, at the split: the carried
  # step must drive the converted schedule.
  out = tmp_path / "handoff"
  result = run_module("launch.handoff", ["--workers=1", "--optimizer=adam", f"--split_at={SPLIT}",
                                         f"--train_steps={SPLIT + RESUME}", *SCHEDULE_FLAGS,
                                         f"--data_dir={real_data_dir}", f"--out={out}",
                                         "--nomeasure_uninterrupted"],  # Two runs fewer.
                      timeout=1500)
  assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
  assert "Overall: PASS" in result.stdout
  report = json.loads((out / "handoff_report.json").read_text())
  names = [c["name"] for c in report["checks"]]
  own, handed = "estimator-then-estimator", "estimator-then-keras"
  pair = f"{own} vs {handed}"
  for expected in ("1w: every Estimator variable mapped or ignored",
                   "1w: max |diff|, answers predict/logits, Estimator vs converted Keras",
                   "1w: signature classification: method, inputs and outputs, Estimator vs "
                   "converted Keras",
                   # The way back: Keras's checkpoint converted serves as Keras's export.
                   "1w: max |diff|, answers predict/logits, Keras vs converted Estimator",
                   "1w: bad request, malformed proto to predict: same error, Keras and "
                   "converted Estimator",
                   f"1w {pair}: max |weight diff| {pair}",
                   "1w keras-then-keras vs keras-then-estimator: max |weight diff| "
                   "keras-then-keras vs keras-then-estimator",
                   f"1w {pair}: per-step loss rel diff after the split {pair}",
                   f"1w {handed}: learning rate at step 21",
                   f"1w {handed}: resumed from the split"):
    assert expected in names, names
  assert {len(v) for k, v in report["losses"].items() if " 0-" not in k} == {RESUME}
  assert report["measured"] == {} and os.path.getsize(out / "loss_curves.png") > 10_000

  accounted = next(c for c in report["checks"] if "every Estimator variable" in c["name"])
  assert accounted["measured"] == 21, accounted  # 6 weights, 12 slots, 2 powers, the step.

  # Negative controls: the Estimator's checkpoint at the split converted, with
  # its step reset or its optimizer's state zeroed. A reset step already fails the rate
  # check, before any step is taken; zeroed state keeps the rate, so Keras
  # trains again from it: the resume checks against the Estimator's own must fail.
  run_dir = out / "1w"
  config = Config(data_dir=real_data_dir, init_weights=str(out / "init_weights.npz"),
                  deterministic=True, optimizer="adam", learning_rate_schedule="exponential",
                  decay_rate=0.5, staircase=True, decay_steps=SPLIT, warmup_steps=SPLIT)
  tolerances = handoff.Tolerances()
  for name, change in (("reset_step", _reset_step), ("zero_slots", _zero_slots)):
    leg = tmp_path / name
    carry.estimator_to_keras(str(run_dir / "estimator-first" / "model"), str(leg / "model"),
                               config=config)
    tamper_keras_checkpoint(str(leg / "model"), config, change)
    rate = handoff.rate_check(name, "keras", str(leg / "model"), config, SPLIT,
                               tolerances.learning_rate_atol)
    assert rate.passed == (name == "zero_slots"), rate
  name, leg = "zero_slots", tmp_path / "zero_slots"
  summary = runs.run_trainer(
      "keras", dataclasses.replace(config, train_steps=SPLIT + RESUME, record_dir=str(leg),
                                   checkpoint_every_steps=SPLIT + RESUME),
      workers=1, model_dir=str(leg / "model"), log_path=str(leg / "run.log"))
  losses = {own: json.loads((run_dir / own / "losses.json").read_text())["losses"],
            name: json.loads((leg / "losses.json").read_text())["losses"]}
  checks = handoff.resume_checks(name, {own: runs.read_summary(str(run_dir / own / "model")),
                                        name: summary}, losses,
                                 {own: "estimator", name: "keras"}, tolerances, config)
  weights = next(c for c in checks if "max |weight diff|" in c.name)
  assert not weights.passed and weights.measured > 1e-4, handoff.format_table(
      handoff.Report([1], SPLIT, SPLIT + RESUME, SPLIT, checks, {}, {}))
  # Same steps, same rates: only the optimizer's state differs.
  assert len(losses[name]) == RESUME
  assert not next(c for c in checks if "per-step loss" in c.name).passed


@pytest.mark.real_data
@pytest.mark.parametrize("flags, variables", [
    # The canned DNNClassifier: weights, Adagrad's training/ slots, its hyperparameter
    # variables and the step; its export is fed tf.Examples.
    pytest.param(["--model=dnn", "--hidden_units=64"], 11, marks=pytest.mark.extended),
    # The canned DNNLinearCombinedClassifier over the built-in feature columns: both parts'
    # weights (the linear part's per column, the DNN part's embedding tables), Adagrad's
    # and Ftrl's slots of each, their hyperparameters and counts; its exports are fed the
    # tabular tf.Examples, their edge cases (50 serving checks each way) too.
    # (Extended: its columns carried bit for bit in tests/launch/convert/test_canned.py, its
    # exports served tf.Examples in tests/launch/proofs/test_serving_check.py.)
    pytest.param(["--model=wide_deep", "--features=tabular", "--hidden_units=64"], 48,
                 marks=pytest.mark.extended),
    # Momentum, the default: a slot a weight. RMSProp at momentum 0: a v1 slot the Keras
    # twin does not keep, 6 of 12 ignored and written back as zeros. (Each optimizer's
    # state also goes across and back bit for bit in tests/launch/convert/test_carry.py.)
    pytest.param(["--optimizer=momentum", f"--decay_steps={STEPS}"], 13,
                 marks=pytest.mark.extended),
    pytest.param(["--optimizer=rmsprop", f"--decay_steps={STEPS}"], 19,
                 marks=pytest.mark.extended),
    # tf.compat.v1's DNNLinearCombinedClassifier: a v1 optimizer per part (Adagrad's 6
    # slots, Ftrl's 4), one step for the twin's two counts.
    pytest.param(["--model=wide_deep_v1"], 19, marks=pytest.mark.extended),
    # The staircase and warm-up ending at the split, with momentum's slots (13 variables);
    # with Adam's in CI: test_cli_passes_every_check_and_tampering_fails.
    pytest.param(SCHEDULE_FLAGS, 13, marks=pytest.mark.extended),
], ids=["canned-dnn", "canned-wide_deep-tabular", "momentum", "rmsprop", "canned-wide_deep_v1",
        "staircase-warmup"])
def test_cli_carries_each_kind_of_state_both_ways(flags, variables, real_data_dir, tmp_path):
  out = tmp_path / "handoff"
  result = run_module("launch.handoff", ["--workers=1", *flags, f"--split_at={SPLIT}",
                                         f"--train_steps={SPLIT + RESUME}",
                                         f"--data_dir={real_data_dir}", f"--out={out}",
                                         "--nomeasure_uninterrupted"], timeout=1500)
  assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
  checks = json.loads((out / "handoff_report.json").read_text())["checks"]
  assert all(c["passed"] for c in checks), [c for c in checks if not c["passed"]]
  # 13, and the serving check's 27 each way: 5 on the signatures, 16 on answers, 6 on bad
  # requests (over the tabular features, 50: their edge cases and bad requests too).
  served = 50 if "--features=tabular" in flags else 27
  assert len(checks) == 13 + 2 * served, [c["name"] for c in checks]
  accounted = next(c for c in checks if "every Estimator variable" in c["name"])
  assert accounted["measured"] == variables, accounted


@pytest.mark.real_data
@pytest.mark.extended  # Six runs of a cluster each (a chief, a ps, an evaluator): 4 minutes.
def test_at_one_worker_on_a_parameter_server_the_handoff_changes_nothing(real_data_dir,
                                                                         tmp_path):
  out = tmp_path / "handoff"
  result = run_module("launch.handoff", ["--workers=1", "--ps=1", f"--split_at={SPLIT}",
                                         f"--train_steps={SPLIT + RESUME}",
                                         f"--decay_steps={STEPS}", "--nomeasure_uninterrupted",
                                         f"--data_dir={real_data_dir}", f"--out={out}"],
                      timeout=1500)
  assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
  report = json.loads((out / "handoff_report.json").read_text())
  assert report["passed"] and report["ps"] == 1
  for leg in ("estimator-then-keras", "keras-then-estimator"):  # Resumed on the ps task.
    assert (out / "1w" / leg / "model" / "logs" / "ps-0.log").exists(), leg
  weights = [c for c in report["checks"] if "max |weight diff|" in c["name"]]
  assert weights and all(c["measured"] == 0 for c in weights), weights
  refused = run_module("launch.handoff", ["--workers=2", "--ps=1"])
  assert refused.returncode == 2 and "goes with --workers=1" in refused.stderr


@pytest.mark.parametrize("args, said", [
    (["--split_at=50", "--train_steps=50", "--decay_steps=100"], None),
    # The old meaning of --train_steps (the schedule's length): the run says which it took.
    (["--split_at=500", "--train_steps=1200"], "note: --train_steps=1200 is taken as the step"),
    (["--split_at=50", "--resume_steps=60", "--decay_steps=100"],
     "warning: --resume_steps is deprecated; use --train_steps=110"),
    (["--split_at=50", "--train_steps=50", "--decay_steps=100", "--logit_atol=1e-4"],
     "warning: --logit_atol is deprecated; use --logits_atol=0.0001"),
])
def test_cli_rejects_a_split_or_an_end_past_the_schedule_saying_how_it_read_them(args, said):
  result = run_module("launch.handoff", args)
  assert result.returncode == 2 and "Need 0 < --split_at" in result.stderr, result.stderr
  assert said is None or said in result.stderr, result.stderr


def test_the_table_says_a_canned_model_resumes_at_constant_rates_not_on_a_schedule():
  checks = [handoff.Check("c", True, 0.0, 1.0)]
  scheduled = handoff.format_table(handoff.Report([1], SPLIT, SPLIT + RESUME, STEPS, checks,
                                                  {}, {}))
  assert f"resumed to step {SPLIT + RESUME} on a {STEPS}-step schedule" in scheduled
  constant = handoff.format_table(handoff.Report([1], SPLIT, SPLIT + RESUME, None, checks, {},
                                                 {}))
  assert "at the canned model's constant rates" in constant and "schedule" not in constant


@pytest.mark.parametrize("args, said", [
    ([], "holds no checkpoint (no `checkpoint` file naming one): give the model_dir your "
         "program trains in"),
    (["--split_at=5", "--nomeasure_uninterrupted"],
     "with no run of ours before it: leave out --split_at, --measure_uninterrupted"),
])
def test_cli_from_a_model_dir_refuses_what_does_not_apply_writing_nothing(args, said, tmp_path):
  theirs = tmp_path / "theirs"
  theirs.mkdir()
  result = run_module("launch.handoff", [f"--from_model_dir={theirs}",
                                         f"--out={tmp_path / 'out'}", *args])
  assert result.returncode == 2 and said in result.stderr, result.stderr
  assert "Traceback" not in result.stderr
  assert not (tmp_path / "out").exists() and not list(theirs.iterdir())
