"""Reconcile requests for one SD that arrive while another is waiting join it."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

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


def started_behind_the_first(
    reconciler: Any, errors: list[BaseException]
) -> list[threading.Thread]:
    """One reconcile running (held at its first read), then four more requests."""
    first = run(reconciler, errors)
    deadline = time.monotonic() + 10
    while (NS, NAME) in reconciler._waiting and time.monotonic() < deadline:
        time.sleep(0.01)  # the first has taken the lock and left the waiting list
    others = [run(reconciler, errors) for _ in range(4)]
    time.sleep(0.5)  # all four have asked: one waits for the lock, three joined it
    return [first, *others]


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
