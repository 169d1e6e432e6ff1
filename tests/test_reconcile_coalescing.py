"""Reconcile requests for one SD that arrive while another is waiting join it."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from specdeploy.handlers import reconcile as reconcile_module
from test_reconcile import sd_body, setup

NS, NAME = "ns", "chat"


def blocked_first_read(kube: Any, fail_second: bool = False) -> tuple[threading.Event, list[int]]:
    """Makes the first reconcile's first read wait for the returned gate; counts reads of the SD
    (one per reconcile that runs)."""
    gate, reads = threading.Event(), [0]
    original = kube.get_speculative_deployment

    def read(namespace: str, name: str) -> Any:
        reads[0] += 1
        if reads[0] == 1:
            assert gate.wait(10)
        elif fail_second:
            raise RuntimeError("API down")
        return original(namespace, name)

    kube.get_speculative_deployment = read
    return gate, reads


def run(reconciler: Any, errors: list[BaseException]) -> threading.Thread:
    def target() -> None:
        try:
            reconciler.reconcile(NS, NAME)
        except BaseException as error:  # collected for the test to look at
            errors.append(error)

    thread = threading.Thread(target=target)
    thread.start()
    return thread


class CountedEvent(threading.Event):
    """An Event that counts the threads that came to wait on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiters = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waiters += 1
        return super().wait(timeout)


class CountedWaiting(reconcile_module._Waiting):
    def __init__(self) -> None:
        super().__init__()
        self.done = CountedEvent()


def wait_until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def started_behind_the_first(
    reconciler: Any, errors: list[BaseException]
) -> list[threading.Thread]:
    """One reconcile running (held at its first read), then four more requests: one waiting
    for the lock, three joined to it (seen waiting on its completion, not assumed after a
    pause)."""
    first = run(reconciler, errors)
    # The first has taken the lock and left the waiting list.
    wait_until(lambda: (NS, NAME) not in reconciler._waiting, "the first reconcile to start")
    others = [run(reconciler, errors) for _ in range(4)]

    def four_asked() -> bool:
        waiting = reconciler._waiting.get((NS, NAME))
        return waiting is not None and waiting.done.waiters == 3

    wait_until(four_asked, "one request waiting for the lock and three joined to it")
    return [first, *others]


@pytest.fixture(autouse=True)
def counted_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reconcile_module, "_Waiting", CountedWaiting)


def test_requests_behind_a_running_reconcile_become_one_more_reconcile() -> None:
    kube, reconciler, _ = setup(sd_body())
    gate, reads = blocked_first_read(kube)
    errors: list[BaseException] = []
    threads = started_behind_the_first(reconciler, errors)
    gate.set()
    for thread in threads:
        thread.join(10)
    assert not errors
    assert reads[0] == 2, "the first reconcile and one for the four requests made meanwhile"
    assert kube.deployments(), "the reconcile that ran did its work"
    assert not reconciler._waiting


def test_a_request_that_joined_raises_what_the_reconcile_it_joined_raised() -> None:
    kube, reconciler, _ = setup(sd_body())
    gate, reads = blocked_first_read(kube, fail_second=True)
    errors: list[BaseException] = []
    threads = started_behind_the_first(reconciler, errors)
    gate.set()
    for thread in threads:
        thread.join(10)
    assert reads[0] == 2
    assert len(errors) == 4, "the one that ran and the three that joined it"
    assert all(str(e) == "API down" for e in errors)
    # The next request runs afresh (the SD's read now fails at once, as the API is down).
    with pytest.raises(RuntimeError, match="API down"):
        reconciler.reconcile(NS, NAME)
    assert reads[0] == 3


@pytest.mark.parametrize("count", [1, 3])
def test_sequential_requests_each_reconcile(count: int) -> None:
    kube, reconciler, _ = setup(sd_body())
    _, reads = blocked_first_read(kube)
    reads[0] = 1  # no gate: the first read is past
    for _ in range(count):
        reconciler.reconcile(NS, NAME)
    assert reads[0] == 1 + count
