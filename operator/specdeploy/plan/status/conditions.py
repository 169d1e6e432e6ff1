"""Conditions as pure functions: what a reconcile concluded about one condition, applied to a list.

A condition keeps its lastTransitionTime while its status stays the same, even when its reason
or message change; `observedGeneration` always names the generation it was computed for.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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
    existing = next((c for c in conditions if c.type == update.type), None)
    kept_time = (
        existing.last_transition_time
        if existing is not None and existing.status == update.status
        else None
    )
    condition = Condition(
        type=update.type,
        status=update.status,
        reason=update.reason,
        message=update.message,
        observed_generation=generation,
        last_transition_time=kept_time or now,
    )
    if existing is None:
        return [*conditions, condition]
    return [condition if c.type == update.type else c for c in conditions]


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
