"""Kueue placement: speculation per queue, and the Admitted condition from gates and Workloads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from specdeploy.api.conditions import Reason
from specdeploy.plan.placement.admission import (
    QUOTA_GRACE_SECONDS,
    describe_shortage,
    judge_admission,
)
from specdeploy.plan.placement.kueue import KueueWebhooks, read_kueue_webhooks
from specdeploy.plan.status.report import condition_events

PENDING = (
    "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in "
    "flavor h100, 4 more needed"
)


def pod(name: str, gated: bool) -> dict[str, Any]:
    gates = [{"name": "kueue.x-k8s.io/admission"}] if gated else []
    return {"metadata": {"name": name}, "spec": {"schedulingGates": gates}}


def workload(
    pod_name: str, message: str | None, cluster_queue: str | None = None
) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": []}
    if message is not None:
        status["conditions"].append(
            {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": message}
        )
    if cluster_queue:
        status["admission"] = {"clusterQueue": cluster_queue}
        status["conditions"].append({"type": "Admitted", "status": "True"})
    return {
        "metadata": {
            "name": f"pod-{pod_name}",
            "ownerReferences": [{"kind": "Pod", "name": pod_name}],
        },
        "status": status,
    }


LOCAL_QUEUE = {"metadata": {"name": "interactive"}, "spec": {"clusterQueue": "gpu-cq"}}


def test_admitted_without_a_queue() -> None:
    update = judge_admission(None, [pod("a", False)], [], None)
    assert (update.status, update.reason) == ("True", Reason.NO_QUEUE)


def test_not_admitted_names_the_cluster_queue_and_what_it_lacks() -> None:
    pods = [pod("a", True), pod("b", False)]
    workloads = [workload("a", PENDING), workload("b", None, "gpu-cq")]
    update = judge_admission("interactive", pods, workloads, LOCAL_QUEUE)
    assert (update.status, update.reason) == ("False", Reason.WAITING_FOR_QUOTA)
    assert "ClusterQueue gpu-cq" in update.message
    assert "4 nvidia.com/gpu (flavor h100)" in update.message
    assert "1 of 2 pods" in update.message


def test_admitted_once_no_pod_is_gated() -> None:
    update = judge_admission(
        "interactive", [pod("a", False)], [workload("a", None, "gpu-cq")], LOCAL_QUEUE
    )
    assert (update.status, update.reason) == ("True", Reason.ADMITTED)
    assert "gpu-cq" in update.message


def test_unknown_before_pods_of_a_queue_that_exists() -> None:
    update = judge_admission("interactive", [], [], LOCAL_QUEUE)
    assert (update.status, update.reason) == ("Unknown", Reason.WAITING_FOR_QUOTA)


def test_a_missing_local_queue_is_named_with_or_without_pods() -> None:
    for pods, held in (([pod("a", True)], "1 of 1 pods stay gated"), ([], "pods will stay")):
        update = judge_admission("nope", pods, [], None)
        assert (update.status, update.reason) == ("False", Reason.LOCAL_QUEUE_NOT_FOUND)
        assert update.message.startswith("LocalQueue nope does not exist")
        assert held in update.message


def test_a_missing_priority_class_is_named_rather_than_a_missing_workload() -> None:
    update = judge_admission(
        "interactive", [pod("a", True)], [], LOCAL_QUEUE, missing_priority_class="urgent"
    )
    assert (update.status, update.reason) == ("False", Reason.PRIORITY_CLASS_NOT_FOUND)
    assert "WorkloadPriorityClass urgent does not exist" in update.message
    assert "1 of 1 pods stay gated" in update.message
    # A missing LocalQueue is named first: without it nothing is admitted either way.
    both = judge_admission("nope", [pod("a", True)], [], None, missing_priority_class="urgent")
    assert both.reason == Reason.LOCAL_QUEUE_NOT_FOUND


def test_pods_admitted_before_their_priority_class_went_stay_admitted() -> None:
    update = judge_admission(
        "interactive",
        [pod("a", False)],
        [workload("a", None, "gpu-cq")],
        LOCAL_QUEUE,
        missing_priority_class="urgent",
    )
    assert (update.status, update.reason) == ("True", Reason.ADMITTED)


def test_describe_shortage_keeps_unparsed_messages() -> None:
    assert describe_shortage("ClusterQueue gpu-cq is inactive") == "ClusterQueue gpu-cq is inactive"


def test_gated_pods_without_workloads_say_so() -> None:
    update = judge_admission("interactive", [pod("a", True)], [], LOCAL_QUEUE)
    assert (update.status, update.reason) == ("False", Reason.WAITING_FOR_QUOTA)
    assert "has no Workload for them yet" in update.message
    assert "events" not in update.message


def test_waiting_for_quota_is_news_only_after_a_grace() -> None:
    # Every new pod (a canary's, each rollout) waits a moment for Kueue to make and admit its
    # Workload: no Warning for that. After QUOTA_GRACE_SECONDS it is False (and a Warning).
    young = pod("a", True)
    young["metadata"]["creationTimestamp"] = "2026-11-26T08:00:00Z"
    now = datetime(2026, 11, 26, 8, 0, 14, tzinfo=UTC)
    update = judge_admission("interactive", [young], [], LOCAL_QUEUE, now=now)
    assert (update.status, update.reason) == ("Unknown", Reason.WAITING_FOR_QUOTA)
    later = now + timedelta(seconds=QUOTA_GRACE_SECONDS)
    update = judge_admission(
        "interactive", [young], [workload("a", PENDING)], LOCAL_QUEUE, now=later
    )
    assert (update.status, update.reason) == ("False", Reason.WAITING_FOR_QUOTA)
    assert "4 nvidia.com/gpu (flavor h100)" in update.message
    events = condition_events(
        [{"type": "Admitted", "status": "Unknown", "reason": "WaitingForQuota"}],
        [{"type": "Admitted", "status": "False", "reason": "WaitingForQuota", "message": "m"}],
    )
    assert [(e.reason, e.warning) for e in events] == [("WaitingForQuota", True)]
    assert not condition_events(
        [], [{"type": "Admitted", "status": "Unknown", "reason": "WaitingForQuota"}]
    )


# --- quota that would not hold -----------------------------------------------------------------


def test_pods_that_kueue_neither_gates_nor_admitted_bypass_quota() -> None:
    pods = [pod("a", False), pod("b", False), pod("c", True)]
    update = judge_admission(
        "interactive", pods, [workload("a", None, "gpu-cq")], LOCAL_QUEUE, namespace="serving"
    )
    assert (update.status, update.reason) == ("False", Reason.QUOTA_BYPASSED)
    assert update.message.startswith("1 pods run without Kueue's admission (b: ")
    assert "namespace serving" in update.message
    # With a Workload of its own, each ungated pod was admitted.
    admitted = judge_admission(
        "interactive",
        pods[:2],
        [workload("a", None, "gpu-cq"), workload("b", None, "gpu-cq")],
        LOCAL_QUEUE,
    )
    assert (admitted.status, admitted.reason) == ("True", Reason.ADMITTED)


def mutating(name: str, *hooks: tuple[str, str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": hook,
                "clientConfig": {"service": {"name": "kueue-webhook-service"}},
                "rules": [
                    {"apiGroups": [group], "resources": [resource], "operations": ["CREATE"]}
                ],
            }
            for hook, group, resource in hooks
        ],
    }


POD_HOOK = ("mpod.kb.io", "", "pods")
DEPLOYMENT_HOOK = ("mdeployment.kb.io", "apps", "deployments")


def test_kueue_webhooks_are_found_by_name_rule_and_owner() -> None:
    both = read_kueue_webhooks(
        [mutating("kueue-mutating-webhook-configuration", POD_HOOK, DEPLOYMENT_HOOK)], True
    )
    assert both == KueueWebhooks(
        True, "kueue-mutating-webhook-configuration", "kueue-mutating-webhook-configuration"
    )
    assert both.bypassed_because is None
    assert "confirm" in both.describe()
    # Another project's kubebuilder webhook of the same name is not Kueue's.
    foreign = mutating("other-webhooks", DEPLOYMENT_HOOK)
    foreign["webhooks"][0]["clientConfig"] = {"service": {"name": "other"}}
    only_pods = read_kueue_webhooks([mutating("kueue-x", POD_HOOK), foreign], True)
    assert only_pods.deployments is None
    assert only_pods.bypassed_because == (
        "Kueue's mutating webhook for Deployments (mdeployment.kb.io) is not registered"
    )
    assert read_kueue_webhooks([], False).bypassed_because == (
        "Kueue is not installed (no CustomResourceDefinition workloads.kueue.x-k8s.io)"
    )


def test_quota_that_would_be_bypassed_is_said_before_pods_exist() -> None:
    kueue = read_kueue_webhooks([mutating("kueue-x", POD_HOOK)], True)
    update = judge_admission("interactive", [], [], LOCAL_QUEUE, kueue=kueue)
    assert (update.status, update.reason) == ("False", Reason.QUOTA_BYPASSED)
    assert update.message == (
        "Kueue's mutating webhook for Deployments (mdeployment.kb.io) is not registered, so "
        "LocalQueue interactive does not hold back pods: they would bypass quota"
    )
    # Without a queue nothing is bypassed.
    assert judge_admission(None, [], [], None, kueue=kueue).reason == Reason.NO_QUEUE
