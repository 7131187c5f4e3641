"""The trainers on a Ray cluster (`python -m launch.ray`): a production engine beside the
local launcher (`launch.supervisor`), keeping its rules.

  engine.py   Ray Train's `TensorflowTrainer` running the trainer binaries, the watch
  record.py   the run's record its tasks and launcher share, and its rules (no Ray)
"""
