"""Events are posted behind the reconcile that decides them (handlers.run.EventPoster): the
reconcile does not wait for the POSTs, they go in order, and a stop posts what is waiting."""

from __future__ import annotations

import threading
from typing import Any

from kubernetes.client.exceptions import ApiException

from specdeploy.adapters.metrics import OperatorMetrics
from specdeploy.handlers.run import EventPoster

SD = {
    "apiVersion": "specdeploy.dev/v1alpha1",
    "kind": "SpeculativeDeployment",
    "metadata": {"name": "chat", "namespace": "ns", "uid": "u-1"},
}


class SlowApi:
    """An Event API whose first POST waits until the test lets it go."""

    def __init__(self, fail: set[str] | None = None) -> None:
        self.posted: list[str] = []
        self.first = threading.Event()
        self.fail = fail or set()

    def __call__(self, namespace: str, body: Any) -> None:
        if not self.posted and not self.first.is_set():
            assert self.first.wait(10)
        if body["reason"] in self.fail:
            raise ApiException(status=403, reason="Forbidden")
        self.posted.append(f"{namespace}/{body['reason']}")


def test_the_reconcile_hands_events_over_without_waiting_and_they_go_in_order() -> None:
    api = SlowApi()
    poster = EventPoster(api, "op-1")
    for reason in ("NewRevision", "Sized", "RolloutComplete"):
        poster(SD, "Normal", reason, "m")  # returns while the first POST is held
    assert api.posted == []
    api.first.set()
    poster.close()
    assert api.posted == ["ns/NewRevision", "ns/Sized", "ns/RolloutComplete"]


def test_a_refused_event_is_logged_and_the_next_ones_still_go() -> None:
    api = SlowApi(fail={"Sized"})
    api.first.set()
    poster = EventPoster(api, "op-1")
    for reason in ("NewRevision", "Sized", "RolloutComplete"):
        poster(SD, "Normal", reason, "m")
    poster.close()
    assert api.posted == ["ns/NewRevision", "ns/RolloutComplete"]


def test_beyond_the_backlog_events_are_dropped_not_waited_for() -> None:
    api = SlowApi()
    metrics = OperatorMetrics()
    poster = EventPoster(api, "op-1", backlog=2, on_drop=metrics.events_dropped.inc)
    poster(SD, "Normal", "First", "m")  # taken by the thread, held in its POST
    while not poster._waiting.empty():  # the thread took it
        threading.Event().wait(0.001)
    for reason in ("A", "B", "C", "D"):
        poster(SD, "Normal", reason, "m")
    api.first.set()
    poster.close()
    assert api.posted == ["ns/First", "ns/A", "ns/B"]
    # Counted where a person watching the operator sees them.
    assert metrics.registry.get_sample_value("specdeploy_events_dropped_total") == 2
