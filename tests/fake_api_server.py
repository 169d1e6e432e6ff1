"""An in-memory API server for one kind, as far as watch-fed stores see one: a resourceVersion
counter over every change, LISTs at a resourceVersion (whole, or in pages with `limit` and
`continue` from one snapshot, a continue token expiring with compaction), watches that resume
from one and answer 410 Gone once it is older than what the server still keeps, bookmarks; a
stream that feeds the operator's handlers the way kopf's watch does (a first listing, events
in order, a relist after a 410); and `serve_http`, which answers the kubernetes client's
discovery and LIST requests over HTTP on 127.0.0.1, so that the operator's own LIST code runs
unchanged against it.
"""

from __future__ import annotations

import copy
import itertools
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

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
    #: The objects each paged LIST read, by its resourceVersion (for its continue pages).
    snapshots: dict[int, list[Obj]] = field(default_factory=dict)
    #: Each LIST request answered: (verb, namespace, limit, continue token).
    requests: list[tuple[str, str | None, int | None, str | None]] = field(default_factory=list)
    #: The label selector of each LIST request, in order (None: none).
    selectors: list[str | None] = field(default_factory=list)
    #: Whether each LIST request over HTTP asked for its objects' metadata alone, in order.
    metadata_only: list[bool] = field(default_factory=list)
    #: Called before each LIST request is answered (a test changes the server between pages).
    before_list: Callable[[], None] = lambda: None

    def _bump(self) -> str:
        self.rv += 1
        return str(self.rv)

    def create(
        self, name: str, namespace: str = "ns", owner: str | None = "sd", **spec: Any
    ) -> Obj:
        """An object of an SD named `owner`, or, with no owner, one that is none of ours."""
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
                "labels": (
                    {labels.NAME: owner, labels.MANAGED_BY: labels.MANAGED_BY_VALUE}
                    if owner is not None
                    else {"app": name}
                ),
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

    def list_objects(
        self, namespace: str | None = None, selector: str | None = None
    ) -> tuple[list[Obj], int]:
        """Every object (of `namespace`, carrying the label `selector` names: an existence
        selector, `key`) and the LIST's resourceVersion; items carry no kind, as a real LIST's
        do not."""
        items = []
        for (ns, _), obj in sorted(self.objects.items()):
            if selector is not None and selector not in obj["metadata"]["labels"]:
                continue
            if namespace is None or ns == namespace:
                item = copy.deepcopy(obj)
                del item["kind"], item["apiVersion"]
                items.append(item)
        return items, self.rv

    def list_page(
        self,
        namespace: str | None = None,
        limit: int | None = None,
        token: str | None = None,
        selector: str | None = None,
    ) -> Obj:
        """One LIST request as the API server answers it: a `...List` whose metadata holds the
        resourceVersion of the snapshot it reads and, when `limit` left objects out, a
        `continue` token for the next page of that same snapshot (etcd keeps old revisions
        until compaction: a token older than that is GoneError, 410 ResourceExpired)."""
        self.selectors.append(selector)
        if token is None:
            items, version = self.list_objects(namespace, selector)
            self.snapshots[version] = items
            offset = 0
        else:
            version, offset = (int(part) for part in token.split(":"))
            if version < self.compacted or version not in self.snapshots:
                raise GoneError(version)
            items = self.snapshots[version]
        end = len(items) if not limit else offset + limit
        metadata: Obj = {"resourceVersion": str(version)}
        if end < len(items):
            metadata["continue"] = f"{version}:{end}"
        self.requests.append(("LIST", namespace, limit, token))
        return {
            "apiVersion": self.api_version,
            "kind": f"{self.kind}List",
            "metadata": metadata,
            "items": copy.deepcopy(items[offset:end]),
        }

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
    `deliver` is called for every event (the raw-event handler). Like the operator's kopf,
    it lists and watches only the objects that carry the label `selector` names."""

    server: FakeApiServer
    deliver: Callable[[str | None, Obj], None]
    selector: str | None = labels.NAME
    position: int = 0
    relists: int = 0
    #: Objects each relist delivered (a relist of nothing cannot be noticed by a handler).
    relist_sizes: list[int] = field(default_factory=list)
    _backlog: list[tuple[str, Obj]] = field(default_factory=list)

    def start(self) -> None:
        items, self.position = self.server.list_objects(None, self.selector)
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
            if self.selector is not None and self.selector not in obj["metadata"]["labels"]:
                continue
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
            items, self.position = self.server.list_objects(None, self.selector)
            self.relist_sizes.append(len(items))
            for item in items:
                self.deliver(None, item)

    def catch_up(self) -> None:
        self.reconnect()
        self.pump()


#: The kinds `serve_http` says it serves: enough discovery for the dynamic client.
_RESOURCES = {
    "apps/v1": [("deployments", "Deployment", True), ("deployments/scale", "Scale", True)],
    "v1": [("pods", "Pod", True), ("nodes", "Node", False)],
}


def _discovery(path: str) -> Obj | None:
    if path == "/version":
        return {"major": "1", "minor": "34", "gitVersion": "v1.34.0"}
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"]}
    if path == "/apis":
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": "apps",
                    "versions": [{"groupVersion": "apps/v1", "version": "v1"}],
                    "preferredVersion": {"groupVersion": "apps/v1", "version": "v1"},
                }
            ],
        }
    group_version = {"/api/v1": "v1", "/apis/apps/v1": "apps/v1"}.get(path)
    if group_version is None:
        return None
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": [
            {
                "name": name,
                "kind": kind,
                "namespaced": namespaced,
                "singularName": "",
                "verbs": ["get", "list", "watch", "patch"],
            }
            for name, kind, namespaced in _RESOURCES[group_version]
        ],
    }


@contextmanager
def serve_http(server: FakeApiServer) -> Iterator[str]:
    """`server` over HTTP on 127.0.0.1 (its URL), for the kubernetes client: discovery, and
    LISTs of its kind (`?limit=`, `?continue=` and an existence `?labelSelector=`; 410 with
    reason Expired for a token older than compaction; the objects' metadata alone for an
    Accept header that asks for a PartialObjectMetadataList), cluster-wide or of one
    namespace."""
    plural = next(name for name, kind, _ in _RESOURCES[server.api_version] if kind == server.kind)
    prefix = "/api/v1" if server.api_version == "v1" else f"/apis/{server.api_version}"

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            found = _discovery(url.path)
            if found is None:
                found = self._list(url.path, query)
            if found is None:
                self._answer(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
            elif found.get("kind") == "Status":
                self._answer(found["code"], found)
            else:
                self._answer(200, found)

        def _list(self, path: str, query: dict[str, str]) -> Obj | None:
            namespace: str | None = None
            if path.startswith(f"{prefix}/namespaces/"):
                namespace, _, rest = path.removeprefix(f"{prefix}/namespaces/").partition("/")
                path = f"{prefix}/{rest}"
            if path != f"{prefix}/{plural}":
                return None
            server.before_list()
            limit = int(query["limit"]) if query.get("limit") else None
            # As the API server: `Accept: ...;as=PartialObjectMetadataList;...` answers with
            # each object's metadata alone.
            metadata_only = "as=PartialObjectMetadataList" in (self.headers.get("Accept") or "")
            server.metadata_only.append(metadata_only)
            try:
                found = server.list_page(
                    namespace,
                    limit,
                    query.get("continue") or None,
                    query.get("labelSelector") or None,
                )
            except GoneError:
                return {"kind": "Status", "code": 410, "reason": "Expired",
                        "message": "The provided continue parameter is too old"}  # fmt: skip
            if not metadata_only:
                return found
            return {
                "apiVersion": "meta.k8s.io/v1",
                "kind": "PartialObjectMetadataList",
                "metadata": found["metadata"],
                "items": [{"metadata": item["metadata"]} for item in found["items"]],
            }

        def _answer(self, code: int, body: Obj) -> None:
            raw = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *_: Any) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{http.server_address[1]}"
    finally:
        http.shutdown()
        http.server_close()
