"""Ports for the test bed's listeners, from outside the range outgoing connections take theirs from.

A port found free by binding port 0 comes from ``ip_local_port_range``, the range the kernel also
takes the local end of every outgoing connection from. Closed again and handed to a component that
listens seconds later, it can in between become the local end of a connection (the API server's
to etcd, a controller's to the API server), and the component then fails with "address already in
use": a CI run lost the whole e2e session so, its Kueue refused by its own metrics port. A port
outside that range is only ever taken by a listener that asks for it by number.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOOPBACK = "127.0.0.1"
OUTGOING_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Below it the well-known and registered services' ports, which other programs ask for by number.
LOWEST = 10000
HIGHEST = 65535
# A stretch smaller than this is left for the kernel's choice (a machine with a widened range).
ENOUGH = 1000


def listener_ports(outgoing_range_file: Path = OUTGOING_RANGE_FILE) -> range | None:
    """The larger stretch of ports below or above the outgoing range, or None when neither has
    ``ENOUGH`` ports or the range cannot be read."""
    try:
        low, high = (int(part) for part in outgoing_range_file.read_text().split())
    except (OSError, ValueError):
        return None
    below = range(LOWEST, low)
    above = range(high + 1, HIGHEST + 1)
    stretch = max(below, above, key=len)
    return stretch if len(stretch) >= ENOUGH else None


def free_ports(
    count: int,
    *,
    outgoing_range_file: Path = OUTGOING_RANGE_FILE,
    rng: random.Random | None = None,
) -> list[int]:
    """``count`` distinct ports on 127.0.0.1 that were free a moment ago, each held bound while
    the others are found, outside the outgoing range where the machine allows it."""
    stretch = listener_ports(outgoing_range_file)
    candidates = [0] * count if stretch is None else (rng or random).sample(stretch, len(stretch))
    held: list[socket.socket] = []
    try:
        for port in candidates:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                sock.close()
                continue
            held.append(sock)
            if len(held) == count:
                return [int(s.getsockname()[1]) for s in held]
        raise OSError(f"no {count} free ports on {LOOPBACK} in {stretch}")
    finally:
        for sock in held:
            sock.close()


def free_port(outgoing_range_file: Path = OUTGOING_RANGE_FILE) -> int:
    """One port on 127.0.0.1 that was free a moment ago (see ``free_ports``)."""
    (port,) = free_ports(1, outgoing_range_file=outgoing_range_file)
    return port
