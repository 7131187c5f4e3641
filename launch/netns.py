"""A network namespace with only loopback, so no other host can reach a local cluster.

TensorFlow's gRPC servers listen on every interface (`[::]:<port>`), whatever
address TF_CONFIG gives them, and accept any client: any host that can reach
this machine could run graph operations in a task. A local cluster needs
only loopback, so its tasks join one private network namespace holding just
`lo` (Linux: as root, or through a user namespace otherwise). A small holder
process keeps the namespace alive; each task joins it before exec. No
TensorFlow import here.
"""

import ctypes
import os
import subprocess
import sys
from typing import Optional

CLONE_NEWNET, CLONE_NEWUSER = 0x40000000, 0x10000000
# Runs in the holder: a new network namespace (a user namespace too when not
# root), `lo` brought up, "ready" printed, then it waits for its stdin to close.
_HOLDER = r"""
import ctypes, fcntl, os, socket, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
uid, gid = os.getuid(), os.getgid()
user = False
if libc.unshare(0x40000000) != 0:
    if libc.unshare(0x40000000 | 0x10000000) != 0:
        print("cannot unshare:", os.strerror(ctypes.get_errno()), flush=True)
        sys.exit(1)
    user = True
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                       ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sH14x", fcntl.ioctl(s, 0x8913, struct.pack("16sH14x", b"lo", 0)))[1]
fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", flags | 1))  # SIOCSIFFLAGS: IFF_UP.
print("ready", "user" if user else "net", flush=True)
sys.stdin.read()
"""


class UnavailableError(OSError):
  """No private network namespace can be made here; the message says why."""


class PrivateNetwork:
  """A network namespace with only `lo`; `join()` moves the calling process into it.

  Use as a context manager; tasks call `join` in their preexec_fn (after
  fork, before exec, single-threaded as setns into a user namespace needs).
  """

  def __init__(self, preexec=None):
    if not sys.platform.startswith("linux"):
      raise UnavailableError("network namespaces are Linux-only")
    self._holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, preexec_fn=preexec, start_new_session=True)
    status = self._holder.stdout.readline().decode().split()
    if status[:1] != ["ready"]:
      self.close()
      raise UnavailableError(" ".join(status) or "the namespace holder exited")
    ns = f"/proc/{self._holder.pid}/ns"
    self._fds = [os.open(f"{ns}/user", os.O_RDONLY)] if status[1] == "user" else []
    self._fds.append(os.open(f"{ns}/net", os.O_RDONLY))
    self._libc = ctypes.CDLL(None, use_errno=True)

  @property
  def path(self) -> str:
    """The namespace, as /proc shows it (compare with /proc/<pid>/ns/net)."""
    return os.readlink(f"/proc/{self._holder.pid}/ns/net")

  def join(self) -> None:
    """Moves this process into the namespace (exits 1 if it cannot: never run exposed)."""
    for fd, kind in zip(self._fds, (CLONE_NEWUSER, CLONE_NEWNET)[-len(self._fds):]):
      if self._libc.setns(fd, kind) != 0:
        os.write(2, f"error: cannot join the private network namespace: "
                    f"{os.strerror(ctypes.get_errno())}\n".encode())
        os._exit(1)

  def close(self) -> None:
    for fd in getattr(self, "_fds", []):
      os.close(fd)
    self._fds = []
    if self._holder.poll() is None:
      self._holder.stdin.close()
      try:
        self._holder.wait(5)
      except subprocess.TimeoutExpired:
        self._holder.kill()
        self._holder.wait()
    self._holder.stdout.close()

  def __enter__(self) -> "PrivateNetwork":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def private_network(preexec=None) -> "tuple[Optional[PrivateNetwork], str]":
  """A PrivateNetwork, or (None, why not)."""
  try:
    return PrivateNetwork(preexec), ""
  except (UnavailableError, OSError) as e:
    return None, str(e)
