"""Both binaries as users run them: 1 and 2 local workers, loss scaling, bad input."""

import dataclasses
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from trainers import flags as trainer_flags
from trainers import model as model_lib
from trainers import reference
from trainers.config import Config
from tests.conftest import run_module

BACKENDS = ("keras", "estimator")
STEPS = 3
TINY = Config(train_steps=STEPS, global_batch_size=32, learning_rate=0.1, momentum=0.9,
              eval_batch_size=50, log_every_steps=1, checkpoint_every_steps=STEPS)
SUMMARY_KEYS = {"backend", "workers", "global_step", "test_accuracy", "test_loss",
                "train_seconds", "examples_per_second", "model_dir", "export_dir"}


def _flags(config: Config, data_dir: str):
  return trainer_flags.config_to_flags(dataclasses.replace(config, data_dir=data_dir))


def _train(backend, workers, tiny_data_dir, tmp_path_factory):
  model_dir = str(tmp_path_factory.mktemp(f"{backend}{workers}"))
  result = run_module(f"trainers.{backend}_main",
                      [f"--workers={workers}", f"--model_dir={model_dir}",
                       "--timeout=300", *_flags(TINY, tiny_data_dir)])
  assert result.returncode == 0, result.stderr[-5000:]
  return model_dir, result


@pytest.fixture(scope="module", params=[(b, w) for w in (1, 2) for b in BACKENDS],
                ids=lambda p: f"{p[0]}-{p[1]}w")
def run(request, tiny_data_dir, tmp_path_factory):
  backend, workers = request.param
  model_dir, result = _train(backend, workers, tiny_data_dir, tmp_path_factory)
  return backend, workers, model_dir, result


def test_run_writes_a_valid_summary(run):
  backend, workers, model_dir, result = run
  with open(os.path.join(model_dir, "summary.json")) as f:
    summary = json.load(f)
  assert set(summary) == SUMMARY_KEYS
  assert (summary["backend"], summary["workers"], summary["global_step"]) == (
      backend, workers, STEPS)
  assert 0.0 <= summary["test_accuracy"] <= 1.0 and summary["test_loss"] > 0
  assert summary["train_seconds"] > 0 and summary["examples_per_second"] > 0
  assert json.loads(result.stdout.strip().splitlines()[-1]) == summary
  assert os.path.exists(os.path.join(summary["export_dir"], "saved_model.pb"))
  assert os.listdir(os.path.join(model_dir, "eval"))  # Evaluation events.


def test_only_the_chief_writes_to_model_dir(run):
  backend, workers, model_dir, _ = run
  leftovers = [n for n in os.listdir(model_dir) if n.startswith(("tmp", ".tmp"))]
  assert not leftovers
  if workers > 1:
    logs = sorted(os.listdir(os.path.join(model_dir, "logs")))
    expected = ["chief-0.log", "worker-0.log"] + (["evaluator-0.log"] if backend == "estimator"
                                                  else [])
    assert logs == sorted(expected)


def _trained_weights(backend: str, model_dir: str, names):
  if backend == "estimator":
    reader = tf.train.load_checkpoint(model_dir)
    return {name: reader.get_tensor(name) for name in names}
  with open(os.path.join(model_dir, "summary.json")) as f:
    export_dir = json.load(f)["export_dir"]
  return {model_lib.weight_name(v): v.numpy()
          for v in tf.saved_model.load(export_dir).trainable_variables}


def test_loss_scaling_gives_the_gradient_of_the_global_batch_mean(run, tiny_data_dir):
  """Each backend's weights equal a plain GradientTape loop over the global batches.

  Keras divides by the global batch; under train_distribute the Estimator's v1
  optimizer divides the per-replica mean by the number of replicas. A model_fn
  dividing by the global batch would step half as far at 2 workers: the
  `half` weights show the test tells the two apart. trainers.reference is the
  same loop launch.parity uses; its own test is here.
  """
  backend, workers, model_dir, _ = run
  config = dataclasses.replace(TINY, data_dir=tiny_data_dir)
  _, want = reference.train_reference(config, workers)
  # v1 momentum is linear in the gradient: half the rate = half the gradient.
  _, half = reference.train_reference(
      dataclasses.replace(config, learning_rate=config.learning_rate / 2), workers)
  initial = model_lib.get_weights(model_lib.build_model(config.seed))
  got = _trained_weights(backend, model_dir, want)
  assert sorted(got) == sorted(want)
  for name in want:
    assert np.abs(want[name] - initial[name]).max() > 1e-3, f"{name} did not move"
    assert np.abs(half[name] - want[name]).max() > 1e-4, f"{name}: no power to detect 1/2"
    np.testing.assert_allclose(got[name], want[name], atol=1e-6, err_msg=f"{backend} {name}")


def test_both_backends_export_the_same_serving_signature(tiny_data_dir, tmp_path_factory):
  images = tf.random.stateless_uniform((4, 28, 28, 1), seed=(1, 2))
  signatures, outputs = {}, {}
  for backend in BACKENDS:
    model_dir = str(tmp_path_factory.mktemp(f"sig-{backend}"))
    result = run_module(f"trainers.{backend}_main",
                        [f"--model_dir={model_dir}", *_flags(TINY, tiny_data_dir)])
    assert result.returncode == 0, result.stderr[-3000:]
    export_dir = json.loads(result.stdout.strip().splitlines()[-1])["export_dir"]
    serve = tf.saved_model.load(export_dir).signatures["serving_default"]
    signatures[backend] = (serve.structured_input_signature,
                           {k: (v.dtype, v.shape.as_list())
                            for k, v in serve.structured_outputs.items()})
    outputs[backend] = serve(image=images)
  assert signatures["keras"] == signatures["estimator"]
  assert set(signatures["keras"][1]) == {"classes", "probabilities", "logits"}
  for key in ("logits", "probabilities"):
    np.testing.assert_allclose(outputs["keras"][key], outputs["estimator"][key], atol=1e-5)


@pytest.mark.parametrize("args, env, code, message", [
    (["--workers=0"], {}, 2, "--workers must be at least 1"),
    (["--workers=2", "--global_batch_size=33"], {}, 2, "not divisible by the 2 replicas"),
    (["--train_steps=0"], {}, 2, "--train_steps must be positive"),
    (["extra"], {}, 2, "Unexpected arguments: extra"),
    ([], {"TF_CONFIG": "{oops"}, 2, "TF_CONFIG is not valid JSON"),
    (["--workers=3"], {"TF_CONFIG": json.dumps(
        {"cluster": {"chief": ["localhost:1"], "worker": ["localhost:2"]},
         "task": {"type": "worker", "index": 0}})}, 2, "TF_CONFIG describes 2 training tasks"),
])
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_input_is_rejected_with_the_fix(backend, args, env, code, message, tiny_data_dir,
                                            tmp_path):
  model_dir = tmp_path / "model"
  result = run_module(f"trainers.{backend}_main",
                      [f"--data_dir={tiny_data_dir}", f"--model_dir={model_dir}", *args],
                      env=env, timeout=120)
  assert result.returncode == code, result.stderr[-3000:]
  assert message in result.stderr
  assert not model_dir.exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_missing_data_names_the_prepare_command(backend, tmp_path):
  result = run_module(f"trainers.{backend}_main", [f"--data_dir={tmp_path}", "--workers=2"],
                      timeout=120)
  assert result.returncode == 1
  assert "python -m data.prepare --idx_dir=DIR" in result.stderr


@pytest.mark.real_data
@pytest.mark.parametrize("backend", BACKENDS)
def test_real_mnist_two_workers_reach_97_percent(backend, real_data_dir, tmp_path):
  result = run_module(f"trainers.{backend}_main",
                      ["--workers=2", f"--data_dir={real_data_dir}", f"--model_dir={tmp_path}",
                       "--timeout=900"], timeout=1000)
  assert result.returncode == 0, result.stderr[-5000:]
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  print(json.dumps(summary))
  assert summary["global_step"] == Config().train_steps
  assert summary["test_accuracy"] >= 0.97
