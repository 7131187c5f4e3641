"""trainers.distribute: the chief rule, task-tagged logs, and the process set-up."""

import logging

import tensorflow as tf

from launch import cluster
from launch import console
from trainers import distribute


def test_a_strategy_without_a_cluster_is_one_chief():
  strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
  assert distribute.num_workers(strategy) == 1 and distribute.is_chief(strategy)
  distribute.barrier(strategy, "alone")  # No-op for one worker.


def test_task_logs_are_tagged_and_own_lines_carry_their_path():
  formatter = distribute._TaskFormatter("worker:1")
  own = logging.LogRecord("absl", logging.INFO, f"{console.REPO}/trainers/progress.py", 3,
                          "hello", None, None)
  theirs = logging.LogRecord("absl", logging.INFO, "/venv/tensorflow/saver.py", 3, "hi",
                             None, None)
  assert formatter.format(own).startswith("[worker:1] I")
  assert "trainers/progress.py:3] hello" in formatter.format(own)
  assert " saver.py:3] hi" in formatter.format(theirs)
  keep = console.LineFilter(verbose=False)
  assert keep(formatter.format(own).encode()) and not keep(formatter.format(theirs).encode())


def test_the_chief_rule_follows_the_cluster_layout():
  assert cluster.Task("chief", 0, 2).is_chief and not cluster.Task("worker", 0, 2).is_chief
  assert cluster.Task("worker", 0, 2, has_chief_job=False).is_chief


def test_a_lost_peer_is_found_in_an_errors_chain_and_nothing_else_is():
  """runner.run maps these to exit_codes.PEER_LOST (200), which the launcher and TFJob retry."""
  aborted = tf.errors.UnavailableError(None, None, "Collective ops is aborted by: Socket closed")
  try:
    try:
      raise aborted
    except tf.errors.UnavailableError as e:
      raise RuntimeError("fit failed") from e
  except RuntimeError as wrapped:
    assert distribute.lost_peer(wrapped) is aborted
  assert distribute.lost_peer(ValueError("bad batch")) is None
  assert distribute.lost_peer(tf.errors.InvalidArgumentError(None, None, "shape")) is None
