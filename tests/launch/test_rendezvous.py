"""launch.rendezvous: a training task waits for its peers, says whom, and gives up in time."""

import json
import socket
import threading
import time

import pytest

from launch import cluster
from launch import rendezvous


def _tasks(count, ps=0):
  """Every training task of one localhost cluster of `count` workers (and `ps` parameter
  servers, last)."""
  configs = cluster.make_tf_configs(cluster.pick_free_ports(count + ps), ps=ps)
  return [cluster.parse_tf_config({"TF_CONFIG": json.dumps(c)}) for c in configs]


def _serve(task, until):
  """What TensorFlow's server does once a task goes on: listen on its port."""
  with socket.create_server(("", int(task.address.rpartition(":")[2])), reuse_port=True):
    until.wait(timeout=60)


def test_tasks_started_apart_each_return_once_all_have_listened():
  tasks = _tasks(3)
  returned, done = {}, threading.Event()

  def start(task, delay):
    time.sleep(delay)
    rendezvous.wait_for_peers(task, timeout=30)
    returned[task.name] = time.monotonic()
    _serve(task, done)

  began = time.monotonic()
  threads = [threading.Thread(target=start, args=(t, d)) for t, d in zip(tasks, (0, 0, 2))]
  for t in threads:
    t.start()
  deadline = time.monotonic() + 60
  while len(returned) < len(tasks) and time.monotonic() < deadline:
    time.sleep(0.1)
  done.set()
  for t in threads:
    t.join(timeout=10)
  assert sorted(returned) == sorted(t.name for t in tasks)
  # The early two waited for the late one; nobody waited for one that had left.
  assert all(2 <= at - began < 10 for at in returned.values()), returned


def test_a_peer_that_never_starts_is_named_after_the_timeout(monkeypatch):
  monkeypatch.setattr(rendezvous, "SAY_EVERY_SECONDS", 0.5)
  # What it logs, whatever logging levels earlier tests in this process left set.
  said = []
  monkeypatch.setattr(rendezvous.logging, "info", lambda text, *args: said.append(text % args))
  chief, worker = _tasks(2)
  began = time.monotonic()
  with pytest.raises(rendezvous.StartupTimeout) as raised:
    rendezvous.wait_for_peers(chief, timeout=2)
  assert 2 <= time.monotonic() - began < 5
  assert (f"did not come up within 2 s (--startup_timeout): no task listens at "
          f"worker:0 ({worker.address})") in str(raised.value)
  assert said and said[0].startswith(f"Waiting for worker:0 ({worker.address}) to start")


def test_a_parameter_server_is_a_peer_every_training_task_waits_for():
  chief, worker, ps = _tasks(2, ps=1)
  done = threading.Event()
  threading.Thread(target=lambda: (rendezvous.wait_for_peers(worker, timeout=30),
                                   _serve(worker, done)), daemon=True).start()
  with pytest.raises(rendezvous.StartupTimeout) as raised:
    rendezvous.wait_for_peers(chief, timeout=2)
  assert f"no task listens at ps:0 ({ps.address})" in str(raised.value)
  # A parameter server serves at once (its TensorFlow server): then they go on.
  threading.Thread(target=_serve, args=(ps, done), daemon=True).start()
  rendezvous.wait_for_peers(chief, timeout=10)
  done.set()


def test_on_parameter_servers_a_worker_waits_for_them_not_for_the_chief():
  # A worker restarted after the chief has ended finds the run finished on the ps tasks.
  chief, worker, ps = _tasks(2, ps=1)
  with pytest.raises(rendezvous.StartupTimeout) as raised:
    rendezvous.wait_for_peers(worker, timeout=1)
  assert f"no task listens at ps:0 ({ps.address})" in str(raised.value)
  assert "chief" not in str(raised.value)
  done = threading.Event()
  threading.Thread(target=_serve, args=(ps, done), daemon=True).start()
  rendezvous.wait_for_peers(worker, timeout=10)  # No chief listening.
  done.set()


def test_a_lone_task_and_the_evaluator_do_not_wait():
  for config in cluster.make_tf_configs(cluster.pick_free_ports(2), evaluator=True):
    task = cluster.parse_tf_config({"TF_CONFIG": json.dumps(config)})
    began = time.monotonic()
    rendezvous.wait_for_peers(task, timeout=30)
    assert time.monotonic() - began < 1, task.name


def test_tasks_started_with_different_clusters_both_name_the_other():
  chief, worker = _tasks(2)
  told = dict(worker.cluster, worker=worker.cluster["worker"] + ["localhost:1"])
  worker = cluster.parse_tf_config({"TF_CONFIG": json.dumps(
      {"cluster": told, "task": {"type": "worker", "index": 0}})})
  errors = {}

  def start(task):
    try:
      rendezvous.wait_for_peers(task, timeout=20)
    except rendezvous.ClusterMismatchError as e:
      errors[task.name] = str(e)

  threads = [threading.Thread(target=start, args=(t,)) for t in (chief, worker)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=30)
  assert sorted(errors) == ["chief:0", "worker:0"]
  assert errors["chief:0"].startswith("Task worker:0 was started with TF_CONFIG cluster")
  assert errors["worker:0"].startswith("Task chief:0 was started with TF_CONFIG cluster")
