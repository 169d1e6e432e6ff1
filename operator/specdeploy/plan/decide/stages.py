"""The named stages of one reconcile's decision; each takes and returns plain data.

    read_world → choose_served_pair → check_pair → judge_the_canary → plan_revisions
      → choose_child_writes → report_status → collect_events (and wake_at)

Each stage is a thin join of the world so far with the concern that decides (placement,
rollout, children, status): the decisions themselves live in those packages.

No stage patches another's result: each one's output is an input of the next.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, NamedTuple

from specdeploy.api.conditions import Reason
from specdeploy.api.config import AnalysisSettings, OperatorConfig
from specdeploy.api.models import (
    ModelShape,
    ScheduleStep,
    SizingDecision,
    SpeculationStatus,
    SpeculativeDeployment,
)
from specdeploy.api.times import RFC3339
from specdeploy.plan.children.manifests import pod_selector
from specdeploy.plan.children.revision import HASH_SCHEMA, revision_for, schema_of
from specdeploy.plan.children.writes import (
    ChildWrites,
    LiveChildren,
    plan_child_writes,
    revision_label,
)
from specdeploy.plan.decide.snapshot import Snapshot
from specdeploy.plan.placement.admission import describe_group, judge_admission
from specdeploy.plan.placement.gpu_catalog import (
    GpuNodeInventory,
    GpuProduct,
    read_gpu_inventories,
)
from specdeploy.plan.placement.sizing import ShapeUnknown, Unschedulable, keep_sizing, size_pair
from specdeploy.plan.rollout.analysis import duration_seconds
from specdeploy.plan.rollout.autotune import Tuning, tune_deployment, tuned_spec
from specdeploy.plan.rollout.canary import (
    CanaryDecision,
    analysis_events,
    judge_revisions,
    rolled_back,
    wake_moments,
)
from specdeploy.plan.rollout.collapse import RESUME_ANNOTATION, GuardVerdict, watch_collapse
from specdeploy.plan.rollout.lifecycle import PersonRequests
from specdeploy.plan.rollout.retry import honour_retry
from specdeploy.plan.rollout.revisions import (
    RevisionDeployment,
    RolloutEvent,
    RolloutPlan,
    plan_rollout,
    read_revision_deployment,
    ready_pods_by_revision,
)
from specdeploy.plan.rollout.speculation import decide_speculation, served_spec
from specdeploy.plan.rollout.wakeup import next_wake
from specdeploy.plan.status.crash_loop import read_crash_loop
from specdeploy.plan.status.pair_check import PairVerdict, judge_pair
from specdeploy.plan.status.pod_failure import read_pod_failure
from specdeploy.plan.status.refusal import blocked_keys, revision_refusal
from specdeploy.plan.status.report import ObservedRollout, build_status, condition_events


@dataclass(frozen=True)
class World:
    """The snapshot in the plan's own terms, read once."""

    sd: SpeculativeDeployment
    settings: AnalysisSettings
    #: Nodes that take new pods.
    inventory: Sequence[GpuNodeInventory]
    #: Every node, cordoned ones too (a serving revision keeps a device some node gives).
    known_devices: Sequence[GpuNodeInventory]
    revisions: Sequence[RevisionDeployment]
    #: How long a new revision may take to be ready and judged (the progress deadline).
    deadline_seconds: float = 1800.0


def read_world(snapshot: Snapshot, config: OperatorConfig, catalog: Sequence[GpuProduct]) -> World:
    """The SD, its analysis settings, the GPU inventory and its revision Deployments; a
    person's retry of a rolled-back revision is read into its status (plan.rollout.retry)."""
    sd = SpeculativeDeployment.from_body(dict(snapshot.body))
    retried = honour_retry(sd.status, sd.metadata.annotations)
    if retried is not sd.status:
        sd = sd.model_copy(update={"status": retried})
    ready_pods = ready_pods_by_revision(snapshot.pods)
    found = (
        read_revision_deployment(d, ready_pods)
        for d in (*snapshot.deployments, *snapshot.leader_worker_sets)
    )
    return World(
        sd=sd,
        settings=config.analysis_for(sd.spec.rollout.analysis),
        inventory=read_gpu_inventories(snapshot.nodes, catalog),
        known_devices=read_gpu_inventories(snapshot.nodes, catalog, include_cordoned=True),
        revisions=[r for r in found if r is not None],
        deadline_seconds=config.progress_deadline_for(sd.spec.rollout),
    )


class ServedPair(NamedTuple):
    """The SD as served (after the speculation decision), its sizing, and its revision."""

    served: SpeculativeDeployment
    sized: SizingDecision | ShapeUnknown | Unschedulable
    #: The revision hash; None when the pair could not be sized.
    revision: str | None
    #: The hash schema the revision was (or is to be) made with (plan.children.revision).
    schema: int = HASH_SCHEMA


def serve_pair(
    sd: SpeculativeDeployment,
    speculation: SpeculationStatus,
    inventory: Sequence[GpuNodeInventory],
    config: OperatorConfig,
    *,
    catalog: Sequence[GpuProduct],
    fetched_shapes: Mapping[str, ModelShape],
    known_devices: Sequence[GpuNodeInventory] = (),
    existing: Mapping[str, int] | None = None,
    tokens: int | None = None,
    schedule: Sequence[ScheduleStep] | None = None,
    lws_served: bool = True,
) -> ServedPair:
    """The served spec, what one replica of it runs on, and the revision those pods make.

    `known_devices` (every node, cordoned ones too) and `existing` (the revisions that have
    Deployments, each with the hash schema it was made with) keep a serving revision's device: a
    node cordoned, drained or added changes the inventory, not the pair, so a revision that
    exists keeps its device while some known node still gives it. A revision an older operator
    made keeps its name (revision_for). `tokens` is the autotuned speculation length (None: the
    spec's own).
    """
    existing = existing or {}
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
        if kept is not None and revision_for(served.spec, kept, config, existing)[0] in existing:
            sized = kept
    if isinstance(sized, SizingDecision) and (sized.nodes_per_replica or 1) > 1 and not lws_served:
        sized = Unschedulable(
            memory=sized.memory,
            message=(
                f"{sized.message}; but a replica across nodes is a LeaderWorkerSet group, and "
                "the LeaderWorkerSet kind (leaderworkerset.x-k8s.io/v1) is not served here: "
                "install the LeaderWorkerSet controller (Kueue's leaderworkerset integration "
                "admits its groups)"
            ),
        )
    if not isinstance(sized, SizingDecision):
        return ServedPair(served, sized, None)
    revision, schema = revision_for(served.spec, sized, config, existing)
    return ServedPair(served, sized, revision, schema)


@dataclass(frozen=True)
class Serving:
    """What the pods are to serve: speculation on or off, the autotuner's step, the collapse
    guard's verdict, and the served pair with its sizing and revision."""

    speculation: SpeculationStatus
    tuning: Tuning
    guard: GuardVerdict
    #: The guard's action once it fired (now or before), else None.
    guard_action: str | None
    pair: ServedPair
    #: The revision of the spec's pair while it speculates (what the guard watches).
    pair_revision: str | None

    @property
    def desired_revision(self) -> str | None:
        return self.pair.revision

    @property
    def sizing(self) -> SizingDecision | None:
        sized = self.pair.sized
        return sized if isinstance(sized, SizingDecision) else None


def live_schemas(snapshot: Snapshot) -> dict[str, int]:
    """Each revision that has a Deployment or LeaderWorkerSet, with its hash schema."""
    return {
        revision: schema_of(child)
        for child in (*snapshot.deployments, *snapshot.leader_worker_sets)
        if (revision := revision_label(child))
    }


def choose_served_pair(
    world: World,
    snapshot: Snapshot,
    config: OperatorConfig,
    catalog: Sequence[GpuProduct],
    now: datetime,
) -> Serving:
    """The pair the spec names, tuned by the autotuner, with speculation turned off when the
    queue or the collapse guard says so."""
    sd, status = world.sd, world.sd.status
    existing = live_schemas(snapshot)

    def serve(
        speculation: SpeculationStatus,
        tokens: int | None,
        schedule: Sequence[ScheduleStep] | None = None,
    ) -> ServedPair:
        return serve_pair(
            sd,
            speculation,
            world.inventory,
            config,
            catalog=catalog,
            fetched_shapes=snapshot.fetched_shapes,
            known_devices=world.known_devices,
            existing=existing,
            tokens=tokens,
            schedule=schedule,
            lws_served=snapshot.leader_worker_sets_served,
        )

    speculation = decide_speculation(sd.spec, config)
    # The autotuner (spec.pair.draft.autotune) may serve a tuned k in place of the spec's.
    tuning = tune_deployment(
        sd,
        snapshot.autotune,
        world.settings,
        lambda k, steps: (
            serve(speculation, k, steps).revision if speculation.state == "Enabled" else None
        ),
        now,
        trial_measured=snapshot.autotune_trial,
    )
    pair = serve(speculation, tuning.tokens, tuning.schedule)
    pair_revision = pair.revision if speculation.state == "Enabled" else None
    guard = watch_collapse(
        status.collapse if status else None,
        guard=sd.spec.rollout.collapse_guard,
        pair_revision=pair_revision,
        serving=pair_revision is not None
        and (status.stable_revision if status else None) == pair_revision,
        measured=snapshot.measurements.get(pair_revision or ""),
        min_draft_tokens=world.settings.min_draft_tokens,
        resume=sd.metadata.annotations.get(RESUME_ANNOTATION),
        now=now,
    )
    action = guard.state.action if guard.fired and guard.state is not None else None
    if action == "DisableSpeculation" and guard.state is not None:
        speculation = decide_speculation(sd.spec, config, collapsed=True).model_copy(
            update={"message": f"{guard.state.message}; resume: see status.collapse"}
        )
        pair = serve(speculation, tuning.tokens, tuning.schedule)
    return Serving(speculation, tuning, guard, action, pair, pair_revision)


def _desired_ready(desired_revision: str | None, revisions: Sequence[RevisionDeployment]) -> bool:
    """Whether the desired revision has pods and all of them are ready (its launcher then
    accepted the pair)."""
    desired = next((r for r in revisions if r.revision == desired_revision), None)
    return desired is not None and desired.replicas > 0 and desired.fully_ready


def check_pair(world: World, serving: Serving, pods: Sequence[Mapping[str, Any]]) -> PairVerdict:
    """The launcher's verdict on the desired pair, read from its pods' exits."""
    return judge_pair(
        serving.desired_revision,
        _desired_ready(serving.desired_revision, world.revisions),
        serving.pair.served.spec.pair.draft.method != "none",
        pods,
        world.sd.status,
        rolled_back=rolled_back(world.sd.status),
    )


def judge_the_canary(
    world: World,
    serving: Serving,
    pair: PairVerdict,
    snapshot: Snapshot,
    now: datetime,
) -> CanaryDecision:
    """The stable and canary revisions and the canary's verdict (plan.rollout.canary)."""
    return judge_revisions(
        world.sd.spec,
        world.sd.status,
        world.revisions,
        desired_revision=serving.desired_revision,
        pair_revision=serving.pair_revision,
        refused_by_launcher=pair.refused,
        guard_action=serving.guard_action,
        tuning=serving.tuning.state,
        measurements=snapshot.measurements,
        settings=world.settings,
        now=now,
        pods=snapshot.pods,
        annotations=world.sd.metadata.annotations,
        generation=world.sd.metadata.generation,
        probes_measured=snapshot.probes,
        requests=PersonRequests.from_annotations(world.sd.metadata.annotations),
        deadline_seconds=world.deadline_seconds,
    )


def plan_revisions(world: World, serving: Serving, canary: CanaryDecision) -> RolloutPlan:
    """The replicas of every revision Deployment, and which ones go."""
    spec = world.sd.spec
    return plan_rollout(
        serving.desired_revision,
        world.revisions,
        spec.replicas,
        canary.recorded_stable,
        spec.revision_history_limit,
        held=canary.held,
        canary_replicas=canary.canary_replicas,
        promoted=canary.promoted,
        max_surge=spec.rollout.max_surge,
    )


def choose_child_writes(
    snapshot: Snapshot,
    world: World,
    serving: Serving,
    plan: RolloutPlan,
    config: OperatorConfig,
) -> ChildWrites:
    """Every child's manifest, and the writes of those that differ (plan.children.writes),
    less those of children not to be written (snapshot.refused_writes)."""
    live = LiveChildren(
        deployments=snapshot.deployments,
        leader_worker_sets=snapshot.leader_worker_sets,
        records=snapshot.records,
        service=snapshot.service,
        pod_monitor_served=snapshot.pod_monitor_served,
        pod_monitor=snapshot.pod_monitor,
    )
    writes = plan_child_writes(
        live,
        serving.pair.served,
        desired_revision=serving.desired_revision,
        sizing=serving.sizing,
        plan=plan,
        config=config,
        revisions=world.revisions,
        schema=serving.pair.schema,
    )
    blocked = blocked_keys(snapshot.refused_writes)
    if not blocked:
        return writes
    return replace(
        writes,
        applies=tuple(m for m in writes.applies if _key(m) not in blocked),
        create_records=tuple(r for r in writes.create_records if _key(r) not in blocked),
        scales=tuple(s for s in writes.scales if ("Deployment", s[0]) not in blocked),
    )


def held_revision(snapshot: Snapshot, serving: Serving) -> str | None:
    """The desired revision when its Deployment or LeaderWorkerSet is not to be written
    (snapshot.refused_writes), else None."""
    desired = serving.desired_revision
    sd_name = serving.pair.served.metadata.name
    return desired if revision_refusal(snapshot.refused_writes, sd_name, desired) else None


def _key(manifest: Mapping[str, Any]) -> tuple[str, str]:
    return manifest["kind"], manifest["metadata"]["name"]


def report_status(
    snapshot: Snapshot,
    world: World,
    serving: Serving,
    *,
    pair: PairVerdict,
    canary: CanaryDecision,
    plan: RolloutPlan,
    now: datetime,
) -> dict[str, Any]:
    """The status this reconcile concludes, Kueue's admission included."""
    spec = world.sd.spec
    queue = spec.placement.queue
    sizing = serving.sizing
    group_note = None
    if sizing is not None and (sizing.nodes_per_replica or 1) > 1:
        group_note = describe_group(
            sizing.nodes_per_replica or 1,
            sizing.count,
            sizing.resource_name,
            canary_revision=serving.desired_revision if plan.canary else None,
        )
    admission = judge_admission(
        queue,
        snapshot.pods,
        snapshot.workloads if queue else [],
        snapshot.local_queue,
        missing_priority_class=(
            spec.placement.priority_class if snapshot.priority_class is None else None
        ),
        group_sets={r.name for r in world.revisions if r.kind == "LeaderWorkerSet"},
        group_note=group_note,
        now=now,
        kueue=snapshot.kueue,
        namespace=world.sd.metadata.namespace or "",
    )
    sized = serving.pair.sized
    seen = ObservedRollout(
        sizing=serving.sizing,
        sizing_problem=None if serving.sizing is not None else sized.message,
        speculation=serving.speculation,
        desired_revision=serving.desired_revision,
        plan=plan,
        revisions=world.revisions,
        admission=admission,
        selector=pod_selector(world.sd),
        pair=pair,
        crash_loop=read_crash_loop(snapshot.pods, serving.desired_revision),
        pod_failure=read_pod_failure(snapshot.pods, serving.desired_revision),
        canary=canary.judgement,
        measurements=snapshot.measurements,
        figures_every_seconds=duration_seconds(world.settings.interval),
        collapse=serving.guard,
        autotune=serving.tuning.state,
        since=canary.since,
        overdue=canary.overdue,
        undone=canary.undone,
        probes=canary.probes,
        refused_writes=tuple(snapshot.refused_writes),
    )
    return build_status(world.sd, seen, now.strftime(RFC3339))


def collect_events(
    serving: Serving,
    *,
    pair: PairVerdict,
    canary: CanaryDecision,
    plan: RolloutPlan,
    children: ChildWrites,
    told: Sequence[RolloutEvent],
    held: bool = False,
) -> tuple[RolloutEvent, ...]:
    """Every Event of this reconcile, in the order a person reads them in `kubectl describe`;
    `told`, those of the status's condition changes (status_events), come last. No revision
    is said created while its child is not written (`held`: held_revision)."""
    return (
        *(e for e in plan.events if not (held and e.reason == Reason.NEW_REVISION)),
        *analysis_events(canary),
        *pair.events,
        *serving.guard.events,
        *serving.tuning.events,
        *children.events,
        *told,
    )


def status_events(snapshot: Snapshot, status: Mapping[str, Any]) -> tuple[RolloutEvent, ...]:
    """The Events of the conditions `status` changes from those the SD holds."""
    current = snapshot.body.get("status") or {}
    return tuple(condition_events(current.get("conditions") or [], status["conditions"]))


def wake_at(
    world: World,
    serving: Serving,
    canary: CanaryDecision,
    now: datetime,
    *,
    also: Iterable[datetime | None] = (),
) -> datetime | None:
    """When the SD next has a verdict due: the canary's next interval or the guard's `for`;
    `also` adds other moments (a first status left unwritten)."""
    guard = world.sd.spec.rollout.collapse_guard
    return next_wake(
        canary.judgement.state if canary.canary is not None else None,
        world.settings.interval,
        serving.guard.state,
        guard.for_ if guard else None,
        now,
        also=(*wake_moments(canary, world.deadline_seconds, now), *also),
    )
