"""One reconcile's decision: from one snapshot of the world and `now` to every write and Event.

The reconcile is one straight path: the handler reads a `Snapshot` (the SD, its children, pods,
nodes, Kueue's objects, model shapes), `decide` turns it into a `Decision` with no I/O, and the
handler applies that. Each step's result is an input of the next, never patched afterwards:

    speculation → served spec → sizing → revision → launcher verdict → rollout plan
      → child manifests (and which of them need a write) → status → Events
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from specdeploy.api import labels
from specdeploy.api.conditions import Reason, RevisionPhase
from specdeploy.api.config import OperatorConfig
from specdeploy.api.models import (
    AutotuneStatus,
    ModelShape,
    ScheduleStep,
    SizingDecision,
    SpeculationStatus,
    SpeculativeDeployment,
    SpeculativeDeploymentSpec,
    SpeculativeDeploymentStatus,
)
from specdeploy.plan.children.drift import decide_apply, drift_event, with_applied_hash
from specdeploy.plan.children.manifests import (
    build_pod_monitor,
    build_revision_deployment,
    build_revision_record,
    build_service,
    deployment_from_record,
    pod_selector,
)
from specdeploy.plan.children.revision import revision_hash
from specdeploy.plan.placement.admission import judge_admission
from specdeploy.plan.placement.gpu_catalog import GpuNodeInventory, GpuProduct, read_gpu_inventories
from specdeploy.plan.placement.sizing import ShapeUnknown, Unschedulable, keep_sizing, size_pair
from specdeploy.plan.rollout.analysis import (
    RFC3339,
    CanaryJudgement,
    Measurement,
    Outcome,
    Result,
    duration_seconds,
    judge_canary,
)
from specdeploy.plan.rollout.autotune import AutotuneMeasurement, tune_deployment, tuned_spec
from specdeploy.plan.rollout.collapse import RESUME_ANNOTATION, watch_collapse
from specdeploy.plan.rollout.revisions import (
    RevisionDeployment,
    RolloutEvent,
    RolloutPlan,
    plan_rollout,
    read_revision_deployment,
    resolve_stable,
)
from specdeploy.plan.rollout.speculation import decide_speculation, served_spec
from specdeploy.plan.rollout.wakeup import next_wake
from specdeploy.plan.status.crash_loop import read_crash_loop
from specdeploy.plan.status.pair_check import judge_pair
from specdeploy.plan.status.report import (
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
    #: The Kueue WorkloadPriorityClass spec.placement names (read only with a queue), or None.
    priority_class: Mapping[str, Any] | None = None
    #: Shapes of models neither the spec nor the catalog describes, read from their config.json.
    fetched_shapes: Mapping[str, ModelShape] = field(default_factory=dict)
    #: What Prometheus measured of each revision with ready pods (when it is read at all).
    measurements: Mapping[str, Measurement] = field(default_factory=dict)
    #: The stable revision's speculation figures, when the autotuner is due to recommend.
    autotune: AutotuneMeasurement | None = None
    #: The same of the autotuner's trial revision, while one is under the canary.
    autotune_trial: AutotuneMeasurement | None = None


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
    #: The serving revision's acceptance rate as the status now holds it (for /metrics).
    acceptance_rate: float | None = None
    #: When the SD next has a verdict due (plan.rollout.wakeup): reconcile it again then.
    wake_at: datetime | None = None


def _owned_revision(obj: Mapping[str, Any]) -> str | None:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(labels.REVISION)


def _desired_ready(desired_revision: str | None, revisions: Sequence[RevisionDeployment]) -> bool:
    """Whether the desired revision has pods and all of them are ready (its launcher then
    accepted the pair)."""
    desired = next((r for r in revisions if r.revision == desired_revision), None)
    return desired is not None and desired.replicas > 0 and desired.fully_ready


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


def _served_before(
    status: SpeculativeDeploymentStatus | None,
    revisions: Sequence[RevisionDeployment],
    pair_revision: str,
) -> str | None:
    """The newest revision that served before `pair_revision` and whose Deployment is kept."""
    if status is None:
        return None
    kept = {r.revision for r in revisions}
    recorded = [r.revision for r in status.revisions]
    before = recorded[: recorded.index(pair_revision)] if pair_revision in recorded else recorded
    candidates = [
        r
        for r in status.revisions
        if r.revision in before
        and r.revision in kept
        and r.phase in (RevisionPhase.SUPERSEDED, RevisionPhase.STABLE)
    ]
    return candidates[-1].revision if candidates else None


def watches_acceptance(spec: SpeculativeDeploymentSpec) -> bool:
    """Whether the SD needs its revisions measured: a canary analysis or a collapse guard."""
    return analysed(spec) or spec.rollout.collapse_guard is not None


def analysed(spec: SpeculativeDeploymentSpec) -> bool:
    """Whether a new pair is a canary judged by its measurements (spec.rollout.canary or
    .analysis set), rather than replacing the stable one as soon as it is ready."""
    return spec.rollout.canary is not None or spec.rollout.analysis is not None


def _canary_ready(
    desired_revision: str | None, revisions: Sequence[RevisionDeployment], canary_replicas: int
) -> bool:
    """Whether the desired revision has all its canary pods ready (its analysis may start)."""
    desired = next((r for r in revisions if r.revision == desired_revision), None)
    return (
        desired is not None
        and desired.observed
        and desired.replicas >= canary_replicas
        and desired.ready_replicas >= canary_replicas
    )


def _tuned_only(
    canary: str | None,
    tuning: AutotuneStatus | None,
    stable: RevisionDeployment | None,
    candidate: RevisionDeployment | None,
) -> bool:
    """Whether the canary is the autotuner's trial and serves the stable's pair (models and
    version): its only change is then the tuned length, which the canary judges by throughput."""
    if canary is None or tuning is None or tuning.trial_revision != canary:
        return False
    if stable is None or candidate is None or not stable.pair or not candidate.pair:
        return False

    def served(pair: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in pair.items() if k != "revision"}

    return served(stable.pair) == served(candidate.pair)


def _rolled_back(status: SpeculativeDeploymentStatus | None) -> frozenset[str]:
    """Revisions an analysis rolled back: never tried again until the spec names another pair."""
    if status is None:
        return frozenset()
    return frozenset(
        r.revision
        for r in status.revisions
        if r.phase == RevisionPhase.FAILED and any(v.result == "Fail" for v in r.verdicts)
    )


class ServedPair(NamedTuple):
    """The SD as served (after the speculation decision), its sizing, and its revision."""

    served: SpeculativeDeployment
    sized: SizingDecision | ShapeUnknown | Unschedulable
    #: The revision hash; None when the pair could not be sized.
    revision: str | None


def serve_pair(
    sd: SpeculativeDeployment,
    speculation: SpeculationStatus,
    inventory: Sequence[GpuNodeInventory],
    config: OperatorConfig,
    *,
    catalog: Sequence[GpuProduct],
    fetched_shapes: Mapping[str, ModelShape],
    known_devices: Sequence[GpuNodeInventory] = (),
    existing: Collection[str] = (),
    tokens: int | None = None,
    schedule: Sequence[ScheduleStep] | None = None,
) -> ServedPair:
    """The served spec, what one replica of it runs on, and the revision those pods make.

    `known_devices` (every node, cordoned ones too) and `existing` (the revisions that have
    Deployments) keep a serving revision's device: a node cordoned, drained or added changes the
    inventory, not the pair, so a revision that exists keeps its device while some known node
    still gives it. `tokens` is the autotuned speculation length (None: the spec's own).
    """
    served = sd.model_copy(
        update={"spec": served_spec(tuned_spec(sd.spec, tokens, schedule), speculation)}
    )
    sized = size_pair(served.spec, inventory, config, catalog, fetched_shapes)
    previous = sd.status.sizing if sd.status else None
    if previous is not None and existing:
        kept = keep_sizing(
            served.spec,
            previous,
            known_devices,
            config,
            catalog=catalog,
            fetched_shapes=fetched_shapes,
        )
        if kept is not None and revision_hash(served.spec, kept, config) in existing:
            sized = kept
    revision = (
        revision_hash(served.spec, sized, config) if isinstance(sized, SizingDecision) else None
    )
    return ServedPair(served, sized, revision)


def decide(
    snapshot: Snapshot,
    config: OperatorConfig,
    catalog: Sequence[GpuProduct],
    now: datetime,
) -> Decision:
    """Everything the reconcile does about one SD, decided from `snapshot` alone."""
    sd = SpeculativeDeployment.from_body(dict(snapshot.body))
    spec = sd.spec
    stamp = now.strftime(RFC3339)
    status = sd.status
    settings = config.analysis_for(spec.rollout.analysis)
    inventory = read_gpu_inventories(snapshot.nodes, catalog)
    known_devices = read_gpu_inventories(snapshot.nodes, catalog, include_cordoned=True)
    found = (read_revision_deployment(d) for d in snapshot.deployments)
    revisions = [r for r in found if r is not None]
    existing = {r.revision for r in revisions}

    def serve(
        speculation: SpeculationStatus,
        tokens: int | None,
        schedule: Sequence[ScheduleStep] | None = None,
    ) -> ServedPair:
        return serve_pair(
            sd,
            speculation,
            inventory,
            config,
            catalog=catalog,
            fetched_shapes=snapshot.fetched_shapes,
            known_devices=known_devices,
            existing=existing,
            tokens=tokens,
            schedule=schedule,
        )

    # The pair the spec names, and the collapse guard watching it while it serves.
    speculation = decide_speculation(spec, config)
    # The autotuner (spec.pair.draft.autotune) may serve a tuned k in place of the spec's.
    tuning = tune_deployment(
        sd,
        snapshot.autotune,
        settings,
        lambda k, steps: (
            serve(speculation, k, steps)[2] if speculation.state == "Enabled" else None
        ),
        now,
        trial_measured=snapshot.autotune_trial,
    )
    served, sized, desired_revision = serve(speculation, tuning.tokens, tuning.schedule)
    pair_revision = desired_revision if speculation.state == "Enabled" else None
    recorded_stable = status.stable_revision if status else None
    guard = watch_collapse(
        status.collapse if status else None,
        guard=spec.rollout.collapse_guard,
        pair_revision=pair_revision,
        serving=pair_revision is not None and recorded_stable == pair_revision,
        measured=snapshot.measurements.get(pair_revision or ""),
        min_draft_tokens=settings.min_draft_tokens,
        resume=sd.metadata.annotations.get(RESUME_ANNOTATION),
        now=now,
    )
    action = guard.state.action if guard.fired and guard.state is not None else None
    if action == "DisableSpeculation" and guard.state is not None:
        speculation = decide_speculation(spec, config, collapsed=True).model_copy(
            update={"message": f"{guard.state.message}; resume: see status.collapse"}
        )
        served, sized, desired_revision = serve(speculation, tuning.tokens, tuning.schedule)
    sizing = sized if isinstance(sized, SizingDecision) else None

    has_draft = served.spec.pair.draft.method != "none"
    pair = judge_pair(
        desired_revision,
        _desired_ready(desired_revision, revisions),
        has_draft,
        snapshot.pods,
        sd.status,
    )

    # RollbackToPrevious: the pair that collapsed stops, the revision that served before it
    # serves again (with no such revision left, the guard only alerts).
    refused = pair.refused | (_rolled_back(status) & {desired_revision})
    if action == "RollbackToPrevious" and pair_revision is not None:
        previous = _served_before(status, revisions, pair_revision)
        if previous is not None:
            refused = refused | {pair_revision}
            recorded_stable = previous

    # The canary and its analysis (spec.rollout set): judged before the plan, whose input the
    # outcome is. A revision rolled back stays at zero until the spec names another pair. The
    # collapse guard's fallback is not a canary: it replaces the collapsed pair once ready.
    stable = resolve_stable(recorded_stable, revisions, desired_revision)
    rollout = spec.rollout
    canary_replicas = (
        (rollout.canary.replicas if rollout.canary else 1)
        if analysed(spec) and action != "DisableSpeculation"
        else None
    )
    canary = (
        desired_revision
        if canary_replicas is not None
        and stable is not None
        and desired_revision not in (None, stable)
        and desired_revision not in refused
        else None
    )
    stable_record = next((r for r in revisions if r.revision == stable), None)
    canary_record = next((r for r in revisions if r.revision == canary), None)
    judgement = judge_canary(
        status.analysis if status else None,
        canary=canary,
        canary_ready=canary is not None and _canary_ready(canary, revisions, canary_replicas or 1),
        stable=stable,
        stable_has_draft=bool(
            stable_record
            and (stable_record.pair.get("draft") or {}).get("method") not in (None, "none")
        ),
        measurements=snapshot.measurements,
        settings=settings,
        now=now,
        tuned=_tuned_only(canary, tuning.state, stable_record, canary_record),
    )
    if judgement.outcome == Outcome.ROLLBACK and canary is not None:
        refused = refused | {canary}
    plan = plan_rollout(
        desired_revision,
        revisions,
        spec.replicas,
        recorded_stable,
        spec.revision_history_limit,
        held=refused,
        canary_replicas=canary_replicas,
        promoted=judgement.outcome == Outcome.PROMOTE,
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
        queue,
        snapshot.pods,
        snapshot.workloads if queue else [],
        snapshot.local_queue,
        missing_priority_class=(
            spec.placement.priority_class if snapshot.priority_class is None else None
        ),
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
        crash_loop=read_crash_loop(snapshot.pods, desired_revision),
        canary=judgement,
        measurements=snapshot.measurements,
        figures_every_seconds=duration_seconds(settings.interval),
        collapse=guard,
        autotune=tuning.state,
    )
    desired_status = build_status(sd, seen, stamp)
    current_status = snapshot.body.get("status") or {}
    events = (
        *plan.events,
        *_analysis_events(judgement, canary, stable),
        *pair.events,
        *guard.events,
        *tuning.events,
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
        acceptance_rate=desired_status.get("acceptanceRate"),
        wake_at=next_wake(
            judgement.state if canary is not None else None,
            settings.interval,
            guard.state,
            rollout.collapse_guard.for_ if rollout.collapse_guard else None,
            now,
        ),
    )


_VERDICT_REASONS = {
    Result.PASS: Reason.ANALYSIS_PASSED,
    Result.FAIL: Reason.ANALYSIS_FAILED,
    Result.INCONCLUSIVE: Reason.ANALYSIS_INCONCLUSIVE,
}


def _analysis_events(
    judgement: CanaryJudgement, canary: str | None, stable: str | None
) -> list[RolloutEvent]:
    """An Event per verdict counted, and one when the verdicts promote or roll back."""
    verdict, state = judgement.verdict, judgement.state
    if verdict is None or state is None or canary is None:
        return []
    counts = f"{state.passes_in_a_row} passes in a row, {state.failures} failures"
    events = [
        RolloutEvent(
            _VERDICT_REASONS[verdict.result],
            f"canary {canary}: {verdict.message} ({counts})",
            warning=verdict.result == Result.FAIL,
        )
    ]
    if judgement.outcome == Outcome.PROMOTE:
        events.append(
            RolloutEvent(
                Reason.CANARY_PROMOTED,
                f"canary {canary} promoted after {state.passes_in_a_row} passing verdicts; "
                f"it scales up and replaces revision {stable}",
            )
        )
    elif judgement.outcome == Outcome.ROLLBACK:
        events.append(
            RolloutEvent(
                Reason.ROLLED_BACK,
                f"canary {canary} rolled back: {verdict.message}, {state.failures} failed "
                f"verdicts; revision {stable} keeps serving",
                warning=True,
            )
        )
    return events


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
    """The manifest of every child, and which of them need a write (see plan.children.drift)."""
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
        wanted.append(build_pod_monitor(served, config.pod_monitor_labels))
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
