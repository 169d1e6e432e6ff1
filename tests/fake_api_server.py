"""An in-memory API server for one kind, as far as watch-fed stores see one: a resourceVersion
counter over every change, LISTs at a resourceVersion, watches that resume from one and answer
410 Gone once it is older than what the server still keeps, bookmarks; and a stream that feeds
the operator's handlers the way kopf's watch does (a first listing, events in order, a
relist after a 410).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specdeploy.api import labels

Key = tuple[str, str]
Obj = dict[str, Any]


class GoneError(Exception):
    """410 Gone: the watch's resourceVersion is older than the events the server keeps."""


@dataclass
class FakeApiServer:
    kind: str = "Deployment"
    api_version: str = "apps/v1"
    rv: int = 100
    objects: dict[Key, Obj] = field(default_factory=dict)
    events: list[tuple[int, str, Obj]] = field(default_factory=list)
    #: Events at or before this resourceVersion are forgotten (etcd compaction).
    compacted: int = 0
    _uids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def _bump(self) -> str:
        self.rv += 1
        return str(self.rv)

    def create(self, name: str, namespace: str = "ns", owner: str = "sd", **spec: Any) -> Obj:
        key = (namespace, name)
        if key in self.objects:
            raise ValueError(f"409: {name} exists")
        obj: Obj = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"uid-{next(self._uids)}",
                "resourceVersion": self._bump(),
                "labels": {labels.NAME: owner, labels.MANAGED_BY: labels.MANAGED_BY_VALUE},
            },
            "spec": dict(spec),
        }
        self.objects[key] = obj
        self.events.append((self.rv, "ADDED", copy.deepcopy(obj)))
        return copy.deepcopy(obj)

    def update(self, name: str, namespace: str = "ns", **spec: Any) -> Obj:
        obj = self.objects[(namespace, name)]
        obj["spec"].update(spec)
        obj["metadata"]["resourceVersion"] = self._bump()
        self.events.append((self.rv, "MODIFIED", copy.deepcopy(obj)))
        return copy.deepcopy(obj)

    def delete(self, name: str, namespace: str = "ns") -> Obj:
        obj = self.objects.pop((namespace, name))
        # A DELETED event carries the object's last state at the deletion's resourceVersion.
        obj["metadata"]["resourceVersion"] = self._bump()
        self.events.append((self.rv, "DELETED", copy.deepcopy(obj)))
        return copy.deepcopy(obj)

    def list_objects(self, namespace: str | None = None) -> tuple[list[Obj], int]:
        """Every object (of `namespace`) and the LIST's resourceVersion; items carry no kind,
        as a real LIST's do not."""
        items = []
        for (ns, _), obj in sorted(self.objects.items()):
            if namespace is None or ns == namespace:
                item = copy.deepcopy(obj)
                del item["kind"], item["apiVersion"]
                items.append(item)
        return items, self.rv

    def watch(self, since: int) -> list[tuple[str, Obj]]:
        """Every event after `since`, in order: what a watch started at `since` streams;
        GoneError when `since` is compacted away."""
        if since < self.compacted:
            raise GoneError(since)
        return self.events_after(since)

    def events_after(self, since: int) -> list[tuple[str, Obj]]:
        """What a watch connection that is open streams, compaction or not."""
        return [(kind, copy.deepcopy(obj)) for rv, kind, obj in self.events if rv > since]

    def tick(self, changes: int = 10) -> None:
        """Other kinds change: the resourceVersion moves with no event of this kind."""
        self.rv += changes

    def compact(self) -> None:
        self.compacted = self.rv


@dataclass
class KopfLikeStream:
    """What kopf's watch hands to handlers for one kind: a first listing (every object with
    event type None), then the watch's events in order from the LIST's resourceVersion; a
    bookmark moves the position without an event; a reconnect from a compacted position gets
    410 and lists again (every object with type None, deletions meanwhile not shown).

    `fill` is called for each object of the first listing (kopf's index handlers run for it
    before any other handler), `deliver` for every event (the raw-event handler)."""

    server: FakeApiServer
    deliver: Callable[[str | None, Obj], None]
    fill: Callable[[Obj], None] = lambda _: None
    position: int = 0
    relists: int = 0
    #: Objects each relist delivered (a relist of nothing cannot be noticed by a handler).
    relist_sizes: list[int] = field(default_factory=list)
    _backlog: list[tuple[str, Obj]] = field(default_factory=list)

    def start(self) -> None:
        items, self.position = self.server.list_objects()
        for item in items:
            self.fill(item)
        for item in items:
            self.deliver(None, item)

    def pump(self, count: int | None = None) -> int:
        """Delivers up to `count` pending events (all when None); returns how many."""
        delivered = 0
        while count is None or delivered < count:
            if not self._backlog:
                self._backlog = self.server.events_after(self.position)
                if not self._backlog:
                    break
            event_type, obj = self._backlog.pop(0)
            self.position = int(obj["metadata"]["resourceVersion"])
            self.deliver(event_type, obj)
            delivered += 1
        return delivered

    def bookmark(self) -> None:
        """The server's BOOKMARK on a quiet stream: once every event of the kind is
        delivered, the position moves to the server's current resourceVersion."""
        if not self._backlog and not self.server.events_after(self.position):
            self.position = self.server.rv

    def reconnect(self) -> None:
        """The watch connection ended; it resumes from the position, or lists again."""
        self._backlog = []
        try:
            self._backlog = self.server.watch(self.position)
        except GoneError:
            self.relists += 1
            items, self.position = self.server.list_objects()
            self.relist_sizes.append(len(items))
            for item in items:
                self.deliver(None, item)

    def catch_up(self) -> None:
        self.reconnect()
        self.pump()
