"""One reconcile's decision: from one snapshot of the world and `now` to every write and Event.

The reconcile is one straight path: the handler reads a `Snapshot` (the SD, its children, pods,
nodes, Kueue's objects, model shapes, measurements), `decide` turns it into a `Decision` with no
I/O, and the handler applies that. `decide` (pipeline.py) runs the named stages of stages.py,
each one's result an input of the next, never patched afterwards:

    read_world → choose_served_pair (speculation, autotune, collapse guard, sizing, revision)
      → check_pair (the launcher's verdict) → judge_revisions (stable, canary, its verdict)
      → plan_revisions (replicas) → plan_child_writes (manifests that differ)
      → report_status → collect_events

A reconcile that writes children decides once more on the same snapshot with those children as
its writes left them, and `settle` sends that decision's status instead (the status then names
what the writes made).
"""

from specdeploy.plan.decide.pipeline import decide, settle
from specdeploy.plan.decide.snapshot import Decision, Snapshot
from specdeploy.plan.decide.stages import ServedPair, serve_pair
from specdeploy.plan.rollout.canary import analysed, watches_acceptance

__all__ = [
    "Decision",
    "ServedPair",
    "Snapshot",
    "analysed",
    "decide",
    "serve_pair",
    "settle",
    "watches_acceptance",
]
