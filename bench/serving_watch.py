"""Which revisions serve, moment by moment, as a watch on the SD's pods sees it (P3).

A revision serves while one of its pods is Ready and not being deleted: what the SD's Service
would route to (its endpoints; the test bed's pods all have the address 127.0.0.1, which an
EndpointSlice refuses, so the pods themselves are read). The reaction to a bad canary runs from
the first moment the canary serves to the first moment after it when the stable is the only
revision serving. `PodWatch` records the events; the rest is pure.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import watch

from testbed.conditions import is_serving


@dataclass(frozen=True)
class PodEvent:
    """One pod as a watch event showed it, `at` seconds (monotonic clock)."""

    at: float
    pod: str
    revision: str
    serving: bool  # Ready and not being deleted
    gone: bool = False  # deleted


def pod_event(at: float, kind: str, pod: Mapping[str, Any], revision_label: str) -> PodEvent:
    metadata = pod.get("metadata") or {}
    return PodEvent(
        at=at,
        pod=str(metadata.get("name")),
        revision=str((metadata.get("labels") or {}).get(revision_label, "")),
        serving=is_serving(pod) and kind != "DELETED",
        gone=kind == "DELETED",
    )


def serving_timeline(events: Sequence[PodEvent]) -> list[tuple[float, frozenset[str]]]:
    """After each event, the revisions with a serving pod."""
    pods: dict[str, PodEvent] = {}
    timeline = []
    for event in sorted(events, key=lambda e: e.at):
        if event.gone:
            pods.pop(event.pod, None)
        else:
            pods[event.pod] = event
        timeline.append((event.at, frozenset(p.revision for p in pods.values() if p.serving)))
    return timeline


def reaction_seconds(events: Sequence[PodEvent], canary: str, stable: str) -> float | None:
    """Seconds from the first moment `canary` serves to the first moment after it when only
    `stable` serves; None when either never happens."""
    began: float | None = None
    for at, serving in serving_timeline(events):
        if began is None and canary in serving:
            began = at
        elif began is not None and serving == frozenset({stable}):
            return at - began
    return None


@dataclass
class PodWatch:
    """Records the SD's pod events from a watch, in a background thread, from `start()` on."""

    core: Any  # kubernetes.client.CoreV1Api
    namespace: str
    selector: str
    revision_label: str
    events: list[PodEvent] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> PodWatch:
        listed = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector)
        now = time.monotonic()
        for pod in listed.to_dict()["items"]:
            self.events.append(pod_event(now, "ADDED", _camel(pod), self.revision_label))
        version = listed.metadata.resource_version
        self._thread = threading.Thread(target=self._run, args=(version,), daemon=True)
        self._thread.start()
        return self

    def _run(self, version: str) -> None:
        while not self._stop.is_set():
            stream = watch.Watch()  # type: ignore[no-untyped-call]
            try:
                for event in stream.stream(  # type: ignore[no-untyped-call]
                    self.core.list_namespaced_pod,
                    self.namespace,
                    label_selector=self.selector,
                    resource_version=version,
                    timeout_seconds=30,
                ):
                    pod = event["raw_object"]
                    version = pod["metadata"]["resourceVersion"]
                    self.events.append(
                        pod_event(time.monotonic(), event["type"], pod, self.revision_label)
                    )
                    if self._stop.is_set():
                        break
            except Exception:  # a dropped watch is resumed from the last version seen
                time.sleep(0.2)
            finally:
                stream.stop()  # type: ignore[no-untyped-call]

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=40)


def _camel(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A listed pod (the client's snake_case dict) with the fields pod_event reads."""
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    return {
        "metadata": {
            "name": metadata.get("name"),
            "labels": metadata.get("labels"),
            "deletionTimestamp": metadata.get("deletion_timestamp"),
        },
        "status": {"conditions": status.get("conditions") or []},
    }
