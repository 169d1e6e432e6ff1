"""Starting, watching and stopping the test bed's local processes.

Each component runs in its own session (so a Ctrl-C in the terminal that ran ``up`` does not reach
it, and its whole process group can be signalled), writes its output to ``<name>.log`` and has its
PID in ``<name>.pid`` in the run folder. Stopping goes by those PIDs only, after checking that the
PID still runs the executable we started.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


class ComponentError(RuntimeError):
    """A component did not come up; the message names it and its log file."""

    def __init__(self, name: str, log: Path, reason: str) -> None:
        self.component = name
        self.log = log
        tail = log_tail(log)
        super().__init__(
            f"{name} did not come up: {reason}\n  log: {log}\n"
            + (f"  last lines:\n{tail}" if tail else "")
        )


def log_tail(log: Path, lines: int = 15) -> str:
    """The last lines of a log file, indented, or '' when there is none."""
    try:
        text = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(f"    {line[:300]}" for line in text[-lines:])


_PR_SET_PDEATHSIG = 1


def logged_failures(log: Path, offset: int = 0, limit: int = 40) -> list[str]:
    """The lines of a component's log, from byte `offset` on, that say it failed inside: those
    logged at ERROR, and tracebacks (a thread's uncaught exception goes to the log as one).
    A log that cannot be read has none."""
    try:
        with log.open("rb") as file:
            file.seek(offset)
            text = file.read().decode(errors="replace")
    except OSError:
        return []
    found = [
        line
        for line in text.splitlines()
        if " ERROR " in line or line.startswith("Traceback (most recent call last)")
    ]
    return found[:limit]


def _parent_death_signal(sig: signal.Signals) -> Callable[[], None]:
    def arm() -> None:
        # Runs in the child between fork and exec: the kernel sends `sig` when the parent dies.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)

    return arm


@dataclass(frozen=True)
class Running:
    """A started component: what the pid file and env.json record about it."""

    name: str
    pid: int
    exe: str
    log: Path


def start(
    name: str,
    argv: Sequence[str],
    run_dir: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    parent_death_signal: signal.Signals | None = None,
) -> Running:
    """Start one component in the background; returns once the process exists.

    With ``parent_death_signal`` the component gets that signal when the starting process dies
    (used when a test session owns the cluster, so a killed session leaves nothing running).
    """
    log = run_dir / f"{name}.log"
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    with log.open("ab") as out:
        out.write(f"### {time.strftime('%H:%M:%S')} {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=(  # noqa: PLW1509
                _parent_death_signal(parent_death_signal) if parent_death_signal else None
            ),
        )
    (run_dir / f"{name}.pid").write_text(f"{proc.pid}\n")
    return Running(name=name, pid=proc.pid, exe=str(argv[0]), log=log)


def is_alive(pid: int, exe: str | None = None) -> bool:
    """True when ``pid`` is a live (not zombie) process, running ``exe`` if given."""
    with contextlib.suppress(ChildProcessError, OSError):
        # Our own children (the pytest fixture started them) must be reaped to disappear.
        os.waitpid(pid, os.WNOHANG)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    if state in ("Z", "X"):
        return False
    if exe is None:
        return True
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return False
    return argv0 == exe or Path(argv0).name == Path(exe).name


def wait_until_ready(
    running: Running,
    check: Callable[[], bool],
    timeout: float,
    what: str = "ready",
) -> None:
    """Poll ``check`` until true; raise ComponentError if the process dies or time runs out."""
    deadline = time.monotonic() + timeout
    last_error = ""
    while True:
        if not is_alive(running.pid):
            raise ComponentError(running.name, running.log, "the process exited")
        try:
            if check():
                return
        except Exception as exc:  # a readiness probe may fail in many ways while starting
            last_error = f" (last probe error: {exc})"
        if time.monotonic() > deadline:
            raise ComponentError(
                running.name, running.log, f"not {what} after {timeout:.0f}s{last_error}"
            )
        time.sleep(0.25)


def stop(pid: int, exe: str | None, timeout: float = 15.0) -> bool:
    """Stop a component we started: SIGTERM its process group, SIGKILL after ``timeout``.

    Returns False when the PID no longer runs ``exe`` (nothing was signalled).
    """
    if not is_alive(pid, exe):
        return False
    try:
        target_group = os.getpgid(pid) == pid
    except ProcessLookupError:
        return False

    def send(sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if target_group:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)

    send(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_alive(pid):
            break
        time.sleep(0.1)
    else:
        send(signal.SIGKILL)
        kill_deadline = time.monotonic() + 5
        while is_alive(pid) and time.monotonic() < kill_deadline:
            time.sleep(0.1)
    if target_group:
        # Children that outlived the leader (same group, started by it) go too.
        send(signal.SIGKILL)
    return True
