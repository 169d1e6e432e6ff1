"""Watch-fed, in-memory copies of what a reconcile reads, so that an idle operator's API reads
do not grow with the number of SpeculativeDeployments.

One `KindStore` per kind holds stripped copies (no managedFields, no last-applied annotations)
keyed by (namespace, name) and indexed by the `specdeploy.dev/name` label. kopf's watch
handlers feed it (`WatchCache.observe`, handlers.run), the adapter's own writes feed it their
answers (`KindStore.write_through`), and a store counts as synced only once one LIST of the
kind filled it (`WatchCache.refresh`, page by page): the operator lists every kind at its start
(handlers.run.fill_stores) and again after a watch gap and periodically (handlers.workers);
until a store is synced, `WatchCache.read` lists it on demand, or reads the API server while
the kind cannot be listed.
Pure: no I/O here.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from specdeploy import GROUP, VERSION
from specdeploy.api import labels

Key = tuple[str, str]
Obj = dict[str, Any]
#: One LIST of a kind in a scope (a namespace, or None for all): its pages, each (items, the
#: LIST's resourceVersion).
Lister = Callable[[str | None], Iterable[tuple[list[Obj], int]]]

#: Annotations that hold a whole earlier copy of the object: never read by the reconcile.
DROPPED_ANNOTATIONS = frozenset(
    {
        "kubectl.kubernetes.io/last-applied-configuration",
        "specdeploy.dev/last-handled-configuration",
    }
)


def strip(
    obj: Mapping[str, Any],
    keep: frozenset[str] | None = None,
    keep_spec: frozenset[str] | None = None,
    keep_status: frozenset[str] | None = None,
) -> Obj:
    """`obj` without the fields the reconcile never reads and that make up most of an object's
    size (managedFields and last-applied annotations); with `keep`, only those top-level fields
    (a CRD's schema is never read, only its status), with `keep_spec` and `keep_status` only
    those fields of its spec and status (of a pod, the reconcile reads its scheduling gates and
    node only; of a node, its allocatable resources, not its images or conditions).

    The result shares what it keeps with `obj` (a watch event's or an API answer's parsed
    JSON, which nothing changes afterwards) rather than copying it: copying every event of
    every kind was a large part of the operator's CPU. The store hands out copies."""
    stripped: Obj = {}
    for key, value in obj.items():
        if keep is not None and key not in keep:
            continue
        if key == "spec" and keep_spec and isinstance(value, Mapping):
            stripped[key] = {field: x for field, x in value.items() if field in keep_spec}
        elif key == "status" and keep_status and isinstance(value, Mapping):
            stripped[key] = {field: x for field, x in value.items() if field in keep_status}
        elif key == "metadata" and isinstance(value, Mapping):
            stripped[key] = _stripped_metadata(value)
        else:
            stripped[key] = value
    return stripped


def _stripped_metadata(metadata: Mapping[str, Any]) -> Obj:
    kept = {field: x for field, x in metadata.items() if field != "managedFields"}
    annotations = kept.get("annotations")
    if isinstance(annotations, Mapping) and DROPPED_ANNOTATIONS & annotations.keys():
        kept["annotations"] = {k: v for k, v in annotations.items() if k not in DROPPED_ANNOTATIONS}
    return kept


def key_of(obj: Mapping[str, Any]) -> Key:
    metadata = obj.get("metadata") or {}
    return (metadata.get("namespace") or "", metadata.get("name") or "")


def version_of(obj: Mapping[str, Any]) -> int:
    """The object's resourceVersion as a number; -1 when it has none or is not a number.

    The API server's resourceVersions are etcd revisions: one counter over every object, so
    they order every state of every object in time (the API conventions call them opaque,
    but client-go's informers compare them too: a watch resumes from one)."""
    raw = (obj.get("metadata") or {}).get("resourceVersion") or ""
    return int(raw) if str(raw).isdigit() else -1


def _uid(obj: Mapping[str, Any]) -> str | None:
    found = (obj.get("metadata") or {}).get("uid")
    return found if isinstance(found, str) and found else None


def _owner_label(obj: Mapping[str, Any]) -> str | None:
    found = ((obj.get("metadata") or {}).get("labels") or {}).get(labels.NAME)
    return found if isinstance(found, str) else None


#: How long a deletion is remembered (to refuse older copies of the object that a LIST or a
#: lagging watch event still carries); far longer than kopf's streams lag behind the server.
TOMBSTONE_SECONDS = 600.0


@dataclass(frozen=True)
class Tombstone:
    """A deletion: no copy of the object at `version` or older may come back. `ours` marks a
    delete we sent, whose own resourceVersion we do not know yet: until the deletion is seen,
    the deleted incarnation (`uid`) is refused whatever its version."""

    uid: str | None
    version: int
    at: float
    ours: bool = False

    def refuses(self, uid: str | None, version: int) -> bool:
        if version <= self.version:
            return True
        return self.ours and self.uid is not None and uid == self.uid


@dataclass(frozen=True)
class Seen:
    """What one watch event changed in a store: `news` when the store's copy moved (a newer
    object, or one removed), `relisted` when the stream listed an object it had not
    delivered as expected (kopf lists afresh after a watch it could not resume, and a LIST
    shows no deletions), `previous` the copy held before."""

    news: bool
    relisted: bool = False
    previous_json: bytes | None = None

    @property
    def previous(self) -> Obj | None:
        return _decode(self.previous_json) if self.previous_json is not None else None


class _Held(NamedTuple):
    """What a store keeps beside an object's JSON, to order, index and list it unread."""

    version: int
    uid: str | None
    owner: str | None
    deleting: bool


def _encode(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _decode(raw: bytes) -> Obj:
    found: Obj = json.loads(raw)
    return found


class KindStore:
    """The stripped objects of one kind. `labelled` keeps only objects that carry the
    `specdeploy.dev/name` label (the children and pods of SDs); the others keep every object.

    Every change is ordered by resourceVersion: a copy replaces the held one only when it is
    newer, a deletion removes only copies as old as itself or older and leaves a tombstone that
    refuses older copies (from a LIST made before it, or a watch event that lags), and a LIST
    removes what it no longer holds unless the store's copy is newer than the LIST.

    Each object is kept as its compact JSON (about a fifth of the memory of the same object as
    Python dicts and lists); a read decodes it, so what a reader gets is its own copy.
    Thread-safe: kopf's event loop writes while reconcile threads read."""

    def __init__(
        self,
        *,
        labelled: bool = False,
        keep: frozenset[str] | None = None,
        keep_spec: frozenset[str] | None = None,
        keep_status: frozenset[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.labelled = labelled
        self.keep = keep
        self.keep_spec = keep_spec
        self.keep_status = keep_status
        self.clock = clock
        self._objects: dict[Key, bytes] = {}
        self._held: dict[Key, _Held] = {}
        # Decoded objects handed out to readers that only read them (`in_namespace(shared)`).
        self._shared: dict[Key, Obj] = {}
        self._by_owner: dict[Key, set[str]] = {}
        self._tombstones: dict[Key, Tombstone] = {}
        # Keys of our first LIST that the stream (kopf's watch, which makes a LIST of its own
        # when it starts) has not shown yet, and keys the stream showed before that LIST was
        # merged. Once the first LIST is merged, an object the stream lists (event type None)
        # that it was not expected to is a relist of the stream.
        self._expected_listing: set[Key] = set()
        self._early_listing: set[Key] = set()
        self._listed_once = False
        self._synced = False
        self._lock = threading.Lock()
        self.priming = threading.Lock()

    @property
    def synced(self) -> bool:
        return self._synced

    # --- changes ----------------------------------------------------------------------------

    def observe(self, event_type: str | None, obj: Mapping[str, Any]) -> Seen:
        """One watch event: DELETED removes the held copy unless it is newer than the deletion;
        anything else (ADDED, MODIFIED, a listing's None) stores the object unless the held
        copy is as new or a deletion refuses it. A listed object the stream's first listing
        does not account for (a relist after a watch gap) is `Seen.relisted`."""
        key = key_of(obj)
        version = version_of(obj)
        with self._lock:
            previous = self._objects.get(key)
            relisted = False
            if not self._listed_once:
                self._early_listing.add(key)
            elif event_type is None and key not in self._expected_listing:
                relisted = True
            else:
                # Shown by the stream: from now on the stream keeps this key current.
                self._expected_listing.discard(key)
            if event_type == "DELETED":
                self._bury(key, Tombstone(_uid(obj), version, self.clock()))
                held = self._held.get(key)
                if held is None or held.version > version:
                    return Seen(news=False, previous_json=previous)
                self._remove(key)
                return Seen(news=True, previous_json=previous)
            news = self._upsert_locked(key, obj, version)
            return Seen(news=news, relisted=relisted, previous_json=previous)

    def write_through(self, obj: Mapping[str, Any], *, only_known: bool = False) -> None:
        """The API server's answer to one of our writes, so that a reconcile right after it
        sees it before its watch event comes. `only_known` leaves out objects the store does
        not hold (a status patch must not bring back an SD whose deletion came first)."""
        key = key_of(obj)
        with self._lock:
            if only_known and key not in self._objects:
                return
            self._upsert_locked(key, obj, version_of(obj))

    def forget(self, namespace: str, name: str) -> None:
        """Our own delete: the copy we held is gone (or going) whatever a LIST or an event
        says until its deletion is seen; an object made again under the name (another uid)
        is taken as usual."""
        key = (namespace, name)
        with self._lock:
            held = self._held.get(key)
            if held is None:
                return
            self._bury(key, Tombstone(held.uid, held.version, self.clock(), ours=True))
            self._remove(key)

    def prime(
        self, items: Iterable[Mapping[str, Any]], scopes: Iterable[str | None], version: int
    ) -> None:
        """Merges LISTs of `scopes` (namespaces; None for all) made at resourceVersion
        `version` (the oldest when several) and marks the store synced: a listed object is
        stored unless the held copy is as new or a deletion refuses it; a held object the LIST
        does not hold is removed (and refused up to `version`) unless it is newer than the
        LIST (created since). Tombstones older than TOMBSTONE_SECONDS go."""
        listed = self.merge_page(items)
        self.remove_unlisted(listed, scopes, version)

    def merge_page(self, items: Iterable[Mapping[str, Any]]) -> set[Key]:
        """One page of a LIST into the store (see `prime`); returns the keys it listed."""
        listed = set()
        with self._lock:
            for item in items:
                key = key_of(item)
                listed.add(key)
                self._upsert_locked(key, item, version_of(item))
        return listed

    def remove_unlisted(
        self, listed: set[Key], scopes: Iterable[str | None], version: int
    ) -> list[Obj]:
        """Ends a LIST merged page by page (see `prime`): what it did not hold goes. Returns
        the copies it removed: deletions no watch event showed, whose SDs need a reconcile."""
        wanted = set(scopes)
        now = self.clock()
        removed: list[Obj] = []
        with self._lock:
            for key, held in list(self._unlisted_locked(listed, wanted, version)):
                removed.append(_decode(self._objects[key]))
                self._bury(key, Tombstone(held.uid, version, now))
                self._remove(key)
                self._expected_listing.discard(key)
            for key, stone in list(self._tombstones.items()):
                in_scope = None in wanted or key[0] in wanted
                if in_scope and key not in listed and not stone.ours and stone.version < version:
                    # Still gone at `version`: older copies stay refused up to it.
                    self._tombstones[key] = Tombstone(stone.uid, version, stone.at)
                elif now - stone.at > TOMBSTONE_SECONDS:
                    del self._tombstones[key]
            if not self._listed_once:
                # The stream's own first listing holds what this first LIST held (bar what
                # changed between the two), less what the stream already showed.
                self._listed_once = True
                self._expected_listing = listed - self._early_listing
                self._early_listing = set()
        self._synced = True
        return removed

    def holds_any(self, namespace: str | None) -> bool:
        """Whether the store holds an object of `namespace` (any when None)."""
        with self._lock:
            return any(namespace is None or key[0] == namespace for key in self._held)

    def holds_unlisted(self, namespace: str | None, listed: set[Key], version: int) -> bool:
        """Whether the store holds an object of `namespace` (any when None) that a LIST made
        at resourceVersion `version` does not, at a version that LIST has seen: deleted since
        it was stored, with no event to show it (what remove_unlisted removes)."""
        with self._lock:
            return next(self._unlisted_locked(listed, {namespace}, version), None) is not None

    def _unlisted_locked(
        self, listed: set[Key], wanted: set[str | None], version: int
    ) -> Iterator[tuple[Key, _Held]]:
        """The held objects of the scopes `wanted` (every one when it holds None) that a LIST
        made at resourceVersion `version` does not hold, at a version that LIST has seen:
        deleted since they were stored."""
        for key, held in self._held.items():
            in_scope = None in wanted or key[0] in wanted
            if in_scope and key not in listed and held.version <= version:
                yield key, held

    def awaiting_stream(self) -> int:
        """How many objects of the first LIST the stream has not shown yet. When the stream
        started after that LIST (kopf lists and then watches from its own LIST), an object
        deleted in between is never shown deleted: it stays held, and waiting, until a LIST of
        ours made after the stream's removes it (handlers.workers.confirm_first_listings)."""
        with self._lock:
            return len(self._expected_listing)

    def _bury(self, key: Key, stone: Tombstone) -> None:
        """Records a deletion, merged with the one already recorded (the newer version wins;
        a delete of ours stays until a deletion of that same incarnation is seen)."""
        held = self._tombstones.get(key)
        if held is None:
            self._tombstones[key] = stone
            return
        version = max(held.version, stone.version)
        other_incarnation = (
            held.ours and held.uid is not None and stone.uid is not None and stone.uid != held.uid
        )
        if stone.ours or other_incarnation:
            ours = stone if stone.ours else held
            self._tombstones[key] = Tombstone(ours.uid, version, ours.at, ours=True)
        else:
            self._tombstones[key] = Tombstone(stone.uid, version, stone.at)

    def _upsert_locked(self, key: Key, obj: Mapping[str, Any], version: int) -> bool:
        """Stores `obj` when it is newer than the held copy and no deletion refuses it;
        returns whether the store changed."""
        stone = self._tombstones.get(key)
        if stone is not None and stone.refuses(_uid(obj), version):
            return False
        held = self._held.get(key)
        if held is not None and held.version >= version:
            return False
        if stone is not None:
            del self._tombstones[key]
        owner = _owner_label(obj)
        if self.labelled and owner is None:
            # The label was taken off: no SD's child any more.
            return self._remove(key)
        self._remove(key)
        self._objects[key] = _encode(strip(obj, self.keep, self.keep_spec, self.keep_status))
        deleting = bool((obj.get("metadata") or {}).get("deletionTimestamp"))
        self._held[key] = _Held(version, _uid(obj), owner, deleting)
        if owner is not None:
            self._by_owner.setdefault((key[0], owner), set()).add(key[1])
        return True

    def _remove(self, key: Key) -> bool:
        self._objects.pop(key, None)
        self._shared.pop(key, None)
        held = self._held.pop(key, None)
        if held is None:
            return False
        owner = held.owner
        if owner is not None:
            names = self._by_owner.get((key[0], owner), set())
            names.discard(key[1])
            if not names:
                self._by_owner.pop((key[0], owner), None)
        return True

    # --- reads ------------------------------------------------------------------------------

    def vanish(self) -> list[Obj]:
        """The kind is not served (its CRD is gone): nothing of it exists. Returns the copies
        it held."""
        with self._lock:
            removed = [_decode(raw) for raw in self._objects.values()]
            self._objects.clear()
            self._held.clear()
            self._shared.clear()
            self._by_owner.clear()
            self._tombstones.clear()
            self._expected_listing.clear()
            self._early_listing.clear()
            self._listed_once = True
        self._synced = True
        return removed

    def get(self, namespace: str, name: str) -> Obj | None:
        """A copy of one object, or None."""
        with self._lock:
            held = self._objects.get((namespace, name))
        return _decode(held) if held is not None else None

    def owned(self, namespace: str, owner: str) -> list[Obj]:
        """Copies of the objects labelled `specdeploy.dev/name=<owner>` in `namespace`."""
        with self._lock:
            names = sorted(self._by_owner.get((namespace, owner), ()))
            found = [self._objects[(namespace, n)] for n in names]
        return [_decode(raw) for raw in found]

    def in_namespace(self, namespace: str | None, *, shared: bool = False) -> list[Obj]:
        """Copies of every object of `namespace` (all when None). `shared` hands out one
        decoded object per stored one, the same until the object changes, for a caller that
        only reads them: every reconcile reads every node."""
        with self._lock:
            keys = [k for k in sorted(self._objects) if namespace is None or k[0] == namespace]
            if not shared:
                found = [self._objects[k] for k in keys]
            else:
                for key in keys:
                    if key not in self._shared:
                        self._shared[key] = _decode(self._objects[key])
                return [self._shared[k] for k in keys]
        return [_decode(raw) for raw in found]

    def names(self, namespace: str | None) -> list[Key]:
        """(namespace, name) of every object of `namespace` (all when None) not being
        deleted, without reading the objects."""
        with self._lock:
            return sorted(
                key
                for key, held in self._held.items()
                if not held.deleting and (namespace is None or key[0] == namespace)
            )

    def keys(self) -> list[Key]:
        with self._lock:
            return sorted(self._objects)

    def version(self, namespace: str, name: str) -> int | None:
        """The resourceVersion of the held copy, or None."""
        with self._lock:
            held = self._held.get((namespace, name))
            return held.version if held is not None else None

    def size(self) -> int:
        """Bytes of JSON held (the objects as stored, not counting what indexes them)."""
        with self._lock:
            return sum(len(raw) for raw in self._objects.values())

    def tombstones(self) -> dict[Key, Tombstone]:
        with self._lock:
            return dict(self._tombstones)

    def __len__(self) -> int:
        return len(self._objects)


@dataclass(frozen=True)
class Kind:
    """A cached kind: how the API names it (`api_version` or, for Kueue's kinds whose
    version the server chooses, `group` with the preferred version), and how kopf watches it
    (group, version or None for the preferred one, plural)."""

    name: str
    api_version: str | None
    group: str | None
    kind: str
    namespaced: bool
    labelled: bool
    watch: tuple[str, str | None, str]
    keep: frozenset[str] | None = None
    keep_spec: frozenset[str] | None = None
    keep_status: frozenset[str] | None = None


SD = Kind(
    "sds",
    f"{GROUP}/{VERSION}",
    None,
    "SpeculativeDeployment",
    True,
    False,
    (GROUP, VERSION, "speculativedeployments"),
)
DEPLOYMENTS = Kind(
    "deployments", "apps/v1", None, "Deployment", True, True, ("apps", "v1", "deployments")
)
LEADER_WORKER_SETS = Kind(
    "leaderworkersets",
    "leaderworkerset.x-k8s.io/v1",
    None,
    "LeaderWorkerSet",
    True,
    True,
    ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets"),
)
RECORDS = Kind(
    "records",
    "apps/v1",
    None,
    "ControllerRevision",
    True,
    True,
    ("apps", "v1", "controllerrevisions"),
)
SERVICES = Kind("services", "v1", None, "Service", True, True, ("", "v1", "services"))
POD_MONITORS = Kind(
    "podmonitors",
    "monitoring.coreos.com/v1",
    None,
    "PodMonitor",
    True,
    True,
    ("monitoring.coreos.com", "v1", "podmonitors"),
)
PODS = Kind(
    "pods",
    "v1",
    None,
    "Pod",
    True,
    True,
    ("", "v1", "pods"),
    # plan.placement.admission reads the gates; the containers are the Deployment's (cached there).
    keep_spec=frozenset({"schedulingGates", "nodeName"}),
)
NODES = Kind(
    "nodes",
    "v1",
    None,
    "Node",
    False,
    False,
    ("", "v1", "nodes"),
    # plan.placement.gpu_catalog reads labels, cordoning and allocatable resources; a node's
    # status also lists every image it holds, often most of its size.
    keep_spec=frozenset({"unschedulable", "taints"}),
    keep_status=frozenset({"allocatable", "capacity"}),
)
WORKLOADS = Kind(
    "workloads",
    None,
    "kueue.x-k8s.io",
    "Workload",
    True,
    False,
    ("kueue.x-k8s.io", None, "workloads"),
    # plan.placement.admission reads the owners and the conditions, never the pod sets' templates.
    keep=frozenset({"apiVersion", "kind", "metadata", "status"}),
)
LOCAL_QUEUES = Kind(
    "localqueues",
    None,
    "kueue.x-k8s.io",
    "LocalQueue",
    True,
    False,
    ("kueue.x-k8s.io", None, "localqueues"),
)
PRIORITY_CLASSES = Kind(
    "workloadpriorityclasses",
    None,
    "kueue.x-k8s.io",
    "WorkloadPriorityClass",
    False,
    False,
    ("kueue.x-k8s.io", None, "workloadpriorityclasses"),
)
CRDS = Kind(
    "crds",
    "apiextensions.k8s.io/v1",
    None,
    "CustomResourceDefinition",
    False,
    False,
    ("apiextensions.k8s.io", "v1", "customresourcedefinitions"),
    keep=frozenset({"apiVersion", "kind", "metadata", "status"}),
)

KINDS: tuple[Kind, ...] = (
    SD,
    DEPLOYMENTS,
    LEADER_WORKER_SETS,
    RECORDS,
    SERVICES,
    POD_MONITORS,
    PODS,
    NODES,
    WORKLOADS,
    LOCAL_QUEUES,
    PRIORITY_CLASSES,
    CRDS,
)


class WatchCache:
    """One `KindStore` per cached kind, for an operator that watches `namespaces` (all when
    empty)."""

    def __init__(
        self, namespaces: Iterable[str] = (), *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.namespaces = list(namespaces)
        self.stores = {
            kind.name: KindStore(
                labelled=kind.labelled,
                keep=kind.keep,
                keep_spec=kind.keep_spec,
                keep_status=kind.keep_status,
                clock=clock,
            )
            for kind in KINDS
        }
        self.hits = 0
        self.misses = 0

    def store(self, kind: Kind) -> KindStore:
        return self.stores[kind.name]

    def scopes(self, kind: Kind) -> list[str | None]:
        """The namespaces one priming LIST of `kind` covers (None: the whole cluster)."""
        if kind.namespaced and self.namespaces:
            return list(self.namespaces)
        return [None]

    def observe(self, kind: Kind, event_type: str | None, obj: Mapping[str, Any]) -> Seen:
        return self.store(kind).observe(event_type, obj)

    def for_write(self, api_version: str, kind_name: str) -> KindStore | None:
        """The store that holds objects of this apiVersion and kind, if one does."""
        group = api_version.rpartition("/")[0] if "/" in api_version else ""
        for kind in KINDS:
            if kind.kind != kind_name:
                continue
            if kind.api_version == api_version or (kind.group is not None and kind.group == group):
                return self.store(kind)
        return None

    def refresh(self, kind: Kind, lister: Lister) -> list[Obj]:
        """Lists `kind` afresh into its store, page by page (`KindStore.merge_page`), and then
        removes what the LIST no longer holds (`KindStore.remove_unlisted`), while reads go on
        from it; returns the copies removed. A failed LIST raises and leaves the store as it
        was (the watch keeps feeding it; the caller tries again)."""
        store = self.store(kind)
        scopes = self.scopes(kind)
        listed: set[Key] = set()
        versions = []
        for scope in scopes:
            for index, (items, version) in enumerate(lister(scope)):
                if index == 0:
                    versions.append(version)  # a paged LIST is one snapshot: its first page's
                listed |= store.merge_page(items)
        return store.remove_unlisted(listed, scopes, min(versions))

    def needs_relist(
        self, kind: Kind, listed: Callable[[str | None], tuple[set[Key], int]]
    ) -> bool:
        """Whether the store of `kind` holds objects the API server no longer has: `listed(scope)`
        answers with the keys a LIST of the scope holds and that LIST's resourceVersion. kopf
        lists a kind again after a watch it could not resume, and every object that relist
        shows asks for a LIST of ours (`Seen.relisted`); the objects deleted during the gap
        are the deletions no handler sees when that relist shows nothing (every object of the
        scope went) or when nothing it shows is new to the store, and this is how they are
        seen. A store that holds nothing needs no check: what exists is in kopf's listing."""
        store = self.store(kind)
        if not store.synced:
            return False  # filled by its next read
        return any(
            store.holds_any(scope) and store.holds_unlisted(scope, *listed(scope))
            for scope in self.scopes(kind)
        )

    def read(
        self,
        kind: Kind,
        lister: Lister,
        reader: Callable[[KindStore], Any],
        fallback: Callable[[], Any],
    ) -> Any:
        """`reader` on the store of `kind` once it is synced. An unsynced store is filled
        first with `lister` (one LIST per scope, page by page); when that LIST fails (the kind
        is not served, or not permitted), `fallback` reads the API server as before."""
        store = self.store(kind)
        if not store.synced:
            with store.priming:
                if not store.synced:
                    try:
                        self.refresh(kind, lister)
                    except Exception:
                        self.misses += 1
                        return fallback()
        self.hits += 1
        return reader(store)


def changed_beyond_status(seen: Seen, obj: Mapping[str, Any]) -> bool:
    """Whether an SD's event changed more than its status (and resourceVersion): its spec
    (the generation), labels, annotations or deletion. Our own status writes come back as
    events that change nothing else."""
    previous = seen.previous
    if previous is None:
        return True
    before = previous.get("metadata") or {}
    after = obj.get("metadata") or {}
    for field in ("generation", "labels", "deletionTimestamp"):
        if before.get(field) != after.get(field):
            return True
    return _kept_annotations(before) != _kept_annotations(after)


def _kept_annotations(metadata: Mapping[str, Any]) -> dict[str, Any]:
    found = metadata.get("annotations") or {}
    return {k: v for k, v in found.items() if k not in DROPPED_ANNOTATIONS}
