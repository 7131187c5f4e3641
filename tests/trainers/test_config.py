"""trainers.config: validation names the bad setting; auto steps_per_execution."""

import dataclasses
import re

import pytest

from trainers.config import Config


@pytest.mark.parametrize("changes, message", [
    ({"learning_rate": float("nan")}, "--learning_rate must be in (0, inf), got nan"),
    ({"learning_rate": float("inf")}, "--learning_rate must be in (0, inf), got inf"),
    ({"learning_rate": 0.0}, "--learning_rate must be in (0, inf), got 0.0"),
    ({"optimizer": "adadelta"}, "--optimizer=adadelta is not one of sgd, momentum"),
    ({"beta1": 0.8}, "--beta1 is not a setting of --optimizer=momentum, which takes "
     "--learning_rate, --momentum: leave it out"),
    ({"optimizer": "adam", "beta2": 1.0}, "--beta2 must be in [0, 1), got 1.0"),
    ({"optimizer": "ftrl", "learning_rate_power": 0.5}, "--learning_rate_power must be in "
     "(-inf, 0], got 0.5"),
    ({"optimizer": "ftrl", "l1": -1.0}, "--l1 must be in [0, inf), got -1.0"),
    ({"optimizer": "adagrad", "initial_accumulator_value": 0.0},
     "--initial_accumulator_value must be in (0, inf)"),
    ({"momentum": 1.0}, "--momentum must be in [0, 1)"),
    ({"momentum": float("nan")}, "--momentum must be in [0, 1)"),
    ({"train_steps": 0}, "--train_steps must be positive"),
    ({"steps_per_execution": 7}, "is not a multiple of --steps_per_execution=7"),
    ({"record_dir": "/tmp/r", "steps_per_execution": 10}, "needs --steps_per_execution=1"),
    # A canned model's settings (the canned Estimator's arguments) and nobody else's.
    ({"hidden_units": "64"}, "--hidden_units is not a setting of --model=cnn; it is one of "
     "--model=dnn, wide_deep, dnn_v1, wide_deep_v1."),
    ({"model": "linear", "dropout": 0.1}, "--dropout is not a setting of --model=linear"),
    ({"model": "dnn", "optimizer": "adam"}, "--optimizer is not a setting of --model=dnn, which "
     "trains with the canned Estimator's optimizers: set --dnn_optimizer, --dnn_learning_rate."),
    ({"model": "linear", "learning_rate": 0.1}, "--learning_rate is not a setting of "
     "--model=linear"),
    ({"model": "dnn", "hidden_units": "64,x"}, "--hidden_units=64,x: give positive widths"),
    ({"model": "dnn", "hidden_units": "0"}, "--hidden_units=0: give positive widths"),
    ({"model": "dnn", "dropout": 1.0}, "--dropout must be in [0, 1), got 1.0"),
    ({"model": "dnn", "activation": "swish"}, "--activation=swish is not one of relu"),
    ({"model": "dnn", "dnn_optimizer": "momentum"}, "--dnn_optimizer=momentum is not one of "
     "adagrad, adam, ftrl, rmsprop, sgd."),
    ({"model": "linear", "linear_learning_rate": 0.0}, "--linear_learning_rate must be "
     "positive, got 0.0"),
    ({"model": "linear", "feature_name": "my image"}, "--feature_name='my image': give a name"),
    # The learning-rate schedule's settings: each schedule's own, in range.
    ({"learning_rate_schedule": "linear"}, "--learning_rate_schedule=linear is not one of "
     "cosine, constant, exponential"),
    ({"learning_rate_schedule": "exponential"}, "--learning_rate_schedule=exponential needs "
     "--decay_rate."),
    ({"learning_rate_schedule": "exponential", "decay_rate": -0.5}, "--decay_rate must be "
     "positive, got -0.5"),
    ({"staircase": True}, "--staircase is not a setting of --learning_rate_schedule=cosine; "
     "it is one of exponential, inverse_time."),
    ({"cycle": True, "learning_rate_schedule": "exponential", "decay_rate": 0.5},
     "--cycle is not a setting of --learning_rate_schedule=exponential; it is one of "
     "polynomial."),
    ({"learning_rate_schedule": "polynomial", "power": 0.0}, "--power must be positive"),
    ({"learning_rate_schedule": "polynomial", "end_learning_rate": -1.0},
     "--end_learning_rate must be >= 0"),
    ({"learning_rate_schedule": "piecewise", "values": "0.1"}, "needs --boundaries."),
    ({"learning_rate_schedule": "piecewise", "boundaries": "200,100", "values": "0.1,0.01,0.001"},
     "--boundaries=200,100 must be steps >= 0, increasing."),
    ({"learning_rate_schedule": "piecewise", "boundaries": "100,200", "values": "0.1,0.01"},
     "--values=0.1,0.01 must hold one rate more than --boundaries=100,200: 3, got 2."),
    ({"learning_rate_schedule": "piecewise", "boundaries": "100", "values": "0.1,-0.01"},
     "--values=0.1,-0.01: rates must be >= 0, the first positive."),
    ({"learning_rate_schedule": "piecewise", "boundaries": "1x", "values": "0.1,0.01"},
     "give whole steps and rates"),
    ({"learning_rate_schedule": "piecewise", "boundaries": "100", "values": "0.1,0.01",
      "learning_rate": 0.2}, "takes its rates from --values: leave out --learning_rate."),
    ({"warmup_steps": -1}, "--warmup_steps must be >= 0, got -1."),
    ({"clip_global_norm": 0.0}, "--clip_global_norm must be positive, got 0.0."),
    ({"clip_global_norm": float("inf")}, "--clip_global_norm must be positive, got inf."),
    ({"model": "linear", "clip_global_norm": 1.0}, "--model=linear trains as its canned "
     "Estimator does, which clips no gradient"),
    ({"model": "dnn", "warmup_steps": 10}, "--model=dnn trains at the canned Estimator's "
     "constant rates"),
    ({"model": "dnn", "weight_column": "w"}, "--weight_column names the weights' feature "
     "and --digit_weights gives them: give both"),
    ({"model": "linear", "digit_weights": "1,1,1,1,1,1,1,1,1,1"}, "give both"),
    ({"model": "cnn", "weight_column": "w"}, "--weight_column is not a setting of --model=cnn"),
    ({"model": "dnn", "weight_column": "image", "digit_weights": "1,1,1,1,1,1,1,1,1,1"},
     "other than --feature_name=image"),
    ({"model": "dnn", "weight_column": "w", "digit_weights": "1,1,1,1,1,1,1,1,1,-1"},
     "--digit_weights=1,1,1,1,1,1,1,1,1,-1: give ten numbers >= 0"),
    ({"model": "dnn", "weight_column": "w", "digit_weights": "1,1,1"}, "give ten numbers"),
    ({"model": "dnn", "weight_column": "w", "digit_weights": "0,0,0,0,0,0,0,0,0,0"},
     "not all 0"),
    ({"model": "dnn", "weight_column": "w", "digit_weights": "1,1,1,1,1,1,1,1,1,x"},
     "give ten numbers"),
    ({"model": "dnn", "task": "regression", "label_vocabulary": "a,b"},
     "--task=regression's labels are numbers, not classes; leave --label_vocabulary out."),
    ({"model": "dnn", "task": "binary:3", "label_vocabulary": "a,b,c"},
     "--label_vocabulary=a,b,c: give 2 distinct names"),
    ({"model": "linear", "label_vocabulary": "a,b,c,d,e,f,g,h,i,a"},
     "give 10 distinct names, comma-separated, one for each class of --task=multiclass"),
    ({"model": "linear", "task": "binary:1", "label_vocabulary": "no, yes"}, "give 2 distinct"),
    ({"model": "cnn", "label_vocabulary": "no,yes"}, "--label_vocabulary is not a setting of "
     "--model=cnn"),
    ({"model": "dnn", "loss_reduction": "mean"}, "--loss_reduction=mean is not one of "
     "sum_over_batch_size, sum."),
    ({"model": "cnn", "features": "tabular"}, "--features is not a setting of --model=cnn"),
    ({"model": "dnn", "features": "table"}, "--features=table is not one of image, tabular."),
    ({"model": "dnn", "feature_columns": "my.cols:COLUMNS"}, "--feature_columns describe the "
     "tabular features: give --features=tabular"),
    ({"model": "dnn", "features": "tabular", "feature_columns": "columns"},
     "unknown feature columns 'columns': --feature_columns takes package.module:NAME"),
    ({"model": "dnn", "features": "tabular", "feature_columns": "no_such_pkg.cols:COLUMNS"},
     "feature columns 'no_such_pkg.cols:COLUMNS': no module no_such_pkg.cols"),
    ({"task": "binary:12"}, "--task=binary:12 is not one of multiclass, binary:D with D a "
     "digit 0 to 9"),
    ({"task": "binary:03"}, "--task=binary:03 is not one of"),
    ({"task": "binary"}, "--task=binary is not one of"),
    ({"task": "regression:1"}, "--task=regression:1 is not one of"),
    ({"task": "Multiclass"}, "--task=Multiclass is not one of"),
    ({"early_stopping_steps": 100}, "--early_stopping_steps says how --early_stopping_metric "
     "stops a run: give --early_stopping_metric too"),
    ({"early_stopping_mode": "max"}, "--early_stopping_mode says how --early_stopping_metric"),
    ({"early_stopping_metric": "loss"}, "--early_stopping_metric needs --early_stopping_steps"),
    ({"early_stopping_metric": "loss", "early_stopping_steps": 10,
      "early_stopping_mode": "lower"}, "--early_stopping_mode must be min or max, got 'lower'."),
    ({"early_stopping_metric": "loss", "early_stopping_steps": 10,
      "early_stopping_check_every_steps": -5}, "--early_stopping_check_every_steps must be >= 0"),
    ({"early_stopping_metric": "loss", "early_stopping_steps": 10, "steps_per_execution": 10},
     "it needs --steps_per_execution=1 (or 0)."),
    ({"export": "best"}, "--export=best ranks evaluations by a metric: give --export_metric"),
    ({"export": "newest"}, "--export must be final, latest or best, got 'newest'."),
    ({"export_metric": "loss"}, "--export_metric and --export_mode say which export is the "
     "best: give --export=best too"),
    ({"export": "latest", "export_mode": "max"}, "give --export=best too"),
    ({"export": "best", "export_metric": "loss", "export_mode": "lower"},
     "--export_mode must be min or max, got 'lower'."),
    ({"exports_to_keep": 3}, "--exports_to_keep is for --export=latest or best"),
    ({"log_tensors": "loss,,hidden"}, "--log_tensors=loss,,hidden: give each name once"),
    ({"log_tensors": "loss,loss"}, "give each name once"),
    ({"model": "dnn", "log_tensors": "loss"}, "--model=dnn is a canned Estimator"),
    ({"export": "latest", "exports_to_keep": -1}, "--exports_to_keep must be >= 0 (0: all)"),
])
def test_bad_settings_are_named(changes, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    dataclasses.replace(Config(), **changes).validate()


def test_the_global_batch_must_divide_among_the_replicas():
  Config(global_batch_size=96).validate(num_replicas=4)
  with pytest.raises(ValueError, match="not divisible by the 5 replicas"):
    Config(global_batch_size=96).validate(num_replicas=5)


def test_auto_steps_per_execution_divides_every_interval():
  assert Config().keras_steps_per_execution() == 10
  assert Config(train_steps=12, log_every_steps=2, checkpoint_every_steps=6,
                backup_every_steps=6).keras_steps_per_execution() == 2
  assert Config(record_dir="/tmp/r").keras_steps_per_execution() == 1
  assert Config(early_stopping_metric="loss").keras_steps_per_execution() == 1
  assert Config(steps_per_execution=5).keras_steps_per_execution() == 5


def test_each_optimizer_reads_its_own_defaults_and_what_is_given():
  assert Config().hyperparameters() == {"learning_rate": 0.1, "momentum": 0.9}
  assert Config(optimizer="adam", beta2=0.99).hyperparameters() == {
      "learning_rate": 0.001, "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-8}
  assert Config(optimizer="rmsprop").hyperparameters()["momentum"] == 0.0
  assert Config(optimizer="ftrl", learning_rate=0.5).initial_learning_rate() == 0.5


def test_every_field_has_its_help():
  assert all(f.metadata.get("help") for f in dataclasses.fields(Config))


def test_a_canned_model_reads_the_canned_defaults_and_what_is_given():
  assert Config().canned_settings() == {}
  assert Config(model="dnn").canned_settings() == {
      "hidden_units": "128,64", "dropout": 0.0, "batch_norm": False, "activation": "relu",
      "feature_name": "image", "dnn_optimizer": "adagrad", "dnn_learning_rate": 0.05,
      "weight_column": "", "digit_weights": "", "label_vocabulary": "", "loss_reduction": "",
      "features": "image", "feature_columns": ""}
  assert Config(model="linear", linear_optimizer="sgd").canned_settings()[
      "linear_learning_rate"] == 0.2
  assert Config(model="wide_deep").canned_settings()["dnn_learning_rate"] == 0.001
  assert Config(model="dnn", hidden_units="32, 16").hidden_units_list() == [32, 16]
  Config(model="dnn", hidden_units="32,16", dropout=0.5, batch_norm=True,
         activation="tanh", dnn_optimizer="adam", dnn_learning_rate=0.01).validate()


def test_a_teams_program_keeps_its_own_head():
  with pytest.raises(ValueError, match="--estimator_program's model_fn has its own head"):
    Config(estimator_program="team_program:PROGRAM", task="binary:1").validate_task()
  Config(estimator_program="team_program:PROGRAM").validate_task()


def test_example_weights_are_each_digits_under_a_weight_column():
  assert Config(model="dnn").example_weights() is None
  weighted = Config(model="wide_deep_v1", weight_column="w",
                    digit_weights="0,1,2,3,4,5,6,7,8,9.5")
  assert weighted.example_weights() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9.5]
