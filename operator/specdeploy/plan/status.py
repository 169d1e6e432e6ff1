"""Status as pure functions: conditions, phase, the status a reconcile writes, and its patch.

The launcher's verdict on the pair is one of the inputs: a refused desired revision makes Ready
and Progressing say so, is marked Failed in the revision history, and leaves the SD Degraded
while a stable revision serves (Failed when none does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specdeploy.api.conditions import ConditionType, Phase, Reason, RevisionPhase
from specdeploy.api.contract import EXIT_PAIR_INCOMPATIBLE
from specdeploy.api.models import (
    RevisionDraft,
    RevisionStatus,
    RevisionTarget,
    SizingDecision,
    SpeculationStatus,
    SpeculativeDeployment,
    SpeculativeDeploymentStatus,
)
from specdeploy.plan.conditions import ConditionUpdate, set_conditions
from specdeploy.plan.pair_check import PairVerdict
from specdeploy.plan.rollout import RevisionDeployment, RolloutEvent, RolloutPlan


def status_patch(current: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that makes the keys of `desired` exactly so in `current`.

    Empty when nothing differs, so a steady reconcile writes nothing. Inside those keys,
    anything `current` holds that `desired` does not is removed (a None in the patch), so no
    stale field outlives the decision that wrote it; lists are replaced whole. Keys `desired`
    does not mention (other writers' fields) are left alone; a None value in `desired` removes
    its key.
    """
    return merge_patch(dict(current or {}), desired, prune=False)


def merge_patch(
    current: Mapping[str, Any], desired: Mapping[str, Any], prune: bool
) -> dict[str, Any]:
    """The RFC 7386 patch from `current` to `desired`; with `prune`, keys only `current` has
    are removed too."""
    patch: dict[str, Any] = {}
    for key, value in desired.items():
        before = current.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            inner = merge_patch(before, value, prune=True)
            if inner:
                patch[key] = inner
        elif before != value:
            patch[key] = value
    if prune:
        patch.update({key: None for key in current if key not in desired})
    return patch


@dataclass(frozen=True)
class ObservedRollout:
    """What a reconcile saw and decided, the inputs of the status it writes."""

    sizing: SizingDecision | None
    sizing_problem: str | None
    speculation: SpeculationStatus
    desired_revision: str | None
    plan: RolloutPlan
    revisions: Sequence[RevisionDeployment]
    admission: ConditionUpdate
    selector: str
    pair: PairVerdict


def _refused_desired(seen: ObservedRollout) -> bool:
    problem = seen.pair.desired_problem
    return (
        problem is not None
        and problem.exit_code == EXIT_PAIR_INCOMPATIBLE
        and seen.desired_revision is not None
    )


def _refusal_detail(seen: ObservedRollout) -> str:
    stable = seen.plan.stable_revision
    serving = (
        f"; revision {stable} keeps serving" if stable and stable != seen.desired_revision else ""
    )
    return f"revision {seen.desired_revision} refused by the engine launcher{serving}"


def _ready_update(sd: SpeculativeDeployment, seen: ObservedRollout) -> ConditionUpdate:
    desired = next((r for r in seen.revisions if r.revision == seen.desired_revision), None)
    replicas = sd.spec.replicas
    if seen.desired_revision is None:
        return ConditionUpdate(
            ConditionType.READY, "False", Reason.UNSCHEDULABLE, seen.sizing_problem or ""
        )
    if seen.plan.desired_ready and seen.plan.stable_revision == seen.desired_revision:
        if replicas == 0:
            return ConditionUpdate(
                ConditionType.READY, "True", Reason.SCALED_TO_ZERO, "spec.replicas is 0"
            )
        return ConditionUpdate(
            ConditionType.READY,
            "True",
            Reason.ALL_REPLICAS_READY,
            f"{replicas}/{replicas} pods of revision {seen.desired_revision} ready",
        )
    problem = seen.pair.desired_problem
    if problem is not None and _refused_desired(seen):
        return ConditionUpdate(
            ConditionType.READY,
            "False",
            Reason.PAIR_INCOMPATIBLE,
            f"{_refusal_detail(seen)}: {problem.message}",
        )
    if problem is not None:
        return ConditionUpdate(
            ConditionType.READY,
            "False",
            Reason.MODEL_NOT_FOUND,
            f"revision {seen.desired_revision}: {problem.message}",
        )
    ready = desired.ready_replicas if desired else 0
    if seen.admission.status == "False":
        return ConditionUpdate(
            ConditionType.READY, "False", Reason.WAITING_FOR_QUOTA, seen.admission.message
        )
    return ConditionUpdate(
        ConditionType.READY,
        "False",
        Reason.REPLICAS_NOT_READY,
        f"{ready}/{replicas} pods of revision {seen.desired_revision} ready",
    )


def _progressing_update(seen: ObservedRollout) -> ConditionUpdate:
    if seen.desired_revision is None:
        return ConditionUpdate(
            ConditionType.PROGRESSING, "False", Reason.UNSCHEDULABLE, seen.sizing_problem or ""
        )
    if seen.plan.desired_ready and seen.plan.stable_revision == seen.desired_revision:
        return ConditionUpdate(
            ConditionType.PROGRESSING,
            "False",
            Reason.ROLLOUT_COMPLETE,
            f"revision {seen.desired_revision} serves",
        )
    if _refused_desired(seen):
        return ConditionUpdate(
            ConditionType.PROGRESSING, "False", Reason.PAIR_INCOMPATIBLE, _refusal_detail(seen)
        )
    serving = seen.plan.stable_revision
    beside = f" alongside revision {serving}" if serving else ""
    return ConditionUpdate(
        ConditionType.PROGRESSING,
        "True",
        Reason.NEW_REVISION,
        f"rolling out revision {seen.desired_revision}{beside}",
    )


def _phase(ready: ConditionUpdate, seen: ObservedRollout) -> str:
    if ready.status == "True":
        return Phase.SERVING
    if _refused_desired(seen):
        stable = seen.plan.stable_revision
        return Phase.DEGRADED if stable and stable != seen.desired_revision else Phase.FAILED
    if seen.desired_revision is None:
        return Phase.DEGRADED if seen.plan.stable_revision else Phase.FAILED
    if seen.admission.status == "False" and not seen.plan.stable_revision:
        return Phase.PENDING
    return Phase.PROGRESSING


def _revision_history(
    seen: ObservedRollout, history_limit: int, recorded: Sequence[RevisionStatus]
) -> list[RevisionStatus]:
    refused = seen.pair.refused
    """One record per revision Deployment, oldest first; a revision the launcher refused is
    Failed; verdicts and a Failed phase written earlier are kept."""
    earlier = {r.revision: r for r in recorded}
    records: list[RevisionStatus] = []
    for revision in sorted(seen.revisions, key=lambda r: (r.created, r.name)):
        pair = revision.pair
        target = pair.get("target") or {}
        draft = pair.get("draft") or {}
        if revision.revision == seen.plan.stable_revision:
            phase = RevisionPhase.STABLE
        elif revision.revision == seen.desired_revision:
            phase = RevisionPhase.PENDING
        else:
            phase = RevisionPhase.SUPERSEDED
        before = earlier.get(revision.revision)
        if revision.revision in refused or (
            before is not None and before.phase == RevisionPhase.FAILED
        ):
            phase = RevisionPhase.FAILED
        records.append(
            RevisionStatus(
                revision=revision.revision,
                pair_version=revision.pair_version or str(pair.get("version", "")),
                target=RevisionTarget(
                    model=str(target.get("model", "")), revision=target.get("revision")
                ),
                draft=RevisionDraft(
                    method=str(draft.get("method", "none")),
                    model=draft.get("model"),
                    revision=draft.get("revision"),
                ),
                phase=phase,
                created_at=revision.created or None,
                verdicts=before.verdicts if before is not None else [],
            )
        )
    return records[-(history_limit + 1) :]


def build_status(sd: SpeculativeDeployment, seen: ObservedRollout, now: str) -> dict[str, Any]:
    """The status fields this reconcile owns, as the API stores them (camelCase JSON).

    Fields other parts of the operator own (acceptance rate, canary) are not included, so a
    merge patch of this never touches them.
    """
    current = sd.status or SpeculativeDeploymentStatus()
    generation = sd.metadata.generation
    if seen.sizing is not None:
        sized = ConditionUpdate(ConditionType.SIZED, "True", Reason.SIZED, seen.sizing.message)
    else:
        sized = ConditionUpdate(
            ConditionType.SIZED, "False", Reason.UNSCHEDULABLE, seen.sizing_problem or ""
        )
    ready = _ready_update(sd, seen)
    speculating = ConditionUpdate(
        ConditionType.SPECULATING,
        "True" if seen.speculation.state == "On" else "False",
        seen.speculation.reason,
        seen.speculation.message,
    )
    conditions = set_conditions(
        current.conditions,
        [ready, _progressing_update(seen), sized, seen.admission, speculating, seen.pair.condition],
        generation,
        now,
    )
    pods = sum(r.pods for r in seen.revisions)
    ready_pods = sum(r.ready_replicas for r in seen.revisions)
    status = SpeculativeDeploymentStatus(
        observed_generation=generation,
        phase=_phase(ready, seen),
        conditions=conditions,
        stable_revision=seen.plan.stable_revision,
        revisions=_revision_history(seen, sd.spec.revision_history_limit, current.revisions),
        speculation=seen.speculation,
        sizing=seen.sizing,
        replicas=pods,
        ready_replicas=ready_pods,
        selector=seen.selector,
    )
    dumped = status.model_dump(by_alias=True, exclude_none=False, mode="json")
    owned = (
        "observedGeneration",
        "phase",
        "conditions",
        "stableRevision",
        "revisions",
        "speculation",
        "sizing",
        "replicas",
        "readyReplicas",
        "selector",
    )
    return {key: _drop_none(dumped[key]) for key in owned}


def _drop_none(value: Any) -> Any:
    """Removes None members inside objects, as the API server would not store them."""
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def condition_changes(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """Conditions in `after` whose status or reason differ from `before` (or that are new)."""
    old = {c.get("type"): (c.get("status"), c.get("reason")) for c in before}
    return [c for c in after if old.get(c.get("type")) != (c.get("status"), c.get("reason"))]


# Conditions whose changes are worth an Event; a False Sized or Admitted is a Warning.
CONDITIONS_WORTH_AN_EVENT = (
    ConditionType.READY,
    ConditionType.SIZED,
    ConditionType.ADMITTED,
    ConditionType.SPECULATING,
)
WARNING_WHEN_FALSE = (ConditionType.SIZED, ConditionType.ADMITTED)


def condition_events(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]
) -> list[RolloutEvent]:
    """The Events a person wants from condition changes.

    Unknown is never news. Ready speaks when it becomes True or stops being True (while a new
    SD starts, "not ready yet" is expected; Sized and Admitted say why it cannot start).
    """
    was = {c.get("type"): c.get("status") for c in before}
    events: list[RolloutEvent] = []
    for condition in condition_changes(before, after):
        type_, status = condition.get("type"), condition.get("status")
        if type_ not in CONDITIONS_WORTH_AN_EVENT or status == "Unknown":
            continue
        if type_ == ConditionType.READY and status != "True" and was.get(type_) != "True":
            continue
        events.append(
            RolloutEvent(
                reason=str(condition.get("reason", "")),
                message=f"{type_}={status}: {condition.get('message', '')}",
                warning=status == "False" and type_ in WARNING_WHEN_FALSE,
            )
        )
    return events
