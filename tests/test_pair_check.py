"""The launcher's verdict read from pods: PairCompatible, a refused revision stopped, no loop."""

from __future__ import annotations

from typing import Any

from specdeploy.api.models import (
    SizingDecision,
    SpeculationStatus,
    SpeculativeDeployment,
    SpeculativeDeploymentStatus,
)
from specdeploy.plan.rollout.revisions import RevisionDeployment, plan_rollout
from specdeploy.plan.status import pair_check
from specdeploy.plan.status.conditions import ConditionUpdate
from specdeploy.plan.status.pair_check import (
    judge_pair,
    read_launcher_exits,
    shows_launcher_exit,
)
from specdeploy.plan.status.report import ObservedRollout, build_status

LINE = "EAGLE-3 head expects target hidden size 512, but the target /m/target has hidden size 256"


def pod(
    revision: str,
    *,
    state: dict[str, Any] | None = None,
    last: dict[str, Any] | None = None,
    restarts: int = 0,
    container: str = "engine",
) -> dict[str, Any]:
    status: dict[str, Any] = {"name": container, "restartCount": restarts}
    status["state"] = state or {"waiting": {"reason": "ContainerCreating"}}
    if last is not None:
        status["lastState"] = last
    return {
        "metadata": {"name": f"sd-{revision}-x", "labels": {"specdeploy.dev/revision": revision}},
        "status": {"containerStatuses": [status]},
    }


def terminated(code: int, message: str = "") -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "reason": "Error", "message": message}}


def test_a_refusal_is_read_from_the_terminated_state_or_the_last_state() -> None:
    now = read_launcher_exits([pod("b", state=terminated(3, LINE + "\n"))])
    assert now["b"].exit_code == 3
    assert now["b"].message == LINE
    assert now["b"].reason == "PairIncompatible"
    # Restarted and waiting in back-off: the refusal is in lastState.
    later = read_launcher_exits(
        [pod("b", state={"waiting": {"reason": "CrashLoopBackOff"}}, last=terminated(3, LINE))]
    )
    assert later["b"].message == LINE
    assert later["b"].restarts == 0


def test_other_exits_and_other_containers_are_not_the_launchers_verdict() -> None:
    pods = [
        pod("a", state=terminated(137)),
        pod("a", state=terminated(1, "vLLM crashed")),
        pod("c", state=terminated(3, LINE), container="sidecar"),
        {"metadata": {"name": "stray"}, "status": {}},
    ]
    assert read_launcher_exits(pods) == {}


def test_a_missing_model_is_told_apart_and_a_refusal_wins_over_it() -> None:
    missing = read_launcher_exits([pod("b", state=terminated(4, "no model at /m/draft"))])
    assert missing["b"].reason == "ModelNotFound"
    both = read_launcher_exits(
        [pod("b", state=terminated(4, "no model")), pod("b", state=terminated(3, LINE))]
    )
    assert both["b"].exit_code == 3


def test_a_refused_desired_revision_is_incompatible_and_held_at_zero() -> None:
    verdict = judge_pair("b", False, True, [pod("b", state=terminated(3, LINE))], None)
    assert verdict.refused == {"b"}
    assert (verdict.condition.status, verdict.condition.reason) == ("False", "PairIncompatible")
    assert verdict.condition.message == LINE
    assert [(e.reason, e.warning) for e in verdict.events] == [("PairIncompatible", True)]
    assert LINE in verdict.events[0].message

    existing = [
        RevisionDeployment("sd-a", "a", 1, 1, "t0"),
        RevisionDeployment("sd-b", "b", 1, 0, "t1", pods=1),
    ]
    plan = plan_rollout("b", existing, 1, "a", 5)
    assert dict(plan.replicas) == {"a": 1, "b": 1}
    held = plan_rollout("b", existing, 1, "a", 5, held=verdict.refused)
    assert dict(held.replicas) == {"a": 1, "b": 0}
    assert held.stable_revision == "a"


def test_a_missing_model_is_unknown_and_keeps_its_pods() -> None:
    verdict = judge_pair("b", False, True, [pod("b", state=terminated(4, "no model"))], None)
    assert verdict.refused == frozenset()
    assert (verdict.condition.status, verdict.condition.reason) == ("Unknown", "ModelNotFound")
    assert [e.warning for e in verdict.events] == [True]


def test_ready_pods_verify_the_pair_and_pending_ones_leave_it_unverified() -> None:
    ready = judge_pair("b", True, True, [], None)
    assert (ready.condition.status, ready.condition.reason) == ("True", "PairVerified")
    waiting = judge_pair("b", False, True, [], None)
    assert (waiting.condition.status, waiting.condition.reason) == ("Unknown", "PairUnverified")
    assert waiting.events == ()
    no_draft = judge_pair("b", True, False, [], None)
    assert "no draft" in no_draft.condition.message


def _sd(status: dict[str, Any] | None = None) -> SpeculativeDeployment:
    body: dict[str, Any] = {
        "metadata": {"name": "sd", "namespace": "ns", "generation": 2},
        "spec": {
            "replicas": 1,
            "pair": {
                "version": "1",
                "target": {"model": "/m/target"},
                "draft": {
                    "method": "eagle3",
                    "model": "/m/eagle3-wrong-hidden",
                    "numSpeculativeTokens": 3,
                },
            },
        },
    }
    if status is not None:
        body["status"] = status
    return SpeculativeDeployment.from_body(body)


def _one_pass(
    sd: SpeculativeDeployment,
    existing: list[RevisionDeployment],
    pods: list[dict[str, Any]],
    now: str,
) -> tuple[dict[str, Any], dict[str, int], pair_check.PairVerdict]:
    """What reconcile does with plan/: rollout, the launcher's verdict, the status it writes."""
    stable = sd.status.stable_revision if sd.status else None
    desired = next(r for r in existing if r.revision == "b")
    verdict = judge_pair("b", desired.fully_ready, True, pods, sd.status)
    plan = plan_rollout("b", existing, 1, stable, 5, held=verdict.refused)
    seen = ObservedRollout(
        sizing=SizingDecision(resource_name="nvidia.com/gpu", count=1, tensor_parallel_size=1),
        sizing_problem=None,
        speculation=SpeculationStatus(state="Enabled", reason="SpeculationEnabled"),
        desired_revision="b",
        plan=plan,
        revisions=existing,
        admission=ConditionUpdate("Admitted", "True", "Admitted", ""),
        selector="specdeploy.dev/name=sd",
        pair=verdict,
    )
    return build_status(sd, seen, now), dict(plan.replicas), verdict


def test_refused_revision_stays_stopped_after_its_pods_are_gone_while_stable_serves() -> None:
    pair = {"target": {"model": "/m/target"}, "draft": {"method": "eagle3"}}
    serving = RevisionDeployment("sd-a", "a", 1, 1, "t0", pair=pair, pods=1)
    trying = RevisionDeployment("sd-b", "b", 1, 0, "t1", pair=pair, pods=1)
    before = {"stableRevision": "a", "conditions": []}

    # Pass 1: the launcher refused the new pair.
    status, replicas, verdict = _one_pass(
        _sd(before), [serving, trying], [pod("b", state=terminated(3, LINE))], "t2"
    )
    assert replicas == {"a": 1, "b": 0}
    assert verdict.events
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["PairCompatible"]["status"] == "False"
    assert conditions["PairCompatible"]["reason"] == "PairIncompatible"
    assert conditions["PairCompatible"]["message"] == LINE
    assert conditions["PairCompatible"]["observedGeneration"] == 2
    # Ready means serving: the stable revision serves every replica; Degraded says why.
    ready = conditions["Ready"]
    assert (ready["status"], ready["reason"]) == ("True", "AllReplicasReady")
    assert "revision b stopped (PairIncompatible: see Degraded)" in ready["message"]
    assert "revision a keeps serving" in conditions["Degraded"]["message"]
    assert conditions["Progressing"]["status"] == "False"
    assert status["phase"] == "Degraded"
    phases = {r["revision"]: r["phase"] for r in status["revisions"]}
    assert phases == {"a": "Stable", "b": "Failed"}

    # Pass 2: scaled to zero, its pod is gone; status remembers; nothing changes, no Event.
    stopped = RevisionDeployment("sd-b", "b", 0, 0, "t1", pair=pair, pods=0)
    again, replicas, verdict = _one_pass(_sd({**status}), [serving, stopped], [], "t3")
    assert replicas == {"a": 1, "b": 0}
    assert verdict.events == ()
    assert again == {**status, "replicas": 1}


def test_refused_revision_without_a_stable_one_fails_the_sd() -> None:
    trying = RevisionDeployment("sd-b", "b", 1, 0, "t1", pods=1)
    status, replicas, _ = _one_pass(
        _sd({"conditions": []}), [trying], [pod("b", last=terminated(3, LINE), restarts=1)], "t2"
    )
    assert replicas == {"b": 0}
    assert status["phase"] == "Failed"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "PairIncompatible")
    assert LINE in ready["message"]


def test_a_failed_mark_alone_does_not_stop_the_desired_revision() -> None:
    # The canary analysis marks revisions Failed too; only a PairIncompatible verdict stops it.
    status = SpeculativeDeploymentStatus.model_validate(
        {
            "conditions": [{"type": "PairCompatible", "status": "True", "reason": "PairVerified"}],
            "revisions": [
                {
                    "revision": "b",
                    "pairVersion": "1",
                    "target": {"model": "t"},
                    "draft": {"method": "eagle3"},
                    "phase": "Failed",
                }
            ],
        }
    )
    assert judge_pair("b", False, True, [], status).refused == frozenset()


def test_a_pod_shows_a_launcher_exit_only_for_exit_2_3_or_4_of_its_engine() -> None:
    def pod(name: str, code: int) -> dict[str, Any]:
        return {
            "metadata": {"name": "p", "labels": {"specdeploy.dev/revision": "abc"}},
            "status": {
                "containerStatuses": [
                    {"name": name, "lastState": {"terminated": {"exitCode": code}}}
                ]
            },
        }

    assert shows_launcher_exit(pod("engine", 3))
    assert shows_launcher_exit(pod("engine", 4))
    assert not shows_launcher_exit(pod("engine", 137))
    assert not shows_launcher_exit(pod("sidecar", 3))
    assert not shows_launcher_exit({"metadata": {"name": "p"}, "status": {}})
    assert shows_launcher_exit(pod("engine", 2))


USAGE_LINE = "--speculative-config is not JSON: Expecting value: line 1 column 1 (char 0)"


def test_exit_2_stops_the_revision_with_reason_arguments_refused() -> None:
    verdict = judge_pair("b", False, True, [pod("b", state=terminated(2, USAGE_LINE))], None)
    assert verdict.refused == {"b"}
    assert (verdict.condition.status, verdict.condition.reason) == ("False", "ArgumentsRefused")
    assert verdict.condition.message == USAGE_LINE
    assert [(e.reason, e.warning) for e in verdict.events] == [("ArgumentsRefused", True)]
    assert "stopped (scaled to zero)" in verdict.events[0].message
    # vLLM's own argument parser exits 2 too, with no termination message.
    bare = read_launcher_exits([pod("b", last=terminated(2), restarts=1)])
    assert bare["b"].permanent
    assert "exited 2" in bare["b"].message
    # An exit 2 wins over an exit 4 like an exit 3 does.
    both = read_launcher_exits(
        [pod("b", state=terminated(4, "no model")), pod("b", state=terminated(2, USAGE_LINE))]
    )
    assert both["b"].exit_code == 2


def test_a_revision_refused_for_its_arguments_stays_stopped_when_reapplied() -> None:
    pair = {"target": {"model": "/m/target"}, "draft": {"method": "eagle3"}}
    serving = RevisionDeployment("sd-a", "a", 1, 1, "t0", pair=pair, pods=1)
    trying = RevisionDeployment("sd-b", "b", 1, 0, "t1", pair=pair, pods=1)
    status, replicas, _ = _one_pass(
        _sd({"stableRevision": "a", "conditions": []}),
        [serving, trying],
        [pod("b", state=terminated(2, USAGE_LINE))],
        "t2",
    )
    assert replicas == {"a": 1, "b": 0}
    conditions = {c["type"]: c for c in status["conditions"]}
    for type_ in ("PairCompatible", "Progressing", "Degraded"):
        assert conditions[type_]["reason"] == "ArgumentsRefused", type_
    assert USAGE_LINE in conditions["PairCompatible"]["message"]
    assert "revision b stopped (ArgumentsRefused" in conditions["Ready"]["message"]
    assert {r["revision"]: r["phase"] for r in status["revisions"]} == {
        "a": "Stable",
        "b": "Failed",
    }

    # The same pair applied again is the same revision: its pods are gone, status remembers,
    # and it is not started again (no replicas, no new Event).
    stopped = RevisionDeployment("sd-b", "b", 0, 0, "t1", pair=pair, pods=0)
    again, replicas, verdict = _one_pass(_sd({**status}), [serving, stopped], [], "t3")
    assert replicas == {"a": 1, "b": 0}
    assert verdict.events == ()
    assert verdict.condition.reason == "ArgumentsRefused"
    assert verdict.condition.message == USAGE_LINE
    assert again == {**status, "replicas": 1}
