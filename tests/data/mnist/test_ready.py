"""data.mnist.ready and python -m data.prepare: MNIST made ready, from local IDX files or
TFDS's download (run for real on a local mirror), with errors naming the fixes."""

import functools
import hashlib
import http.server
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.core.download import checksums as tfds_checksums
from tensorflow_datasets.image_classification import mnist as tfds_mnist

from data import mnist
from data.mnist import build
from data.mnist import idx
from data.mnist import pipeline
from data.mnist import ready
from data.mnist import store
from tests.conftest import REPO, SHARED_IDX_DIR, run_module, write_idx_dir

TRAINERS_FLAG = "--mnist_idx_dir"  # As the trainers and tools name theirs (runner.IDX_DIR_FLAG).


def _prepare(data_dir, url, subset_checksums):
  """ensure_prepared for the trainers, downloading from `url` (see _mirror_builder)."""
  return ready.ensure_prepared(data_dir, idx_dir_flag=TRAINERS_FLAG,
                               builder_cls=_mirror_builder(url, subset_checksums))

# The download path, run for real on a local mirror: TFDS's official builder,
# downloader and checksum checks, with its URL pointed at a local HTTP server
# that serves ../shared. The shared test files are the official ones, so their
# official checksums apply. The shared training files are a re-headered subset
# (22,699 of 60,000 examples): for them, and only in these tests, the checksums
# are the subset's own and the builder's example count is the subset's.
_OFFICIAL_URL = tfds_mnist.MNIST.URL


_FILES = [name + ".gz" for pair in mnist.IDX_FILES.values() for name in pair]


_SUBSET = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")


@pytest.fixture(scope="module")
def mirror():
  """The URL of a local HTTP server serving the shared IDX files."""
  if not (SHARED_IDX_DIR / _SUBSET[0]).exists():
    pytest.skip(f"real MNIST IDX files not found in {SHARED_IDX_DIR}")

  class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
      pass

  server = http.server.ThreadingHTTPServer(
      ("127.0.0.1", 0), functools.partial(Quiet, directory=str(SHARED_IDX_DIR)))
  threading.Thread(target=server.serve_forever, daemon=True).start()
  yield f"http://127.0.0.1:{server.server_address[1]}/"
  server.shutdown()


def _mirror_builder(url, subset_checksums):
  """TFDS's MNIST builder reading `url`, with the official checksums, re-keyed to it.

  With `subset_checksums`, the two training files' checksums are the shared
  subset's own (test-only); without, all four are the official ones.
  """
  official = tfds_mnist.MNIST.url_infos
  infos = {url + name: official[_OFFICIAL_URL + name] for name in _FILES}
  if subset_checksums:
    for name in _SUBSET:
      raw = (SHARED_IDX_DIR / name).read_bytes()
      infos[url + name] = tfds_checksums.UrlInfo(
          size=len(raw), checksum=hashlib.sha256(raw).hexdigest(), filename=name)

  class Mirror(tfds_mnist.MNIST, skip_registration=True):
    name = store.DATASET
    URL = url
    url_infos = infos

  return Mirror


def _leftovers(data_dir):
  """What a preparation left in data_dir: the dataset, if it succeeded, and no lock file."""
  return sorted(os.listdir(data_dir))


def test_download_runs_tfds_with_its_checksum_checks(mirror, tmp_path, monkeypatch):
  monkeypatch.delenv(mnist.IDX_DIR_ENV, raising=False)
  monkeypatch.setattr(tfds_mnist, "_TRAIN_EXAMPLES", 22_699)  # The subset's count.
  data_dir = str(tmp_path / "tfds")
  counts = _prepare(data_dir, mirror, True)
  assert counts == {"train": 22_699, "test": 10_000}
  assert store.is_prepared(data_dir) and _leftovers(data_dir) == ["mnist"]  # No downloads.
  # The official test set, exactly: TFDS's examples are the IDX file's.
  images, labels = idx.read_idx_split(str(SHARED_IDX_DIR), "test")
  got = tfds.load("mnist", split="test", data_dir=data_dir, download=False, batch_size=-1,
                  as_supervised=True)
  want = sorted(zip(labels.tolist(), images.sum(axis=(1, 2)).tolist()))
  assert sorted(zip(got[1].numpy().tolist(), got[0].numpy().sum(axis=(1, 2, 3)).tolist())) \
      == want
  assert _prepare(data_dir, mirror, True) is None


def test_a_checksum_mismatch_fails_and_leaves_nothing(mirror, tmp_path, monkeypatch):
  # The official checksums do not match the shared training subset: the product
  # must refuse it, as it would a corrupted download.
  monkeypatch.delenv(mnist.IDX_DIR_ENV, raising=False)
  with pytest.raises(ready.MissingDataError, match="(?i)checksum") as e:
    _prepare(str(tmp_path), mirror, False)
  assert "--mnist_idx_dir=DIR" in str(e.value)
  assert _leftovers(tmp_path) == []


def test_no_network_and_no_idx_files_fail_fast_naming_both_fixes(tmp_path, monkeypatch):
  monkeypatch.delenv(mnist.IDX_DIR_ENV, raising=False)
  with socket.socket() as s:  # A port nobody listens on: a refused connection.
    s.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{s.getsockname()[1]}/"
  start = time.monotonic()
  with pytest.raises(ready.MissingDataError) as e:
    _prepare(str(tmp_path), url, False)
  assert time.monotonic() - start < 20  # TFDS's own retries take minutes.
  message = str(e.value)
  for part in ("Tried: cannot reach", "Connection refused", "Not tried: local IDX files",
               "no --mnist_idx_dir given", "--mnist_idx_dir=DIR", "$MNIST_IDX_DIR=DIR",
               "python -m data.prepare --idx_dir=DIR", f"--data_dir={tmp_path}", url):
    assert part in message, message
  assert _leftovers(tmp_path) == []


def _offline_env():
  """Every request goes to a proxy that refuses connections: TFDS's real download fails fast."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    proxy = f"http://127.0.0.1:{s.getsockname()[1]}"
  return {mnist.IDX_DIR_ENV: None, "HTTPS_PROXY": proxy, "HTTP_PROXY": proxy,
          "https_proxy": proxy, "http_proxy": proxy, "NO_PROXY": None, "no_proxy": None}


def test_the_prepare_cli_names_its_own_idx_dir_flag(tmp_path):
  # data.prepare takes --idx_dir, not the trainers' --mnist_idx_dir: its message
  # names the flag it takes, and does not send the user to itself.
  result = run_module("data.prepare", [f"--data_dir={tmp_path}"], timeout=120,
                      env=_offline_env())
  assert result.returncode == 1, result.stderr[-3000:]
  for part in ("error: MNIST is not prepared", "Tried: cannot reach", "no --idx_dir given",
               "with --idx_dir=DIR or $MNIST_IDX_DIR=DIR."):
    assert part in result.stderr, result.stderr[-3000:]
  assert "mnist_idx_dir" not in result.stderr and "python -m data.prepare" not in result.stderr
  assert _leftovers(tmp_path) == []  # Nor its lock file.
  # The flag it names is one it takes: the same command with it prepares.
  idx_dir = write_idx_dir(tmp_path / "idx", {"train": 30, "test": 10})
  ok = run_module("data.prepare", [f"--idx_dir={idx_dir}", f"--data_dir={tmp_path / 'tfds'}"],
                  timeout=120, env=_offline_env())
  assert ok.returncode == 0 and "Prepared MNIST" in ok.stdout, ok.stderr[-3000:]
  assert _leftovers(tmp_path / "tfds") == ["mnist"]
  # Its output is a pipe here, not a terminal: no progress bars' cursor-up codes in it.
  assert "\x1b[A" not in ok.stderr and "examples/s" not in ok.stderr, ok.stderr[-3000:]


def test_bad_idx_files_leave_no_lock_file(tmp_path):
  with pytest.raises(ready.MissingDataError, match="is missing from"):
    ready.ensure_prepared(str(tmp_path / "tfds"), idx_dir=str(tmp_path), idx_dir_flag=None)
  assert _leftovers(tmp_path / "tfds") == []


def test_idx_files_from_the_environment(tiny_idx_dir, tmp_path, monkeypatch):
  monkeypatch.setenv(mnist.IDX_DIR_ENV, str(tiny_idx_dir))
  assert ready.ensure_prepared(str(tmp_path), idx_dir_flag=None) == {"train": 600, "test": 200}
  assert _leftovers(tmp_path) == ["mnist"]


def test_prepare_cli_refuses_to_clobber_and_rejects_corrupt_files(tiny_idx_dir, tiny_data_dir,
                                                                   tmp_path):
  before = sorted(os.listdir(store.dataset_path(tiny_data_dir)))
  again = run_module("data.prepare", [f"--idx_dir={tiny_idx_dir}", f"--data_dir={tiny_data_dir}"])
  assert again.returncode == 0, again.stderr
  assert "--overwrite" in again.stdout
  bad_dir = write_idx_dir(tmp_path / "bad", {"train": 30, "test": 10})
  raw = (bad_dir / "t10k-images-idx3-ubyte.gz").read_bytes()
  (bad_dir / "t10k-images-idx3-ubyte.gz").write_bytes(raw[: len(raw) // 2])
  corrupt = run_module("data.prepare", [f"--idx_dir={bad_dir}", f"--data_dir={tiny_data_dir}",
                                        "--overwrite"])
  assert corrupt.returncode != 0
  assert "t10k-images-idx3-ubyte.gz" in corrupt.stderr and "Nothing was written" in corrupt.stderr
  assert sorted(os.listdir(store.dataset_path(tiny_data_dir))) == before
  assert not os.path.exists(os.path.join(tiny_data_dir, build.LOCK_NAME))  # Failed: none left.
  assert pipeline.num_examples("train", tiny_data_dir) == 600


def test_prepared_data_is_checked_without_importing_tensorflow(tiny_data_dir):
  probe = ("import sys; from data.mnist import ready; "
           f"assert ready.ensure_prepared({str(tiny_data_dir)!r}, idx_dir_flag=None) is None; "
           "print(sorted(m for m in sys.modules if m.split('.')[0] in "
           "('tensorflow', 'tensorflow_datasets')))")
  result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.strip() == "[]"
