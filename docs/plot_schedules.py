"""Draws docs/schedules.png: each --learning_rate_schedule's rate over a 1,500-step run, as
both backends compute it (trainers/schedules.py).

  python docs/plot_schedules.py
"""

import os
import sys

import matplotlib
import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from trainers import schedules  # noqa: E402 -- after the repository is on the path.
from trainers.config import Config  # noqa: E402

matplotlib.use("Agg")
from matplotlib import pyplot  # noqa: E402 -- after the backend is chosen.

STEPS = 1500
RUNS = {  # What each line is trained with: the flags, as Config fields.
    "cosine (default)": {},
    "constant": {"learning_rate_schedule": "constant"},
    "exponential, --decay_rate=0.5 --decay_steps=300 --staircase": {
        "learning_rate_schedule": "exponential", "decay_rate": 0.5, "decay_steps": 300,
        "staircase": True},
    "inverse_time, --decay_rate=1 --decay_steps=300": {
        "learning_rate_schedule": "inverse_time", "decay_rate": 1.0, "decay_steps": 300},
    "polynomial, --end_learning_rate=0 --warmup_steps=150 (BERT's)": {
        "learning_rate_schedule": "polynomial", "end_learning_rate": 0.0, "warmup_steps": 150},
    "piecewise, --boundaries=500,1000 --values=0.1,0.03,0.01": {
        "learning_rate_schedule": "piecewise", "boundaries": "500,1000",
        "values": "0.1,0.03,0.01"},
}


def rates(config: Config) -> np.ndarray:
  schedule = schedules.keras_schedule(config)
  rate = tf.function(lambda step: tf.cast(schedule(step), tf.float32))
  return np.array([float(rate(tf.constant(i, tf.int64))) for i in range(STEPS)])


def main() -> None:
  figure, axes = pyplot.subplots(figsize=(9, 5))
  for label, settings in RUNS.items():
    config = Config(train_steps=STEPS, **settings)
    config.validate(find_model=False)
    axes.plot(np.arange(1, STEPS + 1), rates(config), label=label)
  axes.set_xlabel("step")
  axes.set_ylabel("learning rate (momentum's default start, 0.1)")
  axes.legend(fontsize=8)
  out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schedules.png")
  figure.savefig(out, dpi=100, bbox_inches="tight")
  print(f"Wrote {out}")


if __name__ == "__main__":
  main()
