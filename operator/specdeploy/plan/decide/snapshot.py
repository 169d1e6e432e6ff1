"""What a reconcile reads (`Snapshot`) and what it sends (`Decision`): the pipeline's two ends."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from specdeploy.api.models import ModelShape
from specdeploy.plan.placement.kueue import KueueWebhooks
from specdeploy.plan.rollout.analysis import Measurement
from specdeploy.plan.rollout.autotune import AutotuneMeasurement
from specdeploy.plan.rollout.probe import ProbeResult
from specdeploy.plan.rollout.revisions import RolloutEvent
from specdeploy.plan.status.refusal import RefusedWrite


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
    #: The Kueue WorkloadPriorityClass spec.placement names (read only with a queue), or None.
    priority_class: Mapping[str, Any] | None = None
    #: LeaderWorkerSets owned by this SD (revisions whose replicas span nodes).
    leader_worker_sets: Sequence[Mapping[str, Any]] = ()
    #: Whether the LeaderWorkerSet kind is served (its CRD installed).
    leader_worker_sets_served: bool = True
    #: Shapes of models neither the spec nor the catalog describes, read from their config.json.
    fetched_shapes: Mapping[str, ModelShape] = field(default_factory=dict)
    #: What Prometheus measured of each revision with ready pods (when it is read at all).
    measurements: Mapping[str, Measurement] = field(default_factory=dict)
    #: The stable revision's speculation figures, when the autotuner is due to recommend.
    autotune: AutotuneMeasurement | None = None
    #: The same of the autotuner's trial revision, while one is under the canary.
    autotune_trial: AutotuneMeasurement | None = None
    #: What each revision's pods measured on the probe (spec.rollout.analysis.probe), read
    #: while a canary's or the stable's figures are not yet kept in status.
    probes: Mapping[str, ProbeResult] = field(default_factory=dict)
    #: Kueue's API and webhooks as the operator found them at its start (None: not looked at).
    kueue: KueueWebhooks | None = None
    #: Children not to be written, and why (plan.status.refusal): refused by the API server
    #: for this generation, or their name held by an object this SD does not own.
    refused_writes: Sequence[RefusedWrite] = ()


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
    #: Revision LeaderWorkerSets (and their records, of the same name) to delete.
    delete_sets: tuple[str, ...] = ()
    #: The merge patch of status; empty when nothing differs.
    status_patch: dict[str, Any] = field(default_factory=dict)
    events: tuple[RolloutEvent, ...] = ()
    #: The Events of condition changes: the last of `events`, those the status patch tells.
    status_events: tuple[RolloutEvent, ...] = ()
    #: Why the pair could not be sized, when a model's shape is unknown (for the log).
    shape_unknown: str | None = None
    #: The serving revision's acceptance rate as the status now holds it (for /metrics).
    acceptance_rate: float | None = None
    #: When the SD next has a verdict due (plan.rollout.wakeup), or its first status left
    #: unwritten is (`status_due`): reconcile it again then.
    wake_at: datetime | None = None
    #: When a new SD's first status, left unwritten by this decision, is due
    #: (plan.status.first_status); None when the status patch is this decision's to send.
    status_due: datetime | None = None
    #: Pods whose probe readiness gate opens (their revision's probe was judged): the pod
    #: condition specdeploy.dev/probe-judged is set True on each.
    open_gates: tuple[str, ...] = ()
    #: The desired revision when its Deployment or LeaderWorkerSet is not written
    #: (Snapshot.refused_writes): no Event says it was created.
    held_revision: str | None = None
    #: (annotation, value) of `kubectl specdeploy` requests whose canary's analysis has ended
    #: (plan.rollout.lifecycle.spent_requests): removed from the SD after its status is written.
    spent_requests: tuple[tuple[str, str], ...] = ()

    @property
    def writes_children(self) -> bool:
        """Whether any write but the status is sent (children, their records, pod gates)."""
        return bool(
            self.replace_records
            or self.create_records
            or self.applies
            or self.scales
            or self.deletes
            or self.delete_sets
            or self.open_gates
        )
