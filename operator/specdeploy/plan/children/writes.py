"""Which children a reconcile writes: the manifest of every child, and only those that differ.

The desired revision's Deployment is built from the served spec and recorded in a
ControllerRevision (so a later rollback can scale it up unchanged); once recorded, its pods are
the record's (an operator that would build them otherwise restarts none of them: only its
metadata follows the spec); every other revision the rollout plan keeps is rebuilt from its
record at its planned size; those that shrink are written before those that grow. A child is
written only when
it lacks a field it should hold (plan.children.drift); a change made out of band is reverted
with an Event saying what was set back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specdeploy.api import labels
from specdeploy.api.config import OperatorConfig
from specdeploy.api.models import SizingDecision, SpeculativeDeployment
from specdeploy.plan.children.drift import decide_apply, drift_event, with_applied_hash
from specdeploy.plan.children.manifests import (
    LWS_KIND,
    build_pod_monitor,
    build_revision_child,
    build_revision_record,
    build_service,
    deployment_from_record,
)
from specdeploy.plan.children.revision import HASH_SCHEMA
from specdeploy.plan.rollout.revisions import RevisionDeployment, RolloutEvent, RolloutPlan


@dataclass(frozen=True)
class LiveChildren:
    """The children of one SD as the API returned them."""

    deployments: Sequence[Mapping[str, Any]]
    #: LeaderWorkerSets of revisions whose replicas span nodes.
    leader_worker_sets: Sequence[Mapping[str, Any]]
    records: Sequence[Mapping[str, Any]]
    service: Mapping[str, Any] | None
    #: False while the PodMonitor kind is not served.
    pod_monitor_served: bool
    pod_monitor: Mapping[str, Any] | None


@dataclass(frozen=True)
class ChildWrites:
    """The child writes of one reconcile, in the order they are sent."""

    #: Names of revision records to delete before they are created anew (content changed).
    replace_records: tuple[str, ...]
    create_records: tuple[dict[str, Any], ...]
    #: Manifests to server-side apply (each carries its applied-hash annotation).
    applies: tuple[dict[str, Any], ...]
    #: (Deployment name, replicas) of revisions made before revisions were recorded.
    scales: tuple[tuple[str, int], ...]
    #: One per child set back after a change made out of band.
    events: tuple[RolloutEvent, ...]


def revision_label(obj: Mapping[str, Any]) -> str | None:
    """The revision label of a revision's child or record, if it has one."""
    return ((obj.get("metadata") or {}).get("labels") or {}).get(labels.REVISION)


def _shrinks(manifest: Mapping[str, Any], live: Mapping[str, Any] | None) -> bool:
    """Whether a revision's write lowers its replicas."""
    had = int(((live or {}).get("spec") or {}).get("replicas") or 0)
    return int(manifest["spec"].get("replicas") or 0) < had


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


def _recorded_pods(manifest: dict[str, Any], record: Mapping[str, Any] | None) -> dict[str, Any]:
    """The desired revision's manifest with the pods its record holds (everything in its spec
    but replicas), so a revision's pods never change while it exists."""
    data = (record or {}).get("data") or {}
    if data.get("kind") != manifest["kind"] or not data.get("spec"):
        return manifest
    return {**manifest, "spec": {**data["spec"], "replicas": manifest["spec"]["replicas"]}}


def plan_child_writes(
    live: LiveChildren,
    served: SpeculativeDeployment,
    *,
    desired_revision: str | None,
    sizing: SizingDecision | None,
    plan: RolloutPlan,
    config: OperatorConfig,
    revisions: Sequence[RevisionDeployment],
    schema: int = HASH_SCHEMA,
) -> ChildWrites:
    """The manifest of every child, and which of them need a write (see plan.children.drift).
    `schema` is the hash schema of the desired revision (ServedPair.schema)."""
    records = {r: rec for rec in live.records if (r := revision_label(rec)) is not None}
    current: dict[tuple[str, str], Mapping[str, Any] | None] = {
        ("Deployment", d["metadata"]["name"]): d for d in live.deployments
    }
    current.update({(LWS_KIND, s["metadata"]["name"]): s for s in live.leader_worker_sets})
    wanted: list[dict[str, Any]] = []
    replace: list[str] = []
    create: list[dict[str, Any]] = []
    if desired_revision is not None and sizing is not None:
        manifest = build_revision_child(
            served,
            desired_revision,
            sizing,
            config,
            replicas=plan.replicas[desired_revision],
            schema=schema,
        )
        manifest = _recorded_pods(manifest, records.get(desired_revision))
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
        elif (existing := by_revision.get(revision)) and existing.replicas != replicas:
            # A revision made before revisions were recorded: only its size is known.
            scales.append((existing.name, replicas))
    # Revisions that shrink go first, so that between two writes no more pods are asked for
    # than before or after them (spec.rollout.maxSurge bounds every moment, not each reconcile).
    wanted.sort(key=lambda m: not _shrinks(m, current.get((m["kind"], m["metadata"]["name"]))))
    wanted.append(build_service(served))
    current[("Service", served.metadata.name)] = live.service
    if live.pod_monitor_served:
        wanted.append(build_pod_monitor(served, config.pod_monitor_labels))
        current[("PodMonitor", served.metadata.name)] = live.pod_monitor

    applies: list[dict[str, Any]] = []
    events: list[RolloutEvent] = []
    for manifest in wanted:
        body = with_applied_hash(manifest)
        key = (body["kind"], body["metadata"]["name"])
        decision = decide_apply(body, current.get(key))
        if decision.write:
            applies.append(body)
        if decision.reverted:
            events.append(drift_event(key[0], key[1], decision.reverted))
    return ChildWrites(tuple(replace), tuple(create), tuple(applies), tuple(scales), tuple(events))
