"""trainers.loop: the outer loop's dispatch, with a backend that records what it is asked."""

import dataclasses
import json
import os
from typing import Dict, List

import pytest
import tensorflow as tf

from launch import cluster
from launch.proofs import runs
from trainers import evaluation
from trainers import export
from trainers import failures
from trainers import loop
from trainers import model_dir as layout
from trainers import progress
from trainers.config import Config

CONFIG = Config(train_steps=6, global_batch_size=32)
METRICS = {"accuracy": 0.75, "loss": 0.5}


class _Recording(loop.Backend):
  """Trains nothing; records the calls the loop makes, in order."""

  name = "recording"
  calls: List[str] = []
  diverge = False

  def evaluate_checkpoints(self) -> None:
    self.calls.append("evaluate_checkpoints")

  def train(self) -> loop.Trained:
    self.calls.append(f"train chief={self.run.chief} chief_evaluates={self.run.chief_evaluates}")
    if self.diverge:
      raise failures.diverged(4)
    report = progress.Progress(self.run.config.train_steps, None)
    report.start(0)
    report.log(6, 0.25)
    report.end()
    return loop.Trained(6, report, [1.0, 0.5], [0.1, 0.05])

  def evaluate(self, step: int) -> Dict[str, float]:
    self.calls.append(f"evaluate {step}")
    return METRICS

  def export(self) -> str:
    self.calls.append("export")
    return "/exported"

  def export_evaluation(self, step: int, metrics: Dict[str, float]) -> str:
    self.calls.append(f"export_evaluation {step}")
    return "/exported/best"


class _ClusterStrategy:
  """What the loop reads of a MultiWorkerMirroredStrategy: its cluster, and one replica."""

  num_replicas_in_sync = 1

  def __init__(self, task_type: str, task_id: int, jobs: Dict[str, List[str]]):
    self.cluster_resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(jobs), task_type=task_type, task_id=task_id)


@pytest.fixture(name="backend")
def _backend(monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  monkeypatch.setattr(_Recording, "calls", [])
  return _Recording


def _as_task(monkeypatch, index: int, evaluator: bool) -> _ClusterStrategy:
  """Sets TF_CONFIG to task `index` of a 2-worker cluster; returns its strategy."""
  tf_config = cluster.make_tf_configs(["localhost:1", "localhost:2", "localhost:3"],
                                      evaluator)[index]
  monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
  jobs = {job: addresses for job, addresses in tf_config["cluster"].items()
          if job != cluster.EVALUATOR}
  return _ClusterStrategy(tf_config["task"]["type"], tf_config["task"]["index"], jobs)


def test_a_lone_process_trains_evaluates_exports_and_writes_the_summary(tmp_path, backend):
  config = Config(**{**CONFIG.__dict__, "record_dir": str(tmp_path / "record")})
  summary = loop.train_and_evaluate(backend, config, str(tmp_path),
                                    strategy=tf.distribute.get_strategy())
  assert backend.calls == ["train chief=True chief_evaluates=True", "evaluate 6", "export"]
  assert summary == runs.read_summary(str(tmp_path))
  assert (summary["backend"], summary["global_step"], summary["test_accuracy"],
          summary["export_dir"]) == ("recording", 6, 0.75, "/exported")
  with open(tmp_path / "record" / layout.LOSSES_FILE) as f:
    assert json.load(f) == {"backend": "recording", "losses": [1.0, 0.5],
                            "learning_rates": [0.1, 0.05]}


def test_the_chief_of_a_cluster_with_an_evaluator_takes_its_result(tmp_path, backend,
                                                                   monkeypatch):
  strategy = _as_task(monkeypatch, 0, evaluator=True)
  evaluation.write_result(str(tmp_path), 6, {"accuracy": 0.5, "loss": 1.0})
  summary = loop.train_and_evaluate(backend, CONFIG, str(tmp_path), strategy=strategy)
  assert backend.calls == ["train chief=True chief_evaluates=False", "export"]
  assert (summary["workers"], summary["test_accuracy"]) == (2, 0.5)


def test_with_latest_or_best_the_task_that_evaluates_exports(tmp_path, backend, monkeypatch):
  config = dataclasses.replace(CONFIG, export="best", export_metric="loss")
  (tmp_path / "alone").mkdir()
  summary = loop.train_and_evaluate(backend, config, str(tmp_path / "alone"),
                                    strategy=tf.distribute.get_strategy())
  assert backend.calls[-2:] == ["evaluate 6", "export_evaluation 6"]
  assert summary["export_dir"] == "/exported/best"
  # In a cluster, the chief waits for the evaluator task's decision on its final step.
  monkeypatch.setattr(backend, "calls", [])
  strategy = _as_task(monkeypatch, 0, evaluator=True)
  evaluation.write_result(str(tmp_path), 6, {"accuracy": 0.5, "loss": 1.0})
  exports = export.Exports(export.Policy.of(config), str(tmp_path))
  exported = exports.after_evaluation(6, {"loss": 1.0}, lambda directory: None)
  summary = loop.train_and_evaluate(backend, config, str(tmp_path), strategy=strategy)
  assert backend.calls == ["train chief=True chief_evaluates=False"]
  assert summary["export_dir"] == exported


def test_a_worker_trains_and_writes_nothing(tmp_path, backend, monkeypatch):
  strategy = _as_task(monkeypatch, 1, evaluator=False)
  assert loop.train_and_evaluate(backend, CONFIG, str(tmp_path), strategy=strategy) is None
  assert backend.calls == ["train chief=False chief_evaluates=True"]
  assert os.listdir(tmp_path) == []


def test_the_evaluator_task_only_evaluates_checkpoints(tmp_path, backend, monkeypatch):
  _as_task(monkeypatch, 2, evaluator=True)
  # No strategy is given: one would be created, and fail, if the loop tried.
  assert loop.train_and_evaluate(backend, CONFIG, str(tmp_path)) is None
  assert backend.calls == ["evaluate_checkpoints"]


@pytest.mark.parametrize("task", [0, 1])
def test_a_divergence_is_set_aside_by_the_chief_only(tmp_path, backend, monkeypatch, task):
  strategy = _as_task(monkeypatch, task, evaluator=False)
  monkeypatch.setattr(backend, "diverge", True)
  with pytest.raises(failures.DivergedError) as raised:
    loop.train_and_evaluate(backend, CONFIG, str(tmp_path), strategy=strategy)
  assert ("Nothing saved holds NaN or Inf" in str(raised.value)) == (task == 0)
  assert backend.calls == [f"train chief={task == 0} chief_evaluates=True"]
