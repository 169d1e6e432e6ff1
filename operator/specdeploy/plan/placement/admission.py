"""Kueue placement as a pure function: the Admitted condition.

The speculation policy per queue lives in `specdeploy.plan.rollout.speculation`.

Kueue gates each pod with the scheduling gate `kueue.x-k8s.io/admission` until its Workload is
admitted. A pending Workload's QuotaReserved condition says what the ClusterQueue lacks
("insufficient unused quota for nvidia.com/gpu in flavor h100, 4 more needed"); the LocalQueue
names the ClusterQueue.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from specdeploy.api.conditions import ConditionType, Reason
from specdeploy.api.times import parse_time
from specdeploy.plan.placement.kueue import KueueWebhooks
from specdeploy.plan.status.conditions import ConditionUpdate

ADMISSION_GATE = "kueue.x-k8s.io/admission"
#: How long pods may wait for Kueue before that is news: every new pod is gated for the moment
#: Kueue takes to make and admit its Workload (a canary's pod every rollout), which is no
#: shortage. Until then Admitted is Unknown (no Warning Event); after it, False.
QUOTA_GRACE_SECONDS = 15.0
#: The label the LeaderWorkerSet controller puts on every pod of its groups.
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
QUOTA_SHORTAGE = re.compile(
    r"insufficient unused quota for (?P<resource>\S+) in flavor (?P<flavor>\S+), "
    r"(?P<amount>\S+) more needed"
)


def is_gated(pod: Mapping[str, Any]) -> bool:
    """Whether Kueue still holds the pod back from the scheduler."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == ADMISSION_GATE for g in gates)


def _owner_names(obj: Mapping[str, Any], kind: str) -> set[str]:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return {r.get("name", "") for r in refs if r.get("kind") == kind}


def _condition(obj: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == type_), None)


def describe_shortage(message: str) -> str:
    """Kueue's pending message reduced to what is missing: `4 nvidia.com/gpu (flavor h100)`.

    A Workload of several pod sets (a LeaderWorkerSet group: leader, workers) gets one clause
    per pod set, each counting the pod sets before it too ("8 more needed" for the leader, "16
    more needed" for leader and workers): per resource and flavor the largest is what the
    Workload lacks."""
    lacking: dict[tuple[str, str], str] = {}
    for m in QUOTA_SHORTAGE.finditer(message):
        key, amount = (m["resource"], m["flavor"]), m["amount"]
        held = lacking.get(key, "")
        if not (held.isdigit() and amount.isdigit()) or int(amount) > int(held):
            lacking[key] = amount
    found = [f"{amount} {res} (flavor {flavor})" for (res, flavor), amount in lacking.items()]
    return ", ".join(found) if found else message


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def unadmitted_pods(
    pods: Sequence[Mapping[str, Any]], workloads: Sequence[Mapping[str, Any]]
) -> list[str]:
    """Pods that Kueue neither holds back (its scheduling gate) nor admitted (a Workload of
    theirs, or of their group's LeaderWorkerSet): they run outside its quota. Kueue's pod
    integration gates every pod it manages from its creation and makes a Workload for it, which
    lives as long as the pod; its leaderworkerset integration makes one per group, owned by the
    LeaderWorkerSet."""
    owned = set().union(*(_owner_names(w, "Pod") for w in workloads))
    groups = set().union(*(_owner_names(w, "LeaderWorkerSet") for w in workloads))
    return sorted(
        _name(p)
        for p in pods
        if not is_gated(p) and _name(p) not in owned and _group_of(p) not in groups
    )


def _group_of(pod: Mapping[str, Any]) -> str | None:
    """The LeaderWorkerSet a pod belongs to (its controller's label), if any."""
    found = ((pod.get("metadata") or {}).get("labels") or {}).get(LWS_NAME_LABEL)
    return str(found) if found else None


def quota_bypassed(
    queue: str, namespace: str, pods: Sequence[str], why: str | None = None
) -> ConditionUpdate:
    """Admitted False, QuotaBypassed: Kueue does not manage the pods, and says why."""
    if why is not None:
        said = f"{why}, so LocalQueue {queue} does not hold back pods: they would bypass quota"
    else:
        listed = ", ".join(pods[:3]) + (f" and {len(pods) - 3} more" if len(pods) > 3 else "")
        said = (
            f"{len(pods)} pods run without Kueue's admission ({listed}: neither its scheduling "
            f"gate nor a Workload): they bypass the quota of LocalQueue {queue}. Kueue does not "
            f"manage Deployments' pods in namespace {namespace}: its pod or deployment "
            "integration is off (integrations.frameworks), or its namespace selector leaves "
            "this namespace out"
        )
    return ConditionUpdate(ConditionType.ADMITTED, "False", Reason.QUOTA_BYPASSED, said)


def judge_admission(
    queue: str | None,
    pods: Sequence[Mapping[str, Any]],
    workloads: Sequence[Mapping[str, Any]],
    local_queue: Mapping[str, Any] | None,
    *,
    missing_priority_class: str | None = None,
    group_sets: Collection[str] = (),
    group_note: str | None = None,
    now: datetime | None = None,
    kueue: KueueWebhooks | None = None,
    namespace: str = "",
) -> ConditionUpdate:
    """The Admitted condition from the pods' scheduling gates and their Kueue Workloads.

    A replica across nodes is a LeaderWorkerSet group, which Kueue admits whole through one
    Workload owned by the LeaderWorkerSet (one of `group_sets`); `group_note` says what a group
    asks for, and is added to the reason pods wait.

    True when no pod is gated and Kueue admitted each (a Workload of its own, or of its
    group's LeaderWorkerSet). False naming what Kueue lacks to admit them: the LocalQueue
    (`local_queue` None), the WorkloadPriorityClass `missing_priority_class` (Kueue makes no
    Workload for a pod whose class does not exist, and says so only in its own log), or the
    ClusterQueue's quota. False with QuotaBypassed when quota would not hold: Kueue not
    installed or its webhooks missing (`kueue`, read at the operator's start), or pods that run
    without Kueue's admission. Unknown while the gated pods are younger than QUOTA_GRACE_SECONDS
    (Kueue admits new pods in a moment), and before any pod exists.
    """
    if queue is None:
        return ConditionUpdate(
            ConditionType.ADMITTED,
            "True",
            Reason.NO_QUEUE,
            "no Kueue queue; pods schedule directly",
        )
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    why = kueue.bypassed_because if kueue is not None else None
    if why is not None:
        return quota_bypassed(queue, namespace, [_name(p) for p in live], why)
    cluster_queue = str(((local_queue or {}).get("spec") or {}).get("clusterQueue") or "")
    gated = [p for p in live if is_gated(p)]
    bypassing = unadmitted_pods(live, workloads)
    if bypassing:
        return quota_bypassed(queue, namespace, bypassing)
    if live and not gated:
        admitted_by = {
            str(((w.get("status") or {}).get("admission") or {}).get("clusterQueue") or "")
            for w in workloads
        } - {""}
        by = ", ".join(sorted(admitted_by)) or cluster_queue or queue
        return ConditionUpdate(
            ConditionType.ADMITTED,
            "True",
            Reason.ADMITTED,
            f"{len(live)} pods admitted by ClusterQueue {by} (LocalQueue {queue})",
        )
    held = f"{len(gated)} of {len(live)} pods stay gated" if live else "pods will stay gated"
    if local_queue is None:
        return ConditionUpdate(
            ConditionType.ADMITTED,
            "False",
            Reason.LOCAL_QUEUE_NOT_FOUND,
            f"LocalQueue {queue} does not exist in this namespace: {held} until it is created "
            "(or spec.placement.queue names one that does)",
        )
    if missing_priority_class is not None:
        return ConditionUpdate(
            ConditionType.ADMITTED,
            "False",
            Reason.PRIORITY_CLASS_NOT_FOUND,
            f"WorkloadPriorityClass {missing_priority_class} does not exist, so Kueue makes no "
            f"Workload: {held} until it is created (or spec.placement.priorityClass names one "
            "that does)",
        )
    if not live:
        return ConditionUpdate(
            ConditionType.ADMITTED, "Unknown", Reason.WAITING_FOR_QUOTA, "no pods yet"
        )
    gated_names = {str((p.get("metadata") or {}).get("name", "")) for p in gated}
    shortages: list[str] = []
    with_workload = 0
    for workload in workloads:
        owned = _owner_names(workload, "Pod") & gated_names or (
            _owner_names(workload, "LeaderWorkerSet") & set(group_sets)
            and not _condition_true(workload, "QuotaReserved")
        )
        if not owned:
            continue
        with_workload += 1
        reserved = _condition(workload, "QuotaReserved")
        if reserved is not None and reserved.get("status") == "False" and reserved.get("message"):
            shortage = describe_shortage(str(reserved["message"]))
            if shortage not in shortages:
                shortages.append(shortage)
    if shortages:
        lacks = f" lacks {'; '.join(shortages)}"
    elif with_workload == 0:
        lacks = " has no Workload for them yet"
    else:
        lacks = " has not admitted them yet"
    note = f"; {group_note}" if group_note else ""
    waited = _longest_wait(gated, now)
    young = waited is not None and waited < QUOTA_GRACE_SECONDS
    return ConditionUpdate(
        ConditionType.ADMITTED,
        "Unknown" if young else "False",
        Reason.WAITING_FOR_QUOTA,
        f"{len(gated)} of {len(live)} pods wait for quota: ClusterQueue "
        f"{cluster_queue or '?'} (LocalQueue {queue}){lacks}{note}",
    )


def _condition_true(obj: Mapping[str, Any], type_: str) -> bool:
    found = _condition(obj, type_)
    return found is not None and found.get("status") == "True"


def describe_group(
    nodes: int, gpus: int, resource: str, *, canary_revision: str | None = None
) -> str:
    """What one replica across nodes asks Kueue for, said once pods wait: a group is admitted
    whole or not at all, so a canary needs a whole group of quota beside the stable's."""
    group = f"{nodes} pods x {gpus} {resource} ({nodes * gpus})"
    if canary_revision is not None:
        return (
            f"the canary {canary_revision} is a whole extra group of {group} beside the "
            "stable revision's groups: Kueue admits a group whole or not at all"
        )
    return f"each replica is a group of {group}, admitted whole or not at all"


def _longest_wait(pods: Sequence[Mapping[str, Any]], now: datetime | None) -> float | None:
    """Seconds the oldest of `pods` has existed (None: unknown, so no grace)."""
    if now is None:
        return None
    ages = []
    for pod in pods:
        created = (pod.get("metadata") or {}).get("creationTimestamp")
        try:
            then = parse_time(str(created))
        except ValueError:
            return None
        ages.append((now - then).total_seconds())
    return max(ages) if ages else None
