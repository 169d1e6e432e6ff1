"""Status transitions as pure functions: conditions, phase, and whether status changed at all.

A condition keeps its lastTransitionTime while its status stays the same, even when its reason
or message change; `observedGeneration` always names the generation it was computed for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specdeploy.api.models import Condition, ConditionStatus


@dataclass(frozen=True)
class ConditionUpdate:
    """What a reconcile concluded about one condition type."""

    type: str
    status: ConditionStatus
    reason: str
    message: str = ""


def set_condition(
    conditions: Sequence[Condition],
    update: ConditionUpdate,
    generation: int | None,
    now: str,
) -> list[Condition]:
    """Conditions with `update` applied: replaced in place, or appended when new.

    lastTransitionTime moves to `now` only when the status differs from the existing one.
    """
    result: list[Condition] = []
    found = False
    for existing in conditions:
        if existing.type != update.type:
            result.append(existing)
            continue
        found = True
        transition = (
            existing.last_transition_time
            if existing.status == update.status and existing.last_transition_time
            else now
        )
        result.append(
            Condition(
                type=update.type,
                status=update.status,
                reason=update.reason,
                message=update.message,
                observed_generation=generation,
                last_transition_time=transition,
            )
        )
    if not found:
        result.append(
            Condition(
                type=update.type,
                status=update.status,
                reason=update.reason,
                message=update.message,
                observed_generation=generation,
                last_transition_time=now,
            )
        )
    return result


def set_conditions(
    conditions: Sequence[Condition],
    updates: Iterable[ConditionUpdate],
    generation: int | None,
    now: str,
) -> list[Condition]:
    """Applies several updates in order (see `set_condition`)."""
    result = list(conditions)
    for update in updates:
        result = set_condition(result, update, generation, now)
    return result


def find_condition(conditions: Sequence[Condition], type_: str) -> Condition | None:
    """The condition of this type, if present."""
    return next((c for c in conditions if c.type == type_), None)


def status_patch(current: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that turns `current` status into `desired`; empty when nothing changed.

    Keys present in `current` but absent from `desired` are set to None (removed), except the
    ones kopf keeps for itself (`kopf`).
    """
    current = dict(current or {})
    patch: dict[str, Any] = {}
    for key, value in desired.items():
        if current.get(key) != value:
            patch[key] = value
    for key in current:
        if key not in desired and key != "kopf":
            patch[key] = None
    return patch
