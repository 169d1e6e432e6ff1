"""The process kubelet's child processes: started so they die with it, recorded so they can be
cleaned up after it.

Each child is the leader of its own session (and so of its process group, which stands in for
the container: stopping a container signals the whole group), and gets PR_SET_PDEATHSIG so the
kernel kills it when the process kubelet dies, however it dies. Each child is also recorded in
`<run dir>/pids/<pid>.json` with its start time and command line; a later instance kills
children a crashed instance left behind, and nothing else.

Each child is pinned to one CPU of its own while there are CPUs to go round (`CpuAllocator`;
a pod being deleted gives its CPUs back at once, `PodWorker._give_back_cpus`),
as kubelet's static CPU manager policy gives a pod exclusive CPUs: vLLM's CPU worker
busy-polls for a second after every step, so two engines sharing every core take turns
starving each other (on 2 cores, 5x slower steps, docs/testbed.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
# Loaded once, before any fork: the preexec function must not load libraries.
_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_prctl.restype = ctypes.c_int


def _die_with(parent_pid: int, cpu: int | None = None) -> Callable[[], None]:
    def preexec() -> None:
        # PR_SET_PDEATHSIG fires when the *thread* that forked exits; the pod workers that
        # spawn children live as long as their children (see process_kubelet.PodWorker).
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)
        if cpu is not None:  # before exec, so every process and thread of the child has it
            os.sched_setaffinity(0, {cpu})

    return preexec


class CpuAllocator:
    """One CPU per process, the least taken first; none on a machine of one CPU.

    A process pinned here runs on its CPU only; the rest of the machine (the control plane, the
    tests) runs anywhere. With more processes than CPUs, CPUs are shared, the fewest first.
    """

    def __init__(self, cpus: Collection[int] | None = None) -> None:
        found = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
        self._taken = {cpu: 0 for cpu in found} if len(found) > 1 else {}
        self._lock = threading.Lock()

    def take(self) -> int | None:
        """A CPU for a new process (None: do not pin)."""
        with self._lock:
            if not self._taken:
                return None
            cpu = min(self._taken, key=lambda c: (self._taken[c], c))
            self._taken[cpu] += 1
            return cpu

    def give_back(self, cpu: int | None) -> None:
        """The process pinned to `cpu` ended."""
        with self._lock:
            if cpu in self._taken and self._taken[cpu] > 0:
                self._taken[cpu] -= 1

    def taken(self) -> dict[int, int]:
        """Processes pinned per CPU."""
        with self._lock:
            return dict(self._taken)


@dataclass(frozen=True)
class ProcessIdentity:
    """What identifies one process across pid reuse: its start time in clock ticks."""

    pid: int
    session: int
    start_ticks: int


def read_identity(pid: int) -> ProcessIdentity | None:
    """The identity of a live (or zombie) process, None when there is none with this pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may hold spaces.
    fields = stat.rsplit(")", 1)[1].split()
    return ProcessIdentity(pid=pid, session=int(fields[3]), start_ticks=int(fields[19]))


def read_command_line(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def runs_command(actual: list[str], recorded: list[str]) -> bool:
    """Whether a process still runs the recorded command line.

    A script started through its `#!` line shows its interpreter first, so only the program
    name's end and the arguments are compared.
    """
    if not actual or not recorded or len(actual) < len(recorded):
        return False
    tail = actual[len(actual) - len(recorded) :]
    return Path(tail[0]).name == Path(recorded[0]).name and tail[1:] == recorded[1:]


def exit_code_of(returncode: int) -> int:
    """A Popen return code as a container exit code (killed by signal N → 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def signal_group(pid: int, signum: int) -> None:
    """Signal the process group led by `pid`, if any of it is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


class PidLedger:
    """The record of children in `<run dir>/pids/`, one JSON file per child."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def record(self, identity: ProcessIdentity, argv: list[str], owner: str) -> None:
        entry = {
            "pid": identity.pid,
            "startTicks": identity.start_ticks,
            "argv": argv,
            "owner": owner,
            "recordedBy": os.getpid(),
        }
        path = self.folder / f"{identity.pid}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(entry))
        tmp.replace(path)

    def forget(self, pid: int) -> None:
        (self.folder / f"{pid}.json").unlink(missing_ok=True)

    def entries(self) -> Iterator[dict[str, Any]]:
        for path in sorted(self.folder.glob("*.json")):
            try:
                yield json.loads(path.read_text())
            except (OSError, ValueError):
                log.warning("unreadable pid record %s", path)
                path.unlink(missing_ok=True)

    def kill_leftovers(self, wait_seconds: float = 5.0) -> list[int]:
        """Kill the children a previous instance recorded and left running; forget the records.

        A recorded leader is killed (with its group) only if it is the same process (same
        start time) and still runs the recorded command line. If the leader is gone, processes
        still in its session that started after it are its orphans and are killed too.
        Returns the pids signalled.
        """
        killed: list[int] = []
        for entry in list(self.entries()):
            pid, start_ticks, argv = int(entry["pid"]), int(entry["startTicks"]), entry["argv"]
            leader = read_identity(pid)
            if leader is not None and leader.start_ticks == start_ticks:
                if runs_command(read_command_line(pid) or [], argv):
                    log.info("stopping leftover child %d (%s)", pid, entry.get("owner"))
                    signal_group(pid, signal.SIGTERM)
                    killed.append(pid)
                else:
                    log.warning("pid %d no longer runs its recorded command; left alone", pid)
            else:
                orphans = [
                    identity.pid
                    for identity in _all_processes()
                    if identity.session == pid and identity.start_ticks >= start_ticks
                ]
                for orphan in orphans:
                    log.info("killing orphan %d of leftover child %d", orphan, pid)
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(orphan, signal.SIGKILL)
                killed.extend(orphans)
            self.forget(pid)
        deadline = time.monotonic() + wait_seconds
        while any(read_identity(pid) for pid in killed) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in killed:
            signal_group(pid, signal.SIGKILL)
        return killed


def _proportional_set_size(pid: int) -> int:
    """A process's proportional set size in bytes (its own pages, plus its share of pages it
    shares with others); its resident set size where smaps_rollup cannot be read; 0 once gone."""
    for path, key in ((f"/proc/{pid}/smaps_rollup", "Pss:"), (f"/proc/{pid}/status", "VmRSS:")):
        try:
            text = Path(path).read_text()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        for line in text.splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    return 0


def session_memory_bytes(session: int) -> int:
    """The memory a container uses: the proportional set sizes of every process of its session
    (a container's processes are one session, led by the process the container started), so
    pages its processes share count once, as a memory cgroup charges them."""
    return sum(
        _proportional_set_size(identity.pid)
        for identity in _all_processes()
        if identity.session == session
    )


def _all_processes() -> Iterator[ProcessIdentity]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            identity = read_identity(int(entry.name))
            if identity is not None:
                yield identity


@dataclass
class Child:
    """One running container process."""

    popen: subprocess.Popen[bytes]
    argv: list[str]
    started_monotonic: float
    #: The CPU it is pinned to (None: not pinned).
    cpu: int | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid


def spawn_child(
    argv: list[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    log_path: Path,
    ledger: PidLedger,
    owner: str,
    cpu: int | None = None,
    record_argv: list[str] | None = None,
) -> Child:
    """Start a container process: own session, dies with us, output appended to `log_path`,
    pinned to `cpu` when one is given. `record_argv` is what the process ends up running when
    `argv` starts it through a wrapper that execs it (the pid record's command line).

    Raises OSError when the program cannot be started (not found, not executable).
    """
    with log_path.open("ab") as output:
        popen = subprocess.Popen(
            argv,
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with(os.getpid(), cpu),  # noqa: PLW1509 - PR_SET_PDEATHSIG needs it
        )
    identity = read_identity(popen.pid)
    if identity is not None:
        ledger.record(identity, record_argv or argv, owner)
    return Child(popen=popen, argv=record_argv or argv, started_monotonic=time.monotonic(), cpu=cpu)


def has_exited(child: Child) -> bool:
    """Whether the child's leader has exited, without reaping it.

    While the leader is an unreaped zombie its pid, and so its process group id, cannot be
    reused, which makes signalling the group afterwards safe.
    """
    if child.popen.returncode is not None:
        return True
    try:
        result = os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return result is not None


def reap_child(child: Child, ledger: PidLedger) -> int:
    """End a child for good: kill what is left of its group (a container's end kills all its
    processes), reap the leader, forget its record. Returns the container exit code."""
    if child.popen.returncode is None:
        signal_group(child.pid, signal.SIGKILL)
    child.popen.wait()
    ledger.forget(child.pid)
    return exit_code_of(child.popen.returncode)


def stop_children(children: list[Child], grace_seconds: float, ledger: PidLedger) -> list[int]:
    """Stops containers as a container runtime does: SIGTERM to each one's main process (the
    container's PID 1) at once, then, when that process has exited or the grace period is
    over, SIGKILL to every process left in its group. Its other processes get no SIGTERM:
    stopping them is the main process's business (vLLM's API server drains its requests,
    then stops its engine and workers itself).

    Returns the exit codes, in the order of `children`.
    """
    for child in children:
        if not has_exited(child):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and not all(has_exited(child) for child in children):
        time.sleep(0.05)
    return [reap_child(child, ledger) for child in children]
