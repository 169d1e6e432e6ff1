"""Start one container process of the process kubelet with its volumes where the pod says.

    python -I container_init.py MOUNTS.json -- PROGRAM [ARG...]

Runs before the container's program, in the child the process kubelet started: it enters a
mount namespace of its own, bind-mounts each prepared volume folder at the container's
`mountPath` (read-only where the mount says so), and then becomes the program (exec), so the
program sees `/etc/specdeploy/config.yaml` or `/var/run/secrets/kubernetes.io/serviceaccount/
token` at the paths it would see in a container, while the rest of the file system is the
host's. Nothing is mounted on the host: the namespace ends with the process.

A mount point that does not exist on the host (`/etc/specdeploy`) is made inside an overlay of
its deepest existing parent (`/etc`), whose changes land in the pod's folder, never on the host.

Needs CAP_SYS_ADMIN (root); without it, a user namespace of its own is entered first (kernels
that allow unprivileged user namespaces). Standard library only: it runs with `-I`, before the
program's own environment matters.

With `"network": true` it also enters a network namespace of its own, brings its loopback up
and waits for the file `ready` to appear (the process kubelet makes it once it has set up the
namespace's forwarding, `pod_network.py`) before it becomes the program.

MOUNTS.json: {"mounts": [{"source": folder or file, "target": path, "readOnly": bool}],
"scratch": a folder for the overlays' upper and work folders, "network": bool, "ready": path}.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import socket
import struct
import sys
import time
from pathlib import Path

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
NETWORK_READY_TIMEOUT_S = 30.0
MS_RDONLY = 0x1
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]
_libc.unshare.argtypes = [ctypes.c_int]


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {source} on {target}",
    )


def enter_mount_namespace() -> bool:
    """A mount namespace of our own, whose mounts never propagate back to the host; True when
    a user namespace had to be entered for it."""
    in_user_namespace = False
    if _libc.unshare(CLONE_NEWNS) != 0:
        in_user_namespace = True
        uid, gid = os.getuid(), os.getgid()
        _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare (user and mount namespace)")
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    return in_user_namespace


def _existing_parent(path: Path) -> Path:
    parent = path
    while not parent.exists():
        parent = parent.parent
    return parent


def make_mount_point(
    target: Path, is_file: bool, scratch: Path, overlaid: set[Path], user_xattr: bool
) -> None:
    """Create `target` inside an overlay of its deepest existing parent (mounted once)."""
    anchor = _existing_parent(target).resolve()
    if anchor == Path("/"):
        raise OSError(f"cannot make {target}: its only existing parent is /")
    if anchor not in overlaid:
        layer = scratch / str(len(overlaid))
        (layer / "upper").mkdir(parents=True, exist_ok=True)
        (layer / "work").mkdir(parents=True, exist_ok=True)
        options = f"lowerdir={anchor},upperdir={layer / 'upper'},workdir={layer / 'work'}"
        if user_xattr:  # trusted.* extended attributes are root's only
            options += ",userxattr"
        _mount("overlay", str(anchor), "overlay", 0, options)
        overlaid.add(anchor)
    if is_file:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
    else:
        target.mkdir(parents=True, exist_ok=True)


class HostPaths:
    """Host paths held open from before the first mount, and reached through their descriptors
    (`/proc/self/fd/N`) afterwards: a volume mounted over a parent of one (an emptyDir at /tmp
    while the pod's folder is under /tmp) hides it by path, never by descriptor. A container
    runtime resolves its mounts' sources in the host's namespace for the same reason."""

    def __init__(self) -> None:
        self._held: dict[Path, int] = {}

    def hold(self, path: Path) -> Path:
        """A path to `path` that no later mount can hide (`path` must exist)."""
        path = path.absolute()
        if path not in self._held:
            self._held[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
        return Path(f"/proc/self/fd/{self._held[path]}")


def _under(path: Path, folder: Path) -> bool:
    return path != folder and path.is_relative_to(folder)


def mount_volumes(
    spec: dict[str, object], user_xattr: bool = False, host: HostPaths | None = None
) -> None:
    """Bind-mount each volume folder at its target, parents before children; then put back the
    host folders the image runs from (`keep`: the project and its virtualenv standing in for
    the image's own files) where a volume's target hides them, as a volume never hides an
    image's files."""
    host = host or HostPaths()
    mounts = list(spec.get("mounts") or [])  # type: ignore[call-overload]
    scratch = Path(str(spec["scratch"]))
    scratch.mkdir(parents=True, exist_ok=True)
    scratch = host.hold(scratch)
    sources = {id(m): (host.hold(Path(m["source"])), Path(m["source"]).is_file()) for m in mounts}
    keep = [Path(p) for p in spec.get("keep") or [] if Path(p).exists()]  # type: ignore[attr-defined]
    kept = {path: host.hold(path) for path in keep}
    overlaid: set[Path] = set()
    # Parents before children, as kubelet orders them.
    for mount in sorted(mounts, key=lambda m: len(Path(m["target"]).parts)):
        (source, is_file), target = sources[id(mount)], Path(mount["target"])
        if not target.exists():
            make_mount_point(target, is_file, scratch, overlaid, user_xattr)
        _mount(str(source), str(target), None, MS_BIND | MS_REC)
        if mount.get("readOnly"):
            _mount(None, str(target), None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_REC)
    targets = [Path(m["target"]) for m in mounts]
    for path, source in kept.items():
        if any(_under(path, target) for target in targets):
            try:  # a folder in the volume (an emptyDir stays shared with the pod's others)
                path.mkdir(parents=True, exist_ok=True)
            except OSError:  # a read-only volume: in an overlay of it
                make_mount_point(path, False, scratch, overlaid, user_xattr)
            _mount(str(source), str(path), None, MS_BIND | MS_REC)


def enter_network_namespace(ready: Path) -> None:
    """A network namespace with only a loopback, up; returns once the kubelet joined it."""
    _check(_libc.unshare(CLONE_NEWNET), "unshare (network namespace)")
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14s", b"lo", 0, b"\0" * 14)
        flags = struct.unpack("16sH14s", fcntl.ioctl(sock, siocgifflags, request))[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack("16sH14s", b"lo", flags | iff_up, b"\0" * 14))
    deadline = time.monotonic() + NETWORK_READY_TIMEOUT_S
    while not ready.exists():
        if time.monotonic() > deadline:
            raise OSError(f"the network was not set up within {NETWORK_READY_TIMEOUT_S:.0f}s")
        time.sleep(0.02)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: container_init.py MOUNTS.json -- PROGRAM [ARG...]", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[1]).read_text())
    host = HostPaths()
    try:
        # The file's folder held now: a volume over one of its parents must not hide it.
        ready = Path(spec["ready"]) if spec.get("network") else None
        ready = host.hold(ready.parent) / ready.name if ready is not None else None
        mount_volumes(spec, user_xattr=enter_mount_namespace(), host=host)
        if ready is not None:
            enter_network_namespace(ready)
    except OSError as error:
        # The container could not be set up: like a runtime's create failure, exit 128.
        print(f"container_init: {error}", file=sys.stderr)
        return 128
    program = argv[3:]
    try:
        os.execvp(program[0], program)
    except OSError as error:
        print(f"container_init: exec {program[0]}: {error}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv))
