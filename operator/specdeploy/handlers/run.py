"""`specdeploy operator run`: the kopf wiring around `Reconciler`.

kopf is the watch machinery and nothing more: for each kind the reconcile reads (SDs, their
revision Deployments and records, Services, PodMonitors, pods, nodes, Kueue's objects, CRDs)
one raw-event handler (`route_event`) puts each event into the kind's watch-fed store and the
SDs it concerns onto the work queue (handlers.work_queue). At the start one LIST of our own
fills each store (`fill_stores`), every SD goes onto the queue, and only then do the workers
take SDs off it and reconcile them (handlers.workers), as client-go's controllers wait for
their informers' caches; the periodic round and each SD's next verdict (plan.rollout.wakeup)
add to the same queue. No handler is a create/update/resume handler, so kopf keeps no progress
or diff base on the objects and writes nothing to them.

No handler needs a finalizer, so none is set (kopf removes the `specdeploy.dev/finalizer` an
older operator left): SDs and their namespaces can be deleted while the operator is not
running, and owner references let the garbage collector delete the children. kopf's timers
always set one, hence the periodic round of our own rather than `kopf.timer`.

With `leaderElection.enabled` the process first takes a Lease (handlers.leadership) and runs
kopf and the workers only while it holds it. The config comes from a file
(`--config PATH`) or a ConfigMap (`--config configmap:<namespace>/<name>`, key `config.yaml`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import queue
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import kopf
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from specdeploy.adapters import watch_cache
from specdeploy.adapters.kube import LIST_PAGE, REQUEST_TIMEOUT, KubeAdapter, with_timeout
from specdeploy.adapters.metrics import OperatorMetrics
from specdeploy.api import labels
from specdeploy.api.config import OperatorConfig
from specdeploy.handlers.leadership import LeaseElector, default_identity, serve_standby_probe
from specdeploy.handlers.logs import configure_logging
from specdeploy.handlers.reconcile import Reconciler
from specdeploy.handlers.work_queue import Backoff, WorkQueue
from specdeploy.handlers.workers import (
    RECONCILE_WORKERS,
    SDKey,
    call_every,
    check_stores,
    confirm_first_listings,
    enqueue_every_round,
    reconcile_from,
    relist_from,
)
from specdeploy.plan.rollout.revisions import pod_is_ready
from specdeploy.plan.status.pair_check import shows_launcher_exit

FINALIZER = "specdeploy.dev/finalizer"
ANNOTATION_PREFIX = "specdeploy.dev"
CONFIGMAP_PREFIX = "configmap:"
CONFIGMAP_KEY = "config.yaml"
EVENT_SOURCE = "specdeploy"
#: How often Kueue's webhooks are looked at again after the start (Reconciler.check_kueue).
KUEUE_RECHECK_SECONDS = 300.0

log = logging.getLogger("specdeploy.operator")


def load_config(source: str | None, kube: KubeAdapter | None = None) -> OperatorConfig:
    """The operator config from a YAML file, a ConfigMap (`configmap:<ns>/<name>`), or defaults."""
    if not source:
        return OperatorConfig()
    if source.startswith(CONFIGMAP_PREFIX):
        namespace, _, name = source.removeprefix(CONFIGMAP_PREFIX).partition("/")
        if kube is None:
            raise ValueError("reading a ConfigMap needs a cluster connection")
        configmap = kube.get("v1", "ConfigMap", namespace, name)
        if configmap is None:
            raise ValueError(f"ConfigMap {namespace}/{name} not found")
        text = (configmap.get("data") or {}).get(CONFIGMAP_KEY, "")
    else:
        text = Path(source).read_text()
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{source}: the operator config must be a mapping")
    return OperatorConfig.from_mapping(data)


#: How long kopf keeps an object's worker task after its last event (kopf's default is 5 s).
WORKER_IDLE_SECONDS = 0.5
#: (namespace, Event) -> the POST of one Event.
CreateEvent = Callable[[str, dict[str, Any]], object]
#: Events waiting to be posted at most; beyond it new ones are dropped (and logged).
EVENT_BACKLOG = 1000


class EventPoster:
    """Posts Kubernetes Events about an SD (what `kubectl describe sd` shows), in order, from a
    thread of its own: a reconcile hands its Events over and ends without waiting for their
    POSTs, which would hold the SD's next reconcile back (Events are best effort).

    Written here rather than with `kopf.event`, which only works inside kopf's own handlers: the
    reconciles run outside them. Its own API client, as kopf's was: Events are not counted as
    reconcile writes. A failure to post is logged, never raised; `close` posts what is waiting.
    """

    def __init__(
        self,
        create: CreateEvent,
        instance: str,
        backlog: int = EVENT_BACKLOG,
        on_drop: Callable[[], object] = lambda: None,
    ) -> None:
        self.create = create
        self.instance = instance
        self.on_drop = on_drop
        self._waiting: queue.Queue[dict[str, Any] | None] = queue.Queue(backlog)
        self._thread = threading.Thread(target=self._post_each, name="events", daemon=True)
        self._thread.start()

    def __call__(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        metadata = body.get("metadata") or {}
        namespace = metadata.get("namespace", "")
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{metadata.get('name', 'sd')}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": body.get("apiVersion"),
                "kind": body.get("kind"),
                "name": metadata.get("name"),
                "namespace": namespace,
                "uid": metadata.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": EVENT_SOURCE},
            "reportingComponent": EVENT_SOURCE,
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self._waiting.put_nowait(event)
        except queue.Full:
            self.on_drop()
            log.warning("event %s about %s/%s dropped: too many waiting", reason, namespace,
                        metadata.get("name"))  # fmt: skip

    def close(self, timeout: float = 5.0) -> None:
        """Posts the Events still waiting (for at most `timeout` seconds), then stops."""
        with contextlib.suppress(queue.Full):
            self._waiting.put(None, timeout=timeout)
        self._thread.join(timeout)

    def _post_each(self) -> None:
        while (event := self._waiting.get()) is not None:
            namespace = event["metadata"]["namespace"]
            try:
                self.create(namespace, event)
            except (ApiException, OSError) as error:
                log.warning(
                    "event %s about %s/%s not posted: %s",
                    event["reason"],
                    namespace,
                    event["involvedObject"]["name"],
                    error,
                )


def event_creator(api_client: client.ApiClient) -> CreateEvent:
    """Creates Events through the dynamic client: the generated CoreV1Api module alone holds
    17 MiB once imported, and the operator needs one call of it."""
    events = DynamicClient(api_client).resources.get(api_version="v1", kind="Event")  # type: ignore[no-untyped-call]

    def create(namespace: str, event: dict[str, Any]) -> object:
        return events.create(body=event, namespace=namespace)

    return create


@dataclass
class Queues:
    """The operator's work queues: SDs to reconcile, and kinds whose store to list afresh."""

    reconciles: WorkQueue[SDKey] = field(default_factory=WorkQueue)
    relists: WorkQueue[str] = field(default_factory=WorkQueue)


class NoDiffBase(kopf.DiffBaseStorage):
    """No diff base: the operator has no create/update/resume handlers, the only ones kopf
    diffs an object for. kopf's own storage would deep-copy and diff every watch event of
    every kind for nothing (and keep `specdeploy.dev/last-handled-configuration` on SDs)."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {})

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def build_registry(cache: watch_cache.WatchCache, queues: Queues) -> kopf.OperatorRegistry:
    """The operator's handlers: for each cached kind, one raw-event handler that routes each
    watch event (handlers.run.route_event)."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A private registry has none of kopf's default activities: log in as the client does
        # (in-cluster service account, else KUBECONFIG).
        info: kopf.ConnectionInfo | None = kopf.login_via_client(**kwargs)
        return info

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # kopf removes this finalizer (an older operator set it) from every SD it sees: no
        # handler needs one.
        settings.persistence.finalizer = FINALIZER
        settings.persistence.diffbase_storage = NoDiffBase()
        # Only raw-event handlers, which post no Events; ours go through EventPoster.
        settings.posting.enabled = False
        # kopf lists each kind page by page, and an object's worker task ends soon after its
        # last event: at a start with thousands of objects, neither is held all at once.
        settings.watching.chunk_size = LIST_PAGE
        # kopf's own requests give up too: a connection that cannot be made in 5 s, a request
        # (its finalizer patch, a list page) unanswered in 30 s.
        settings.networking.connect_timeout = REQUEST_TIMEOUT[0]
        settings.networking.request_timeout = REQUEST_TIMEOUT[1]
        settings.watching.connect_timeout = REQUEST_TIMEOUT[0]
        settings.queueing.idle_timeout = WORKER_IDLE_SECONDS
        for kind in watch_cache.KINDS:
            if kind.labelled:
                # Only the children and pods of SDs are watched (listed, streamed, kept).
                group, version, plural = kind.watch
                settings.watching.label_selectors[group, version or "", plural] = labels.NAME

    for kind in watch_cache.KINDS:
        group, version, plural = kind.watch
        kopf.on.event(
            group=group, version=version, plural=plural, registry=registry, id=f"watch-{kind.name}"
        )(_router(cache, queues, kind))
    return registry


def _router(
    cache: watch_cache.WatchCache, queues: Queues, kind: watch_cache.Kind
) -> Callable[..., Awaitable[None]]:
    # Async, so it runs on kopf's loop at once rather than waiting for a worker thread.
    async def route(event: Mapping[str, Any], type: str | None, **_: Any) -> None:
        obj = event.get("object")
        if isinstance(obj, Mapping):
            route_event(cache, queues, kind, type, obj)

    return route


def route_event(
    cache: watch_cache.WatchCache,
    queues: Queues,
    kind: watch_cache.Kind,
    event_type: str | None,
    obj: Mapping[str, Any],
) -> None:
    """One watch event: into its store first (so the reconcile it asks for reads it), then
    the SDs it concerns onto the work queue; a relist of the kind's stream (which shows no
    deletions) asks for a LIST of our own that removes what is gone. Events that come before
    the stores are filled (fill_stores) wait on the queue like any other."""
    starting = event_type is None and not cache.store(kind).synced
    seen = cache.observe(kind, event_type, obj)
    if seen.relisted:
        queues.relists.add(kind.name)
    if starting and kind is not watch_cache.SD:
        return  # kopf's first listing of the children: their SDs are each reconciled at start
    for key in reconciles_for(kind, event_type, obj, seen):
        queues.reconciles.add(key)
    if kind is watch_cache.SD and event_type == "DELETED":
        metadata = obj.get("metadata") or {}
        queues.reconciles.forget((metadata.get("namespace") or "", metadata.get("name") or ""))


def route_removed(queues: Queues, kind: watch_cache.Kind, removed: list[dict[str, Any]]) -> None:
    """What a LIST of ours removed from a store (deleted while no watch event could show it):
    each removal reconciles the SDs its DELETED event would have, so that a child gone during
    a watch gap is made again now, not at the next periodic round."""
    for obj in removed:
        for key in reconciles_for(kind, "DELETED", obj, watch_cache.Seen(news=True)):
            queues.reconciles.add(key)


#: Children whose changes are set back or read at once: their events reconcile their SD.
WATCHED_CHILDREN = frozenset(
    {
        watch_cache.DEPLOYMENTS.name,
        watch_cache.LEADER_WORKER_SETS.name,
        watch_cache.RECORDS.name,
        watch_cache.SERVICES.name,
        watch_cache.POD_MONITORS.name,
    }
)


def reconciles_for(
    kind: watch_cache.Kind,
    event_type: str | None,
    obj: Mapping[str, Any],
    seen: watch_cache.Seen,
) -> list[SDKey]:
    """The SDs one watch event asks to reconcile:

    - an SD: listed (the operator's start, or a relist), or changed beyond its status (the
      spec, its labels or annotations, its deletion); its own status writes come back as
      events too and ask for nothing;
    - a revision Deployment or LeaderWorkerSet, its record, the Service, the PodMonitor (ours:
      managed-by): any
      change the store did not already hold (pods became ready, someone edited or deleted
      it), not the echo of our own write;
    - a pod whose engine container ended with the launcher's exit (its Deployment may not
      change at all), or that turned Ready (its revision is ready before the Deployment
      controller counts the pod);
    - nothing else (nodes, Kueue's objects, CRDs: the periodic round reads them)."""
    metadata = obj.get("metadata") or {}
    namespace = metadata.get("namespace") or ""
    if kind is watch_cache.SD:
        if event_type == "DELETED":
            return []
        key = (namespace, metadata.get("name") or "")
        if event_type is None or (seen.news and watch_cache.changed_beyond_status(seen, obj)):
            return [key]
        return []
    owner = (metadata.get("labels") or {}).get(labels.NAME)
    if not seen.news or not isinstance(owner, str) or not owner:
        return []
    if kind.name in WATCHED_CHILDREN:
        managed = (metadata.get("labels") or {}).get(labels.MANAGED_BY)
        return [(namespace, owner)] if managed == labels.MANAGED_BY_VALUE else []
    pod_news = kind is watch_cache.PODS and event_type != "DELETED"
    if pod_news and (shows_launcher_exit(obj) or became_ready(seen, obj)):
        return [(namespace, owner)]
    return []


def became_ready(seen: watch_cache.Seen, pod: Mapping[str, Any]) -> bool:
    """Whether this pod event is its turn to Ready: the reconcile it asks for counts the pod
    before the Deployment controller does (plan.rollout.revisions.read_revision_deployment)."""
    if not pod_is_ready(pod):
        return False
    previous = seen.previous
    return previous is None or not pod_is_ready(previous)


async def run_operator(  # noqa: PLR0917
    reconciler: Reconciler,
    registry: kopf.OperatorRegistry,
    queues: Queues,
    config: OperatorConfig,
    namespaces: list[str],
    elector: LeaseElector | None,
) -> int:
    """kopf, the reconcile workers, the periodic round and the stores' relists, once
    `elector` (if any) holds its Lease; returns 1 when the Lease was lost, else 0 on a clean
    stop."""
    lost = asyncio.Event()
    if elector is not None:
        stop_probe = await serve_standby_probe(config.liveness_endpoint)
        try:
            await elector.acquire()
        finally:
            await stop_probe()
    # Before any reconcile: does Kueue manage the kinds the operator relies on?
    await asyncio.to_thread(reconciler.check_kueue)
    executor = ThreadPoolExecutor(RECONCILE_WORKERS, thread_name_prefix="reconcile")
    tasks = [
        asyncio.create_task(reconcile_once_filled(reconciler, queues, namespaces, config, executor))
    ]
    # Kueue's webhooks can go (or come back) while the operator runs: looked at again now and then.
    tasks.append(asyncio.create_task(call_every(reconciler.check_kueue, KUEUE_RECHECK_SECONDS)))

    # On SIGINT/SIGTERM kopf stops its own tasks, runs its cleanup activity, then waits 5 s for
    # every task made after it started (the reconcile workers, the periodic round, the
    # relists) before it cancels them and exits: the cleanup stops them first, so a clean stop
    # ends at once. A lost Lease cancels kopf instead, which runs no cleanup and waits for
    # nothing.
    @kopf.on.cleanup(registry=registry)
    async def stop_reconciling(**_: Any) -> None:
        stop_tasks(queues, tasks)

    operator = asyncio.create_task(
        kopf.operator(
            registry=registry,
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=True,
            liveness_endpoint=config.liveness_endpoint,
        )
    )
    if elector is not None:
        tasks.append(asyncio.create_task(elector.keep(lost)))
        tasks.append(asyncio.create_task(_cancel_when_set(lost, operator)))
    try:
        await operator
    except asyncio.CancelledError:
        if not lost.is_set():
            raise
    finally:
        stop_tasks(queues, tasks)
        if lost.is_set():
            executor.shutdown(wait=False, cancel_futures=True)
        else:
            # The Lease is handed over once no reconcile of ours can still write.
            await asyncio.to_thread(executor.shutdown, wait=True, cancel_futures=True)
            if elector is not None:
                await asyncio.to_thread(elector.release)
    return 1 if lost.is_set() else 0


def stop_tasks(queues: Queues, tasks: Sequence[asyncio.Task[None]]) -> None:
    """Ends the work queues and cancels `tasks` (a reconcile under way in a worker thread runs
    to its end: run_operator waits for it before it hands the Lease over)."""
    queues.reconciles.shutdown()
    queues.relists.shutdown()
    for task in tasks:
        task.cancel()


async def reconcile_once_filled(
    reconciler: Reconciler,
    queues: Queues,
    namespaces: list[str],
    config: OperatorConfig,
    executor: ThreadPoolExecutor,
) -> None:
    """Fills every store with one LIST of its kind (fill_stores), puts every SD on the queue
    (the start is a reason to reconcile each), then runs the reconcile workers, the periodic
    round and the stores' relists until cancelled. Reconciles wait for whole stores, as
    client-go's controllers wait for their informers' caches to sync."""
    kube = reconciler.kube
    if kube.cache is not None:
        await fill_stores(kube)
    for key in await asyncio.to_thread(kube.list_speculative_deployments, namespaces):
        queues.reconciles.add(key)
    log.info("stores filled; reconciling")
    tasks = [
        asyncio.create_task(
            reconcile_from(queues.reconciles, reconciler.reconcile, reconciler.clock, executor)
        )
        for _ in range(RECONCILE_WORKERS)
    ]
    tasks.append(
        asyncio.create_task(
            enqueue_every_round(
                queues.reconciles,
                functools.partial(kube.list_speculative_deployments, namespaces),
                config.reconcile_interval_seconds,
            )
        )
    )
    if kube.cache is not None:
        removed = functools.partial(route_removed, queues)
        tasks.append(asyncio.create_task(relist_from(queues.relists, kube.refresh_kind, removed)))
        tasks.append(
            asyncio.create_task(
                check_stores(queues.relists, kube.kind_is_stale, config.store_check_seconds)
            )
        )
        tasks.append(asyncio.create_task(confirm_first_listings(kube.cache.stores, queues.relists)))
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()


async def fill_stores(kube: KubeAdapter, attempts: int = 3, backoff: Backoff | None = None) -> None:
    """One LIST of each cached kind into its store, page by page, the kinds side by side. A
    kind that cannot be listed is tried again after its backoff, `attempts` times in all; then
    its store is left unfilled (a read fills it, or reads the API server while the kind cannot
    be listed: WatchCache.read). A kind the API server does not serve is empty."""
    backoff = backoff or Backoff(base=1.0, cap=30.0)

    async def fill(kind: watch_cache.Kind) -> None:
        for failures in range(1, attempts + 1):
            try:
                await asyncio.to_thread(kube.refresh_kind, kind)
                return
            except Exception as error:
                if failures == attempts:
                    log.warning("listing %s failed; read on demand: %s", kind.name, error)
                    return
                delay = backoff.delay(failures)
                log.warning("listing %s failed (again in %.0fs): %s", kind.name, delay, error)
                await asyncio.sleep(delay)

    await asyncio.gather(*(fill(kind) for kind in watch_cache.KINDS))


async def _cancel_when_set(flag: asyncio.Event, task: asyncio.Task[None]) -> None:
    await flag.wait()
    task.cancel()


def main(args: argparse.Namespace) -> int:
    """Runs the operator until interrupted; returns the exit code."""
    configure_logging()
    if getattr(args, "log_reconciles", False):
        logging.getLogger("specdeploy.reconcile").setLevel(logging.DEBUG)
    metrics = OperatorMetrics()
    kube = KubeAdapter.from_environment(on_write=metrics.api_writes.inc)
    config = load_config(getattr(args, "config", None), kube)
    namespaces = list(getattr(args, "namespace", None) or config.namespaces)
    cache = kube.cache = watch_cache.WatchCache(namespaces)
    # kopf's per-object INFO lines are only the routing handlers' "succeeded", one per event.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    identity = default_identity()
    post_event = EventPoster(
        event_creator(with_timeout(client.ApiClient())),
        identity,
        on_drop=metrics.events_dropped.inc,
    )
    reconciler = Reconciler(kube, config, post_event, metrics=metrics)
    queues = Queues()
    registry = build_registry(cache, queues)
    elector = None
    if config.leader_election.enabled:
        # Its own API client: Lease renewals are not reconcile writes.
        elector = LeaseElector(
            client.CoordinationV1Api(client.ApiClient()),
            config.leader_election,
            identity,
        )
        # A write of a reconcile still running once the Lease is lost is not sent.
        kube.fence = elector.leads
    if config.metrics_endpoint:
        host, port = metrics.serve(config.metrics_endpoint)
        log.info("metrics on http://%s:%d/metrics", host, port)
    log.info(
        "specdeploy operator: namespaces %s, reconcile every %ss",
        namespaces or "all",
        config.reconcile_interval_seconds,
    )
    try:
        return asyncio.run(run_operator(reconciler, registry, queues, config, namespaces, elector))
    finally:
        post_event.close()
