"""launch.netns: a network namespace with only loopback, that processes join before exec."""

import os
import socket
import subprocess
import sys

import pytest

from launch import netns

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="network namespaces are Linux-only")

# Serves on every interface, as TensorFlow's servers do, and prints what it sees.
SERVE = ("import os, socket; s = socket.create_server(('', 0)); "
         "print(os.readlink('/proc/self/ns/net'), s.getsockname()[1], "
         "sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]), "
         "flush=True); input()")


def test_a_process_that_joins_sees_only_loopback_and_cannot_be_reached_from_outside():
  with netns.PrivateNetwork() as network:
    assert network.path != os.readlink("/proc/self/ns/net")
    with subprocess.Popen([sys.executable, "-c", SERVE], preexec_fn=network.join,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as server:
      path, port, interfaces = server.stdout.readline().split(" ", 2)
      assert path == network.path and interfaces.strip() == "['lo']"
      # The same port on this machine's loopback: nothing listens there.
      with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", int(port)), timeout=5).close()
      server.stdin.close()
  assert not os.path.exists(f"/proc/{network._holder.pid}")


def test_where_none_can_be_made_it_says_why():
  network, why = netns.private_network(preexec=lambda: os._exit(1))  # The holder dies at once.
  assert network is None and why
