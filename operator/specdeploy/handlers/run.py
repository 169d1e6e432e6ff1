"""`specdeploy operator run`: the kopf wiring around `Reconciler`.

Handlers only route: create, update, resume and watch events of every child (revision
Deployments and their records, the Service, the PodMonitor) all call the same level-based
reconcile, which is how a change made to a child out of band is set back at once; a periodic
round (`reconcile_periodically`) reconciles every SD every `reconcileIntervalSeconds`, and
`reconcile_when_due` reconciles an SD as its next canary verdict or collapse guard falls due
(plan.rollout.wakeup).

No handler needs a finalizer, so none is set (kopf removes the `specdeploy.dev/finalizer` an
older operator left): SDs and their namespaces can be deleted while the operator is not
running, and owner references let the garbage collector delete the children. kopf's timers
always set one, hence the periodic round of our own rather than `kopf.timer`.

With `leaderElection.enabled` the process first takes a Lease (handlers.leadership) and runs
kopf and the periodic round only while it holds it. The config comes from a file
(`--config PATH`) or a ConfigMap (`--config configmap:<namespace>/<name>`, key `config.yaml`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import kopf
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from specdeploy import GROUP, VERSION
from specdeploy.adapters import watch_cache
from specdeploy.adapters.kube import KubeAdapter
from specdeploy.adapters.metrics import OperatorMetrics
from specdeploy.api import labels
from specdeploy.api.config import OperatorConfig
from specdeploy.api.models import PLURAL
from specdeploy.handlers.leadership import LeaseElector, default_identity, serve_standby_probe
from specdeploy.handlers.reconcile import Reconciler
from specdeploy.plan.status.pair_check import shows_launcher_exit

FINALIZER = "specdeploy.dev/finalizer"
ANNOTATION_PREFIX = "specdeploy.dev"
CONFIGMAP_PREFIX = "configmap:"
CONFIGMAP_KEY = "config.yaml"
RETRY_DELAY_SECONDS = 5
RECONCILE_WORKERS = 8
# How often the watch-fed stores are listed afresh (bounds what a missed watch event costs).
CACHE_RESYNC_SECONDS = 300.0
EVENT_SOURCE = "specdeploy"

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


class EventPoster:
    """Posts Kubernetes Events about an SD (what `kubectl describe sd` shows).

    Written here rather than with `kopf.event`, which only works inside kopf's own handlers: the
    periodic round runs outside them. Its own API client, as kopf's was: Events are not counted
    as reconcile writes. A failure to post is logged, never raised (Events are best effort).
    """

    def __init__(self, api: client.CoreV1Api, instance: str) -> None:
        self.api = api
        self.instance = instance

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
            self.api.create_namespaced_event(namespace, cast(client.CoreV1Event, event))
        except ApiException as error:
            log.warning(
                "event %s about %s/%s not posted: %s",
                reason,
                namespace,
                metadata.get("name"),
                error,
            )


def build_registry(reconciler: Reconciler, config: OperatorConfig) -> kopf.OperatorRegistry:
    """The operator's handlers, each a thin route into `reconciler`."""
    registry = kopf.OperatorRegistry()
    resource = (GROUP, VERSION, PLURAL)
    if reconciler.kube.cache is not None:
        # First: kopf runs an event's handlers in the order they were registered, so the
        # reconcile a child's event starts already reads that event's object from the cache.
        feed_cache(registry, reconciler.kube.cache)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A private registry has none of kopf's default activities: log in as the client does
        # (in-cluster service account, else KUBECONFIG).
        info: kopf.ConnectionInfo | None = kopf.login_via_client(**kwargs)
        return info

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
            prefix=ANNOTATION_PREFIX
        )
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
        )
        settings.posting.enabled = True
        settings.posting.level = logging.WARNING
        settings.execution.max_workers = RECONCILE_WORKERS

    def reconcile_now(namespace: str | None, name: str | None) -> None:
        if not namespace or not name:
            return
        try:
            reconciler.reconcile(namespace, name)
        except ApiException as error:
            # Conflicts and API hiccups: the next attempt reads the world afresh.
            raise kopf.TemporaryError(
                f"API {error.status}: {error.reason}", delay=RETRY_DELAY_SECONDS
            ) from error

    @kopf.on.resume(*resource, registry=registry, backoff=RETRY_DELAY_SECONDS)
    @kopf.on.create(*resource, registry=registry, backoff=RETRY_DELAY_SECONDS)
    @kopf.on.update(*resource, registry=registry, backoff=RETRY_DELAY_SECONDS)
    def on_spec(namespace: str | None, name: str | None, **_: Any) -> None:
        reconcile_now(namespace, name)

    def reconcile_owner(
        namespace: str | None, child_labels: Mapping[str, str], event: str | None, what: str
    ) -> None:
        """Reconciles the SD named by a child's labels after a watch event about the child."""
        if event is None:
            return  # the initial listing; resume handlers cover it
        try:
            reconciler.reconcile(namespace or "", child_labels.get(labels.NAME, ""))
        except ApiException as error:
            log.warning("reconcile after %s failed: %s", what, error)

    owned_children: Mapping[str, Any] = {
        labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
        labels.NAME: kopf.PRESENT,
    }

    # A child changed (pods became ready, scaled, edited or deleted by someone): re-decide, so
    # a change made out of band is set back by the reconcile its own watch event starts.
    @kopf.on.event("apps", "v1", "deployments", labels=owned_children, registry=registry)
    @kopf.on.event("apps", "v1", "controllerrevisions", labels=owned_children, registry=registry)
    @kopf.on.event("", "v1", "services", labels=owned_children, registry=registry)
    @kopf.on.event(
        "monitoring.coreos.com", "v1", "podmonitors", labels=owned_children, registry=registry
    )
    def on_child(
        namespace: str | None, labels: Mapping[str, str], type: str | None, **_: Any
    ) -> None:
        reconcile_owner(namespace, labels, type, "a child change")

    @kopf.on.event(
        "",
        "v1",
        "pods",
        labels={labels.NAME: kopf.PRESENT, labels.REVISION: kopf.PRESENT},
        when=lambda body, **_: shows_launcher_exit(body),
        registry=registry,
    )
    def on_launcher_exit(
        namespace: str | None, labels: Mapping[str, str], type: str | None, **_: Any
    ) -> None:
        # The launcher refused its pair (or found no model): its Deployment may not change at
        # all, since the pod never became ready, so decide now rather than at the next timer.
        reconcile_owner(namespace, labels, type, "a launcher exit")

    return registry


def feed_cache(registry: kopf.OperatorRegistry, cache: watch_cache.WatchCache) -> None:
    """One watch handler per cached kind that keeps its store current (adapters.watch_cache).
    kopf runs one watch per resource whatever the number of handlers, so the kinds the
    operator already watched cost no further stream."""
    for kind in watch_cache.KINDS:
        group, version, plural = kind.watch
        kopf.on.event(
            group=group,
            version=version,
            plural=plural,
            registry=registry,
            id=f"cache-{kind.name}",
        )(_cache_feeder(cache, kind))


class _QuietCacheFeeders(logging.Filter):
    """Drops kopf's per-event success line of the cache feeders: one per watch event of every
    cached kind would drown the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Handler 'cache-")


def _cache_feeder(
    cache: watch_cache.WatchCache, kind: watch_cache.Kind
) -> Callable[..., Awaitable[None]]:
    # Async, so it runs on kopf's loop at once rather than waiting for a worker thread.
    async def feed(event: Mapping[str, Any], type: str | None, **_: Any) -> None:
        obj = event.get("object")
        if isinstance(obj, Mapping):
            cache.observe(kind, type, obj)

    return feed


async def reconcile_periodically(
    reconciler: Reconciler,
    namespaces: list[str],
    interval: float,
    resync: float = CACHE_RESYNC_SECONDS,
) -> None:
    """Every `interval` seconds, reconciles every SpeculativeDeployment of `namespaces` (all
    when empty): the level-based round that picks up what no watch event announces (quota
    freed, nodes changed, metrics to judge)."""
    workers = asyncio.Semaphore(RECONCILE_WORKERS)
    cache = reconciler.kube.cache
    loop = asyncio.get_running_loop()
    listed_at = loop.time()

    async def one(namespace: str, name: str) -> None:
        async with workers:
            try:
                await asyncio.to_thread(reconciler.reconcile, namespace, name)
            except ApiException as error:
                log.warning("periodic reconcile of %s/%s failed: %s", namespace, name, error)
            except Exception:
                # One SD's failure must not end the round for the others, nor the next rounds.
                log.exception("periodic reconcile of %s/%s failed", namespace, name)

    while True:
        await asyncio.sleep(interval)
        if cache is not None and loop.time() - listed_at >= resync:
            # Each kind listed afresh beside the reads, which go on from the stores.
            await asyncio.to_thread(reconciler.kube.refresh_cache)
            listed_at = loop.time()
        try:
            found = await asyncio.to_thread(
                reconciler.kube.list_speculative_deployments, namespaces
            )
        except Exception as error:  # the API unreachable for a while: try at the next round
            log.warning("listing SpeculativeDeployments failed: %s", error)
            continue
        await asyncio.gather(*(one(namespace, name) for namespace, name in found))


WAKE_TICK_SECONDS = 0.25


async def reconcile_when_due(reconciler: Reconciler, tick: float = WAKE_TICK_SECONDS) -> None:
    """Reconciles each SD when its next verdict falls due (Reconciler.take_due), so an analysis
    interval or a collapse guard's `for` is acted on as it ends rather than at the next round."""
    running: set[asyncio.Task[None]] = set()

    async def one(namespace: str, name: str) -> None:
        try:
            await asyncio.to_thread(reconciler.reconcile, namespace, name)
        except Exception:
            log.exception("reconcile of %s/%s at its verdict time failed", namespace, name)

    while True:
        for namespace, name in reconciler.take_due(reconciler.clock()):
            task = asyncio.create_task(one(namespace, name))
            running.add(task)
            task.add_done_callback(running.discard)
        await asyncio.sleep(tick)


async def run_operator(
    reconciler: Reconciler,
    registry: kopf.OperatorRegistry,
    config: OperatorConfig,
    namespaces: list[str],
    elector: LeaseElector | None,
) -> int:
    """kopf and the periodic round, once `elector` (if any) holds its Lease; returns 1 when
    the Lease was lost, else 0 on a clean stop."""
    lost = asyncio.Event()
    if elector is not None:
        stop_probe = await serve_standby_probe(config.liveness_endpoint)
        try:
            await elector.acquire()
        finally:
            await stop_probe()
    tasks = [
        asyncio.create_task(
            reconcile_periodically(reconciler, namespaces, config.reconcile_interval_seconds)
        ),
        asyncio.create_task(reconcile_when_due(reconciler)),
    ]
    # No `stop_flag` for kopf: on SIGINT/SIGTERM kopf waits 5 s for every task still pending
    # (a waiter on a flag that is never set among them) before it exits. A lost Lease cancels
    # kopf instead, so a clean stop ends at once and hands the Lease over without that wait.
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
        for task in tasks:
            task.cancel()
        if elector is not None and not lost.is_set():
            await asyncio.to_thread(elector.release)
    return 1 if lost.is_set() else 0


async def _cancel_when_set(flag: asyncio.Event, task: asyncio.Task[None]) -> None:
    await flag.wait()
    task.cancel()


def main(args: argparse.Namespace) -> int:
    """Runs the operator until interrupted; returns the exit code."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if getattr(args, "log_reconciles", False):
        logging.getLogger("specdeploy.reconcile").setLevel(logging.DEBUG)
    metrics = OperatorMetrics()
    kube = KubeAdapter.from_environment(on_write=metrics.api_writes.inc)
    config = load_config(getattr(args, "config", None), kube)
    namespaces = list(getattr(args, "namespace", None) or config.namespaces)
    kube.cache = watch_cache.WatchCache(namespaces)
    logging.getLogger("kopf.objects").addFilter(_QuietCacheFeeders())
    identity = default_identity()
    post_event = EventPoster(client.CoreV1Api(client.ApiClient()), identity)
    reconciler = Reconciler(kube, config, post_event, metrics=metrics)
    registry = build_registry(reconciler, config)
    elector = None
    if config.leader_election.enabled:
        # Its own API client: Lease renewals are not reconcile writes.
        elector = LeaseElector(
            client.CoordinationV1Api(client.ApiClient()),
            config.leader_election,
            identity,
        )
    if config.metrics_endpoint:
        host, port = metrics.serve(config.metrics_endpoint)
        log.info("metrics on http://%s:%d/metrics", host, port)
    log.info(
        "specdeploy operator: namespaces %s, reconcile every %ss",
        namespaces or "all",
        config.reconcile_interval_seconds,
    )
    return asyncio.run(run_operator(reconciler, registry, config, namespaces, elector))
