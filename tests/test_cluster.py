"""launch.cluster: TF_CONFIG generation and parsing."""

import json

import pytest

from launch import cluster


def _env(tf_config):
  return {"TF_CONFIG": tf_config if isinstance(tf_config, str) else json.dumps(tf_config)}


def test_make_tf_configs_for_workers_and_evaluator():
  configs = cluster.make_tf_configs([1111, 2222, 3333], evaluator=True)
  assert [c["task"] for c in configs] == [
      {"type": "chief", "index": 0}, {"type": "worker", "index": 0},
      {"type": "worker", "index": 1}, {"type": "evaluator", "index": 0}]
  assert all(c["cluster"] == {"chief": ["localhost:1111"],
                              "worker": ["localhost:2222", "localhost:3333"]} for c in configs)
  tasks = [cluster.parse_tf_config(_env(c)) for c in configs]
  assert [t.is_chief for t in tasks] == [True, False, False, False]
  assert {t.num_workers for t in tasks} == {3}


def test_single_worker_cluster_has_only_a_chief():
  (config,) = cluster.make_tf_configs([1111])
  assert config["cluster"] == {"chief": ["localhost:1111"]}


def test_no_tf_config_means_one_local_process():
  assert cluster.parse_tf_config({}) is None
  assert cluster.parse_tf_config(_env({"task": {"type": "worker", "index": 0}})) is None


def test_worker_zero_is_chief_without_a_chief_job():
  env = _env({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}})
  task = cluster.parse_tf_config(env)
  assert task.is_chief and task.num_workers == 2 and task.name == "worker:0"


@pytest.mark.parametrize("tf_config, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}}, "out of range"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}}, "non-negative"),
    ({"cluster": {"worker": ["a:1"], "ps": ["b:2"]}, "task": {"type": "worker"}}, "'ps'"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}}, "is not run here"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}, "no job"),
    ({"cluster": {"chief": ["a:1", "b:2"]}, "task": {"type": "chief"}}, "exactly one"),
    ({"cluster": {"worker": "a:1"}, "task": {"type": "worker"}}, "non-empty list"),
    ({"cluster": {"chief": ["a:1"]}, "task": {"type": "evaluator", "index": 2}}, "one evaluator"),
])
def test_bad_tf_config_is_rejected_with_the_reason(tf_config, message):
  with pytest.raises(cluster.TFConfigError, match=message):
    cluster.parse_tf_config(_env(tf_config))


def test_free_ports_are_distinct():
  ports = cluster.pick_free_ports(5)
  assert len(set(ports)) == 5 and all(p > 0 for p in ports)
