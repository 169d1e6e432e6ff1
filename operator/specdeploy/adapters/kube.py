"""The operator's only door to the Kubernetes API: reads, server-side apply, scale, delete.

Every write goes through `KubeAdapter`, which counts the non-GET requests it sends and logs each
one (`api write: PATCH /apis/...`), so a steady cluster can be shown to receive none. Whether a
write is needed is decided in plan/ (plan.children.drift), never here.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ConflictError, NotFoundError, ResourceNotFoundError

from specdeploy import GROUP, VERSION
from specdeploy.adapters import watch_cache as wc
from specdeploy.api import labels
from specdeploy.api.models import PLURAL

FIELD_MANAGER = "specdeploy"
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
KUEUE_GROUP = "kueue.x-k8s.io"
POD_MONITOR_CRD = "podmonitors.monitoring.coreos.com"
LWS_CRD = "leaderworkersets.leaderworkerset.x-k8s.io"
#: What a kind the API server does not serve raises: unknown to discovery, or (its CRD just
#: deleted, discovery not yet read again) a 404 for its collection.
NOT_SERVED = (ResourceNotFoundError, NotFoundError)
#: Objects per page of the LISTs that fill the watch-fed stores, answered as JSON (what the
#: kubernetes client asks for by default).
LIST_PAGE = 100
JSON = "application/json"
#: The stores' check asks for the objects' metadata alone (KubeAdapter._listed_keys), in pages
#: of CHECK_PAGE objects: one request up to that many, and about 4 MB at most to decode at once
#: (a pod's metadata is 2 to 4 KB, most of it managedFields).
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
CHECK_PAGE = 1000

#: What the API server answers a write it will refuse again however often it is sent: a body
#: it cannot read (400) or an object that fails validation or admission (422).
REFUSED_FOR_GOOD = frozenset({400, 422})

log = logging.getLogger("specdeploy.kube")

#: RFC 6902: a list of operations, a `test` among them.
JSON_PATCH = "application/json-patch+json"
#: (connect, read) seconds after which a request the operator sends gives up: a call that hangs
#: (an API server gone quiet, a partition) fails rather than holding a worker, or the Lease's
#: renewal, for ever.
REQUEST_TIMEOUT = (5.0, 30.0)


class NotLeadingError(Exception):
    """A write not sent: this process no longer holds its Lease (KubeAdapter.fence)."""


def with_timeout(
    api_client: client.ApiClient, timeout: float | tuple[float, float] = REQUEST_TIMEOUT
) -> client.ApiClient:
    """`api_client`, every request of which gives up after `timeout` unless the call names its
    own (`_request_timeout`). The client has no default of its own: without one a request waits
    as long as the connection stays open."""
    rest = api_client.rest_client
    send = rest.request

    def bounded(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = timeout
        return send(method, url, *args, **kwargs)  # type: ignore[no-untyped-call]

    rest.request = bounded  # type: ignore[method-assign]
    return api_client


class WriteRefusedError(Exception):
    """The API server refused a child write for good (400 or 422): retrying cannot help."""

    def __init__(self, code: int, kind: str, name: str, message: str) -> None:
        super().__init__(f"{kind} {name}: {code}: {message}")
        self.code = code
        self.kind = kind
        self.name = name
        self.message = message


def _api_message(error: ApiException) -> str:
    """The API server's own message (its Status object's), else the HTTP reason."""
    try:
        status = json.loads(error.body or "")
    except (TypeError, ValueError):
        status = None
    message = status.get("message") if isinstance(status, dict) else None
    return message if isinstance(message, str) else str(error.reason or "")


def _as_dict(_client: Any, data: dict[str, Any]) -> dict[str, Any]:
    """The dynamic client's answer as the parsed JSON itself: its ResourceInstance wrapping and
    `to_dict` only spend CPU on the way back to the same dict."""
    return data


@contextlib.contextmanager
def _refusals(kind: str, name: str) -> Iterator[None]:
    """Turns a 400/422 answer to a write into WriteRefusedError; other errors pass unchanged."""
    try:
        yield
    except ApiException as error:
        if error.status in REFUSED_FOR_GOOD:
            raise WriteRefusedError(int(error.status), kind, name, _api_message(error)) from error
        raise


class KubeAdapter:
    """Typed-enough access to the objects the operator reads and writes, as plain dicts."""

    def __init__(
        self,
        api_client: client.ApiClient,
        on_write: Callable[[], None] | None = None,
        cache: wc.WatchCache | None = None,
        fence: Callable[[], bool] | None = None,
    ) -> None:
        self.api_client = with_timeout(api_client)
        self.write_requests = 0
        self.on_write = on_write
        # Whether this process may write (it holds its Lease: LeaseElector.leads); checked
        # before every write, so a reconcile running when the Lease is lost stops at its next
        # write. None: always (no leader election).
        self.fence = fence
        # Watch-fed copies the reads come from once synced (adapters.watch_cache); None reads
        # the API server every time.
        self.cache = cache
        self._lock = threading.Lock()
        # The client's discovery cache is not safe across threads: looking up a kind it does
        # not serve drops and reloads it, and a lookup beside that fails (KeyError 'resources').
        self._discovery = threading.Lock()
        self._count_writes()
        self.dynamic = DynamicClient(api_client)  # type: ignore[no-untyped-call]
        # The client keeps API discovery in a file shared by every process; a kind removed
        # since (a CRD uninstalled) would still look served.
        self.dynamic.resources.invalidate_cache()

    @classmethod
    def from_environment(cls, on_write: Callable[[], None] | None = None) -> KubeAdapter:
        """In-cluster credentials when running in a pod, else the KUBECONFIG context;
        `on_write` is called for each non-GET request."""
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        return cls(client.ApiClient(), on_write)

    def _count_writes(self) -> None:
        rest = self.api_client.rest_client
        send = rest.request

        def counted(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            if method.upper() not in READ_METHODS:
                path = url.split("://", 1)[-1].split("/", 1)[-1].split("?", 1)[0]
                if self.fence is not None and not self.fence():
                    log.warning("api write not sent: %s /%s: not leading", method.upper(), path)
                    raise NotLeadingError(f"{method.upper()} /{path}: this process is not leading")
                with self._lock:
                    self.write_requests += 1
                    total = self.write_requests
                log.info("api write: %s /%s (total %d)", method.upper(), path, total)
                if self.on_write is not None:
                    self.on_write()
            return send(method, url, *args, **kwargs)  # type: ignore[no-untyped-call]

        rest.request = counted  # type: ignore[method-assign]

    # --- reads -------------------------------------------------------------------------------

    def _resource(self, api_version: str, kind: str) -> Any:
        return self._lookup(api_version=api_version, kind=kind)

    def _lookup(self, **query: Any) -> Any:
        """The dynamic client's resource for `query`, one lookup at a time."""
        with self._discovery:
            return self.dynamic.resources.get(**query)

    def _get(self, api_version: str, kind: str, name: str, namespace: str | None) -> Any:
        try:
            found = self._resource(api_version, kind).get(name=name, namespace=namespace)
        except NotFoundError:
            return None
        return found.to_dict()

    def _list(
        self, api_version: str, kind: str, namespace: str | None, selector: str | None = None
    ) -> list[dict[str, Any]]:
        found = self._resource(api_version, kind).get(namespace=namespace, label_selector=selector)
        items: list[dict[str, Any]] = found.to_dict().get("items") or []
        return items

    def _pages(
        self, kind: wc.Kind, namespace: str | None, limit: int, accept: str = JSON
    ) -> Iterator[tuple[dict[str, Any], int]]:
        """One LIST of a cached kind as its store lists it, page by page (`limit` objects each,
        so that a large kind is never held whole): each page as the API server answered it,
        and the LIST's resourceVersion (its first page's: one snapshot)."""
        resource = self._kind_resource(kind)
        token: str | None = None
        version: int | None = None
        while True:
            # Unserialized: json.loads of a page is many times faster than the dynamic
            # client's ResourceInstance and to_dict.
            raw = resource.get(
                namespace=namespace,
                label_selector=self._store_selector(kind),
                limit=limit,
                _continue=token,
                serialize=False,
                header_params={"Accept": accept},
            )
            found: dict[str, Any] = json.loads(raw.data)
            if version is None:
                version = wc.version_of(found)
            yield found, version
            token = (found.get("metadata") or {}).get("continue") or None
            if token is None:
                return

    def _list_kind(
        self, kind: wc.Kind, namespace: str | None
    ) -> Iterator[tuple[list[dict[str, Any]], int]]:
        """One LIST of a cached kind, in pages of LIST_PAGE objects: each page's items and the
        LIST's resourceVersion."""
        for found, version in self._pages(kind, namespace, LIST_PAGE):
            items: list[dict[str, Any]] = found.get("items") or []
            for item in items:
                # A LIST's items carry no apiVersion and kind (a watch event's and a GET's
                # do), and plan.children.drift compares them with the desired manifest's.
                item.setdefault("apiVersion", found.get("apiVersion"))
                item.setdefault("kind", kind.kind)
            yield items, version

    def _listed_keys(self, kind: wc.Kind, namespace: str | None) -> tuple[set[wc.Key], int]:
        """The (namespace, name) of every object a LIST of `kind` in `namespace` holds, as its
        store lists it, and the LIST's resourceVersion: the objects' metadata alone
        (PartialObjectMetadataList, as client-go's metadata informers ask), in pages of
        CHECK_PAGE objects, so one request up to that many."""
        keys: set[wc.Key] = set()
        version = -1
        for found, listed_at in self._pages(kind, namespace, CHECK_PAGE, METADATA_LIST):
            keys.update(wc.key_of(item) for item in found.get("items") or [])
            version = listed_at
        return keys, version

    def _kind_resource(self, kind: wc.Kind) -> Any:
        if kind.api_version is not None:
            return self._resource(kind.api_version, kind.kind)
        return self._lookup(group=kind.group, kind=kind.kind, preferred=True)

    @staticmethod
    def _store_selector(kind: wc.Kind) -> str | None:
        """What a LIST for the store of `kind` asks for: a labelled store keeps only the
        objects that carry `specdeploy.dev/name` (the other Deployments, Services and pods of
        a namespace are never read)."""
        return labels.NAME if kind.labelled else None

    def _cached(
        self,
        kind: wc.Kind,
        reader: Callable[[wc.KindStore], Any],
        fallback: Callable[[], Any],
    ) -> Any:
        """`reader` on the watch-fed store of `kind`, or `fallback` (an API read) without one."""
        if self.cache is None:
            return fallback()
        return self.cache.read(kind, lambda scope: self._list_kind(kind, scope), reader, fallback)

    def refresh_kind(self, kind: wc.Kind) -> list[dict[str, Any]]:
        """Lists `kind` afresh into its store and removes what the LIST no longer holds, while
        reads go on from the store (the start, and a relist after a watch gap); returns the
        copies it removed. A kind no longer served empties its store; another failure raises
        and keeps it."""
        if self.cache is None:
            return []
        try:
            return self.cache.refresh(kind, functools.partial(self._list_kind, kind))
        except NOT_SERVED:
            # Not served (any more), by discovery or by the LIST's 404: none of it exists.
            return self.cache.store(kind).vanish()

    def kind_is_stale(self, kind: wc.Kind) -> bool:
        """Whether the store of `kind` holds objects the API server no longer has
        (WatchCache.needs_relist), asked with one LIST of the objects' metadata per scope the
        store holds anything in. A kind no longer served is stale (refresh_kind empties it)."""
        if self.cache is None:
            return False
        try:
            return self.cache.needs_relist(kind, functools.partial(self._listed_keys, kind))
        except NOT_SERVED:
            return True

    def get_speculative_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The SpeculativeDeployment as stored, or None when it is gone."""
        found: dict[str, Any] | None = self._cached(
            wc.SD,
            lambda store: store.get(namespace, name),
            lambda: self._get(f"{GROUP}/{VERSION}", "SpeculativeDeployment", name, namespace),
        )
        return found

    def list_speculative_deployments(self, namespaces: list[str]) -> list[tuple[str, str]]:
        """(namespace, name) of every SpeculativeDeployment in `namespaces` (all when empty)
        not being deleted."""
        scopes: list[str | None] = list(namespaces) or [None]
        found: list[tuple[str, str]] = self._cached(
            wc.SD,
            lambda store: [key for scope in scopes for key in store.names(scope)],
            lambda: [
                (item["metadata"]["namespace"], item["metadata"]["name"])
                for scope in scopes
                for item in self._list(f"{GROUP}/{VERSION}", "SpeculativeDeployment", scope)
                if not item["metadata"].get("deletionTimestamp")
            ],
        )
        return found

    def list_gpu_nodes(self) -> list[dict[str, Any]]:
        """Every Node; sizing reads the GPU ones. From the cache these are the stored objects
        themselves, to be read only."""
        found: list[dict[str, Any]] = self._cached(
            wc.NODES,
            lambda store: store.in_namespace(None, shared=True),
            lambda: self._list("v1", "Node", None),
        )
        return found

    def _owned(self, kind: wc.Kind, namespace: str, selector: str) -> list[dict[str, Any]]:
        """Objects of a labelled kind matching `selector`: from the store when the selector is
        the one the reconcile uses (`specdeploy.dev/name=<sd>`), else from the API server."""
        assert kind.api_version is not None
        api_version = kind.api_version
        key, _, owner = selector.partition("=")
        if key != labels.NAME or not owner or "," in owner or owner.startswith("="):
            return self._list(api_version, kind.kind, namespace, selector)
        found: list[dict[str, Any]] = self._cached(
            kind,
            lambda store: store.owned(namespace, owner),
            lambda: self._list(api_version, kind.kind, namespace, selector),
        )
        return found

    def list_deployments(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self._owned(wc.DEPLOYMENTS, namespace, selector)

    def list_leader_worker_sets(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """LeaderWorkerSets matching `selector`; empty when the kind is not served (the LWS
        controller and its CRD not installed)."""
        try:
            return self._owned(wc.LEADER_WORKER_SETS, namespace, selector)
        except ResourceNotFoundError:
            return []

    def serves_leader_worker_sets(self) -> bool:
        """Whether the LeaderWorkerSet CRD is installed and established (read from the CRD
        store, so a cluster without it costs no API discovery on every reconcile)."""
        return self._crd_established(LWS_CRD)

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self._owned(wc.PODS, namespace, selector)

    def list_workloads(self, namespace: str) -> list[dict[str, Any]]:
        """Kueue Workloads of the namespace; empty when Kueue is not installed."""
        found: list[dict[str, Any]] = self._cached(
            wc.WORKLOADS,
            lambda store: store.in_namespace(namespace),
            lambda: self._list_workloads(namespace),
        )
        return found

    def _list_workloads(self, namespace: str) -> list[dict[str, Any]]:
        try:
            resource = self._lookup(group=KUEUE_GROUP, kind="Workload", preferred=True)
        except ResourceNotFoundError:
            return []
        items: list[dict[str, Any]] = resource.get(namespace=namespace).to_dict().get("items") or []
        return items

    def _get_kueue(self, kind: str, name: str, namespace: str | None) -> dict[str, Any] | None:
        try:
            resource = self._lookup(group=KUEUE_GROUP, kind=kind, preferred=True)
            found: dict[str, Any] = resource.get(name=name, namespace=namespace).to_dict()
        except (ResourceNotFoundError, NotFoundError):
            return None
        return found

    def get_local_queue(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Kueue LocalQueue, or None when it (or Kueue) does not exist."""
        found: dict[str, Any] | None = self._cached(
            wc.LOCAL_QUEUES,
            lambda store: store.get(namespace, name),
            lambda: self._get_kueue("LocalQueue", name, namespace),
        )
        return found

    def get_workload_priority_class(self, name: str) -> dict[str, Any] | None:
        """The Kueue WorkloadPriorityClass (cluster-scoped), or None when it (or Kueue) does
        not exist."""
        found: dict[str, Any] | None = self._cached(
            wc.PRIORITY_CLASSES,
            lambda store: store.get("", name),
            lambda: self._get_kueue("WorkloadPriorityClass", name, None),
        )
        return found

    def has_pod_monitor_crd(self) -> bool:
        """Whether the Prometheus Operator's PodMonitor CRD is installed and established."""
        return self._crd_established(POD_MONITOR_CRD)

    def _crd_established(self, name: str) -> bool:
        crd = self._cached(
            wc.CRDS,
            lambda store: store.get("", name),
            lambda: self._get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name, None),
        )
        if crd is None or (crd.get("metadata") or {}).get("deletionTimestamp"):
            return False
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

    def read_kueue_webhooks(self, workload_crd: str) -> tuple[list[dict[str, Any]], bool]:
        """The MutatingWebhookConfigurations of the cluster and whether Kueue's Workload CRD
        (`workload_crd`) exists: what plan.placement.kueue reads to tell whether Kueue manages
        pods and Deployments (one LIST and one GET, at the start and at each cache resync)."""
        configurations = self._list(
            "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", None
        )
        crd = self._get("apiextensions.k8s.io/v1", "CustomResourceDefinition", workload_crd, None)
        return configurations, crd is not None

    # --- writes ------------------------------------------------------------------------------

    def apply(self, manifest: Mapping[str, Any]) -> None:
        """Server-side applies `manifest` as field manager `specdeploy`, taking over any field
        another manager changed (plan.children.drift decides whether a write is needed at all).
        WriteRefusedError when the API server refuses it for good (400/422)."""
        body = json.loads(json.dumps(manifest))
        resource = self._resource(body["apiVersion"], body["kind"])
        with _refusals(body["kind"], body["metadata"]["name"]):
            applied = resource.server_side_apply(
                body=body,
                name=body["metadata"]["name"],
                namespace=body["metadata"].get("namespace"),
                field_manager=FIELD_MANAGER,
                force_conflicts=True,
                serializer=_as_dict,
            )
        self._write_through(body["apiVersion"], body["kind"], applied)

    def create(self, manifest: Mapping[str, Any]) -> bool:
        """Creates `manifest`; False when an object of that name is already there (409);
        WriteRefusedError when the API server refuses it for good (400/422)."""
        resource = self._resource(manifest["apiVersion"], manifest["kind"])
        try:
            with _refusals(manifest["kind"], manifest["metadata"]["name"]):
                created = resource.create(
                    body=dict(manifest),
                    namespace=manifest["metadata"].get("namespace"),
                    field_manager=FIELD_MANAGER,
                    serializer=_as_dict,
                )
        except ConflictError:
            return False
        self._write_through(manifest["apiVersion"], manifest["kind"], created)
        return True

    def _write_through(self, api_version: str, kind: str, answer: Any) -> None:
        """Stores the API server's answer to a write in the watch-fed store of its kind."""
        store = self.cache.for_write(api_version, kind) if self.cache is not None else None
        if store is not None and answer is not None:
            store.write_through(answer.to_dict() if hasattr(answer, "to_dict") else answer)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any:
        """One object as a dict, or None (from the watch-fed store of an SD's Service or
        PodMonitor; Secrets and other kinds from the API server)."""
        cached = _CACHED_GETS.get((api_version, kind))
        if cached is None:
            return self._get(api_version, kind, name, namespace)
        return self._cached(
            cached,
            lambda store: store.get(namespace, name),
            lambda: self._get(api_version, kind, name, namespace),
        )

    def live_object(
        self, api_version: str, kind: str, namespace: str, name: str
    ) -> dict[str, Any] | None:
        """The object of that name as the API server holds it, whoever made it: the watch-fed
        store's copy when the store of its kind holds it (the operator's labelled children),
        else one GET (an object without the labels is in no store). Read before a child is
        written, to see whose it is (plan.children.ownership)."""
        store = self.cache.for_write(api_version, kind) if self.cache is not None else None
        held = store.get(namespace, name) if store is not None else None
        if held is not None:
            return held
        found: dict[str, Any] | None = self._get(api_version, kind, name, namespace)
        return found

    def list_objects(
        self, api_version: str, kind: str, namespace: str, selector: str
    ) -> list[dict[str, Any]]:
        """Objects of one kind in a namespace matching a label selector."""
        cached = _CACHED_LISTS.get((api_version, kind))
        if cached is None:
            return self._list(api_version, kind, namespace, selector)
        return self._owned(cached, namespace, selector)

    def scale_deployment(self, namespace: str, name: str, replicas: int) -> None:
        """Sets a Deployment's replicas through its scale subresource (with the dynamic client:
        the generated AppsV1Api module holds 9 MiB once imported)."""
        scale_resource = self._resource("apps/v1", "Deployment").subresources["scale"]
        with _refusals("Deployment", name):
            scale = scale_resource.patch(
                body={"spec": {"replicas": replicas}},
                name=name,
                namespace=namespace,
                content_type="application/merge-patch+json",
                field_manager=FIELD_MANAGER,
                serializer=_as_dict,
            )
        store = self.cache.store(wc.DEPLOYMENTS) if self.cache is not None else None
        held = store.get(namespace, name) if store is not None else None
        version = ((scale or {}).get("metadata") or {}).get("resourceVersion")
        if store is not None and held is not None and version:
            # The Scale's resourceVersion is its Deployment's after the write.
            held.setdefault("spec", {})["replicas"] = replicas
            held.setdefault("metadata", {})["resourceVersion"] = str(version)
            store.write_through(held)

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        """Deletes an object (dependents in the background); gone already is fine."""
        with contextlib.suppress(NotFoundError):
            self._resource(api_version, kind).delete(
                name=name, namespace=namespace, propagation_policy="Background"
            )
        store = self.cache.for_write(api_version, kind) if self.cache is not None else None
        if store is not None:
            store.forget(namespace, name)

    def set_pod_condition(
        self, namespace: str, name: str, condition_type: str, reason: str, message: str
    ) -> None:
        """Sets one condition True on a pod's status (a readiness gate), by strategic merge:
        kubelet's own conditions are kept. A pod gone meanwhile is fine."""
        condition = {
            "type": condition_type,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        # With the dynamic client, as the scale: the generated CoreV1Api module holds 17 MiB.
        status = self._resource("v1", "Pod").subresources["status"]
        try:
            patched = status.patch(
                body={"status": {"conditions": [condition]}},
                name=name,
                namespace=namespace,
                content_type="application/strategic-merge-patch+json",
                field_manager=FIELD_MANAGER,
                serializer=_as_dict,
            )
        except NotFoundError:
            return
        if self.cache is not None:
            store = self.cache.for_write("v1", "Pod")
            if store is not None and patched:
                store.write_through(patched)

    def patch_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Merge-patches (RFC 7386) the SpeculativeDeployment's status subresource: a None
        value removes its key."""
        patched = client.CustomObjectsApi(self.api_client).patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": dict(patch)}
        )
        if self.cache is not None and isinstance(patched, dict):
            # Only an SD the store still holds: a deletion seen meanwhile stays seen.
            self.cache.store(wc.SD).write_through(patched, only_known=True)

    def remove_annotation(self, namespace: str, name: str, key: str, value: str) -> bool:
        """Removes the SpeculativeDeployment's annotation `key` if it still holds `value` (a
        JSON patch whose test fails, 422, changes nothing); whether it was removed."""
        path = "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")
        patch = [{"op": "test", "path": path, "value": value}, {"op": "remove", "path": path}]
        try:
            patched = client.CustomObjectsApi(self.api_client).patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, patch, _content_type=JSON_PATCH
            )
        except ApiException as error:
            if error.status in (404, 422):
                return False
            raise
        if self.cache is not None and isinstance(patched, dict):
            self.cache.store(wc.SD).write_through(patched, only_known=True)
        return True


# Kinds `get` and `list_objects` serve from the watch-fed stores (the SD's own children).
_CACHED_GETS = {
    ("v1", "Service"): wc.SERVICES,
    ("monitoring.coreos.com/v1", "PodMonitor"): wc.POD_MONITORS,
}
_CACHED_LISTS = {("apps/v1", "ControllerRevision"): wc.RECORDS}
