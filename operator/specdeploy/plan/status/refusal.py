"""A child write the API server refused (400 Bad Request, 422 Invalid), as a status and a stop.

Admission (the CRD's schema and CEL rules) holds every string the operator copies into a child
to what that child accepts, so this should not happen; where it still does (a cluster policy
such as a ValidatingAdmissionPolicy, a limit the CRD cannot know), retrying the same write can
only be refused again. The reconcile that sees the refusal sets Ready and Progressing False with
reason `ChildRejected`, the child and the API server's message, and the phase Failed, all for
the SD's current generation; later reconciles of that generation send nothing. A spec change (a
new generation) tries again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdeploy.api.conditions import ConditionType, Phase, Reason
from specdeploy.api.models import SpeculativeDeploymentStatus
from specdeploy.plan.status.conditions import ConditionUpdate, find_condition, set_conditions

#: Longest API server message kept in a condition (Events take 1 KiB).
MAX_MESSAGE = 900


@dataclass(frozen=True)
class RefusedWrite:
    """One child write the API server refused for good."""

    code: int
    kind: str
    name: str
    message: str

    @property
    def summary(self) -> str:
        message = " ".join(self.message.split())[:MAX_MESSAGE]
        return f"the API server refused {self.kind} {self.name} ({self.code}): {message}"


def refused_generation(
    status: SpeculativeDeploymentStatus | None, generation: int | None
) -> str | None:
    """The refusal recorded for this very generation (its message), else None."""
    if status is None or generation is None:
        return None
    ready = find_condition(status.conditions, ConditionType.READY)
    if ready is None or ready.reason != Reason.CHILD_REJECTED:
        return None
    return ready.message if ready.observed_generation == generation else None


def refusal_status(
    status: SpeculativeDeploymentStatus | None,
    generation: int | None,
    refused: RefusedWrite,
    now: str,
) -> dict[str, Any]:
    """The status merge patch that records `refused` for `generation`."""
    updates = [
        ConditionUpdate(ConditionType.READY, "False", Reason.CHILD_REJECTED, refused.summary),
        ConditionUpdate(
            ConditionType.PROGRESSING,
            "False",
            Reason.CHILD_REJECTED,
            "stopped until the spec changes: " + refused.summary,
        ),
    ]
    conditions = set_conditions(
        status.conditions if status is not None else [], updates, generation, now
    )
    return {
        "observedGeneration": generation,
        "phase": Phase.FAILED,
        "conditions": [
            c.model_dump(by_alias=True, exclude_none=True, mode="json") for c in conditions
        ],
    }
