"""Watch-fed, in-memory copies of what a reconcile reads, so that an idle operator's API reads
do not grow with the number of SpeculativeDeployments.

One `KindStore` per kind holds stripped copies (no managedFields, no last-applied annotations)
keyed by (namespace, name) and indexed by the `specdeploy.dev/name` label. kopf's watch
handlers feed it (`WatchCache.observe`, handlers.run), the adapter's own writes feed it their
answers (`KindStore.write_through`), and a store counts as synced only once one LIST of the
kind filled it (`KindStore.prime`): until then, and after each `WatchCache.expire` (a rare
resync that bounds the effect of a missed event), `KubeAdapter` reads the API server instead.
Pure: no I/O here.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from specdeploy import GROUP, VERSION
from specdeploy.api import labels

Key = tuple[str, str]
Obj = dict[str, Any]

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
) -> Obj:
    """A copy of `obj` without the fields the reconcile never reads and that make up most of
    an object's size (managedFields and last-applied annotations); with `keep`, only those
    top-level fields (a CRD's schema is never read, only its status), with `keep_spec` only
    those fields of its spec (of a pod, the reconcile reads its scheduling gates only)."""
    stripped = copy.deepcopy(
        {
            k: (
                {f: x for f, x in v.items() if f in keep_spec}
                if k == "spec" and keep_spec and isinstance(v, Mapping)
                else v
            )
            for k, v in obj.items()
            if keep is None or k in keep
        }
    )
    metadata = stripped.get("metadata")
    if isinstance(metadata, dict):
        metadata.pop("managedFields", None)
        annotations = metadata.get("annotations")
        if isinstance(annotations, dict):
            for key in DROPPED_ANNOTATIONS & annotations.keys():
                del annotations[key]
    return stripped


def _key(obj: Mapping[str, Any]) -> Key:
    metadata = obj.get("metadata") or {}
    return (metadata.get("namespace") or "", metadata.get("name") or "")


def _version(obj: Mapping[str, Any]) -> int:
    """The object's resourceVersion as a number; -1 when it has none or is not a number (the
    API server's versions are numbers in practice, and etcd's revisions grow)."""
    raw = (obj.get("metadata") or {}).get("resourceVersion") or ""
    return int(raw) if str(raw).isdigit() else -1


def _owner_label(obj: Mapping[str, Any]) -> str | None:
    found = ((obj.get("metadata") or {}).get("labels") or {}).get(labels.NAME)
    return found if isinstance(found, str) else None


class KindStore:
    """The stripped objects of one kind. `labelled` keeps only objects that carry the
    `specdeploy.dev/name` label (the children and pods of SDs); the others keep every object.
    Thread-safe: kopf's event loop writes while reconcile threads read."""

    def __init__(
        self,
        *,
        labelled: bool = False,
        keep: frozenset[str] | None = None,
        keep_spec: frozenset[str] | None = None,
    ) -> None:
        self.labelled = labelled
        self.keep = keep
        self.keep_spec = keep_spec
        self._objects: dict[Key, Obj] = {}
        self._by_owner: dict[Key, set[str]] = {}
        self._synced = False
        self._lock = threading.Lock()
        self.priming = threading.Lock()

    @property
    def synced(self) -> bool:
        return self._synced

    def expire(self) -> None:
        """Marks the store unsynced: the next read goes to the API server and primes it."""
        self._synced = False

    def observe(self, event_type: str | None, obj: Mapping[str, Any]) -> None:
        """One watch event: DELETED removes, anything else (ADDED, MODIFIED, the initial
        listing's None) stores the object unless the store holds a newer version of it."""
        if event_type == "DELETED":
            with self._lock:
                self._remove(_key(obj))
            return
        self._upsert(obj, newer_only=True)

    def write_through(self, obj: Mapping[str, Any], *, only_known: bool = False) -> None:
        """The API server's answer to one of our writes, so that a reconcile right after it
        sees it before its watch event comes. `only_known` leaves out objects the store does
        not hold (a status patch must not bring back an SD whose deletion came first)."""
        if only_known and _key(obj) not in self._objects:
            return
        self._upsert(obj, newer_only=True)

    def forget(self, namespace: str, name: str) -> None:
        """Our own delete: the object is gone (or going) whatever the watch says later."""
        with self._lock:
            self._remove((namespace, name))

    def prime(
        self, items: Iterable[Mapping[str, Any]], scopes: Iterable[str | None], version: int
    ) -> None:
        """Replaces the contents of `scopes` (namespaces; None for all) with the items of
        LISTs made at resourceVersion `version` (the oldest when several) and marks the store
        synced. What a watch event brought after that LIST (a newer object, one created
        since) stays."""
        listed = {_key(item): item for item in items}
        wanted = set(scopes)
        with self._lock:
            for key, held in list(self._objects.items()):
                in_scope = None in wanted or key[0] in wanted
                if in_scope and key not in listed and _version(held) <= version:
                    self._remove(key)
        for item in listed.values():
            self._upsert(item, newer_only=True)
        self._synced = True

    def _upsert(self, obj: Mapping[str, Any], *, newer_only: bool) -> None:
        key = _key(obj)
        owner = _owner_label(obj)
        if self.labelled and owner is None:
            with self._lock:
                self._remove(key)  # the label was taken off: no SD's child any more
            return
        stripped = strip(obj, self.keep, self.keep_spec)
        with self._lock:
            held = self._objects.get(key)
            if held is not None and newer_only and _version(held) > _version(stripped):
                return
            self._remove(key)
            self._objects[key] = stripped
            if owner is not None:
                self._by_owner.setdefault((key[0], owner), set()).add(key[1])

    def _remove(self, key: Key) -> None:
        held = self._objects.pop(key, None)
        owner = _owner_label(held) if held is not None else None
        if owner is not None:
            names = self._by_owner.get((key[0], owner), set())
            names.discard(key[1])
            if not names:
                self._by_owner.pop((key[0], owner), None)

    def get(self, namespace: str, name: str) -> Obj | None:
        """A copy of one object, or None."""
        with self._lock:
            held = self._objects.get((namespace, name))
            return copy.deepcopy(held) if held is not None else None

    def owned(self, namespace: str, owner: str) -> list[Obj]:
        """Copies of the objects labelled `specdeploy.dev/name=<owner>` in `namespace`."""
        with self._lock:
            names = sorted(self._by_owner.get((namespace, owner), ()))
            return [copy.deepcopy(self._objects[(namespace, n)]) for n in names]

    def in_namespace(self, namespace: str | None, *, shared: bool = False) -> list[Obj]:
        """Copies of every object of `namespace` (all when None). `shared` hands out the
        stored objects themselves, for a caller that only reads them (the store replaces an
        object on each event, never changes one in place): every reconcile reads every node,
        and copying them all each time was most of a reconcile's cost."""
        with self._lock:
            return [
                obj if shared else copy.deepcopy(obj)
                for key, obj in sorted(self._objects.items())
                if namespace is None or key[0] == namespace
            ]

    def keys(self) -> list[Key]:
        with self._lock:
            return sorted(self._objects)

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
NODES = Kind("nodes", "v1", None, "Node", False, False, ("", "v1", "nodes"))
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

    def __init__(self, namespaces: Iterable[str] = ()) -> None:
        self.namespaces = list(namespaces)
        self.stores = {
            kind.name: KindStore(labelled=kind.labelled, keep=kind.keep, keep_spec=kind.keep_spec)
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

    def observe(self, kind: Kind, event_type: str | None, obj: Mapping[str, Any]) -> None:
        self.store(kind).observe(event_type, obj)

    def expire(self) -> None:
        """Marks every store unsynced (the periodic resync)."""
        for store in self.stores.values():
            store.expire()

    def for_write(self, api_version: str, kind_name: str) -> KindStore | None:
        """The store that holds objects of this apiVersion and kind, if one does."""
        group = api_version.rpartition("/")[0] if "/" in api_version else ""
        for kind in KINDS:
            if kind.kind != kind_name:
                continue
            if kind.api_version == api_version or (kind.group is not None and kind.group == group):
                return self.store(kind)
        return None

    def refresh(self, kind: Kind, lister: Callable[[str | None], tuple[list[Obj], int]]) -> None:
        """Lists `kind` afresh into its store while it stays synced (reads go on meanwhile);
        when the LIST fails the store is marked unsynced, so reads fall back to the API."""
        scopes = self.scopes(kind)
        try:
            lists = [lister(scope) for scope in scopes]
        except Exception:
            self.store(kind).expire()
            return
        items = [item for found, _ in lists for item in found]
        self.store(kind).prime(items, scopes, min(version for _, version in lists))

    def read(
        self,
        kind: Kind,
        lister: Callable[[str | None], tuple[list[Obj], int]],
        reader: Callable[[KindStore], Any],
        fallback: Callable[[], Any],
    ) -> Any:
        """`reader` on the store of `kind` once it is synced. An unsynced store is primed
        first with `lister` (one LIST per scope: its items and resourceVersion); when that
        LIST fails (the kind is not served, or not permitted), `fallback` reads the API
        server as before."""
        store = self.store(kind)
        if not store.synced:
            with store.priming:
                if not store.synced:
                    scopes = self.scopes(kind)
                    try:
                        lists = [lister(scope) for scope in scopes]
                    except Exception:
                        self.misses += 1
                        return fallback()
                    items = [item for found, _ in lists for item in found]
                    store.prime(items, scopes, min(version for _, version in lists))
        self.hits += 1
        return reader(store)
