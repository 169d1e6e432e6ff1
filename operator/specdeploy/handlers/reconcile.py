"""One level-based reconcile of a SpeculativeDeployment: read the world, let plan/ decide, apply.

Reads the SD, its child Deployments and pods, the GPU nodes and Kueue's Workloads; decides the
served spec, the sizing, the revision and the replicas of every revision with plan/; applies the
children by server-side apply when they do not hold their desired fields (repairing changes
made out of band, with an Event); writes status only when it changed;
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
    RECORD_API_VERSION,
    RECORD_KIND,
    build_pod_monitor,
    build_revision_deployment,
    build_revision_record,
    build_service,
    deployment_from_record,
    pod_selector,
)
from specdeploy.plan.drift import decide_apply, drift_event, with_applied_hash
from specdeploy.plan.gpu_catalog import catalog_for_config, read_gpu_inventories
from specdeploy.plan.pair_check import apply_pair_verdict, hold_refused_revisions, judge_pair
from specdeploy.plan.placement import judge_admission
from specdeploy.plan.revision import revision_hash
from specdeploy.plan.rollout import (
    RevisionDeployment,
    RolloutEvent,
    RolloutPlan,
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
            writes = self.kube.write_requests
            self._reconcile(body)
            log.debug(
                "reconciled %s/%s (%d API writes meanwhile)",
                namespace,
                name,
                self.kube.write_requests - writes,
            )

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

        children = self._converge_children(
            served,
            desired_revision=desired_revision,
            sizing=sizing,
            plan=plan,
            revisions=revisions,
            live_deployments=live_deployments,
        )
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

        for event in (*plan.events, *pair.events, *children):
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

    def _converge_children(
        self,
        served: SpeculativeDeployment,
        *,
        desired_revision: str | None,
        sizing: SizingDecision | None,
        plan: RolloutPlan,
        revisions: list[RevisionDeployment],
        live_deployments: list[dict[str, Any]],
    ) -> list[RolloutEvent]:
        """Records each revision, applies every child that does not hold its desired fields,
        deletes pruned revisions; returns the Events for changes it reverted."""
        namespace = served.metadata.namespace or ""
        name = served.metadata.name
        selector = f"{labels.NAME}={name}"
        records = {
            (r["metadata"].get("labels") or {}).get(labels.REVISION): r
            for r in self.kube.list_objects(RECORD_API_VERSION, RECORD_KIND, namespace, selector)
            if _owned_by(r, served.metadata.uid)
        }
        live: dict[tuple[str, str], Mapping[str, Any] | None] = {
            ("Deployment", d["metadata"]["name"]): d for d in live_deployments
        }
        wanted: list[dict[str, Any]] = []
        if desired_revision is not None and sizing is not None:
            manifest = build_revision_deployment(
                served,
                desired_revision,
                sizing,
                self.config,
                replicas=plan.replicas[desired_revision],
            )
            records[desired_revision] = self._record(manifest, records)
            wanted.append(manifest)
        by_revision = {r.revision: r for r in revisions}
        for revision, replicas in plan.replicas.items():
            if revision == desired_revision:
                continue
            if revision in records:
                wanted.append(deployment_from_record(records[revision], replicas))
            elif (current := by_revision.get(revision)) and current.replicas != replicas:
                # A revision made before revisions were recorded: only its size is known.
                self.kube.scale_deployment(namespace, current.name, replicas)
        wanted.append(build_service(served))
        live[("Service", name)] = self.kube.get("v1", "Service", namespace, name)
        if self.kube.has_pod_monitor_crd():
            wanted.append(build_pod_monitor(served))
            live[("PodMonitor", name)] = self.kube.get(
                "monitoring.coreos.com/v1", "PodMonitor", namespace, name
            )

        events: list[RolloutEvent] = []
        for manifest in wanted:
            body = with_applied_hash(manifest)
            key = (body["kind"], body["metadata"]["name"])
            decision = decide_apply(body, live.get(key))
            if decision.write:
                self.kube.apply(body)
            if decision.reverted:
                events.append(drift_event(key[0], key[1], decision.reverted))
        for deployment_name in plan.delete:
            self.kube.delete("apps/v1", "Deployment", namespace, deployment_name)
            self.kube.delete(RECORD_API_VERSION, RECORD_KIND, namespace, deployment_name)
        return events

    def _record(
        self, manifest: dict[str, Any], records: Mapping[str | None, dict[str, Any]]
    ) -> dict[str, Any]:
        """The revision record of the desired revision's Deployment, created when missing and
        replaced when its content changed (the operator's own template changed)."""
        revision = manifest["metadata"]["labels"][labels.REVISION]
        sequences = [int(r.get("revision") or 0) for r in records.values()]
        record = build_revision_record(manifest, max(sequences, default=0) + 1)
        current = records.get(revision)
        if current is not None and current.get("data") == record["data"]:
            return current
        namespace = manifest["metadata"]["namespace"]
        if current is not None:
            self.kube.delete(RECORD_API_VERSION, RECORD_KIND, namespace, record["metadata"]["name"])
        self.kube.create(record)
        return record

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
