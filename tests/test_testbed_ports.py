"""The test bed's listener ports never come from the range outgoing connections take theirs from."""

from __future__ import annotations

import random
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from testbed import ports

_T = TypeVar("_T")


def _outgoing_range(path: Path, low: int, high: int) -> Path:
    path.write_text(f"{low}\t{high}\n")
    return path


def _outgoing_local_ports(count: int) -> list[int]:
    """The local ports the kernel gives to `count` connections to a listener of ours."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind((ports.LOOPBACK, 0))
        server.listen(count)
        clients = [socket.create_connection(server.getsockname()) for _ in range(count)]
        try:
            return [int(c.getsockname()[1]) for c in clients]
        finally:
            for client in clients:
                client.close()


def test_picked_ports_lie_outside_the_range_the_machine_gives_outgoing_connections() -> None:
    low, high = (int(p) for p in ports.OUTGOING_RANGE_FILE.read_text().split())
    # What a connection made between the pick and the listener's start could hold.
    assert all(low <= port <= high for port in _outgoing_local_ports(20))
    picked = ports.free_ports(20)
    assert len(set(picked)) == 20
    assert not [port for port in picked if low <= port <= high], (picked, (low, high))
    assert all(ports.LOWEST <= port <= ports.HIGHEST for port in picked)


def test_the_larger_stretch_outside_the_range_is_used(tmp_path: Path) -> None:
    usual = _outgoing_range(tmp_path / "usual", 32768, 60999)
    assert ports.listener_ports(usual) == range(ports.LOWEST, 32768)
    high_up = _outgoing_range(tmp_path / "high", 10500, 50000)
    assert ports.listener_ports(high_up) == range(50001, ports.HIGHEST + 1)
    for port in ports.free_ports(5, outgoing_range_file=high_up):
        assert 50001 <= port <= ports.HIGHEST


def test_a_machine_with_the_whole_range_outgoing_gets_the_kernels_ports(tmp_path: Path) -> None:
    everything = _outgoing_range(tmp_path / "wide", 1024, 65535)
    assert ports.listener_ports(everything) is None
    assert ports.listener_ports(tmp_path / "absent") is None
    picked = ports.free_ports(3, outgoing_range_file=everything)
    assert len(set(picked)) == 3


class _Offering(random.Random):
    """Offers the given ports first, then the rest in order."""

    def __init__(self, first: Sequence[int]) -> None:
        super().__init__(0)
        self.first = list(first)

    def sample(self, population: Sequence[_T], k: int, **_: Any) -> list[_T]:
        first = [p for p in population if p in self.first]
        rest = [p for p in population if p not in self.first]
        return (first + rest)[:k]


def test_a_port_a_listener_holds_is_passed_over(tmp_path: Path) -> None:
    usual = _outgoing_range(tmp_path / "usual", 32768, 60999)
    busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    busy_port = ports.free_port(usual)
    busy.bind((ports.LOOPBACK, busy_port))
    busy.listen(1)
    try:
        picked = ports.free_ports(2, outgoing_range_file=usual, rng=_Offering([busy_port]))
    finally:
        busy.close()
    assert busy_port not in picked
    assert len(set(picked)) == 2
