"""socket_in_namespace, the process kubelet's way into a pod's network, when the pod's process
has just ended (a container killed while its worker sets up its Services)."""

from __future__ import annotations

import socket
import subprocess

import pytest

from testbed.pod_network import socket_in_namespace


def _listener() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock


def test_a_socket_is_made_in_a_live_process_namespace() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        sock = socket_in_namespace(child.pid, _listener)
    finally:
        child.kill()
        child.wait()
    with sock:
        assert sock.getsockname()[0] == "127.0.0.1"


def test_a_process_that_ended_raises_os_error_for_its_caller_to_handle() -> None:
    # The worker of a pod whose container was killed met an IndexError here (the thread's
    # error was lost), which no caller expects: the worker failed and the container was never
    # restarted. Callers catch OSError and go on.
    child = subprocess.Popen(["true"])
    child.wait()
    with pytest.raises(FileNotFoundError, match=f"/proc/{child.pid}/ns/net"):
        socket_in_namespace(child.pid, _listener)
