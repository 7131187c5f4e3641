"""trainers.export: an export appears whole under its final name, or leaves nothing; one
evaluation history replayed into the Estimator's own LatestExporter and BestExporter and
into Keras's `Exports` keeps the same exports; the record and the chief's wait."""

import os
import threading

import pytest

from trainers import export
from trainers import model_dir as layout

# (step, loss, accuracy), and where the evaluating process restarts (a new exporter).
HISTORY = [(10, 1.2, 0.60), (20, 0.9, 0.70), (30, 0.9, 0.72), (40, 0.95, 0.71),
           (50, 0.85, 0.75), (60, 0.86, 0.74), (70, 0.80, 0.76), (80, 0.82, 0.77)]
RESTART_BEFORE = 60
# Each policy, and the steps it exports and keeps: BestExporter's rule exports a process's
# first evaluation whatever it is, ties are not better, and it keeps the largest timestamps.
POLICIES = [
    (export.Policy(export.BEST, 2, "loss", "min"), [10, 20, 50, 60, 70], [60, 70]),
    (export.Policy(export.BEST, None, "accuracy", "max"), [10, 20, 30, 50, 60, 70, 80],
     [10, 20, 30, 50, 60, 70, 80]),
    (export.Policy(export.LATEST, 3), [step for step, _, _ in HISTORY], [60, 70, 80]),
]


class _Clock:
  """export's `time`: a second per call of time(), so every export has its own timestamp
  and none waits."""

  def __init__(self):
    self.now = 1_700_000_000

  def time(self):
    self.now += 1
    return float(self.now)

  def sleep(self, seconds):
    self.now += seconds

  def monotonic(self):
    return float(self.now)


def _saver(step):
  def save(directory):
    with open(os.path.join(directory, "step"), "w") as f:
      f.write(str(step))
  return save


def _step_of(export_dir):
  with open(os.path.join(export_dir, "step")) as f:
    return int(f.read())


def _kept_steps(parent):
  return sorted(_step_of(os.path.join(parent, name)) for name in os.listdir(parent)
                if name.isdigit())


def test_a_staged_export_is_renamed_into_place(tmp_path):
  export_dir = export.write_staged(str(tmp_path / "export"), _saver(1))
  assert os.path.dirname(export_dir) == str(tmp_path / layout.EXPORT_SUBDIR)
  assert os.listdir(tmp_path / layout.EXPORT_SUBDIR) == [os.path.basename(export_dir)]
  assert os.listdir(export_dir) == ["step"]


def test_a_failed_save_leaves_no_export_under_a_final_name(tmp_path):
  def save(directory):
    raise OSError(28, "No space left on device")

  with pytest.raises(OSError):
    export.write_staged(str(tmp_path), save)
  assert os.listdir(tmp_path) == []


def test_an_export_in_the_same_second_waits_for_the_next(tmp_path, monkeypatch):
  clock = _Clock()
  monkeypatch.setattr(clock, "time", lambda: float(clock.now))  # Stands still but for sleep.
  monkeypatch.setattr(export, "time", clock)
  first = export.write_staged(str(tmp_path), _saver(1))
  second = export.write_staged(str(tmp_path), _saver(2))
  assert int(os.path.basename(second)) == int(os.path.basename(first)) + 1


@pytest.mark.parametrize("policy,exported,kept", POLICIES)
def test_keras_exports_keep_what_the_rule_says(policy, exported, kept, tmp_path, monkeypatch):
  monkeypatch.setattr(export, "time", _Clock())
  exports = export.Exports(policy, str(tmp_path))
  for step, loss, accuracy in HISTORY:
    if step == RESTART_BEFORE:
      exports = export.Exports(policy, str(tmp_path))
    exports.after_evaluation(step, {"loss": loss, "accuracy": accuracy}, _saver(step))
  record = export.read_record(str(tmp_path), policy)
  assert [entry["step"] for entry in record if entry["export_dir"]] == exported
  assert [entry["step"] for entry in record] == [step for step, _, _ in HISTORY]
  assert _kept_steps(policy.directory(str(tmp_path))) == kept
  current = export.current(str(tmp_path), policy)
  assert _step_of(current) == exported[-1]


class _Estimator:
  """What the Estimator's exporters use of an Estimator: its model_dir, and an export of a
  checkpoint (here a file naming its step) at the timestamp the Estimator would choose."""

  def __init__(self, model_dir):
    self.model_dir = model_dir

  def export_saved_model(self, export_dir_base, serving_input_receiver_fn, assets_extra=None,
                         as_text=False, checkpoint_path=None, **kwargs):
    step = int(checkpoint_path.rsplit("-", 1)[-1])
    return export.write_staged(export_dir_base, _saver(step)).encode()


@pytest.mark.estimator
@pytest.mark.parametrize("policy,exported,kept", POLICIES)
def test_the_estimators_exporters_keep_the_same_exports(policy, exported, kept, tmp_path,
                                                        monkeypatch):
  import tensorflow as tf  # noqa: PLC0415
  from trainers import estimator_trainer  # noqa: PLC0415
  from trainers.config import Config  # noqa: PLC0415
  monkeypatch.setattr(export, "time", _Clock())
  config = Config(export=policy.kind, exports_to_keep=policy.keep or 0,
                  export_metric=policy.metric, export_mode=policy.mode
                  if policy.kind == export.BEST else "min")
  assert export.Policy.of(config) == policy
  model_dir = str(tmp_path)
  exporter = estimator_trainer.make_exporter(config, policy)
  for step, loss, accuracy in HISTORY:
    if step == RESTART_BEFORE:
      exporter = estimator_trainer.make_exporter(config, policy)
    # As the Estimator's evaluator calls its exporters after writing each evaluation.
    exporter.export(_Estimator(model_dir), policy.directory(model_dir),
                    f"{model_dir}/model.ckpt-{step}",
                    {"loss": loss, "accuracy": accuracy, tf.compat.v1.GraphKeys.GLOBAL_STEP: step},
                    step == HISTORY[-1][0])
  record = export.read_record(model_dir, policy)
  assert [entry["step"] for entry in record if entry["export_dir"]] == exported
  assert _kept_steps(policy.directory(model_dir)) == kept


def test_collecting_garbage_keeps_the_largest_timestamps_and_nothing_else_is_touched(tmp_path):
  for name in ("1700000003", "1700000001", "1700000002", "temp-1700000004", "exports.jsonl",
               "123"):
    (tmp_path / name).mkdir()
  export.collect_garbage(str(tmp_path), 2)
  assert sorted(os.listdir(tmp_path)) == ["123", "1700000002", "1700000003", "exports.jsonl",
                                          "temp-1700000004"]
  export.collect_garbage(str(tmp_path), None)
  assert len(os.listdir(tmp_path)) == 5


def test_the_chief_waits_for_the_evaluators_decision_on_its_final_step(tmp_path):
  policy = export.Policy(export.BEST, 2, "loss")
  parent = policy.directory(str(tmp_path))
  exports = export.Exports(policy, str(tmp_path))
  exports.after_evaluation(10, {"loss": 0.5}, _saver(10))

  def evaluate_the_final_step():
    exports.after_evaluation(20, {"loss": 0.7}, _saver(20))  # Worse: not exported.

  later = threading.Timer(1.5, evaluate_the_final_step)
  later.start()
  current = export.wait_for(str(tmp_path), policy, 20, timeout=30)
  later.join()
  assert _step_of(current) == 10
  assert [entry["step"] for entry in export.read_record(str(tmp_path), policy)] == [10, 20]
  assert _kept_steps(parent) == [10]
  with pytest.raises(TimeoutError, match="step 30"):
    export.wait_for(str(tmp_path), policy, 30, timeout=1)


@pytest.mark.parametrize("backend", ["keras", pytest.param("estimator",
                                                           marks=pytest.mark.estimator)])
def test_an_evaluation_without_the_export_metric_is_named(backend, tmp_path, monkeypatch):
  """A team's program's eval_metric_ops, which no check before training reads: its first
  evaluation already."""
  from trainers import evaluation  # noqa: PLC0415
  from trainers.config import Config  # noqa: PLC0415
  monkeypatch.setattr(export, "time", _Clock())
  policy = export.Policy(export.BEST, 2, "auc")
  if backend == "keras":
    def evaluate(step, metrics):
      export.Exports(policy, str(tmp_path)).after_evaluation(step, metrics, _saver(step))
  else:
    from trainers import estimator_trainer  # noqa: PLC0415
    exporter = estimator_trainer.make_exporter(
        Config(export="best", export_metric="auc"), policy)

    def evaluate(step, metrics):
      exporter.export(_Estimator(str(tmp_path)), policy.directory(str(tmp_path)),
                      f"{tmp_path}/model.ckpt-{step}", {**metrics, "global_step": step}, False)
  with pytest.raises(evaluation.MissingMetricError,
                     match=r"--export_metric=auc: the evaluation of step 10 has no such "
                           r"metric; it has accuracy, loss\."):
    evaluate(10, {"loss": 0.5, "accuracy": 0.9})
  assert not os.path.exists(policy.directory(str(tmp_path)))
