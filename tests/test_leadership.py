"""Leader election on a Lease: who may take it, and what the Lease says afterwards."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from specdeploy.api.config import LeaderElection, OperatorConfig
from specdeploy.handlers.leadership import (
    claimed_spec,
    default_identity,
    may_take,
    released_spec,
)

NOW = datetime(2026, 11, 23, 18, 0, 0, tzinfo=UTC)
HELD = {"holderIdentity": "a", "leaseDurationSeconds": 15, "leaseTransitions": 2}


def test_a_lease_without_holder_or_held_by_oneself_may_be_taken_at_once() -> None:
    assert may_take({}, "b", unchanged_for=0)
    assert may_take({**HELD, "holderIdentity": None}, "b", unchanged_for=0)
    assert may_take(HELD, "a", unchanged_for=0)


def test_another_holders_lease_is_taken_only_once_unrenewed_for_its_duration() -> None:
    assert not may_take(HELD, "b", unchanged_for=14.9)
    assert may_take(HELD, "b", unchanged_for=15)


def test_a_restarted_process_in_the_same_pod_waits_for_its_old_lease_like_any_candidate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The chart's pod name, the same before and after its container restarts.
    monkeypatch.setenv("POD_NAME", "sd-specdeploy-7c9d8-x2bq4")
    before, after = default_identity(), default_identity()
    assert before != after
    assert before.startswith("sd-specdeploy-7c9d8-x2bq4_")
    assert after.startswith("sd-specdeploy-7c9d8-x2bq4_")
    held_before = claimed_spec({}, before, 15, NOW)
    assert not may_take(held_before, after, unchanged_for=0)
    assert not may_take(held_before, after, unchanged_for=14.9)
    assert may_take(held_before, after, unchanged_for=15)
    assert may_take(released_spec(held_before, NOW), after, unchanged_for=0)


def test_taking_over_counts_a_transition_and_renewing_does_not() -> None:
    taken = claimed_spec(HELD, "b", 15, NOW)
    assert taken["holderIdentity"] == "b"
    assert taken["leaseTransitions"] == 3
    assert taken["acquireTime"] == taken["renewTime"] == "2026-11-23T18:00:00.000000Z"
    later = datetime(2026, 11, 23, 18, 0, 2, tzinfo=UTC)
    renewed = claimed_spec(taken, "b", 15, later)
    assert renewed["leaseTransitions"] == 3
    assert renewed["acquireTime"] == taken["acquireTime"]
    assert renewed["renewTime"] == "2026-11-23T18:00:02.000000Z"
    assert claimed_spec({}, "a", 15, NOW)["leaseTransitions"] == 0


def test_a_released_lease_has_no_holder_and_may_be_taken_at_once() -> None:
    released = released_spec(claimed_spec(HELD, "a", 15, NOW), NOW)
    assert released["holderIdentity"] is None
    assert may_take(released, "b", unchanged_for=0)


def test_leader_election_is_off_by_default_and_needs_a_namespace_when_on() -> None:
    assert not OperatorConfig().leader_election.enabled
    with pytest.raises(ValueError, match="namespace is required"):
        OperatorConfig.from_mapping({"leaderElection": {"enabled": True}})
    config = OperatorConfig.from_mapping({"leaderElection": {"enabled": True, "namespace": "ops"}})
    assert config.leader_election.lease_name == "specdeploy-operator"


def test_the_renew_deadline_must_end_before_the_lease_does() -> None:
    with pytest.raises(ValueError, match="renewDeadlineSeconds < leaseDurationSeconds"):
        LeaderElection.model_validate(
            {"enabled": True, "namespace": "ops", "renewDeadlineSeconds": 20}
        )
