"""One reconcile's decision: from one snapshot of the world and `now` to every write and Event.

The reconcile is one straight path: the handler reads a `Snapshot` (the SD, its children, pods,
nodes, Kueue's objects, model shapes), `decide` turns it into a `Decision` with no I/O, and the
handler applies that. Each step's result is an input of the next, never patched afterwards:

    speculation → served spec → sizing → revision → launcher verdict → rollout plan
      → child manifests (and which of them need a write) → status → Events
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specdeploy.api import labels
from specdeploy.api.config import OperatorConfig
from specdeploy.api.models import ModelShape, SizingDecision, SpeculativeDeployment
from specdeploy.plan.children import (
    build_pod_monitor,
    build_revision_deployment,
    build_revision_record,
    build_service,
    deployment_from_record,
    pod_selector,
)
from specdeploy.plan.drift import decide_apply, drift_event, with_applied_hash
from specdeploy.plan.gpu_catalog import GpuProduct, read_gpu_inventories
from specdeploy.plan.pair_check import judge_pair
from specdeploy.plan.placement import judge_admission
from specdeploy.plan.revision import revision_hash
from specdeploy.plan.rollout import (
    RevisionDeployment,
    RolloutEvent,
    RolloutPlan,
    plan_rollout,
    read_revision_deployment,
)
from specdeploy.plan.sizing import ShapeUnknown, size_pair
from specdeploy.plan.speculation import decide_speculation, served_spec
from specdeploy.plan.status import (
    ObservedRollout,
    build_status,
    condition_events,
    status_patch,
)


@dataclass(frozen=True)
class Snapshot:
    """Everything one reconcile reads, read once, as the API returned it."""

    body: Mapping[str, Any]
    nodes: Sequence[Mapping[str, Any]]
    #: Revision Deployments owned by this SD.
    deployments: Sequence[Mapping[str, Any]]
    #: Revision records (ControllerRevisions) owned by this SD.
    records: Sequence[Mapping[str, Any]]
    service: Mapping[str, Any] | None
    #: None while the PodMonitor kind is not served; else the live PodMonitor or None.
    pod_monitor_served: bool
    pod_monitor: Mapping[str, Any] | None
    pods: Sequence[Mapping[str, Any]]
    workloads: Sequence[Mapping[str, Any]]
    local_queue: Mapping[str, Any] | None
    #: Shapes of models neither the spec nor the catalog describes, read from their config.json.
    fetched_shapes: Mapping[str, ModelShape] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """Every write one reconcile sends, in order, and the Events it posts."""

    #: Names of revision records to delete before they are created anew (content changed).
    replace_records: tuple[str, ...] = ()
    create_records: tuple[dict[str, Any], ...] = ()
    #: Manifests to server-side apply (each carries its applied-hash annotation).
    applies: tuple[dict[str, Any], ...] = ()
    #: (Deployment name, replicas) of revisions made before revisions were recorded.
    scales: tuple[tuple[str, int], ...] = ()
    #: Revision Deployments (and their records, of the same name) to delete.
    deletes: tuple[str, ...] = ()
    #: The merge patch of status; empty when nothing differs.
    status_patch: dict[str, Any] = field(default_factory=dict)
    events: tuple[RolloutEvent, ...] = ()
    #: Why the pair could not be sized, when a model's shape is unknown (for the log).
    shape_unknown: str | None = None


def _owned_revision(obj: Mapping[str, Any]) -> str | None:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(labels.REVISION)


def _desired_ready(
    desired_revision: str | None, revisions: Sequence[RevisionDeployment], replicas: int
) -> bool:
    """Whether every pod the spec asks of the desired revision is ready."""
    desired = next((r for r in revisions if r.revision == desired_revision), None)
    return desired is not None and desired.replicas == replicas and desired.fully_ready


def _record_for(
    manifest: dict[str, Any], records: Mapping[str, Mapping[str, Any]]
) -> tuple[dict[str, Any] | None, bool]:
    """(the record to create, whether an existing one must go first) for the desired revision;
    (None, False) when its record already holds this manifest."""
    revision = manifest["metadata"]["labels"][labels.REVISION]
    sequences = [int(r.get("revision") or 0) for r in records.values()]
    record = build_revision_record(manifest, max(sequences, default=0) + 1)
    current = records.get(revision)
    if current is not None and current.get("data") == record["data"]:
        return None, False
    return record, current is not None


def decide(
    snapshot: Snapshot,
    config: OperatorConfig,
    catalog: Sequence[GpuProduct],
    now: str,
) -> Decision:
    """Everything the reconcile does about one SD, decided from `snapshot` alone."""
    sd = SpeculativeDeployment.from_body(dict(snapshot.body))
    spec = sd.spec

    speculation = decide_speculation(spec, config)
    served = sd.model_copy(update={"spec": served_spec(spec, speculation)})
    inventory = read_gpu_inventories(snapshot.nodes, catalog)
    sized = size_pair(served.spec, inventory, config, catalog, snapshot.fetched_shapes)
    sizing = sized if isinstance(sized, SizingDecision) else None
    desired_revision = revision_hash(served.spec, sizing, config) if sizing is not None else None

    found = (read_revision_deployment(d) for d in snapshot.deployments)
    revisions = [r for r in found if r is not None]
    has_draft = served.spec.pair.draft.method != "none"
    pair = judge_pair(
        desired_revision,
        _desired_ready(desired_revision, revisions, spec.replicas),
        has_draft,
        snapshot.pods,
        sd.status,
    )
    plan = plan_rollout(
        desired_revision,
        revisions,
        spec.replicas,
        sd.status.stable_revision if sd.status else None,
        spec.revision_history_limit,
        held=pair.refused,
    )

    children = _children(
        snapshot,
        served,
        desired_revision=desired_revision,
        sizing=sizing,
        plan=plan,
        config=config,
        revisions=revisions,
    )

    queue = spec.placement.queue
    admission = judge_admission(
        queue, snapshot.pods, snapshot.workloads if queue else [], snapshot.local_queue
    )
    seen = ObservedRollout(
        sizing=sizing,
        sizing_problem=None if sizing is not None else sized.message,
        speculation=speculation,
        desired_revision=desired_revision,
        plan=plan,
        revisions=revisions,
        admission=admission,
        selector=pod_selector(sd),
        pair=pair,
    )
    desired_status = build_status(sd, seen, now)
    current_status = snapshot.body.get("status") or {}
    events = (
        *plan.events,
        *pair.events,
        *children.events,
        *condition_events(current_status.get("conditions") or [], desired_status["conditions"]),
    )
    return Decision(
        replace_records=children.replace_records,
        create_records=children.create_records,
        applies=children.applies,
        scales=children.scales,
        deletes=plan.delete,
        status_patch=status_patch(current_status, desired_status),
        events=events,
        shape_unknown=sized.message if isinstance(sized, ShapeUnknown) else None,
    )


@dataclass(frozen=True)
class _Children:
    replace_records: tuple[str, ...]
    create_records: tuple[dict[str, Any], ...]
    applies: tuple[dict[str, Any], ...]
    scales: tuple[tuple[str, int], ...]
    events: tuple[RolloutEvent, ...]


def _children(
    snapshot: Snapshot,
    served: SpeculativeDeployment,
    *,
    desired_revision: str | None,
    sizing: SizingDecision | None,
    plan: RolloutPlan,
    config: OperatorConfig,
    revisions: Sequence[RevisionDeployment],
) -> _Children:
    """The manifest of every child, and which of them need a write (see plan.drift)."""
    records = {r: rec for rec in snapshot.records if (r := _owned_revision(rec)) is not None}
    live: dict[tuple[str, str], Mapping[str, Any] | None] = {
        ("Deployment", d["metadata"]["name"]): d for d in snapshot.deployments
    }
    wanted: list[dict[str, Any]] = []
    replace: list[str] = []
    create: list[dict[str, Any]] = []
    if desired_revision is not None and sizing is not None:
        manifest = build_revision_deployment(
            served, desired_revision, sizing, config, replicas=plan.replicas[desired_revision]
        )
        record, stale = _record_for(manifest, records)
        if record is not None:
            create.append(record)
            if stale:
                replace.append(record["metadata"]["name"])
        wanted.append(manifest)
    scales: list[tuple[str, int]] = []
    by_revision = {r.revision: r for r in revisions}
    for revision, replicas in plan.replicas.items():
        if revision == desired_revision:
            continue
        if revision in records:
            wanted.append(deployment_from_record(dict(records[revision]), replicas))
        elif (current := by_revision.get(revision)) and current.replicas != replicas:
            # A revision made before revisions were recorded: only its size is known.
            scales.append((current.name, replicas))
    wanted.append(build_service(served))
    live[("Service", served.metadata.name)] = snapshot.service
    if snapshot.pod_monitor_served:
        wanted.append(build_pod_monitor(served))
        live[("PodMonitor", served.metadata.name)] = snapshot.pod_monitor

    applies: list[dict[str, Any]] = []
    events: list[RolloutEvent] = []
    for manifest in wanted:
        body = with_applied_hash(manifest)
        key = (body["kind"], body["metadata"]["name"])
        decision = decide_apply(body, live.get(key))
        if decision.write:
            applies.append(body)
        if decision.reverted:
            events.append(drift_event(key[0], key[1], decision.reverted))
    return _Children(tuple(replace), tuple(create), tuple(applies), tuple(scales), tuple(events))
