"""Faults injected into a running test bed: a component paused, stopped, restarted; etcd's
history compacted.

Every component of the test bed is a local process recorded in env.json. A restart starts the
same command line with the same environment again (read from /proc of the running process, so a
cluster started by any version of the test bed can be restarted), records the new PID in
env.json and its pid file, and returns once the component answers again.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib import request

from testbed import processes
from testbed.cluster import ClusterEnv
from testbed.polling import eventually


def component_pid(env: ClusterEnv, name: str) -> int:
    """The PID of a running component, as env.json records it."""
    pid = int(env.components[name]["pid"])
    if not processes.is_alive(pid, str(env.components[name]["exe"])):
        raise RuntimeError(f"test bed component {name} (pid {pid}) is not running")
    return pid


@contextlib.contextmanager
def paused(env: ClusterEnv, name: str) -> Iterator[int]:
    """The component frozen (SIGSTOP) for the block, then resumed (SIGCONT): it holds its
    connections and answers nothing, as a process stuck on I/O or a stalled VM would."""
    pid = component_pid(env, name)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        os.kill(pid, signal.SIGCONT)


def _command_of(pid: int) -> tuple[list[str], dict[str, str]]:
    """The argv and environment a process was started with."""
    argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    environ: dict[str, str] = {}
    for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        key, sep, value = entry.decode(errors="replace").partition("=")
        if sep:
            environ[key] = value
    return argv, environ


def port_open(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:port."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def answers(env: ClusterEnv, name: str) -> Callable[[], bool]:
    """The default "up again" probe: the API server ready; another component's recorded port
    accepting connections (or, with no port, the process alive)."""
    if name == "kube-apiserver":
        kubectl = env.kubectl()
        return lambda: kubectl.run("get", "--raw", "/readyz", check=False).returncode == 0
    port = env.components[name].get("port")
    if port:
        return lambda: port_open(int(port))
    return lambda: processes.is_alive(int(env.components[name]["pid"]))


@contextlib.contextmanager
def stopped(
    env: ClusterEnv,
    name: str,
    *,
    kill: bool = False,
    grace: float = 10.0,
    ready: Callable[[], bool] | None = None,
    timeout: float = 180.0,
) -> Iterator[None]:
    """The component stopped for the block (SIGTERM, SIGKILL after `grace` seconds, or at once
    with `kill`), then started again with its own command line and environment; returns once
    `ready` (default: `answers`) holds. Started by this process, it dies with it, as the first
    one would have.

    (kube-apiserver drains within a second of SIGTERM but then may not exit: the grace bounds
    the outage, as a kubelet's termination grace period would.)"""
    pid = component_pid(env, name)
    info = env.components[name]
    argv, environ = _command_of(pid)
    ours = _parent_pid(pid) == os.getpid()
    if kill:
        os.kill(pid, signal.SIGKILL)
        eventually(lambda: not processes.is_alive(pid), 30, f"{name} (pid {pid}) to die")
    else:
        processes.stop(pid, str(info["exe"]), timeout=grace)
    try:
        yield
    finally:
        running = processes.start(
            name,
            argv,
            Path(env.run_dir),
            env=environ,
            parent_death_signal=signal.SIGKILL if ours else None,
        )
        env.components[name] = {**info, "pid": running.pid}
        env.write(Path(env.run_dir))
        processes.wait_until_ready(running, ready or answers(env, name), timeout, "answering")


def restart(env: ClusterEnv, name: str, *, kill: bool = False, timeout: float = 180.0) -> None:
    """Stops the component and starts it again at once (see `stopped`)."""
    with stopped(env, name, kill=kill, timeout=timeout):
        pass


def _parent_pid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def compact_etcd(env: ClusterEnv) -> int:
    """Compacts etcd's history up to its current revision (what the API server does every
    5 minutes) through etcd's JSON gateway, and returns that revision: a watch that resumes
    from an older resourceVersion then gets 410 Gone, and its client must list again."""
    base = f"http://127.0.0.1:{env.components['etcd']['port']}/v3/kv"

    def post(path: str, body: dict[str, object]) -> dict[str, object]:
        call = request.Request(
            f"{base}/{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with request.urlopen(call, timeout=10) as answer:
            found: dict[str, object] = json.load(answer)
            return found

    header = post("range", {"key": "AA==", "limit": 1})["header"]
    assert isinstance(header, dict)
    revision = int(header["revision"])
    post("compaction", {"revision": revision, "physical": True})
    return revision
