"""Children the operator did not write, as status: what was refused, why, and what goes on.

Two ways a child is not written:

- **ChildRejected**: the API server answered 400 Bad Request or 422 Invalid (a cluster policy
  such as a ValidatingAdmissionPolicy or a webhook, a limit the CRD cannot know). Sending the
  same write again can only be refused again, so that child is not sent again for the SD's
  current generation; a spec change (a new generation) tries again.
- **NameTaken**: an object of the child's name exists that this SD does not own
  (plan.children.ownership). It is left exactly as it is and looked at again at every
  reconcile: once its owner removes it, the child is made.

Either way only that child waits. The rest of the reconcile goes on: the other children are
written, the stable keeps serving, a canary is judged and rolled back, deadlines run, the collapse
guard watches. Each refusal is listed in `status.refusedWrites` (kind, name, reason, the API
server's message with its field path, the generation, since when); Ready is False with the
first one's reason and every refusal's line; a phase that would read Serving reads Degraded; a
Warning Event is posted when a refusal is new.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from specdeploy.api.conditions import ConditionType, Reason
from specdeploy.api.models import RefusedChildWrite, SpeculativeDeploymentStatus
from specdeploy.plan.children.manifests import LWS_KIND, deployment_name
from specdeploy.plan.status.conditions import ConditionUpdate

#: Longest API server message kept (Events take 1 KiB).
MAX_MESSAGE = 900


@dataclass(frozen=True)
class RefusedWrite:
    """One child the operator did not write, and why."""

    code: int | None
    kind: str
    name: str
    message: str
    reason: str = Reason.CHILD_REJECTED

    @property
    def key(self) -> tuple[str, str]:
        return self.kind, self.name

    @property
    def summary(self) -> str:
        message = " ".join(self.message.split())[:MAX_MESSAGE]
        if self.reason == Reason.NAME_TAKEN:
            return f"{self.kind} {self.name} is not this SD's ({message}): left as it is"
        return f"the API server refused {self.kind} {self.name} ({self.code}): {message}"


def name_taken(kind: str, name: str, holder: str) -> RefusedWrite:
    """The refusal of a child whose name an object this SD does not own holds (`holder`: why,
    from plan.children.ownership)."""
    return RefusedWrite(None, kind, name, holder, Reason.NAME_TAKEN)


def recorded_refusals(
    status: SpeculativeDeploymentStatus | None, generation: int | None
) -> tuple[RefusedWrite, ...]:
    """The refusals status records that still hold: those the API server gave this very
    generation, and every name found taken (to be looked at again by the caller)."""
    if status is None:
        return ()
    return tuple(
        RefusedWrite(r.code, r.kind, r.name, r.message, r.reason)
        for r in status.refused_writes
        if r.reason == Reason.NAME_TAKEN or (generation is not None and r.generation == generation)
    )


def merge_refusals(*groups: Iterable[RefusedWrite]) -> tuple[RefusedWrite, ...]:
    """One refusal per child (the latest given wins), in the order first seen."""
    merged: dict[tuple[str, str], RefusedWrite] = {}
    for group in groups:
        for refused in group:
            merged[refused.key] = refused
    return tuple(merged.values())


def refusals_status(
    refusals: Sequence[RefusedWrite],
    recorded: Sequence[RefusedChildWrite],
    generation: int | None,
    now: str,
) -> list[RefusedChildWrite]:
    """status.refusedWrites for `refusals`; one already recorded (same child, same reason)
    keeps its generation and since when."""
    earlier = {(r.kind, r.name, r.reason): r for r in recorded}
    listed = []
    for refused in refusals:
        was = earlier.get((refused.kind, refused.name, refused.reason))
        listed.append(
            RefusedChildWrite(
                kind=refused.kind,
                name=refused.name,
                reason=refused.reason,
                code=refused.code,
                message=" ".join(refused.message.split())[:MAX_MESSAGE],
                generation=was.generation if was is not None else generation,
                since=was.since if was is not None else now,
            )
        )
    return listed


def refusal_condition(refusals: Sequence[RefusedWrite]) -> ConditionUpdate | None:
    """Ready False with the first refusal's reason and every refusal's line, or None."""
    if not refusals:
        return None
    lines = "; ".join(r.summary for r in refusals)
    return ConditionUpdate(
        ConditionType.READY, "False", refusals[0].reason, lines[: 2 * MAX_MESSAGE]
    )


def blocked_keys(refusals: Iterable[RefusedWrite]) -> frozenset[tuple[str, str]]:
    """(kind, name) of every child not to be written."""
    return frozenset(r.key for r in refusals)


def revision_refusal(
    refusals: Iterable[RefusedWrite], sd_name: str, revision: str | None
) -> RefusedWrite | None:
    """The refusal of `revision`'s Deployment or LeaderWorkerSet, if any."""
    if revision is None:
        return None
    name = deployment_name(sd_name, revision)
    return next(
        (r for r in refusals if r.name == name and r.kind in ("Deployment", LWS_KIND)), None
    )
