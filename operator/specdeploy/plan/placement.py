"""Kueue placement as pure functions: the speculation policy per queue, and the Admitted condition.

Kueue gates each pod with the scheduling gate `kueue.x-k8s.io/admission` until its Workload is
admitted. A pending Workload's QuotaReserved condition says what the ClusterQueue lacks
("insufficient unused quota for nvidia.com/gpu in flavor h100, 4 more needed"); the LocalQueue
names the ClusterQueue.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specdeploy.api.conditions import ConditionType, Reason
from specdeploy.api.config import OperatorConfig
from specdeploy.api.models import DraftSpec, SpeculationStatus
from specdeploy.api.models import SpeculativeDeploymentSpec as Spec
from specdeploy.plan.status import ConditionUpdate

ADMISSION_GATE = "kueue.x-k8s.io/admission"
QUOTA_SHORTAGE = re.compile(
    r"insufficient unused quota for (?P<resource>\S+) in flavor (?P<flavor>\S+), "
    r"(?P<amount>\S+) more needed"
)


@dataclass(frozen=True)
class SpeculationDecision:
    """Whether the pods speculate, and the spec they are built from."""

    effective_spec: Spec
    status: SpeculationStatus

    @property
    def enabled(self) -> bool:
        return self.status.state == "On"


def decide_speculation(spec: Spec, config: OperatorConfig) -> SpeculationDecision:
    """Applies the speculation policy: On, Off, or Auto (off on the configured batch queues).

    When speculation is off the effective spec serves the target alone (draft method none), so
    the pods form a revision of their own and never half-speculate.
    """
    draft = spec.pair.draft
    queue = spec.placement.queue
    policy = spec.placement.speculation
    if draft.method == "none":
        return SpeculationDecision(
            spec, SpeculationStatus(state="Off", reason=Reason.NO_DRAFT, message="no draft")
        )
    if policy == "Off":
        reason, message = Reason.SPECULATION_DISABLED_BY_SPEC, "spec.placement.speculation: Off"
    elif policy == "Auto" and queue is not None and queue in config.batch_queues:
        reason = Reason.SPECULATION_DISABLED_BATCH_QUEUE
        message = (
            f"queue {queue} is a batch queue: speculation pays at low concurrency only, "
            f"so the target serves alone"
        )
    else:
        why = (
            "spec.placement.speculation: On"
            if policy == "On"
            else (f"queue {queue} is interactive" if queue else "no queue; speculation Auto")
        )
        return SpeculationDecision(
            spec,
            SpeculationStatus(
                state="On",
                reason=Reason.SPECULATION_ENABLED,
                message=f"{draft.method} with {draft.num_speculative_tokens} tokens ({why})",
            ),
        )
    plain = spec.model_copy(
        update={"pair": spec.pair.model_copy(update={"draft": DraftSpec(method="none")})}
    )
    return SpeculationDecision(
        plain, SpeculationStatus(state="Off", reason=reason, message=message)
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
    """Kueue's pending message reduced to what is missing: `4 nvidia.com/gpu (flavor h100)`."""
    found = [
        f"{m['amount']} {m['resource']} (flavor {m['flavor']})"
        for m in QUOTA_SHORTAGE.finditer(message)
    ]
    return ", ".join(found) if found else message


def judge_admission(
    queue: str | None,
    pods: Sequence[Mapping[str, Any]],
    workloads: Sequence[Mapping[str, Any]],
    local_queue: Mapping[str, Any] | None,
) -> ConditionUpdate:
    """The Admitted condition from the pods' scheduling gates and their Kueue Workloads.

    True when no pod is gated; False naming the ClusterQueue and what it lacks while pods wait
    for quota; Unknown before any pod exists.
    """
    if queue is None:
        return ConditionUpdate(
            ConditionType.ADMITTED,
            "True",
            Reason.NO_QUEUE,
            "no Kueue queue; pods schedule directly",
        )
    cluster_queue = str(((local_queue or {}).get("spec") or {}).get("clusterQueue") or "")
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    if not live:
        return ConditionUpdate(
            ConditionType.ADMITTED, "Unknown", Reason.WAITING_FOR_QUOTA, "no pods yet"
        )
    gated = [p for p in live if is_gated(p)]
    if not gated:
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
    if local_queue is None:
        return ConditionUpdate(
            ConditionType.ADMITTED,
            "False",
            Reason.WAITING_FOR_QUOTA,
            f"{len(gated)} of {len(live)} pods gated: LocalQueue {queue} does not exist",
        )
    gated_names = {str((p.get("metadata") or {}).get("name", "")) for p in gated}
    shortages: list[str] = []
    for workload in workloads:
        if not (_owner_names(workload, "Pod") & gated_names):
            continue
        reserved = _condition(workload, "QuotaReserved")
        if reserved is not None and reserved.get("status") == "False" and reserved.get("message"):
            shortage = describe_shortage(str(reserved["message"]))
            if shortage not in shortages:
                shortages.append(shortage)
    lacks = f" lacks {'; '.join(shortages)}" if shortages else " has not admitted them yet"
    return ConditionUpdate(
        ConditionType.ADMITTED,
        "False",
        Reason.WAITING_FOR_QUOTA,
        f"{len(gated)} of {len(live)} pods wait for quota: ClusterQueue "
        f"{cluster_queue or '?'} (LocalQueue {queue}){lacks}",
    )
