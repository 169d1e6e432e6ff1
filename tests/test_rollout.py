"""Revision transitions: new revision alongside, old one to zero only once the new is ready."""

from __future__ import annotations

from specdeploy.api.conditions import Reason
from specdeploy.plan.rollout.revisions import (
    RevisionDeployment,
    plan_rollout,
    pods_of,
    read_revision_deployment,
)


def rev(
    name: str, replicas: int, ready: int, created: str = "2026-01-01T00:00:00Z"
) -> RevisionDeployment:
    return RevisionDeployment(
        name=f"sd-{name}",
        revision=name,
        replicas=replicas,
        ready_replicas=ready,
        created=created,
        pods=replicas,
    )


def test_first_revision_is_created_with_the_spec_replicas() -> None:
    plan = plan_rollout("aaa", [], spec_replicas=2, stable_revision=None, history_limit=5)
    assert plan.create_desired
    assert plan.replicas == {"aaa": 2}
    assert plan.stable_revision is None
    assert not plan.desired_ready
    assert [e.reason for e in plan.events] == [Reason.NEW_REVISION]


def test_first_revision_becomes_stable_once_ready() -> None:
    plan = plan_rollout("aaa", [rev("aaa", 2, 2)], 2, None, 5)
    assert not plan.create_desired
    assert plan.stable_revision == "aaa"
    assert plan.desired_ready
    assert plan.replicas == {"aaa": 2}


def test_new_revision_runs_alongside_until_ready() -> None:
    existing = [rev("old", 2, 2, "2026-01-01T00:00:00Z")]
    plan = plan_rollout("new", existing, 2, "old", 5)
    assert plan.create_desired
    assert plan.replicas == {"new": 2, "old": 2}
    assert plan.stable_revision == "old"

    existing.append(rev("new", 2, 1, "2026-01-02T00:00:00Z"))
    plan = plan_rollout("new", existing, 2, "old", 5)
    assert plan.replicas == {"new": 2, "old": 2}, "old keeps serving while new is partly ready"
    assert plan.stable_revision == "old"


def test_old_revision_scales_to_zero_when_new_is_ready_and_is_kept() -> None:
    existing = [rev("old", 2, 2, "2026-01-01T00:00:00Z"), rev("new", 2, 2, "2026-01-02T00:00:00Z")]
    plan = plan_rollout("new", existing, 2, "old", 5)
    assert plan.replicas == {"new": 2, "old": 0}
    assert plan.stable_revision == "new"
    assert plan.delete == ()
    assert Reason.ROLLOUT_COMPLETE in [e.reason for e in plan.events]


def test_going_back_scales_an_old_revision_up_without_creating_one() -> None:
    existing = [rev("old", 0, 0, "2026-01-01T00:00:00Z"), rev("new", 2, 2, "2026-01-02T00:00:00Z")]
    plan = plan_rollout("old", existing, 2, "new", 5)
    assert not plan.create_desired
    assert plan.replicas == {"old": 2, "new": 2}
    assert plan.stable_revision == "new"


def test_a_revision_that_never_got_ready_is_dropped_for_the_next() -> None:
    existing = [
        rev("a", 2, 2, "2026-01-01T00:00:00Z"),
        rev("b", 2, 0, "2026-01-02T00:00:00Z"),
    ]
    plan = plan_rollout("c", existing, 2, "a", 5)
    assert plan.replicas == {"c": 2, "a": 2, "b": 0}
    assert Reason.SCALED_TO_ZERO in [e.reason for e in plan.events]


def test_history_limit_deletes_the_oldest_zero_replica_revisions() -> None:
    existing = [rev(f"r{i}", 0, 0, f"2026-01-0{i}T00:00:00Z") for i in range(1, 6)]
    existing.append(rev("cur", 1, 1, "2026-01-09T00:00:00Z"))
    plan = plan_rollout("cur", existing, 1, "cur", history_limit=2)
    assert plan.delete == ("sd-r3", "sd-r2", "sd-r1")
    assert set(plan.replicas) == {"cur", "r4", "r5"}


def test_unschedulable_desired_keeps_the_stable_revision_serving() -> None:
    existing = [rev("old", 2, 2)]
    plan = plan_rollout(None, existing, 3, "old", 5)
    assert not plan.create_desired
    assert plan.replicas == {"old": 3}
    assert plan.stable_revision == "old"


def test_scaling_the_sd_scales_the_stable_revision() -> None:
    plan = plan_rollout("aaa", [rev("aaa", 1, 1)], 3, "aaa", 5)
    assert plan.replicas == {"aaa": 3}
    assert not plan.desired_ready


def test_lost_status_finds_the_serving_revision() -> None:
    existing = [rev("old", 2, 2), rev("new", 2, 0, "2026-02-01T00:00:00Z")]
    plan = plan_rollout("new", existing, 2, None, 5)
    assert plan.stable_revision == "old"
    assert plan.replicas == {"new": 2, "old": 2}


def test_read_revision_deployment_and_pod_counts() -> None:
    deployment = {
        "metadata": {
            "name": "sd-abc",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"specdeploy.dev/revision": "abc", "specdeploy.dev/pair-version": "3.1"},
        },
        "spec": {
            "replicas": 2,
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "engine",
                            "env": [{"name": "SPECDEPLOY_PAIR", "value": '{"version": "3.1"}'}],
                        }
                    ]
                }
            },
        },
        "status": {"replicas": 2, "readyReplicas": 1},
    }
    state = read_revision_deployment(deployment)
    assert state is not None
    assert (state.revision, state.replicas, state.ready_replicas) == ("abc", 2, 1)
    assert state.pair == {"version": "3.1"}
    assert pods_of([state]) == (2, 1)
    assert read_revision_deployment({"metadata": {"name": "x"}}) is None


def test_with_a_surge_limit_the_new_revision_replaces_the_stable_one_step_by_step() -> None:
    old = rev("old", 4, 4, "2026-01-01T00:00:00Z")
    steps = []
    for ready_new in range(5):
        existing = [old] if ready_new == 0 else [old, rev("new", 4, ready_new, "2026-01-02")]
        plan = plan_rollout("new", existing, 4, "old", 5, max_surge=1)
        steps.append((plan.replicas["new"], plan.replicas["old"]))
        # Never more than replicas + maxSurge pods; as many ready as replicas all along.
        assert plan.replicas["new"] + plan.replicas["old"] <= 5
        assert ready_new + plan.replicas["old"] >= 4
        old = rev("old", plan.replicas["old"], plan.replicas["old"], "2026-01-01T00:00:00Z")
    assert steps == [(1, 4), (2, 3), (3, 2), (4, 1), (4, 0)]
    assert plan.desired_ready
    assert plan.stable_revision == "new"
    assert [e.reason for e in plan.events] == [Reason.ROLLOUT_COMPLETE]


def test_a_surge_of_two_and_a_surge_beyond_the_replicas() -> None:
    old = rev("old", 4, 4, "2026-01-01T00:00:00Z")
    plan = plan_rollout("new", [old, rev("new", 2, 1, "2026-01-02")], 4, "old", 5, max_surge=2)
    assert plan.replicas == {"new": 3, "old": 3}
    wide = plan_rollout("new", [old], 4, "old", 5, max_surge=8)
    assert wide.replicas == {"new": 4, "old": 4}


def test_a_surge_limit_leaves_the_first_revision_and_a_canary_alone() -> None:
    first = plan_rollout("new", [], 4, None, 5, max_surge=1)
    assert first.replicas == {"new": 4}
    old = rev("old", 4, 4, "2026-01-01T00:00:00Z")
    canary = plan_rollout("new", [old], 4, "old", 5, canary_replicas=1, max_surge=1)
    assert canary.replicas == {"new": 1, "old": 4}
    # Promoted, the canary grows by the surge as its pods get ready.
    promoted = plan_rollout(
        "new",
        [old, rev("new", 1, 1, "2026-01-02")],
        4,
        "old",
        5,
        canary_replicas=1,
        promoted=True,
        max_surge=1,
    )
    assert promoted.replicas == {"new": 2, "old": 3}
