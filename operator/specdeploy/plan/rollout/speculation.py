"""Whether the pods of a SpeculativeDeployment speculate, and the spec they are served with.

Speculation is decided before hashing: turning it off changes the pods (no draft, no
`--speculative-config`), so it is a new revision, exactly like a new pair.
"""

from __future__ import annotations

from specdeploy.api.conditions import Reason
from specdeploy.api.config import OperatorConfig
from specdeploy.api.models import DraftSpec, SpeculationStatus
from specdeploy.api.models import SpeculativeDeploymentSpec as Spec


def decide_speculation(
    spec: Spec, config: OperatorConfig, *, collapsed: bool = False
) -> SpeculationStatus:
    """Enabled or Disabled, with the reason, for this spec on this operator.

    `collapsed` is True when the collapse guard fired with action DisableSpeculation; it wins
    over `placement.speculation: Enabled`, because the guard is configured on the same resource.
    """
    queue = spec.placement.queue
    if spec.pair.draft.method == "none":
        return SpeculationStatus(
            state="Disabled", reason=Reason.NO_DRAFT, message="draft method none"
        )
    if spec.placement.speculation == "Disabled":
        return SpeculationStatus(
            state="Disabled",
            reason=Reason.SPECULATION_DISABLED_BY_SPEC,
            message="placement.speculation is Disabled",
        )
    if collapsed:
        return SpeculationStatus(
            state="Disabled",
            reason=Reason.SPECULATION_DISABLED_COLLAPSE,
            message="acceptance stayed below the collapse guard's floor",
        )
    if spec.placement.speculation == "Auto" and queue is not None and queue in config.batch_queues:
        return SpeculationStatus(
            state="Disabled",
            reason=Reason.SPECULATION_DISABLED_BATCH_QUEUE,
            message=f"queue {queue} is a batch queue",
        )
    return SpeculationStatus(
        state="Enabled",
        reason=Reason.SPECULATION_ENABLED,
        message=f"{spec.pair.draft.method} draft",
    )


def served_spec(spec: Spec, speculation: SpeculationStatus) -> Spec:
    """The spec the pods are built from: with speculation Disabled, the draft becomes method none.

    Everything in plan/ that builds pods or hashes them takes this spec, never the raw one.
    """
    if speculation.state == "Enabled":
        return spec
    pair = spec.pair.model_copy(update={"draft": DraftSpec(method="none")})
    return spec.model_copy(update={"pair": pair})
