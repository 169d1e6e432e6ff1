"""Condition transitions keep lastTransitionTime while the status stays."""

from __future__ import annotations

import dataclasses
from typing import Any

from specdeploy.api.conditions import Reason
from specdeploy.api.models import (
    ConditionStatus,
    SizingDecision,
    SpeculationStatus,
    SpeculativeDeployment,
)
from specdeploy.plan.rollout.revisions import RevisionDeployment, RolloutPlan
from specdeploy.plan.status.conditions import ConditionUpdate, find_condition, set_condition
from specdeploy.plan.status.pair_check import judge_pair
from specdeploy.plan.status.pod_failure import PodFailure
from specdeploy.plan.status.report import (
    ObservedRollout,
    build_status,
    condition_events,
    status_patch,
)


def test_new_condition_gets_now_and_generation() -> None:
    conditions = set_condition([], ConditionUpdate("Ready", "False", "Waiting", "m"), 3, "t1")
    assert len(conditions) == 1
    assert conditions[0].last_transition_time == "t1"
    assert conditions[0].observed_generation == 3


def test_same_status_keeps_the_transition_time_but_updates_reason_and_generation() -> None:
    first = set_condition([], ConditionUpdate("Ready", "False", "A", "m"), 1, "t1")
    second = set_condition(first, ConditionUpdate("Ready", "False", "B", "n"), 2, "t2")
    ready = find_condition(second, "Ready")
    assert ready is not None
    assert (ready.reason, ready.message, ready.last_transition_time) == ("B", "n", "t1")
    assert ready.observed_generation == 2


def test_status_change_moves_the_transition_time_and_keeps_other_conditions() -> None:
    conditions = set_condition([], ConditionUpdate("Admitted", "True", "Admitted"), 1, "t0")
    conditions = set_condition(conditions, ConditionUpdate("Ready", "False", "A"), 1, "t1")
    conditions = set_condition(conditions, ConditionUpdate("Ready", "True", "B"), 1, "t2")
    assert [c.type for c in conditions] == ["Admitted", "Ready"]
    ready = find_condition(conditions, "Ready")
    assert ready is not None
    assert ready.last_transition_time == "t2"


def test_status_patch_is_empty_when_nothing_changed() -> None:
    current = {"phase": "Serving", "kopf": {"progress": {}}, "replicas": 2}
    assert status_patch(current, {"phase": "Serving", "replicas": 2}) == {}
    assert status_patch(current, {"phase": "Progressing", "replicas": 2}) == {
        "phase": "Progressing"
    }
    assert status_patch(current, {"phase": "Serving", "replicas": None}) == {"replicas": None}
    assert status_patch(current, {"sizing": None}) == {}


def test_status_patch_removes_what_the_desired_status_no_longer_holds() -> None:
    current = {
        "sizing": {"resourceName": "nvidia.com/mig-3g.40gb", "migProfile": "3g.40gb", "count": 1},
        "conditions": [{"type": "Ready", "status": "True"}, {"type": "Old", "status": "True"}],
        "acceptanceRate": 0.8,
    }
    desired = {
        "sizing": {"resourceName": "nvidia.com/gpu", "count": 1},
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    patch = status_patch(current, desired)
    # Nested keys the decision dropped are removed; lists are replaced whole; keys the desired
    # status does not own (acceptanceRate) are left alone.
    assert patch == {
        "sizing": {"resourceName": "nvidia.com/gpu", "migProfile": None},
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    assert status_patch({**current, **desired}, desired) == {}


def _observed(
    desired: str | None, stable: str | None, ready: bool, admitted: ConditionStatus = "True"
) -> ObservedRollout:
    revisions = [
        RevisionDeployment(
            "sd-a", "a", 0 if desired == "b" else 1, 0, "t0", pair={"draft": {"method": "eagle3"}}
        ),
    ]
    if desired == "b":
        revisions.append(RevisionDeployment("sd-b", "b", 1, 1 if ready else 0, "t1"))
    sizing = (
        SizingDecision(resource_name="nvidia.com/gpu", count=1, tensor_parallel_size=1)
        if desired
        else None
    )
    return ObservedRollout(
        sizing=sizing,
        sizing_problem=None if desired else "needs 976.0 GiB",
        speculation=SpeculationStatus(state="Enabled", reason="SpeculationEnabled"),
        desired_revision=desired,
        plan=RolloutPlan({}, False, (), stable, ready),
        revisions=revisions,
        admission=ConditionUpdate(
            "Admitted", admitted, "Admitted" if admitted == "True" else "WaitingForQuota", "m"
        ),
        selector="specdeploy.dev/name=sd",
        pair=judge_pair(desired, ready, True, [], None),
    )


def _sd(status: dict[str, Any] | None = None) -> SpeculativeDeployment:
    return SpeculativeDeployment.model_validate(
        {
            "metadata": {"name": "sd", "generation": 4},
            "spec": {
                "replicas": 1,
                "pair": {"version": "1", "target": {"model": "m"}, "draft": {"method": "none"}},
            },
            "status": status,
        }
    )


def test_status_of_a_serving_rollout() -> None:
    status = build_status(_sd(), _observed("b", "b", ready=True), "t9")
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == (
        "True",
        "AllReplicasReady",
        4,
    )
    assert status["phase"] == "Serving"
    assert [(r["revision"], r["phase"]) for r in status["revisions"]] == [
        ("a", "Superseded"),
        ("b", "Stable"),
    ]


def test_status_while_waiting_for_quota_and_when_unschedulable() -> None:
    waiting = build_status(_sd(), _observed("b", None, ready=False, admitted="False"), "t9")
    assert waiting["phase"] == "Pending"
    assert next(c for c in waiting["conditions"] if c["type"] == "Ready")["reason"] == (
        "WaitingForQuota"
    )
    failed = build_status(_sd(), _observed(None, None, ready=False), "t9")
    assert failed["phase"] == "Failed"
    sized = next(c for c in failed["conditions"] if c["type"] == "Sized")
    assert (sized["status"], sized["reason"], sized["message"]) == (
        "False",
        "Unschedulable",
        "needs 976.0 GiB",
    )
    degraded = build_status(_sd(), _observed(None, "a", ready=False), "t9")
    assert degraded["phase"] == "Degraded"


def test_verdicts_and_failed_phase_written_by_analysis_are_kept() -> None:
    recorded = {
        "revisions": [
            {
                "revision": "a",
                "pairVersion": "1",
                "target": {"model": "m"},
                "draft": {"method": "eagle3"},
                "phase": "Failed",
                "verdicts": [{"time": "t1", "result": "Fail", "acceptanceRate": 0.2}],
            }
        ]
    }
    status = build_status(_sd(recorded), _observed("b", "b", ready=True), "t9")
    first = status["revisions"][0]
    assert first["phase"] == "Failed"
    assert first["verdicts"][0]["acceptanceRate"] == 0.2


def test_condition_events_skip_unknown_and_expected_not_ready() -> None:
    start = [
        {"type": "Ready", "status": "False", "reason": "ReplicasNotReady", "message": "0/1"},
        {"type": "Admitted", "status": "Unknown", "reason": "WaitingForQuota", "message": ""},
        {"type": "Sized", "status": "False", "reason": "Unschedulable", "message": "976 GiB"},
    ]
    events = condition_events([], start)
    assert [(e.reason, e.warning) for e in events] == [("Unschedulable", True)]
    ready = [{"type": "Ready", "status": "True", "reason": "AllReplicasReady", "message": ""}]
    assert [e.reason for e in condition_events(start, ready)] == ["AllReplicasReady"]
    lost = [{"type": "Ready", "status": "False", "reason": "ReplicasNotReady", "message": ""}]
    assert [e.reason for e in condition_events(ready, lost)] == ["ReplicasNotReady"]
    assert condition_events(ready, ready) == []


def test_a_new_sds_first_status_posts_only_its_warnings() -> None:
    start = [
        {"type": "Ready", "status": "True", "reason": "AllReplicasReady", "message": "1/1"},
        {"type": "Sized", "status": "True", "reason": "Sized", "message": "1 x nvidia.com/gpu"},
        {"type": "Admitted", "status": "True", "reason": "NoQueue", "message": "no queue"},
        {"type": "Speculating", "status": "False", "reason": "DisabledBySpec", "message": ""},
    ]
    assert condition_events([], start) == []
    unsized = [{**start[1], "status": "False", "reason": "Unschedulable", "message": "976 GiB"}]
    assert [(e.reason, e.warning) for e in condition_events([], unsized)] == [
        ("Unschedulable", True)
    ]
    # After the first status, each change is news again, Normal ones too.
    enabled = [{**start[3], "status": "True", "reason": "SpeculationEnabled"}]
    assert [(e.reason, e.warning) for e in condition_events(start, enabled)] == [
        ("SpeculationEnabled", False)
    ]
    assert [e.reason for e in condition_events(unsized, start[1:2])] == ["Sized"]


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in status["conditions"] if c["type"] == type_)
    return found


def test_a_pod_that_cannot_start_is_named_in_ready_and_progressing() -> None:
    failing = dataclasses.replace(
        _observed("b", "a", ready=False),
        pod_failure=PodFailure("sd-b-7d9-x2", Reason.IMAGE_PULL_FAILED, "ErrImagePull: nope"),
    )
    status = build_status(_sd(), failing, "t9")
    ready, progressing = _condition(status, "Ready"), _condition(status, "Progressing")
    assert (ready["status"], ready["reason"]) == ("False", "ImagePullFailed")
    assert ready["message"] == (
        "0/1 pods ready; revision b: pod sd-b-7d9-x2 cannot pull its image: ErrImagePull: nope"
    )
    assert (progressing["status"], progressing["reason"]) == ("True", "ImagePullFailed")
    assert progressing["message"] == (
        "rolling out revision b alongside revision a; revision b: pod sd-b-7d9-x2 cannot pull "
        "its image: ErrImagePull: nope"
    )
    assert status["phase"] == "Progressing"
    # News even though Ready was never True: a Warning naming the pod.
    (event,) = condition_events([], [ready])
    assert (event.reason, event.warning) == ("ImagePullFailed", True)
    assert "sd-b-7d9-x2" in event.message


def test_quota_bypassed_does_not_hold_ready_back() -> None:
    bypassed = dataclasses.replace(
        _observed("b", "b", ready=True),
        admission=ConditionUpdate("Admitted", "False", Reason.QUOTA_BYPASSED, "no webhook"),
    )
    status = build_status(_sd(), bypassed, "t9")
    assert _condition(status, "Ready")["status"] == "True"
    assert _condition(status, "Admitted")["reason"] == "QuotaBypassed"
    assert status["phase"] == "Serving"
    starting = dataclasses.replace(bypassed, plan=RolloutPlan({}, False, (), None, False))
    assert build_status(_sd(), starting, "t9")["phase"] == "Progressing"
