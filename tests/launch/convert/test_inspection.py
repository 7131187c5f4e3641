"""launch.convert.inspection: what each variable of any checkpoint is, and the map it
proposes onto a model, guesses marked."""

import tensorflow as tf

from launch.convert import inspection as inspect

F32 = tf.float32


def _kinds(shapes, dtypes=None):
  dtypes = dtypes or {}
  found = inspect._estimator_variables(  # pylint: disable=protected-access
      shapes, {name: dtypes.get(name, F32) for name in shapes})
  return {v.name: (v.kind, v.of) for v in found}


def test_each_kind_of_variable_is_told_apart():
  shapes = {
      "global_step": [], "beta1_power": [], "beta2_power": [],
      "dnn/hiddenlayer_0/kernel": [784, 128],
      # A TF2 canned Estimator's Keras legacy optimizer.
      "training/Adagrad/dnn/hiddenlayer_0/kernel/accumulator": [784, 128],
      "training/Adagrad/decay": [], "training/Adagrad/learning_rate": [],
      # tf.compat.v1.estimator's canned classes name slots under a scope prefix.
      "linear/linear_model/image/weights": [784, 10],
      "linear/linear/linear_model/image/weights/Ftrl": [784, 10],
      "linear/linear/linear_model/image/weights/Ftrl_1": [784, 10],
      "conv/kernel/Momentum": [3, 3, 1, 32], "conv/kernel": [3, 3, 1, 32],
      "accuracy/count": [],
  }
  kinds = _kinds(shapes, {"global_step": tf.int64})
  assert kinds == {
      "global_step": ("step", ""), "beta1_power": ("counter", ""),
      "beta2_power": ("counter", ""), "dnn/hiddenlayer_0/kernel": ("weight", ""),
      "training/Adagrad/dnn/hiddenlayer_0/kernel/accumulator":
          ("slot", "dnn/hiddenlayer_0/kernel"),
      "training/Adagrad/decay": ("hyperparameter", ""),
      "training/Adagrad/learning_rate": ("hyperparameter", ""),
      "linear/linear_model/image/weights": ("weight", ""),
      "linear/linear/linear_model/image/weights/Ftrl":
          ("slot", "linear/linear_model/image/weights"),
      "linear/linear/linear_model/image/weights/Ftrl_1":
          ("slot", "linear/linear_model/image/weights"),
      "conv/kernel/Momentum": ("slot", "conv/kernel"), "conv/kernel": ("weight", ""),
      "accuracy/count": ("other", ""),
  }


def _canned_flags(shapes, values):
  variables = inspect._estimator_variables(  # pylint: disable=protected-access
      shapes, {name: F32 for name in shapes})
  return inspect.canned_flags(variables, values.__getitem__)


def test_a_tf2_canned_checkpoint_names_its_twins_flags():
  deep = {"dnn/hiddenlayer_0/kernel": [784, 32], "dnn/hiddenlayer_1/kernel": [32, 16],
          "dnn/logits/kernel": [16, 10],
          "training/Adagrad/dnn/hiddenlayer_1/kernel/accumulator": [32, 16],
          "training/Adagrad/learning_rate": []}
  assert _canned_flags(deep, {"training/Adagrad/learning_rate": 0.05}) == [
      "--model=dnn", "--hidden_units=32,16"]  # Adagrad at 0.05: the defaults.
  wide = {"linear/linear_model/pixels/weights": [784, 10],
          "training/Ftrl/linear/linear_model/pixels/weights/accumulator": [784, 10],
          "training/Ftrl/learning_rate": []}
  assert _canned_flags(wide, {"training/Ftrl/learning_rate": 0.2}) == [
      "--model=linear", "--feature_name=pixels"]
  adam = {**deep, "training/Adam/dnn/hiddenlayer_1/kernel/m": [32, 16],
          "training/Adam/learning_rate": []}
  del adam["training/Adagrad/dnn/hiddenlayer_1/kernel/accumulator"]
  assert _canned_flags({**adam, **wide}, {"training/Adam/learning_rate": 0.01,
                                          "training/Ftrl/learning_rate": 0.005}) == [
      "--model=wide_deep", "--hidden_units=32,16", "--feature_name=pixels",
      "--dnn_optimizer=adam", "--dnn_learning_rate=0.01"]
  normed = {**deep, **{f"dnn/hiddenlayer_{i}/batchnorm_{i}/{name}": [width]
                      for i, width in ((0, 32), (1, 16))
                      for name in ("gamma", "beta", "moving_mean", "moving_variance")}}
  told = _canned_flags(normed, {"training/Adagrad/learning_rate": 0.05})
  assert told == ["--model=dnn", "--hidden_units=32,16", "--batch_norm"], told
  variables = inspect._estimator_variables(  # pylint: disable=protected-access
      normed, {name: F32 for name in normed})
  text = inspect.format_text(inspect.Inspection(
      "ckpt", "estimator", 1, variables, "dnn", {}, {}, [], told, []))
  assert "Unknown, as no variable keeps them: --dropout and --activation" in text
  assert _canned_flags({"conv/kernel": [3, 3, 1, 32]}, {}) == []  # Not canned.
  v1 = {"linear/linear_model/pixels/weights": [784, 10],
        "linear/linear/linear_model/pixels/weights/Ftrl": [784, 10]}
  assert _canned_flags(v1, {}) == ["--model=linear_v1", "--feature_name=pixels"]
  v1_adam = {"dnn/hiddenlayer_0/kernel": [784, 8], "dnn/logits/kernel": [8, 10],
             "dnn/dnn/logits/kernel/Adam_1": [8, 10], "dnn/head/dnn/beta1_power": []}
  assert _canned_flags(v1_adam, {}) == ["--model=dnn_v1", "--hidden_units=8",
                                        "--dnn_optimizer=adam"]
  v1_wide_deep = {"dnn/hiddenlayer_0/kernel": [784, 8], "dnn/logits/kernel": [8, 10],
                  "dnn/hiddenlayer_0/kernel/Adagrad": [784, 8],
                  "linear/linear_model/image/weights": [784, 10],
                  "linear/linear_model/image/weights/RMSProp": [784, 10]}
  assert _canned_flags(v1_wide_deep, {}) == ["--model=wide_deep_v1", "--hidden_units=8",
                                             "--feature_name=image",
                                             "--linear_optimizer=rmsprop"]


def test_a_canned_checkpoint_over_feature_columns_names_them():
  from trainers.models import tabular  # noqa: PLC0415
  embedding = "dnn/input_from_feature_columns/input_layer/{}/embedding_weights"
  deep = {"dnn/hiddenlayer_0/kernel": [53, 16], "dnn/logits/kernel": [16, 10],
          embedding.format("grid_embedding"): [1000, 8],
          embedding.format("strokes_embedding"): [16, 8],
          embedding.format("pixels_embedding"): [30, 4]}
  wide = {f"linear/linear_model/{c.name}/weights": [1, 10] for c in tabular.COLUMNS["linear"]}
  builtin = _canned_flags({**deep, **wide}, {})
  assert builtin == ["--model=wide_deep", "--hidden_units=16", "--features=tabular"]
  variables = inspect._estimator_variables(  # pylint: disable=protected-access
      {**deep, **wide}, {name: F32 for name in {**deep, **wide}})
  assert inspect.feature_columns(variables) == sorted(c.name for c in tabular.COLUMNS["linear"]
                                                      ) + ["grid_embedding", "pixels_embedding",
                                                           "strokes_embedding"]
  # A team's: the columns named, their module asked for.
  theirs = {"linear/linear_model/age_bucketized/weights": [5, 1],
            "linear/linear_model/occupation/weights": [1000, 1]}
  assert _canned_flags(theirs, {}) == ["--model=linear", "--features=tabular",
                                       inspect.FEATURE_COLUMNS_FLAG]
  assert _canned_flags(deep, {}) == ["--model=dnn", "--hidden_units=16", "--features=tabular"]
  only_embedded = {**deep, embedding.format("city_embedding"): [50, 4]}
  assert inspect.FEATURE_COLUMNS_FLAG in _canned_flags(only_embedded, {})
  # The image: one column of 784 weights, named by --feature_name.
  assert _canned_flags({"linear/linear_model/pixels/weights": [784, 10]}, {}) == [
      "--model=linear", "--feature_name=pixels"]


def test_the_map_goes_by_name_then_shape_then_order_marking_guesses():
  weights = {"conv/kernel": [3, 3, 1, 32], "conv/bias": [32], "hidden0/bias": [64],
             "hidden1/bias": [64], "logits/kernel": [64, 10], "extra/scale": [5]}
  variables = [inspect.Variable(name, shape, "float32", "weight") for name, shape in (
      ("model/conv/kernel", [3, 3, 1, 32]),  # The model's name under a scope: by name.
      ("conv/bias", [32]),  # Its own name.
      ("dense/bias", [64]), ("dense_1/bias", [64]),  # Two of one shape: by order.
      ("out/kernel", [64, 10]),  # The only one of its shape: by shape.
      ("ema/step_size", [7]),  # Nothing of its shape: null, to be checked.
  )]
  mapping, rule, unfilled = inspect.propose_map(variables, weights)
  assert mapping == {"model/conv/kernel": "conv/kernel", "dense/bias": "hidden0/bias",
                     "dense_1/bias": "hidden1/bias", "out/kernel": "logits/kernel",
                     "ema/step_size": None}
  assert rule == {"model/conv/kernel": "name", "conv/bias": "name",
                  "dense/bias": "order (guess)", "dense_1/bias": "order (guess)",
                  "out/kernel": "shape (guess)", "ema/step_size": "none"}
  assert unfilled == ["extra/scale"]


def test_a_keras_checkpoint_is_read_by_the_names_it_saved(tmp_path):
  from trainers import keras_trainer  # noqa: PLC0415
  from trainers.config import Config  # noqa: PLC0415
  config = Config(optimizer="adam")
  model = keras_trainer.compile_model(config)
  model.optimizer.build(model.trainable_variables)
  keras_trainer.save_checkpoint(model, str(tmp_path), 7)
  found = inspect.inspect(str(tmp_path), config)
  kinds = {v.name.split(":")[0]: (v.kind, v.of) for v in found.variables}
  assert found.backend == "keras" and found.step == 0  # The optimizer's own count.
  assert kinds["conv/kernel"] == ("weight", "")
  assert [k for k, (kind, of) in kinds.items() if of == "conv/kernel"] and all(
      kind == "slot" for kind, of in kinds.values() if of == "conv/kernel")
  assert {kind for kind, _ in kinds.values()} >= {"weight", "slot", "step", "counter"}
  assert found.assignment_map == {} and "no map applies" in inspect.format_text(found)
