"""Condition transitions keep lastTransitionTime while the status stays."""

from __future__ import annotations

from specdeploy.plan.status import ConditionUpdate, find_condition, set_condition, status_patch


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
