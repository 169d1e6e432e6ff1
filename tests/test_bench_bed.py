"""What the benchmarks' watches call ready, read from an event's JSON as parsed, and how their
watch reads the API server's event stream."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter, generate_latest

from bench.bed import counter_total, deployment_ready, time_until


def deployment(
    *, generation: int = 1, observed: int | None = 1, ready: int = 1, updated: int = 1
) -> dict[str, Any]:
    status: dict[str, Any] = {"readyReplicas": ready, "updatedReplicas": updated}
    if observed is not None:
        status["observedGeneration"] = observed
    return {
        "metadata": {"name": "raw", "generation": generation},
        "spec": {"replicas": 1},
        "status": status,
    }


def test_a_deployment_is_ready_once_its_controller_counts_every_replica_of_its_spec() -> None:
    assert deployment_ready(deployment())
    assert not deployment_ready(deployment(ready=0))
    assert not deployment_ready(deployment(updated=0))
    assert not deployment_ready(deployment(observed=None))
    assert not deployment_ready(deployment(generation=2))
    assert not deployment_ready({"metadata": {"generation": 1}, "spec": {"replicas": 1}})


class WatchResponse:
    """A watch's HTTP answer as the client reads it (`_preload_content=False`): the API server's
    events, one JSON object a line."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.body = b"".join(json.dumps(event).encode() + b"\n" for event in events)

    def stream(self, amt: Any = None, decode_content: Any = None) -> Iterator[bytes]:
        yield self.body

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


def list_call(events: list[dict[str, Any]]) -> Any:
    """A list function of the client's shape: a list, or with `watch=True` the events."""

    def call(**kwargs: Any) -> Any:
        if kwargs.get("watch"):
            return WatchResponse(events)
        return {"metadata": {"resourceVersion": "7"}, "items": []}

    return call


def modified(ready: int) -> dict[str, Any]:
    obj = deployment(ready=ready)
    obj["metadata"]["resourceVersion"] = str(8 + ready)
    return {"type": "MODIFIED", "object": obj}


def test_the_watch_times_the_first_event_whose_json_satisfies_the_predicate() -> None:
    started = []
    seen: list[Any] = []

    def predicate(obj: Any) -> bool:
        seen.append(obj)
        return deployment_ready(obj)

    took = time_until(
        list_call([modified(0), modified(1)]), predicate, lambda: started.append(1), 5
    )
    assert started == [1]
    assert 0 <= took < 5
    assert [type(obj) for obj in seen] == [dict, dict]
    assert [obj["status"]["readyReplicas"] for obj in seen] == [0, 1]


def test_an_error_event_raises_the_servers_code_and_message_not_a_key_error() -> None:
    gone = {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": "too old resource version: 7 (12)",
            "reason": "Expired",
            "code": 410,
        },
    }
    with pytest.raises(ApiException) as raised:
        time_until(list_call([modified(0), gone]), deployment_ready, lambda: None, 5)
    assert raised.value.status == 410
    assert "too old resource version" in str(raised.value.reason)


def test_a_counter_is_read_from_the_operators_metrics_page_and_none_when_absent() -> None:
    registry = CollectorRegistry()
    dropped = Counter("specdeploy_events_dropped", "dropped", registry=registry)
    page = generate_latest(registry).decode()
    assert counter_total(page, "specdeploy_events_dropped_total") == 0
    dropped.inc(3)
    page = generate_latest(registry).decode()
    assert counter_total(page, "specdeploy_events_dropped_total") == 3
    assert counter_total(page, "specdeploy_api_writes_total") is None
