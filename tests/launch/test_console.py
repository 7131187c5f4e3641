"""launch.console: the terminal gets the run's own lines, warnings and errors; -v gets all."""

import logging
import os
import sys

import pytest

from launch import console
from tests.conftest import run_module

# Lines as a 2-worker Estimator chief writes them (its log keeps all of them), and
# the start-up lines a TF 2.21 Keras chief adds.
CHIEF = b"""\
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
E0000 00:00:1795444372.815895   11307 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)
2026-11-23 07:47:36.156554: I external/local_tsl/tsl/cuda/cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.
2026-11-23 07:47:36.259490: E external/local_xla/xla/stream_executor/cuda/cuda_dnn.cc:9261] Unable to register cuDNN factory
2026-11-23 07:47:39.508938: W tensorflow/compiler/tf2tensorrt/utils/py_utils.cc:38] TF-TRT Warning: Could not find TensorRT
[chief:0] I1123 07:49:23.195112 140195716713344 trainers/distribute.py:74] Task chief:0 of 2 workers; 1 intra-op threads.
[chief:0] W1123 07:47:44.100000 140615631063936 deprecation.py:50] From /x/estimator.py:1: Variable.initialized_value is deprecated
Instructions for updating:
Use Variable.read_value.
[chief:0] I1123 07:47:43.801939 140615631063936 estimator.py:200] Using config: {'_model_dir': '/tmp/k2',
, '_keep_checkpoint_max': 3}
[chief:0] I1123 07:47:52.000000 140615631063936 cross_device_ops.py:1154] Collective all_reduce tensors: 6 all_reduces, num_devices = 1
[chief:0] I1123 07:49:32.609083 140195716713344 trainers/progress.py:74] step 10/40: loss 1.8661, 1.6 steps/s, ETA 19 s
[chief:0] W1123 07:49:33.000000 140195716713344 checkpoint_management.py:100] A checkpoint was not found
2026-11-23 07:49:33.500000: W tensorflow/core/kernels/data/cache_dataset_ops.cc:858] The calling iterator did not fully read the dataset being cached.
2026-11-23 07:49:34.000000: E tensorflow/core/common_runtime/base_collective_executor.cc:249] BaseCollectiveExecutor::StartAbort UNAVAILABLE: peer died
/venv/lib/python3.11/site-packages/tensorflow_datasets/core/dataset_builder.py:9: UserWarning: a library's own warning
  warnings.warn(
[chief:0] I1123 07:49:35.000000 140195716713344 saver.py:1413] Restoring parameters from /tmp/k2/model.ckpt-40
Traceback (most recent call last):
  File "x.py", line 1, in <module>
tensorflow.python.framework.errors_impl.UnavailableError: peer died
"""

SHOWN = [
    b"[chief:0] I1123 07:49:23.195112 140195716713344 trainers/distribute.py:74] Task chief:0",
    b"[chief:0] I1123 07:49:32.609083 140195716713344 trainers/progress.py:74] step 10/40",
    b"[chief:0] W1123 07:49:33.000000 140195716713344 checkpoint_management.py:100] A check",
    b"2026-11-23 07:49:34.000000: E tensorflow/core/common_runtime/base_collective_executor",
    b"Traceback (most recent call last):", b'  File "x.py", line 1, in <module>',
    b"tensorflow.python.framework.errors_impl.UnavailableError: peer died",
]


def _filtered(verbose):
  keep = console.LineFilter(verbose)
  return [line for line in CHIEF.splitlines(keepends=True) if keep(line)]


def test_the_terminal_shows_own_lines_warnings_and_errors_only():
  shown = _filtered(verbose=False)
  assert len(shown) == len(SHOWN), b"".join(shown).decode()
  for line, start in zip(shown, SHOWN):
    assert line.startswith(start)


def test_verbose_shows_everything():
  assert _filtered(verbose=True) == CHIEF.splitlines(keepends=True)


def test_a_lone_process_filters_its_records_by_the_same_rule():
  def record(level, path):
    return logging.LogRecord("absl", level, path, 1, "message", None, None)

  keep = console.RecordFilter()
  assert keep.filter(record(logging.INFO, f"{console.REPO}/trainers/progress.py"))
  assert not keep.filter(record(logging.INFO, "/venv/site-packages/tensorflow/x/saver.py"))
  assert keep.filter(record(logging.WARNING, "/venv/site-packages/tensorflow/x/saver.py"))
  assert not keep.filter(record(logging.WARNING, "/venv/tensorflow/python/util/deprecation.py"))
  assert not console.is_own("/elsewhere/trainers/progress.py")


TOOLS = ("launch.parity", "launch.chaos", "launch.bench", "launch.handoff", "launch.version_parity")


@pytest.mark.parametrize("module, args", [
    ("trainers.keras_main", ["--workers=abc"]),
    ("trainers.estimator_main", ["--no_such_flag"]),
    ("data.prepare", ["--overwrite=maybe"]),
    ("launch.local", ["--workers=x", "--", "true"]),
    ("launch.parity", ["--steps=ten"]),
    ("launch.chaos", ["--backend=keras", "--trials=some"]),
    ("launch.bench", ["--repeats=1.5"]),
    ("launch.handoff", ["--no_such_flag"]),
    ("launch.convert", ["--no_such_flag"]),
    ("launch.bare", ["--train_steps=many"]),
    ("launch.version_parity", ["--no_such_flag"]),
])
def test_a_bad_flag_is_a_usage_error_in_every_binary(module, args):
  result = run_module(module, args, timeout=120)
  assert result.returncode == 2, result.stderr[-2000:]
  assert "error: " in result.stderr and "--helpfull" in result.stderr
  if module in TOOLS:  # Their imports load TensorFlow, without its C++ start-up lines.
    assert "Unable to register" not in result.stderr and "cpu_feature" not in result.stderr


@pytest.mark.parametrize("args, said", [
    (["--workers=abc"], "error: --workers=abc: it takes a whole number.\n"),
    (["--batch_size=64"], "error: unknown flag --batch_size: here it is --global_batch_size "
     "(Examples per step, summed over all workers)."),
    (["--save_checkpoints_steps=100"], "here it is --checkpoint_every_steps"),
])
def test_a_flag_by_another_name_or_not_a_number_is_said_in_words(args, said):
  result = run_module("trainers.keras_main", args, timeout=120)
  assert result.returncode == 2 and said in result.stderr, result.stderr[-2000:]


def test_a_tools_number_flag_says_its_default_as_an_example():
  result = run_module("launch.chaos", ["--backend=keras", "--trials=some"], timeout=120)
  assert result.returncode == 2
  assert "error: --trials=some: it takes a whole number, such as --trials=10." in result.stderr


@pytest.mark.parametrize("argv, verbose", [
    (["x"], False), (["x", "-v", "1"], True), (["x", "--verbosity=2"], True),
    (["x", "-v=0"], False), (["x", "--v", "-1"], False), (["x", "-v"], False),
])
def test_a_tool_hides_tensorflows_start_up_lines_unless_verbose(argv, verbose, monkeypatch):
  monkeypatch.setattr(sys, "argv", argv)
  # A copy: what the call sets must not reach the processes later tests start.
  monkeypatch.setattr(os, "environ", {"TF_CPP_MIN_LOG_LEVEL": "1"})  # The user's own.
  console.quiet_tool_process()
  assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == ("1" if verbose else "3")
  # What the tool starts gets the user's setting, whatever the tool's own.
  assert console.child_environ()["TF_CPP_MIN_LOG_LEVEL"] == "1"
  assert "MNIST_USER_TF_CPP_MIN_LOG_LEVEL" not in console.child_environ()


def test_a_tools_runs_get_no_level_the_user_did_not_set(monkeypatch):
  monkeypatch.setattr(sys, "argv", ["x"])
  monkeypatch.setattr(os, "environ", {})
  console.quiet_tool_process()
  assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "3"
  assert "TF_CPP_MIN_LOG_LEVEL" not in console.child_environ()
