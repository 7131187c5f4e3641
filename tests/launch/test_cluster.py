"""launch.cluster: TF_CONFIG generation and parsing."""

import json
import re

import pytest

from launch import cluster
from tests.conftest import kubeflow_tf_configs, vertex_tf_configs


def _env(tf_config):
  return {"TF_CONFIG": tf_config if isinstance(tf_config, str) else json.dumps(tf_config)}


def test_make_tf_configs_for_workers_and_evaluator():
  configs = cluster.make_tf_configs([1111, 2222, 3333, 4444], evaluator=True)
  assert [c["task"] for c in configs] == [
      {"type": "chief", "index": 0}, {"type": "worker", "index": 0},
      {"type": "worker", "index": 1}, {"type": "evaluator", "index": 0}]
  # As Kubeflow writes it: every task's cluster lists the evaluator too.
  assert all(c["cluster"] == {"chief": ["localhost:1111"],
                              "worker": ["localhost:2222", "localhost:3333"],
                              "evaluator": ["localhost:4444"]} for c in configs)
  tasks = [cluster.parse_tf_config(_env(c)) for c in configs]
  assert [t.is_chief for t in tasks] == [True, False, False, False]
  assert {t.num_workers for t in tasks} == {3}
  assert all(t.has_evaluator for t in tasks)
  assert tasks[0].training_cluster == {"chief": ["localhost:1111"],
                                       "worker": ["localhost:2222", "localhost:3333"]}
  assert tasks[3].address is None  # The evaluator serves nothing: no port to check.
  assert {t.num_ps for t in tasks} == {0}


def test_make_tf_configs_with_parameter_servers():
  configs = cluster.make_tf_configs([1111, 2222, 3333, 4444, 5555], evaluator=True, ps=2)
  assert [c["task"] for c in configs] == [
      {"type": "chief", "index": 0}, {"type": "worker", "index": 0},
      {"type": "ps", "index": 0}, {"type": "ps", "index": 1},
      {"type": "evaluator", "index": 0}]
  assert all(c["cluster"] == {"chief": ["localhost:1111"], "worker": ["localhost:2222"],
                              "ps": ["localhost:3333", "localhost:4444"],
                              "evaluator": ["localhost:5555"]} for c in configs)
  tasks = [cluster.parse_tf_config(_env(c)) for c in configs]
  assert [t.is_chief for t in tasks] == [True, False, False, False, False]
  assert {(t.num_workers, t.num_ps) for t in tasks} == {(2, 2)}
  assert tasks[2].address == "localhost:3333" and tasks[2].name == "ps:0"
  # The gradient computers, and every server (what a ps-mode session's cluster lists).
  assert tasks[0].training_cluster == {"chief": ["localhost:1111"], "worker": ["localhost:2222"]}
  assert tasks[0].servers == {"chief": ["localhost:1111"], "worker": ["localhost:2222"],
                              "ps": ["localhost:3333", "localhost:4444"]}


@pytest.mark.parametrize("replicas, chief", [
    ({"Chief": 1, "Worker": 2, "Evaluator": 1}, "chief-0"),
    ({"Worker": 3, "Evaluator": 1}, "worker-0"),  # No Chief replica: worker 0 is the chief.
    ({"Chief": 1, "Worker": 1}, "chief-0"),
    ({"Chief": 1, "Worker": 1, "PS": 2, "Evaluator": 1}, "chief-0"),
])
def test_tf_config_as_the_kubeflow_operator_writes_it(replicas, chief):
  configs = kubeflow_tf_configs("mnist", "team-a", replicas)
  tasks = {name: cluster.parse_tf_config({"TF_CONFIG": raw}) for name, raw in configs.items()}
  assert [name for name, t in tasks.items() if t.is_chief] == [chief]
  training = sum(n for r, n in replicas.items() if r in ("Chief", "Worker"))
  assert {(t.num_workers, t.num_ps) for t in tasks.values()} == {(training,
                                                                   replicas.get("PS", 0))}
  assert {t.has_evaluator for t in tasks.values()} == {"Evaluator" in replicas}
  for name, task in tasks.items():
    assert not {"evaluator", "ps"} & set(task.training_cluster)
    expected = (None if task.type == cluster.EVALUATOR else
                f"mnist-{task.type}-{task.index}.team-a.svc:2222")
    assert task.address == expected, name


def test_tf_config_as_vertex_ai_writes_it_master_as_chief_evaluator_outside():
  tasks = {name: cluster.parse_tf_config({"TF_CONFIG": raw})
           for name, raw in vertex_tf_configs(3).items()}
  assert {name: (t.type, t.index, t.is_chief) for name, t in tasks.items()} == {
      "master-0": ("chief", 0, True), "worker-0": ("worker", 0, False),
      "worker-1": ("worker", 1, False), "evaluator-0": ("evaluator", 0, False)}
  assert {t.num_workers for t in tasks.values()} == {3}
  assert tasks["master-0"].training_cluster == {
      "chief": ["cmle-training-master-abc-0:2222"],
      "worker": ["cmle-training-worker-abc-0:2222", "cmle-training-worker-abc-1:2222"]}
  # Outside the cluster, the training tasks do not know of it: the chief evaluates too.
  assert not tasks["master-0"].has_evaluator and tasks["evaluator-0"].has_evaluator


def test_master_is_written_back_as_chief_for_tensorflow_other_keys_kept():
  raw = vertex_tf_configs(2)["master-0"]
  environ = {"TF_CONFIG": raw}
  cluster.write_master_as_chief(environ)
  written, original = json.loads(environ["TF_CONFIG"]), json.loads(raw)
  assert written["cluster"] == {"chief": original["cluster"]["master"],
                                "worker": original["cluster"]["worker"]}
  assert written["task"] == dict(original["task"], type="chief")
  assert {k: v for k, v in written.items() if k not in ("cluster", "task")} == {
      k: v for k, v in original.items() if k not in ("cluster", "task")}
  kubeflow = {"TF_CONFIG": kubeflow_tf_configs("mnist", "a", {"Chief": 1, "Worker": 1})[
      "chief-0"]}
  before = dict(kubeflow)
  cluster.write_master_as_chief(kubeflow)
  assert kubeflow == before  # Nothing to rewrite: not even re-serialized.


@pytest.mark.parametrize("tf_config, message", [
    ({"cluster": {"chief": ["a:1"], "master": ["b:1"]}, "task": {"type": "chief", "index": 0}},
     "both a 'chief' and a 'master' job"),
    ({"cluster": {"master": ["a:1"], "ps1": ["b:1"]}, "task": {"type": "master", "index": 0}},
     "job(s) ['ps1']"),
    ({"cluster": {"master": ["a:1"], "worker": ["b:1"]}, "task": {"type": "master", "index": 1}},
     "task.index 1 is out of range: the cluster has 1 chief task(s)"),
])
def test_a_bad_vertex_tf_config_names_what_is_wrong(tf_config, message):
  with pytest.raises(cluster.TFConfigError, match=re.escape(message)):
    cluster.parse_tf_config(_env(tf_config))


def test_a_one_replica_job_gets_no_tf_config_and_runs_as_one_process():
  # The operator sets no TF_CONFIG for a job of one replica (nothing to connect).
  assert cluster.parse_tf_config({}) is None


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
    ({"cluster": {"worker": ["a:1"], "ps": ["b:2"]}, "task": {"type": "worker", "index": 0}},
     "'ps' tasks but no 'chief' job"),
    ({"cluster": {"ps": ["b:2"]}, "task": {"type": "ps", "index": 0}}, "nothing trains"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}}, "no job"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "server", "index": 0}},
     "is not run here"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}, "no job"),
    ({"cluster": {"chief": ["a:1", "b:2"]}, "task": {"type": "chief"}}, "exactly one"),
    ({"cluster": {"worker": "a:1"}, "task": {"type": "worker"}}, "non-empty list"),
    ({"cluster": {"chief": ["a:1"]}, "task": {"type": "evaluator", "index": 2}}, "one evaluator"),
    ({"cluster": {"chief": ["a:1"], "evaluator": ["b:1", "c:1"]}, "task": {"type": "chief"}},
     "exactly one"),
    ({"cluster": {"evaluator": ["b:1"]}, "task": {"type": "evaluator"}}, "nothing trains"),
])
def test_bad_tf_config_is_rejected_with_the_reason(tf_config, message):
  with pytest.raises(cluster.TFConfigError, match=message):
    cluster.parse_tf_config(_env(tf_config))


_W = {"worker": ["a:1", "b:2"]}  # A good cluster, for the bad tasks below.


@pytest.mark.parametrize("tf_config, message", [
    # TF_CONFIG itself.
    ('"worker"', "must be a JSON object, got a string"),
    ("3", "must be a JSON object, got a number"),
    ("null", "must be a JSON object, got null"),
    ('{"cluster": {"worker": ["a:1"]}, "cluster": {"worker": ["b:1"]}}', r"\['cluster'\] twice"),
    # The cluster.
    ({"cluster": ["a:1"], "task": {"type": "worker", "index": 0}}, "cluster must be an object"),
    ({"cluster": "a:1", "task": {"type": "worker", "index": 0}}, "cluster must be an object"),
    ({"cluster": {"worker": []}, "task": {"type": "worker", "index": 0}},
     r"cluster\.worker must be a non-empty list"),
    ({"cluster": {"worker": {"0": "a:1"}}, "task": {"type": "worker", "index": 0}},
     r"cluster\.worker must be a non-empty list of 'host:port', got an object"),
    ({"cluster": {"worker": None}, "task": {"type": "worker", "index": 0}},
     r"cluster\.worker must be a non-empty list"),
    # Its addresses.
    ({"cluster": {"worker": ["localhost", 2222]}, "task": {"type": "worker", "index": 0}},
     r"cluster\.worker\[0\] is 'localhost', not 'host:port'"),
    ({"cluster": {"worker": ["a:1", 2222]}, "task": {"type": "worker", "index": 0}},
     r"cluster\.worker\[1\] must be a 'host:port' string, got a number \(2222\)"),
    ({"cluster": {"chief": [["a", 1]]}, "task": {"type": "chief", "index": 0}},
     r"cluster\.chief\[0\] must be a 'host:port' string, got a list"),
    ({"cluster": {"worker": [None]}, "task": {"type": "worker", "index": 0}},
     r"cluster\.worker\[0\] must be a 'host:port' string, got null"),
    ({"cluster": {"worker": ["a:http"]}, "task": {"type": "worker", "index": 0}},
     r"cluster\.worker\[0\] is 'a:http', not 'host:port'"),
    ({"cluster": {"worker": [":2222"]}, "task": {"type": "worker", "index": 0}},
     r"cluster\.worker\[0\] is ':2222', not 'host:port'"),
    ({"cluster": {"worker": ["a:"]}, "task": {"type": "worker", "index": 0}},
     r"cluster\.worker\[0\] is 'a:', not 'host:port'"),
    ({"cluster": {"worker": ["a: 1"]}, "task": {"type": "worker", "index": 0}},
     r"cluster\.worker\[0\] is 'a: 1', not 'host:port'"),
    ({"cluster": {"worker": ["a:\u00b2"]}, "task": {"type": "worker", "index": 0}},
     r"cluster\.worker\[0\] is 'a:\u00b2', not 'host:port'"),  # "²" is a digit to isdigit().
    ({"cluster": {"worker": ["a:-1"]}, "task": {"type": "worker", "index": 0}},
     r"cluster\.worker\[0\] is 'a:-1', not 'host:port'"),
    ({"cluster": {"worker": ["a:0"]}, "task": {"type": "worker", "index": 0}},
     r"cluster\.worker\[0\] 'a:0' has port 0; a port is 1 to 65535"),
    ({"cluster": {"worker": ["a:65536"]}, "task": {"type": "worker", "index": 0}},
     r"cluster\.worker\[0\] 'a:65536' has port 65536; a port is 1 to 65535"),
    # Duplicate addresses, within a job and across jobs (the evaluator's too).
    ({"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}},
     r"cluster\.worker\[1\] and cluster\.worker\[0\] are both 'a:1'"),
    ({"cluster": {"chief": ["a:1"], "worker": ["A:1"]}, "task": {"type": "chief", "index": 0}},
     r"cluster\.worker\[0\] and cluster\.chief\[0\] are both 'A:1'"),
    ({"cluster": {"chief": ["a:1"], "evaluator": ["a:1"]}, "task": {"type": "chief", "index": 0}},
     r"cluster\.evaluator\[0\] and cluster\.chief\[0\] are both 'a:1'"),
    # The task.
    ({"cluster": _W}, "has a cluster but no task"),
    ({"cluster": _W, "task": None}, "has a cluster but no task"),
    ({"cluster": _W, "task": "worker"}, "task must be an object .* got a string \\(\"worker\"\\)"),
    ({"cluster": _W, "task": ["worker", 0]}, "task must be an object .* got a list"),
    ({"cluster": _W, "task": {"index": 0}}, "task has no 'type'"),
    ({"cluster": _W, "task": {"type": 1, "index": 0}}, r"task\.type a number \(1\) is not run"),
    ({"cluster": _W, "task": {"type": ["worker"], "index": 0}}, r"task\.type a list .* not run"),
    ({"cluster": _W, "task": {"type": "Worker", "index": 0}}, r"task\.type 'Worker' is not run"),
    ({"cluster": _W, "task": {"type": "chief", "index": 0}}, r"task\.type 'chief' has no job"),
    # Its index.
    ({"cluster": _W, "task": {"type": "worker"}}, "task has no 'index'"),
    ({"cluster": _W, "task": {"type": "evaluator"}}, "task has no 'index'"),
    ({"cluster": _W, "task": {"type": "worker", "index": None}},
     r"task\.index must be a non-negative integer, got null"),
    ({"cluster": _W, "task": {"type": "worker", "index": "1"}},
     r"task\.index must be a non-negative integer, got a string"),
    ({"cluster": _W, "task": {"type": "worker", "index": 1.0}},
     r"task\.index must be a non-negative integer, got a number \(1.0\)"),
    ({"cluster": _W, "task": {"type": "worker", "index": True}},
     r"task\.index must be a non-negative integer, got a boolean"),
    ({"cluster": _W, "task": {"type": "worker", "index": False}},
     r"task\.index must be a non-negative integer, got a boolean"),
    ({"cluster": _W, "task": {"type": "worker", "index": -1}}, r"task\.index .* a number \(-1\)"),
    ({"cluster": _W, "task": {"type": "worker", "index": 2}},
     r"task\.index 2 is out of range: the cluster has 2 worker task\(s\), indices 0 to 1"),
    ({"cluster": _W, "task": {"type": "evaluator", "index": 1}}, r"one evaluator.*task\.index 1"),
    # The evaluator job: one task.
    ({"cluster": {"worker": ["a:1"], "evaluator": ["b:1", "c:1"]},
      "task": {"type": "evaluator", "index": 1}}, r"cluster\.evaluator must list exactly one task"),
])
def test_every_malformed_tf_config_names_the_field(tf_config, message):
  # A TFConfigError (a ValueError: "error: ..." and exit 2), never an AttributeError,
  # TypeError or KeyError, and its message names the field that is wrong.
  with pytest.raises(cluster.TFConfigError, match=message):
    cluster.parse_tf_config(_env(tf_config))


@pytest.mark.parametrize("tf_config", [
    {"cluster": None, "task": {"type": "worker", "index": 0}},
    {"cluster": {}, "task": "anything"},
    {"environment": "cloud"},
])
def test_an_empty_cluster_is_one_local_process(tf_config):
  assert cluster.parse_tf_config(_env(tf_config)) is None


@pytest.mark.parametrize("address", [
    "localhost:1", "10.0.0.1:65535", "[::1]:2222", "mnist-worker-0.team-a.svc:2222"])
def test_good_addresses_are_accepted(address):
  env = _env({"cluster": {"worker": [address]}, "task": {"type": "worker", "index": 0},
              "environment": "cloud", "rpc_layer": "grpc"})
  assert cluster.parse_tf_config(env).address == address


def test_free_ports_are_distinct():
  ports = cluster.pick_free_ports(5)
  assert len(set(ports)) == 5 and all(p > 0 for p in ports)


def test_the_estimator_evaluator_gets_worker_zero_as_its_chief_job():
  spec = {"worker": ["w0:1", "w1:1"], "evaluator": ["e:1"]}
  task = cluster.parse_tf_config(_env({"cluster": spec,
                                       "task": {"type": "evaluator", "index": 0}}))
  rewritten = cluster.evaluator_tf_config_with_chief(task)
  assert rewritten["cluster"] == {"chief": ["w0:1"], "worker": ["w1:1"], "evaluator": ["e:1"]}
  again = cluster.parse_tf_config(_env(rewritten))
  assert (again.type, again.num_workers, again.has_evaluator) == ("evaluator", 2, True)
  worker = cluster.parse_tf_config(_env({"cluster": spec, "task": {"type": "worker", "index": 0}}))
  with pytest.raises(ValueError, match="only the evaluator"):
    cluster.evaluator_tf_config_with_chief(worker)
