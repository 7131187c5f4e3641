"""launch.tools.bare: the bare loop writes what the bench reads; the probe times every part."""

import dataclasses
import json

import tensorflow as tf

from launch.tools import bare
from launch.tools import runs
from trainers.config import Config

CONFIG = Config(train_steps=6, global_batch_size=32, eval_batch_size=50, log_every_steps=2,
                checkpoint_every_steps=3)


def test_the_bare_loop_writes_events_and_a_summary(tiny_data_dir, tmp_path):
  config = dataclasses.replace(CONFIG, data_dir=tiny_data_dir)
  summary = bare.train_bare_loop(config, str(tmp_path))
  assert runs.read_summary(str(tmp_path)) == summary
  assert summary["global_step"] == 6 and 0 <= summary["test_accuracy"] <= 1
  assert list((tmp_path / "eval").iterdir())


def test_the_probe_times_every_part_under_an_injected_strategy(tiny_data_dir, tmp_path):
  config = dataclasses.replace(CONFIG, data_dir=tiny_data_dir)
  out = tmp_path / "costs.json"
  costs = bare.probe_step_costs(config, str(out),
                                strategy=tf.distribute.MirroredStrategy(["/cpu:0"]))
  assert json.loads(out.read_text()) == costs
  assert costs["workers"] == 1 and costs["per_replica_batch"] == 32
  for part in ("input", "compute", "all_reduce", "step"):
    assert costs[part]["ms"] > 0 and len(costs[part]["windows"]) == bare.PROBE_WINDOWS
