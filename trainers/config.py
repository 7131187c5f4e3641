"""The one set of hyperparameters both backends train with."""

import dataclasses
import json
import math
import re
from typing import Any, Dict, List, Optional, Tuple, Union

from trainers import model_registry
from trainers import program

AUTO_STEPS_PER_EXECUTION_MAX = 10

# Each optimizer's hyperparameters (the Config fields it reads) and their defaults: the
# tf.compat.v1.train optimizer's own, and, where v1 has none (the learning rate, the
# momentum), the value that trains `cnn` (docs/training.md, "Optimizers").
OPTIMIZER_DEFAULTS = {
    "sgd": {"learning_rate": 0.3},
    "momentum": {"learning_rate": 0.1, "momentum": 0.9},
    "adagrad": {"learning_rate": 0.1, "initial_accumulator_value": 0.1},
    "adam": {"learning_rate": 0.001, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8},
    "ftrl": {"learning_rate": 0.1, "learning_rate_power": -0.5, "initial_accumulator_value": 0.1,
             "l1": 0.0, "l2": 0.0},
    "rmsprop": {"learning_rate": 0.001, "rho": 0.9, "momentum": 0.0, "epsilon": 1e-10},
}
HYPERPARAMETERS = ("learning_rate", "momentum", "initial_accumulator_value", "beta1", "beta2",
                   "epsilon", "rho", "learning_rate_power", "l1", "l2")
# The range each must lie in: (low, high, low is allowed, high is allowed).
_RANGES = {"learning_rate": (0, math.inf, False, False), "momentum": (0, 1, True, False),
           "initial_accumulator_value": (0, math.inf, False, False),
           "beta1": (0, 1, True, False), "beta2": (0, 1, True, False),
           "epsilon": (0, math.inf, True, False), "rho": (0, 1, True, False),
           "learning_rate_power": (-math.inf, 0, False, True), "l1": (0, math.inf, True, False),
           "l2": (0, math.inf, True, False)}

# The canned models (trainers/models/canned.py): each canned Estimator's constructor
# arguments that are flags here, with its defaults: the canned class's own (a named
# optimizer gets the rate 0.2 in LinearClassifier, and 0.001 and min(0.005,
# 1/sqrt(columns)) for the two parts of DNNLinearCombinedClassifier), and ours where it
# has none (hidden_units) or where its own does not train in 1,500 steps: DNNClassifier
# gives a named optimizer its Keras class's default rate (Adagrad 0.001: 0.84 test
# accuracy), tf.compat.v1's gave it 0.05 (docs/MIGRATION.md, "Canned Estimators").
_DNN = {"hidden_units": "128,64", "dropout": 0.0, "batch_norm": False, "activation": "relu"}
# Every canned class's head arguments, each "" (none, or the class's default) unless given:
# a weight_column, whose weights the input derives from each example's digit
# (--digit_weights); a classifier's label_vocabulary; the loss_reduction.
_HEAD = {"weight_column": "", "digit_weights": "", "label_vocabulary": "",
         "loss_reduction": ""}
# What a canned model reads: the image (one numeric column, --feature_name), or the tabular
# features (data/mnist/tabular.py) through --feature_columns (default: TABULAR_COLUMNS).
_FEATURES = {"features": "image", "feature_columns": ""}
FEATURE_KINDS = ("image", "tabular")
TABULAR_COLUMNS = "trainers.models.tabular:COLUMNS"
CANNED = {
    "dnn": {**_DNN, "feature_name": "image", "dnn_optimizer": "adagrad", "dnn_learning_rate": 0.05,
            **_HEAD, **_FEATURES},
    "linear": {"feature_name": "image", "linear_optimizer": "ftrl", "linear_learning_rate": 0.2,
               **_HEAD, **_FEATURES},
    "wide_deep": {**_DNN, "feature_name": "image", "dnn_optimizer": "adagrad",
                  "dnn_learning_rate": 0.001, "linear_optimizer": "ftrl",
                  "linear_learning_rate": 0.005, **_HEAD, **_FEATURES},
}
# The tf.compat.v1.estimator classes take the same arguments, with the same defaults.
CANNED.update({f"{name}_v1": settings for name, settings in CANNED.items()})
CANNED_SETTINGS = ("hidden_units", "dropout", "batch_norm", "activation", "feature_name",
                   "dnn_optimizer", "dnn_learning_rate", "linear_optimizer",
                   "linear_learning_rate", "weight_column", "digit_weights",
                   "label_vocabulary", "loss_reduction", "features", "feature_columns")
# A canned class's loss_reduction, by its flag's value (the class's default when not given:
# the TF2 ones' sum_over_batch_size, the tf.compat.v1 ones' sum).
CANNED_REDUCTIONS = ("sum_over_batch_size", "sum")
# The optimizers a canned Estimator takes by name.
CANNED_OPTIMIZERS = ("adagrad", "adam", "ftrl", "rmsprop", "sgd")
# Activations whose tf.nn function (the canned Estimator's activation_fn) and tf_keras
# activation (its twin's) compute the same.
CANNED_ACTIVATIONS = ("relu", "elu", "selu", "tanh", "sigmoid", "softplus")

# The learning-rate schedules (trainers/schedules.py): each tf.compat.v1.train function of
# that name, and the settings each takes besides --learning_rate and --decay_steps, with
# v1's defaults (None: no default, the flag is needed).
SCHEDULES = {
    "cosine": {},
    "constant": {},
    "exponential": {"decay_rate": None, "staircase": False},
    "inverse_time": {"decay_rate": None, "staircase": False},
    "polynomial": {"end_learning_rate": 0.0001, "power": 1.0, "cycle": False},
    "piecewise": {"boundaries": None, "values": None},
}
SCHEDULE_SETTINGS = ("decay_rate", "staircase", "end_learning_rate", "power", "cycle",
                     "boundaries", "values")


# The tasks (trainers/heads.py): what the model learns of each MNIST example, each with the
# canned Estimator head that reports it.
MULTICLASS, BINARY, REGRESSION = "multiclass", "binary", "regression"
TASKS = (MULTICLASS, f"{BINARY}:D", REGRESSION)


def parse_task(task: str) -> Tuple[str, Optional[int]]:
  """--task as (kind, the positive digit of a binary task, else None); ValueError naming
  the fix if it is none of `TASKS`."""
  kind, _, digit = task.partition(":")
  if kind == BINARY and digit.isdigit() and 0 <= int(digit) <= 9 and digit == str(int(digit)):
    return kind, int(digit)
  if kind in (MULTICLASS, REGRESSION) and not digit and task == kind:
    return kind, None
  raise ValueError(f"--task={task} is not one of {MULTICLASS}, {BINARY}:D with D a digit "
                   f"0 to 9 ({BINARY}:7: is it a 7?), {REGRESSION}.")


def columns_path(settings: Dict[str, Any]) -> str:
  """Where a canned model's feature columns are (package.module:NAME) under
  --features=tabular, from its settings; "" for the image's one column."""
  if settings.get("features") != "tabular":
    return ""
  return settings["feature_columns"] or TABULAR_COLUMNS


def widths(hidden_units: str) -> List[int]:
  """A --hidden_units value ("128,64") as the layers' widths."""
  return [int(u) for u in hidden_units.split(",")]


def schedule_ends(name: str, cycle: bool) -> bool:
  """Whether the schedule `name` stops changing at --decay_steps (cosine; polynomial unless
  it cycles), rather than decaying by periods of it or not at all."""
  return name in ("cosine", "polynomial") and not cycle


def _given(value: Any) -> bool:
  """Whether a schedule setting was given: not None, nor a boolean flag left off (0.0 is)."""
  return value is not None and value is not False


def _field(default, help_text: str):
  """A Config field; its help is the one text for the flag's --help and the docs' table."""
  return dataclasses.field(default=default, metadata={"help": help_text})


@dataclasses.dataclass(frozen=True)
class Config:
  """Hyperparameters and run settings shared by the Keras and Estimator trainers.

  The defaults reach >= 98% test accuracy on the 22,699-image offline MNIST
  subset with either backend at 1 or 2 workers. Each field is a flag of the
  trainer binaries, of the same name; its help (in the field's metadata) is
  the flag's --help and the row of docs/training.md's flag table.
  """

  model: str = _field(model_registry.DEFAULT, "The model: a built-in spec ("
                      + ", ".join(model_registry.BUILT_IN) + ") or package.module:NAME, a "
                      "ModelSpec of your own (docs/MIGRATION.md, \"Bring your model\").")
  model_options: str = _field("", "The model's own settings, NAME=VALUE,... (cnn_bn: "
                              "dropout=0.25); default: the spec's.")
  estimator_program: Optional[str] = _field(
      None, "package.module:NAME, an EstimatorProgram holding your own model_fn and input_fn "
      "(docs/MIGRATION.md, \"Prove your port\"): the Estimator trains that model_fn in place "
      "of --model's, and both backends read its input_fn (Keras trains --model, your port, "
      "on it); default: none.")
  program_params: str = _field("", "With --estimator_program: NAME=VALUE,... over its params "
                               "(dropout=0); default: the program's.")
  task: str = _field(MULTICLASS, "What the model learns, with the canned head that reports "
                     "it (docs/training.md, \"Tasks\"): multiclass (the digit, 10 classes), "
                     "binary:D (whether the digit is D), regression (the image's ink, the "
                     "mean of its pixels).")
  train_steps: int = _field(1500, "Optimizer steps; each consumes one global batch.")
  global_batch_size: int = _field(96, "Examples per step, summed over all workers; must be "
                                  "divisible by the workers (96 divides 1 to 4).")
  optimizer: str = _field("momentum", "The tf.compat.v1.train optimizer the Estimator trains "
                          "with, and its Keras twin: " + ", ".join(OPTIMIZER_DEFAULTS) + " "
                          "(docs/MIGRATION.md, item 2).")
  learning_rate: Optional[float] = _field(None, "The rate the --learning_rate_schedule starts "
                                          "from (by default cosine-decayed to 0 over "
                                          "--decay_steps). Default: 0.3 for sgd; 0.1 for "
                                          "momentum, adagrad and ftrl; 0.001 for adam and "
                                          "rmsprop.")
  momentum: Optional[float] = _field(None, "momentum (default 0.9) and rmsprop (default 0): "
                                     "the momentum.")
  initial_accumulator_value: Optional[float] = _field(None, "adagrad and ftrl: the starting "
                                                      "value of the squared-gradient sums "
                                                      "(default 0.1).")
  beta1: Optional[float] = _field(None, "adam: the decay of the gradient mean (default 0.9).")
  beta2: Optional[float] = _field(None, "adam: the decay of the squared-gradient mean "
                                  "(default 0.999).")
  epsilon: Optional[float] = _field(None, "adam (default 1e-8) and rmsprop (default 1e-10): "
                                    "added to the denominator, as in tf.compat.v1.train.")
  rho: Optional[float] = _field(None, "rmsprop: the decay of the squared-gradient mean (v1's "
                                "decay; default 0.9).")
  learning_rate_power: Optional[float] = _field(None, "ftrl: how the rate falls with the "
                                                "squared-gradient sum (<= 0; default -0.5).")
  l1: Optional[float] = _field(None, "ftrl: the L1 regularization strength (default 0).")
  l2: Optional[float] = _field(None, "ftrl: the L2 regularization strength (default 0).")
  hidden_units: Optional[str] = _field(None, "dnn, wide_deep: the hidden layers' widths, "
                                       "comma-separated (the canned hidden_units; default "
                                       "128,64).")
  dropout: Optional[float] = _field(None, "dnn, wide_deep: the dropout rate after each hidden "
                                    "layer while training (default 0: none).")
  batch_norm: Optional[bool] = _field(None, "dnn, wide_deep: BatchNormalization after each "
                                      "hidden layer (default false).")
  activation: Optional[str] = _field(None, "dnn, wide_deep: the hidden layers' activation, "
                                     "one of " + ", ".join(CANNED_ACTIVATIONS) + " (default "
                                     "relu).")
  feature_name: Optional[str] = _field(None, "dnn, linear, wide_deep: the image feature's "
                                       "name, which the linear part's variables carry "
                                       "(default image).")
  dnn_optimizer: Optional[str] = _field(None, "dnn, wide_deep: the DNN part's optimizer, the "
                                        "Keras legacy one the canned Estimator builds: "
                                        + ", ".join(CANNED_OPTIMIZERS) + " (default adagrad).")
  dnn_learning_rate: Optional[float] = _field(None, "dnn, wide_deep: the DNN part's constant "
                                              "learning rate (default: dnn 0.05, as "
                                              "tf.compat.v1's DNNClassifier; wide_deep 0.001).")
  linear_optimizer: Optional[str] = _field(None, "linear, wide_deep: the linear part's "
                                           "optimizer, as --dnn_optimizer (default ftrl).")
  linear_learning_rate: Optional[float] = _field(None, "linear, wide_deep: the linear part's "
                                                 "constant learning rate (default: linear "
                                                 "0.2, wide_deep 0.005).")
  weight_column: Optional[str] = _field(None, "dnn, linear, wide_deep: the canned "
                                        "weight_column, the feature holding each example's "
                                        "weight in its loss and metrics (default none); the "
                                        "input derives it by --digit_weights.")
  digit_weights: Optional[str] = _field(None, "With --weight_column: each digit's weight, ten "
                                        "comma-separated numbers >= 0 (0,0,0,1,... weighs "
                                        "only 3s).")
  label_vocabulary: Optional[str] = _field(None, "dnn, linear, wide_deep classifiers: the "
                                           "canned label_vocabulary, the labels as these "
                                           "strings, comma-separated, one a class (ten; two "
                                           "for --task=binary:D), the served classes too "
                                           "(default none: the class ids).")
  loss_reduction: Optional[str] = _field(None, "dnn, linear, wide_deep: the canned "
                                         "loss_reduction, sum_over_batch_size or sum "
                                         "(default: the class's, sum_over_batch_size for "
                                         "the TF2 ones, sum for the _v1 ones).")
  features: Optional[str] = _field(None, "dnn, linear, wide_deep: what the model reads: "
                                   "image (one numeric_column of the 784 pixels) or tabular "
                                   "(raw features derived from each image, as tf.Examples, "
                                   "through feature columns: docs/training.md, \"Feature "
                                   "columns\"); default image.")
  feature_columns: Optional[str] = _field(
      None, "With --features=tabular: package.module:NAME, a team's list of "
      "tf.feature_column columns (or a dict of the canned parts' lists, linear and dnn, or a "
      "function making either); default " + TABULAR_COLUMNS + ", a census model's kinds.")
  seed: int = _field(1, "Seeds the initial weights and the shuffle order.")
  data_dir: Optional[str] = _field(None, "TFDS data directory holding mnist/ (default: "
                                   "$TFDS_DATA_DIR or ~/tensorflow_datasets); prepared there "
                                   "if missing (see --mnist_idx_dir).")
  eval_batch_size: int = _field(500, "Evaluation batch; a divisor of the 10,000 test images "
                                "keeps the Estimator's mean of batch means equal to Keras's "
                                "per-example mean.")
  log_every_steps: int = _field(100, "Steps between progress lines, progress records and loss "
                                "summaries.")
  checkpoint_every_steps: int = _field(500, "Steps between checkpoints (the evaluator task "
                                       "evaluates them; both backends also save step 0) and, "
                                       "with Keras --noevaluator, chief evaluations.")
  keep_checkpoint_max: Optional[int] = _field(
      None, "How many of the newest checkpoints model_dir keeps, the same steps in both "
      "backends (RunConfig's keep_checkpoint_max); 0: all. Default: an --estimator_program's "
      "RunConfig setting, else 3.")
  backup_every_steps: int = _field(100, "Steps between Keras BackupAndRestore backups, which "
                                   "Keras resumes from after a failure.")
  early_stopping_metric: Optional[str] = _field(
      None, "Stop training when this evaluation metric (a key of the evaluator's results: "
      "loss, accuracy, auc, ...) has not improved for --early_stopping_steps steps, as "
      "tf.estimator.experimental.stop_if_no_decrease_hook (mode min) or "
      "stop_if_no_increase_hook (max) stops it; default: train to --train_steps.")
  early_stopping_mode: str = _field("min", "With --early_stopping_metric: min (a lower value "
                                    "is better) or max.")
  early_stopping_steps: int = _field(0, "With --early_stopping_metric: the training steps "
                                     "without improvement that stop the run (the hooks' "
                                     "max_steps_without_decrease or _increase).")
  early_stopping_min_steps: int = _field(0, "With --early_stopping_metric: evaluations of "
                                         "earlier steps are not considered (the hooks' "
                                         "min_steps).")
  early_stopping_check_every_steps: int = _field(
      0, "With --early_stopping_metric: training steps between checks of the evaluator's "
      "results (the hooks' run_every_steps; under MultiWorkerMirroredStrategy the hooks "
      "check by steps only); 0: --checkpoint_every_steps.")
  log_tensors: str = _field(
      "", "Comma-separated values every training task logs every --log_every_steps, as a "
      "tf.estimator.LoggingTensorHook in a model_fn's training_hooks logs them: loss (this "
      "worker's batch loss), learning_rate, global_step, or a layer's name (its output on "
      "this worker's batch). Not for a canned --model, nor an --estimator_program on the "
      "Estimator (its own hooks log).")
  export: str = _field("final", "Which SavedModels a run writes: final (the chief exports the "
                       "trained model once, to model_dir/export/<time>), latest (each "
                       "evaluated checkpoint, as tf.estimator.LatestExporter) or best (each "
                       "best so far by --export_metric, as BestExporter), the last two by the "
                       "task that evaluates, to model_dir/export/<latest|best>_exporter/<time>.")
  exports_to_keep: Optional[int] = _field(
      None, "With --export=latest or best: how many of the newest exports to keep (the "
      "exporters' exports_to_keep); 0: all. Default 5, as theirs.")
  export_metric: Optional[str] = _field(
      None, "With --export=best: the evaluation metric that ranks checkpoints (a key of the "
      "evaluator's results; BestExporter's default compare_fn ranks by loss).")
  export_mode: str = _field("min", "With --export_metric: min (a lower value is better, as "
                            "BestExporter's default) or max.")
  init_weights: Optional[str] = _field(None, "A .npz of initial weights by variable name "
                                       "(launch.parity writes one); default: initialize from "
                                       "--seed.")
  warm_start_from: Optional[str] = _field(
      None, "Start the model's variables from this checkpoint (either backend's model_dir, "
      "its newest; a team's program's; or one checkpoint's path), by name, as "
      "tf.estimator.WarmStartSettings does; the optimizer starts fresh. Skipped when "
      "model_dir holds a checkpoint to resume.")
  warm_start_vars: Optional[str] = _field(
      None, "With --warm_start_from: a regex selecting trainable variables (matched from the "
      "start of their name, as WarmStartSettings' string form; default .*), or a JSON list "
      "of regexes ('[\"conv.*\", \"bn/moving_.*\"]') selecting any model variable, "
      "BatchNorm's moving statistics too.")
  warm_start_map: Optional[str] = _field(
      None, "With --warm_start_from: a JSON file {\"new name\": \"name in the checkpoint\"} "
      "for renamed variables (WarmStartSettings' var_name_to_prev_var_name).")
  deterministic: bool = _field(False, "Turn on TensorFlow op determinism.")
  record_dir: Optional[str] = _field(None, "Record per-step losses (chief) and each shard's "
                                     "example fingerprints here, for launch.parity.")
  decay_steps: int = _field(0, "The schedule's decay_steps: cosine and polynomial decay over "
                            "them, exponential and inverse_time by --decay_rate every that "
                            "many; 0: --train_steps. To stop a run early and go on later on "
                            "the same schedule, give both runs the same --decay_steps.")
  learning_rate_schedule: str = _field(
      "cosine", "How the learning rate changes with the step, as the tf.compat.v1.train "
      "function of that name computes it from global_step: " + ", ".join(SCHEDULES) + ".")
  warmup_steps: int = _field(
      0, "BERT's linear warm-up: the rate rises from 0 to the schedule's starting rate over "
      "these steps (step / warmup_steps of it), then follows the schedule at the unshifted "
      "step, as BERT's optimization.py does; 0: none.")
  decay_rate: Optional[float] = _field(None, "exponential, inverse_time: the decay rate "
                                       "(v1's decay_rate; no default).")
  staircase: bool = _field(False, "exponential, inverse_time: decay in whole periods of "
                           "--decay_steps (v1's staircase).")
  end_learning_rate: Optional[float] = _field(None, "polynomial: the rate at --decay_steps "
                                              "(default 0.0001, v1's).")
  power: Optional[float] = _field(None, "polynomial: the decay's power (default 1.0: linear).")
  cycle: bool = _field(False, "polynomial: decay again over each multiple of --decay_steps "
                       "(v1's cycle).")
  boundaries: Optional[str] = _field(None, "piecewise: the steps where the rate changes, "
                                     "increasing, comma-separated (100,200).")
  values: Optional[str] = _field(None, "piecewise: the rates, one more than --boundaries, "
                                 "comma-separated (0.1,0.01,0.001); the first is the starting "
                                 "rate, so --learning_rate is not taken.")
  clip_global_norm: Optional[float] = _field(
      None, "Clip each replica's gradients by their global norm before they are all-reduced, "
      "as a v1 model_fn's tf.clip_by_global_norm before apply_gradients does (Keras's own "
      "clipnorm and global_clipnorm clip after, another update at 2 workers and more); "
      "default: none.")
  steps_per_execution: int = _field(0, "Keras only: training steps per call of the compiled "
                                    "train function; --train_steps and the log, checkpoint and "
                                    "backup intervals must be multiples of it. 0: the largest "
                                    "that fits, up to 10 (1 with --record_dir).")

  def hyperparameters(self) -> Dict[str, float]:
    """The optimizer's hyperparameters, each as given or its default (`OPTIMIZER_DEFAULTS`)."""
    return {name: default if getattr(self, name) is None else getattr(self, name)
            for name, default in OPTIMIZER_DEFAULTS[self.optimizer].items()}

  def validate_optimizer(self) -> None:
    """Raises ValueError naming the fix for an unknown --optimizer, a hyperparameter it
    does not read, or one out of its range."""
    if self.optimizer not in OPTIMIZER_DEFAULTS:
      raise ValueError(f"--optimizer={self.optimizer} is not one of "
                       f"{', '.join(OPTIMIZER_DEFAULTS)}.")
    takes = OPTIMIZER_DEFAULTS[self.optimizer]
    for name in HYPERPARAMETERS:
      if getattr(self, name) is not None and name not in takes:
        raise ValueError(f"--{name} is not a setting of --optimizer={self.optimizer}, which "
                         f"takes {', '.join('--' + n for n in takes)}: leave it out.")
    for name, value in self.hyperparameters().items():
      low, high, with_low, with_high = _RANGES[name]
      inside = (low < value or with_low and value == low) and (
          value < high or with_high and value == high)
      if math.isnan(value) or not inside:
        raise ValueError(f"--{name} must be in {'[' if with_low else '('}{low}, {high}"
                         f"{']' if with_high else ')'}, got {value}.")

  def canned_settings(self) -> Dict[str, Any]:
    """A canned model's settings (`CANNED`), each as given or its default; {} for others."""
    return {name: default if getattr(self, name) is None else getattr(self, name)
            for name, default in CANNED.get(self.model, {}).items()}

  def optimizer_label(self) -> str:
    """The optimizer a run trains with, for reports: --optimizer, or a canned model's (its
    parts', joined by +)."""
    settings = self.canned_settings()
    parts = [settings[f"{p}_optimizer"] for p in ("dnn", "linear") if f"{p}_optimizer" in settings]
    return "+".join(parts) if settings else self.optimizer

  def hidden_units_list(self) -> List[int]:
    """--hidden_units as widths (the canned model's default when not given)."""
    return widths(self.canned_settings()["hidden_units"])

  def validate_canned(self, find: bool = True) -> None:
    """Raises ValueError naming the fix for a canned setting the model does not take, an
    optimizer setting given to a canned model, or a canned setting out of range (a
    --feature_columns module not on this Python's path, if `find`)."""
    takes = CANNED.get(self.model, {})
    for name in CANNED_SETTINGS:
      if getattr(self, name) is not None and name not in takes:
        models = [m for m, names in CANNED.items() if name in names]
        raise ValueError(f"--{name} is not a setting of --model={self.model}; it is one of "
                         f"--model={', '.join(models)}.")
    if not takes:
      return
    given = [n for n in HYPERPARAMETERS if getattr(self, n) is not None]
    if self.optimizer != Config.optimizer or given:
      parts = [p for p in ("dnn", "linear") if f"{p}_optimizer" in takes]
      raise ValueError(
          f"--{'optimizer' if not given else given[0]} is not a setting of --model="
          f"{self.model}, which trains with the canned Estimator's optimizers: set "
          + " and ".join(f"--{p}_optimizer, --{p}_learning_rate" for p in parts) + ".")
    settings = self.canned_settings()
    for part in ("dnn", "linear"):
      if f"{part}_optimizer" not in settings:
        continue
      if settings[f"{part}_optimizer"] not in CANNED_OPTIMIZERS:
        raise ValueError(f"--{part}_optimizer={settings[f'{part}_optimizer']} is not one of "
                         f"{', '.join(CANNED_OPTIMIZERS)}.")
      if not settings[f"{part}_learning_rate"] > 0:
        raise ValueError(f"--{part}_learning_rate must be positive, got "
                         f"{settings[f'{part}_learning_rate']}.")
    if "hidden_units" in settings:
      units = settings["hidden_units"].split(",")
      if not all(u.strip().isdigit() and int(u) > 0 for u in units):
        raise ValueError(f"--hidden_units={settings['hidden_units']}: give positive widths, "
                         "comma-separated (128,64).")
      if not 0 <= settings["dropout"] < 1:
        raise ValueError(f"--dropout must be in [0, 1), got {settings['dropout']}.")
      if settings["activation"] not in CANNED_ACTIVATIONS:
        raise ValueError(f"--activation={settings['activation']} is not one of "
                         f"{', '.join(CANNED_ACTIVATIONS)}.")
    if settings["features"] not in FEATURE_KINDS:
      raise ValueError(f"--features={settings['features']} is not one of "
                       f"{', '.join(FEATURE_KINDS)}.")
    if settings["feature_columns"] and settings["features"] != "tabular":
      raise ValueError("--feature_columns describe the tabular features: give "
                       "--features=tabular with them, or leave them out for the image.")
    if settings["feature_columns"]:
      model_registry.find_module(settings["feature_columns"], model_registry.COLUMNS, find)
    if not settings["feature_name"].isidentifier():
      raise ValueError(f"--feature_name={settings['feature_name']!r}: give a name of letters, "
                       "digits and underscores (image).")
    self._validate_weights(settings)
    self._validate_vocabulary(settings)
    if settings["loss_reduction"] not in ("", *CANNED_REDUCTIONS):
      raise ValueError(f"--loss_reduction={settings['loss_reduction']} is not one of "
                       f"{', '.join(CANNED_REDUCTIONS)}.")

  def _validate_vocabulary(self, settings: Dict[str, Any]) -> None:
    """Raises ValueError naming the fix for a --label_vocabulary given to a regressor, or
    not one distinct string per class of the task."""
    given = settings["label_vocabulary"]
    if not given:
      return
    kind, _ = parse_task(self.task)
    if kind == REGRESSION:
      raise ValueError(f"--label_vocabulary: --task={REGRESSION}'s labels are numbers, not "
                       "classes; leave --label_vocabulary out.")
    classes = 10 if kind == MULTICLASS else 2
    words = given.split(",")
    if len(words) != classes or len(set(words)) != classes or not all(
        w and w.strip() == w for w in words):
      raise ValueError(f"--label_vocabulary={given}: give {classes} distinct names, "
                       f"comma-separated, one for each class of --task={self.task} in order "
                       f"({'zero,one,...,nine' if classes == 10 else 'no,yes'}).")

  def class_names(self) -> Tuple[str, ...]:
    """--label_vocabulary's strings, one a class; () without one."""
    given = self.canned_settings().get("label_vocabulary")
    return tuple(given.split(",")) if given else ()

  @staticmethod
  def _validate_weights(settings: Dict[str, Any]) -> None:
    """Raises ValueError naming the fix for a --weight_column without --digit_weights (or
    the other way round), a column named as the image's, or weights that are not ten
    numbers >= 0, some above 0."""
    column, given = settings["weight_column"], settings["digit_weights"]
    if bool(column) != bool(given):
      raise ValueError("--weight_column names the weights' feature and --digit_weights gives "
                       "them: give both (--weight_column=weight --digit_weights=1,1,1,2,1,1,"
                       "1,1,1,1), or neither.")
    if not column:
      return
    if not column.isidentifier() or column == settings["feature_name"]:
      raise ValueError(f"--weight_column={column!r}: give a name of letters, digits and "
                       f"underscores other than --feature_name={settings['feature_name']}.")
    try:
      weights = [float(w) for w in given.split(",")]
    except ValueError:
      weights = []
    if (len(weights) != 10 or not all(0 <= w < math.inf for w in weights)
        or not any(weights)):
      raise ValueError(f"--digit_weights={given}: give ten numbers >= 0, comma-separated, "
                       "the weight of each digit 0 to 9, not all 0.")

  def example_weights(self) -> Optional[List[float]]:
    """Each digit's weight (--digit_weights) if the run has a --weight_column, else None."""
    settings = self.canned_settings()
    if not settings.get("weight_column"):
      return None
    return [float(w) for w in settings["digit_weights"].split(",")]

  def validate_schedule(self) -> None:
    """Raises ValueError naming the fix for an unknown schedule, a setting it does not take
    or lacks, a value out of range, or a schedule given to a canned model."""
    name = self.learning_rate_schedule
    if name not in SCHEDULES:
      raise ValueError(f"--learning_rate_schedule={name} is not one of {', '.join(SCHEDULES)}.")
    given = [n for n in SCHEDULE_SETTINGS if _given(getattr(self, n))]
    if self.canned_settings() and (name != Config.learning_rate_schedule or given
                                   or self.warmup_steps):
      raise ValueError(f"--model={self.model} trains at the canned Estimator's constant rates "
                       "(--dnn_learning_rate, --linear_learning_rate): leave out "
                       "--learning_rate_schedule, --warmup_steps and the schedule's settings.")
    for setting in given:
      if setting not in SCHEDULES[name]:
        takes = [s for s, settings in SCHEDULES.items() if setting in settings]
        raise ValueError(f"--{setting} is not a setting of --learning_rate_schedule={name}; "
                         f"it is one of {', '.join(takes)}.")
    for setting, default in SCHEDULES[name].items():
      if default is None and getattr(self, setting) is None:
        raise ValueError(f"--learning_rate_schedule={name} needs --{setting}.")
    if self.warmup_steps < 0:
      raise ValueError(f"--warmup_steps must be >= 0, got {self.warmup_steps}.")
    settings = self.schedule_settings()
    for setting, low in (("decay_rate", 0.0), ("power", 0.0)):
      if setting in settings and not settings[setting] > low:
        raise ValueError(f"--{setting} must be positive, got {settings[setting]}.")
    if "end_learning_rate" in settings and not settings["end_learning_rate"] >= 0:
      raise ValueError(f"--end_learning_rate must be >= 0, got {settings['end_learning_rate']}.")
    if name == "piecewise":
      self._validate_piecewise()
    if self.clip_global_norm is not None:
      if self.canned_settings():
        raise ValueError(f"--model={self.model} trains as its canned Estimator does, which "
                         "clips no gradient: leave out --clip_global_norm.")
      if not 0 < self.clip_global_norm < math.inf:
        raise ValueError(f"--clip_global_norm must be positive, got {self.clip_global_norm}.")

  def _validate_piecewise(self) -> None:
    if self.learning_rate is not None:
      raise ValueError("--learning_rate_schedule=piecewise takes its rates from --values: "
                       "leave out --learning_rate.")
    try:
      boundaries, values = self.piecewise()
    except ValueError:
      raise ValueError(f"--boundaries={self.boundaries} --values={self.values}: give whole "
                       "steps and rates, comma-separated (100,200 and 0.1,0.01,0.001).") from None
    if any(b <= a for a, b in zip(boundaries, boundaries[1:])) or boundaries[0] < 0:
      raise ValueError(f"--boundaries={self.boundaries} must be steps >= 0, increasing.")
    if len(values) != len(boundaries) + 1:
      raise ValueError(f"--values={self.values} must hold one rate more than --boundaries="
                       f"{self.boundaries}: {len(boundaries) + 1}, got {len(values)}.")
    if not all(v >= 0 for v in values) or not values[0] > 0:
      raise ValueError(f"--values={self.values}: rates must be >= 0, the first positive.")

  def initial_learning_rate(self) -> float:
    """The rate the schedule starts from: --learning_rate or the optimizer's; piecewise's
    first --values."""
    if self.learning_rate_schedule == "piecewise":
      return self.piecewise()[1][0]
    return self.hyperparameters()["learning_rate"]

  def schedule_settings(self) -> Dict[str, Any]:
    """The schedule's own settings (`SCHEDULES`), each as given or its default."""
    return {name: getattr(self, name) if _given(getattr(self, name)) else default
            for name, default in SCHEDULES.get(self.learning_rate_schedule, {}).items()}

  def piecewise(self) -> Tuple[List[int], List[float]]:
    """piecewise's --boundaries and --values, as numbers."""
    return ([int(b) for b in self.boundaries.split(",")],
            [float(v) for v in self.values.split(",")])

  def schedule_steps(self) -> int:
    """The learning-rate schedule's length: decay_steps, or train_steps when 0."""
    return self.decay_steps or self.train_steps

  def keras_steps_per_execution(self) -> int:
    """steps_per_execution with auto (0) resolved: the largest value up to 10 that
    divides train_steps and the log, checkpoint and backup intervals; 1 with record_dir
    or early stopping (which stops one step after a check, as the Estimator's hook does)."""
    if self.steps_per_execution:
      return self.steps_per_execution
    if self.record_dir or self.early_stopping_metric:
      return 1
    divides = math.gcd(self.train_steps, self.log_every_steps, self.checkpoint_every_steps,
                       self.backup_every_steps)
    return max(k for k in range(1, AUTO_STEPS_PER_EXECUTION_MAX + 1) if divides % k == 0)

  def validate_program(self, find: bool = True) -> None:
    """Raises ValueError (program.ProgramError) for a malformed --estimator_program, one
    this Python cannot find (if `find`), or --program_params without one, or with a
    canned --model (whose Estimator is the program)."""
    if self.estimator_program is None:
      if self.program_params:
        raise ValueError("--program_params sets an --estimator_program's params: give "
                         "--estimator_program too, or leave --program_params out.")
      return
    program.check(self.estimator_program, find)
    model_registry.parse_settings(self.program_params, "--program_params")
    if self.model in CANNED:
      raise ValueError(f"--model={self.model} is a canned Estimator, which is its own "
                       f"program: leave --estimator_program out, or give --model your port.")

  def warm_start_selection(self) -> Union[str, List[str]]:
    """--warm_start_vars as WarmStartSettings takes it: a regex (trainable variables), or a
    list of them (any model variable); ".*" when not given."""
    text = (self.warm_start_vars or ".*").strip()
    if not text.startswith("["):
      return text
    try:
      patterns = json.loads(text)
    except ValueError:
      patterns = None
    if not (isinstance(patterns, list) and patterns
            and all(isinstance(p, str) for p in patterns)):
      raise ValueError(f"--warm_start_vars={self.warm_start_vars}: a list must be a JSON list "
                       "of regexes, '[\"conv1/.*\", \"bn1/.*\"]'; without brackets it is "
                       "one regex.")
    return patterns

  def validate_task(self) -> None:
    """Raises ValueError naming the fix for a --task that is none of `TASKS`, or one the
    model cannot take: a team's program's model_fn has its own head."""
    if parse_task(self.task)[0] != MULTICLASS and self.estimator_program:
      raise ValueError(f"--task={self.task}: --estimator_program's model_fn has its own head "
                       "and its input_fn its own labels; leave --task out.")

  def validate_checkpointing(self) -> None:
    """Raises ValueError naming the fix for a negative --keep_checkpoint_max, a warm-start
    setting without --warm_start_from, or a --warm_start_vars that is not a regex or a
    list of them."""
    if self.keep_checkpoint_max is not None and self.keep_checkpoint_max < 0:
      raise ValueError(f"--keep_checkpoint_max must be >= 0 (0 = keep all), got "
                       f"{self.keep_checkpoint_max}.")
    if not self.warm_start_from:
      for name in ("warm_start_vars", "warm_start_map"):
        if getattr(self, name):
          raise ValueError(f"--{name} says what --warm_start_from starts: give "
                           f"--warm_start_from too, or leave --{name} out.")
      return
    selection = self.warm_start_selection()
    for pattern in [selection] if isinstance(selection, str) else selection:
      try:
        re.compile(pattern)
      except re.error as e:
        raise ValueError(f"--warm_start_vars: {pattern!r} is not a regex ({e}).") from None

  def validate_early_stopping(self) -> None:
    """Raises ValueError naming the flag for an early-stopping setting without a metric, a
    metric without --early_stopping_steps, a mode other than min or max, a negative step
    count, or Keras steps per execution that would stop past the hook's step."""
    names = ("early_stopping_steps", "early_stopping_min_steps",
             "early_stopping_check_every_steps")
    if not self.early_stopping_metric:
      for name in names:
        if getattr(self, name):
          raise ValueError(f"--{name} says how --early_stopping_metric stops a run: give "
                           f"--early_stopping_metric too, or leave --{name} out.")
      if self.early_stopping_mode != "min":
        raise ValueError("--early_stopping_mode says how --early_stopping_metric improves: "
                         "give --early_stopping_metric too, or leave it out.")
      return
    if self.early_stopping_mode not in ("min", "max"):
      raise ValueError(f"--early_stopping_mode must be min or max, got "
                       f"{self.early_stopping_mode!r}.")
    if self.early_stopping_steps <= 0:
      raise ValueError("--early_stopping_metric needs --early_stopping_steps, the training "
                       "steps without improvement that stop the run (a positive number).")
    for name in names[1:]:
      if getattr(self, name) < 0:
        raise ValueError(f"--{name} must be >= 0, got {getattr(self, name)}.")
    if self.steps_per_execution > 1:
      raise ValueError("--early_stopping_metric stops one step after a check, as the "
                       "Estimator's hook does: it needs --steps_per_execution=1 (or 0).")

  def logged_tensors(self) -> List[str]:
    """--log_tensors as its names."""
    return [name.strip() for name in self.log_tensors.split(",")] if self.log_tensors else []

  def validate_log_tensors(self) -> None:
    """Raises ValueError naming the flag for an empty or repeated name in --log_tensors, or
    --log_tensors with a canned --model, whose layers the canned Estimator builds."""
    names = self.logged_tensors()
    if any(not name for name in names) or len(set(names)) < len(names):
      raise ValueError(f"--log_tensors={self.log_tensors}: give each name once, separated by "
                       "commas (loss,learning_rate,global_step or a layer's name).")
    if names and self.model in CANNED:
      raise ValueError(f"--log_tensors is for a spec's layers; --model={self.model} is a "
                       "canned Estimator, which builds its own: leave --log_tensors out.")

  def validate_export(self) -> None:
    """Raises ValueError naming the flag for an --export that is not final, latest or best,
    best without --export_metric, a metric or mode without best, or a negative
    --exports_to_keep (or one with final, which keeps its one export)."""
    if self.export not in ("final", "latest", "best"):
      raise ValueError(f"--export must be final, latest or best, got {self.export!r}.")
    if self.export == "best" and not self.export_metric:
      raise ValueError("--export=best ranks evaluations by a metric: give --export_metric "
                       "(BestExporter's default ranks by loss: --export_metric=loss).")
    if self.export != "best" and (self.export_metric or self.export_mode != "min"):
      raise ValueError("--export_metric and --export_mode say which export is the best: give "
                       "--export=best too, or leave them out.")
    if self.export_mode not in ("min", "max"):
      raise ValueError(f"--export_mode must be min or max, got {self.export_mode!r}.")
    if self.exports_to_keep is not None:
      if self.export == "final":
        raise ValueError("--exports_to_keep is for --export=latest or best (final exports "
                         "once): give one of them, or leave --exports_to_keep out.")
      if self.exports_to_keep < 0:
        raise ValueError(f"--exports_to_keep must be >= 0 (0: all), got "
                         f"{self.exports_to_keep}.")

  def early_stopping_every(self) -> int:
    """The steps between early-stopping checks."""
    return self.early_stopping_check_every_steps or self.checkpoint_every_steps

  def validate(self, num_replicas: int = 1, find_model: bool = True) -> None:
    """Raises ValueError naming the bad setting and its fix (model_registry.SpecError for
    --model and --model_options: it imports neither TensorFlow nor the model; with
    find_model False it checks only their form, for a model that lives elsewhere)."""
    model_registry.check(self.model, self.model_options, find=find_model)
    self.validate_program(find_model)
    for name in ("train_steps", "global_batch_size", "eval_batch_size", "log_every_steps",
                 "checkpoint_every_steps", "backup_every_steps"):
      if getattr(self, name) <= 0:
        raise ValueError(f"--{name} must be positive, got {getattr(self, name)}.")
    self.validate_task()
    self.validate_optimizer()
    self.validate_canned(find_model)
    if self.decay_steps < 0:
      raise ValueError(f"--decay_steps must be >= 0 (0 = --train_steps), got {self.decay_steps}.")
    self.validate_schedule()
    self.validate_checkpointing()
    self.validate_early_stopping()
    self.validate_export()
    self.validate_log_tensors()
    if self.steps_per_execution < 0:
      raise ValueError(f"--steps_per_execution must be >= 0 (0 = auto), got "
                       f"{self.steps_per_execution}.")
    for name in ("train_steps", "log_every_steps", "checkpoint_every_steps",
                 "backup_every_steps"):
      if self.steps_per_execution and getattr(self, name) % self.steps_per_execution:
        raise ValueError(
            f"--{name}={getattr(self, name)} is not a multiple of --steps_per_execution="
            f"{self.steps_per_execution}: Keras runs callbacks only between executions.")
    if self.record_dir and self.steps_per_execution > 1:
      raise ValueError("--record_dir records every step's loss: it needs "
                       "--steps_per_execution=1.")
    if self.global_batch_size % num_replicas:
      raise ValueError(
          f"--global_batch_size={self.global_batch_size} is not divisible by the "
          f"{num_replicas} replicas; use a multiple of {num_replicas}."
      )
