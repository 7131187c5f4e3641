"""The converter (`python -m launch.convert`): a model_dir's checkpoint carried to the other
backend, and any checkpoint inspected. Users rely on what it writes and prints: it stays
compatible. Each module imports only those above it here:

  kinds.py        the vocabulary (`Kind`), what a conversion reports, `ConversionError`
  report.py       the table a conversion prints
  parts.py        a model's optimizers, by part, and the names the Estimator gives their state
  source.py       the checkpoint read: the newest that loads, its counters
  write.py        the target: staged, read back, moved into place whole or not at all
  assign.py       an Estimator checkpoint's variables given their places in the model
  keras_state.py  a Keras checkpoint's keys: the state carried, what is derived
  canned.py       a TF2 canned Estimator's checkpoint and its Keras twin's
  carry.py        both directions for every model (the TF2 canned ones handed to canned.py)
  inspection.py   `--inspect`: what any checkpoint holds, and the map it proposes

Nothing is imported here: `python -m launch.convert` quiets TensorFlow before it loads.
"""
