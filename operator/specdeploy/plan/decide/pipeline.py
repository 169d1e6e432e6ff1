"""`decide`: one reconcile's decision as a straight pipeline of named stages (stages.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from specdeploy.api.conditions import Reason
from specdeploy.api.config import OperatorConfig
from specdeploy.plan.decide.snapshot import Decision, Snapshot
from specdeploy.plan.decide.stages import (
    check_pair,
    choose_child_writes,
    choose_served_pair,
    collect_events,
    held_revision,
    judge_the_canary,
    plan_revisions,
    read_world,
    report_status,
    status_events,
    wake_at,
)
from specdeploy.plan.placement.gpu_catalog import GpuProduct
from specdeploy.plan.placement.sizing import ShapeUnknown
from specdeploy.plan.rollout.lifecycle import spent_requests
from specdeploy.plan.status.first_status import first_status_due
from specdeploy.plan.status.report import status_patch


def settle(first: Decision, after: Decision, *, report: bool = False) -> Decision:
    """`first` with the status and condition Events of `after`, the decision taken on the same
    snapshot once `first`'s child writes are in it (as the API server answered them): a
    reconcile that writes children reports the world its writes made, so the reconcile their
    watch events start has no status to write just to name a revision this one created.

    `first` as it was when the world is not settled: `after` would write children too, or
    would post an Event (other than of a condition) that `first` does not; unless `report`
    (children of `first` were not written: `after` knows, and its status must say so, or the
    next reconcile would send them again)."""
    others = first.events[: len(first.events) - len(first.status_events)]
    news = after.events[: len(after.events) - len(after.status_events)]
    if not report and (after.writes_children or not set(news) <= set(others)):
        return first
    if after.held_revision is not None:
        # Its Deployment was refused: no Event says the revision was created.
        others = tuple(e for e in others if e.reason != Reason.NEW_REVISION)
    return replace(
        first,
        status_patch=after.status_patch,
        events=(*others, *after.status_events),
        status_events=after.status_events,
        acceptance_rate=after.acceptance_rate,
        wake_at=after.wake_at,
        status_due=after.status_due,
    )


def decide(
    snapshot: Snapshot,
    config: OperatorConfig,
    catalog: Sequence[GpuProduct],
    now: datetime,
) -> Decision:
    """Everything the reconcile does about one SD, decided from `snapshot` alone."""
    world = read_world(snapshot, config, catalog)
    serving = choose_served_pair(world, snapshot, config, catalog, now)
    pair = check_pair(world, serving, snapshot.pods)
    canary = judge_the_canary(world, serving, pair, snapshot, now)
    plan = plan_revisions(world, serving, canary)
    children = choose_child_writes(snapshot, world, serving, plan, config)
    held = held_revision(snapshot, serving)
    status = report_status(snapshot, world, serving, pair=pair, canary=canary, plan=plan, now=now)
    told = status_events(snapshot, status)
    events = collect_events(
        serving,
        pair=pair,
        canary=canary,
        plan=plan,
        children=children,
        told=told,
        held=held is not None,
    )
    # A child not written is said at once (else the next reconcile would send it again).
    due = None if snapshot.refused_writes else first_status_due(snapshot.body, status, events, now)
    if due is not None:
        # The status and the condition Events it tells wait for a later reconcile.
        events, told = events[: len(events) - len(told)], ()
    sized = serving.pair.sized
    sets = {r.name for r in world.revisions if r.kind == "LeaderWorkerSet"}
    return Decision(
        replace_records=children.replace_records,
        create_records=children.create_records,
        applies=children.applies,
        scales=children.scales,
        deletes=tuple(name for name in plan.delete if name not in sets),
        delete_sets=tuple(name for name in plan.delete if name in sets),
        status_patch=(
            status_patch(snapshot.body.get("status") or {}, status) if due is None else {}
        ),
        events=events,
        status_events=told,
        shape_unknown=sized.message if isinstance(sized, ShapeUnknown) else None,
        acceptance_rate=status.get("acceptanceRate"),
        wake_at=wake_at(world, serving, canary, now, also=(due,)),
        status_due=due,
        open_gates=canary.gates_to_open,
        held_revision=held,
        spent_requests=spent_requests(
            world.sd.metadata.annotations, world.sd.status.analysis if world.sd.status else None
        ),
    )
