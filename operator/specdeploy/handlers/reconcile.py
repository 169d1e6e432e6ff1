"""One level-based reconcile of a SpeculativeDeployment: read the world, let plan/ decide, apply.

Reads the SD, its child Deployments and pods, the GPU nodes and Kueue's Workloads; decides the
served spec, the sizing, the revision and the replicas of every revision with plan/; applies the
children by server-side apply (skipped when unchanged); writes status only when it changed;
posts an Event for every decision that changed something.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from specdeploy.adapters.kube import KubeAdapter
from specdeploy.adapters.model_config import ModelConfigUnavailableError, fetch_model_shape
from specdeploy.api import labels
from specdeploy.api.config import OperatorConfig
from specdeploy.api.models import ModelShape, SizingDecision, SpeculativeDeployment
from specdeploy.plan.children import (
    build_pod_monitor,
    build_revision_deployment,
    build_service,
    pod_selector,
)
from specdeploy.plan.gpu_catalog import catalog_for_config, read_gpu_inventories
from specdeploy.plan.pair_check import apply_pair_verdict, hold_refused_revisions, judge_pair
from specdeploy.plan.placement import judge_admission
from specdeploy.plan.revision import revision_hash
from specdeploy.plan.rollout import (
    RevisionDeployment,
    plan_rollout,
    read_revision_deployment,
)
from specdeploy.plan.sizing import ShapeUnknown, models_needing_shapes, size_pair
from specdeploy.plan.speculation import decide_speculation, served_spec
from specdeploy.plan.status import (
    ObservedRollout,
    build_status,
    condition_events,
    status_patch,
)

log = logging.getLogger("specdeploy.reconcile")

# (body, type, reason, message): how a reconcile posts a Kubernetes Event.
# How long a model whose config.json could not be read waits before it is asked for again.
SHAPE_RETRY_SECONDS = 300.0

EventPoster = Callable[[Mapping[str, Any], str, str, str], None]


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Reconciler:
    """Reconciles SpeculativeDeployments; safe to call from several handler threads at once."""

    def __init__(self, kube: KubeAdapter, config: OperatorConfig, post_event: EventPoster) -> None:
        self.kube = kube
        self.config = config
        self.post_event = post_event
        self.catalog = catalog_for_config(config)
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._shapes: dict[tuple[str, str | None], ModelShape] = {}
        # When a config.json could not be read: not asked again before this monotonic time,
        # so a model the hub does not know does not slow every reconcile down.
        self._shape_retry_at: dict[tuple[str, str | None], float] = {}

    def _lock(self, namespace: str, name: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def reconcile(self, namespace: str, name: str) -> None:
        """Brings one SpeculativeDeployment's children and status in line with its spec."""
        with self._lock(namespace, name):
            body = self.kube.get_speculative_deployment(namespace, name)
            if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
                return
            self._reconcile(body)

    def _fetched_shapes(self, sd: SpeculativeDeployment) -> dict[str, ModelShape]:
        """Shapes of models outside the spec and catalog, read once from their config.json."""
        fetched: dict[str, ModelShape] = {}
        spec = sd.spec
        revisions = {spec.pair.target.model: spec.pair.target.revision}
        if spec.pair.draft.model:
            revisions[spec.pair.draft.model] = spec.pair.draft.revision
        for model in models_needing_shapes(spec):
            key = (model, revisions.get(model))
            if key not in self._shapes:
                if time.monotonic() < self._shape_retry_at.get(key, 0.0):
                    continue
                try:
                    self._shapes[key] = fetch_model_shape(
                        self.config.model_config_url, model, key[1], self._hub_token(sd)
                    )
                except ModelConfigUnavailableError as error:
                    log.warning("no shape for %s: %s", model, error)
                    self._shape_retry_at[key] = time.monotonic() + SHAPE_RETRY_SECONDS
                    continue
            fetched[model] = self._shapes[key]
        return fetched

    def _hub_token(self, sd: SpeculativeDeployment) -> str | None:
        source = sd.spec.model_source
        if source is None or source.hub is None or source.hub.token_secret_ref is None:
            return None
        ref = source.hub.token_secret_ref
        secret = self.kube.get("v1", "Secret", sd.metadata.namespace or "", ref.name)
        data = (secret or {}).get("data") or {}
        return base64.b64decode(data[ref.key]).decode() if ref.key in data else None

    def _reconcile(self, body: dict[str, Any]) -> None:
        sd = SpeculativeDeployment.from_body(body)
        namespace = sd.metadata.namespace or ""
        name = sd.metadata.name
        uid = sd.metadata.uid

        speculation = decide_speculation(sd.spec, self.config)
        served = sd.model_copy(update={"spec": served_spec(sd.spec, speculation)})
        inventory = read_gpu_inventories(self.kube.list_gpu_nodes(), self.catalog)
        sizing_result = size_pair(
            served.spec, inventory, self.config, self.catalog, self._fetched_shapes(served)
        )
        sizing = sizing_result if isinstance(sizing_result, SizingDecision) else None
        problem = None if sizing is not None else sizing_result.message
        desired_revision = (
            revision_hash(served.spec, sizing, self.config) if sizing is not None else None
        )

        selector = f"{labels.NAME}={name}"
        live_deployments = [
            d for d in self.kube.list_deployments(namespace, selector) if _owned_by(d, uid)
        ]
        revisions = [
            r for r in (read_revision_deployment(d) for d in live_deployments) if r is not None
        ]
        stable = sd.status.stable_revision if sd.status else None
        plan = plan_rollout(
            desired_revision, revisions, sd.spec.replicas, stable, sd.spec.revision_history_limit
        )
        pods = self.kube.list_pods(namespace, selector)
        has_draft = served.spec.pair.draft.method != "none"
        pair = judge_pair(desired_revision, plan.desired_ready, has_draft, pods, sd.status)
        plan = hold_refused_revisions(plan, pair)

        # Children: the desired revision by apply, the others by scale; then Service, monitor.
        by_revision = {r.revision: r for r in revisions}
        live_by_name = {d["metadata"]["name"]: d for d in live_deployments}
        if desired_revision is not None and sizing is not None:
            manifest = build_revision_deployment(
                served,
                desired_revision,
                sizing,
                self.config,
                replicas=plan.replicas[desired_revision],
            )
            self.kube.apply(manifest, live_by_name.get(manifest["metadata"]["name"]))
        for revision, replicas in plan.replicas.items():
            current = by_revision.get(revision)
            if revision != desired_revision and current and current.replicas != replicas:
                self.kube.scale_deployment(namespace, current.name, replicas)
        for deployment_name in plan.delete:
            self.kube.delete_deployment(namespace, deployment_name)
        service = build_service(served)
        self.kube.apply(service, self.kube.get("v1", "Service", namespace, name))
        if self.kube.has_pod_monitor_crd():
            monitor = build_pod_monitor(served)
            live_monitor = self.kube.get("monitoring.coreos.com/v1", "PodMonitor", namespace, name)
            self.kube.apply(monitor, live_monitor)

        queue = sd.spec.placement.queue
        admission = judge_admission(
            queue,
            pods,
            self.kube.list_workloads(namespace) if queue else [],
            self.kube.get_local_queue(namespace, queue) if queue else None,
        )
        seen = ObservedRollout(
            sizing=sizing,
            sizing_problem=problem,
            speculation=speculation,
            desired_revision=desired_revision,
            plan=plan,
            revisions=revisions,
            admission=admission,
            selector=pod_selector(sd),
        )
        now = now_rfc3339()
        desired_status = apply_pair_verdict(
            build_status(sd, seen, now),
            pair,
            previous=sd.status,
            desired_revision=desired_revision,
            stable_revision=plan.stable_revision,
            generation=sd.metadata.generation,
            now=now,
        )
        current_status = body.get("status") or {}
        patch = status_patch(current_status, desired_status)
        if patch:
            self.kube.patch_status(namespace, name, patch)

        for event in (*plan.events, *pair.events):
            self.post_event(
                body, "Warning" if event.warning else "Normal", event.reason, event.message
            )
        for event in condition_events(
            current_status.get("conditions") or [], desired_status["conditions"]
        ):
            self.post_event(
                body, "Warning" if event.warning else "Normal", event.reason, event.message
            )
        if isinstance(sizing_result, ShapeUnknown):
            log.warning("%s/%s: %s", namespace, name, sizing_result.message)

    def revisions_of(self, namespace: str, name: str) -> list[RevisionDeployment]:
        """The revision Deployments of one SD (for the delete handler and diagnostics)."""
        selector = f"{labels.NAME}={name}"
        found = (
            read_revision_deployment(d) for d in self.kube.list_deployments(namespace, selector)
        )
        return [r for r in found if r is not None]


def _owned_by(obj: Mapping[str, Any], uid: str | None) -> bool:
    """Whether `obj` belongs to the SD with `uid`; an object without owner is adopted."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    if not refs:
        return True
    return any(r.get("uid") == uid for r in refs)
