"""Fencing: a request that hangs gives up, a holder cut off from the API server declares its
Lease lost at the renew deadline, and a write is not sent once this process no longer leads
(adapters.kube.with_timeout and KubeAdapter.fence, handlers.leadership.LeaseElector)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fake_api_server import FakeApiServer, serve_http
from specdeploy.adapters.kube import KubeAdapter, NotLeadingError, with_timeout
from specdeploy.api.config import LeaderElection
from specdeploy.handlers.leadership import LeaseElector


@pytest.fixture
def silent_server() -> Iterator[str]:
    """An address that accepts connections and never answers (an API server gone quiet)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for connection in held:
            connection.close()
        listener.close()


def test_a_request_to_a_silent_api_server_gives_up(silent_server: str) -> None:
    configuration = client.Configuration()
    configuration.host = silent_server
    configuration.retries = 0
    api = client.CoreV1Api(with_timeout(client.ApiClient(configuration), (1.0, 0.5)))
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            api.read_namespace("serving")
        except Exception as error:
            outcome.append(error)

    started = time.monotonic()
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive(), "the request still waits for an answer"
    assert outcome, "the request failed"
    assert time.monotonic() - started < 5


def test_a_write_is_not_sent_once_the_process_no_longer_leads() -> None:
    with serve_http(FakeApiServer()) as url:
        configuration = client.Configuration()
        configuration.host = url
        leading = [False]
        kube = KubeAdapter(client.ApiClient(configuration), fence=lambda: leading[0])
        with pytest.raises(NotLeadingError, match="not leading"):
            kube.patch_status("ns", "chat", {"phase": "Serving"})
        assert kube.write_requests == 0, "nothing sent"
        # Reads are not fenced: a standby may read.
        client.AppsV1Api(kube.api_client).list_namespaced_deployment("ns")
        leading[0] = True
        # Sent now (this fake API server serves no PATCH: 501).
        with pytest.raises(ApiException, match="501"):
            kube.patch_status("ns", "chat", {"phase": "Serving"})
        assert kube.write_requests == 1


SETTINGS = LeaderElection.model_validate(
    {
        "enabled": True,
        "namespace": "ops",
        "leaseDurationSeconds": 1.0,
        "renewDeadlineSeconds": 0.3,
        "retryPeriodSeconds": 0.05,
    }
)


class HangingLeases:
    """A Lease API whose every request hangs until `answer` is set (a partition)."""

    def __init__(self) -> None:
        self.answer = threading.Event()
        self.timeouts: list[Any] = []

    def read_namespaced_lease(self, name: str, namespace: str, **kwargs: Any) -> Any:
        self.timeouts.append(kwargs.get("_request_timeout"))
        self.answer.wait()
        raise OSError("connection reset")


def test_a_holder_cut_off_stops_leading_at_the_renew_deadline_while_its_renewal_hangs() -> None:
    leases = HangingLeases()
    elector = LeaseElector(leases, SETTINGS, "a")  # type: ignore[arg-type]
    elector.held, elector.renewed_at = True, time.monotonic()
    assert elector.leads()
    lost = asyncio.Event()
    # The hung request ends a while after the deadline (the loop's executor waits for it).
    threading.Timer(1.5, leases.answer.set).start()
    started = time.monotonic()

    async def kept() -> float:
        await asyncio.wait_for(elector.keep(lost), timeout=3)
        return time.monotonic() - started

    took = asyncio.run(kept())
    assert lost.is_set()
    assert took < 1.0, "lost at the renew deadline, not the Lease's end"
    assert not elector.leads()
    # Each Lease request gives up within the deadline too.
    assert leases.timeouts
    assert all(t == pytest.approx(0.15) for t in leases.timeouts)


def test_leading_ends_with_the_renew_deadline_since_the_last_renewal() -> None:
    clock = [100.0]
    elector = LeaseElector(
        HangingLeases(),  # type: ignore[arg-type]
        SETTINGS,
        "a",
        monotonic=lambda: clock[0],
    )
    assert not elector.leads(), "not before it took the Lease"
    elector.held, elector.renewed_at = True, 100.0
    clock[0] = 100.29
    assert elector.leads()
    clock[0] = 100.31
    assert not elector.leads(), "a standby may take the Lease 0.7 s later: writes stop now"
