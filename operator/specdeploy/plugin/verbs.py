"""What each `kubectl specdeploy` verb asks of an SD, decided from the SD alone (pure).

Every verb acts through the API: it sets or removes one annotation on the SpeculativeDeployment
that the operator's pure `decide` honours (plan.rollout.lifecycle, plan.rollout.canary), never
a side door to a Deployment or a pod. Each names the revision it is meant for, so a request
never outlives the canary it was made for, and setting it again changes nothing: every verb is
idempotent. A verb that does not apply refuses with one line and changes nothing.

- promote: `specdeploy.dev/promote: <canary>`, the canary is promoted now; while it waits at
  its probe (without --full), `<canary>/probe`: the probe is skipped, live traffic judges it;
- abort: `specdeploy.dev/abort: <canary>`, the canary is rolled back now and not retried while
  the spec names it;
- pause / resume: `specdeploy.dev/pause: <canary>` set / removed: no verdict, promotion,
  rollback or deadline while it is set;
- resume-speculation: `specdeploy.dev/resume-speculation: <revision>[-n]`, the pair the
  collapse guard took off comes back, as any new pair does;
- undo: `specdeploy.dev/undo: <revision>@<generation>`, that revision serves until the spec
  changes (metadata.generation moves on).
- retry: `specdeploy.dev/retry: <revision>[-n]`, the spec's revision, rolled back without a
  failed verdict of its probe or live traffic (a deadline, the inconclusive limit, an abort),
  starts again as a new canary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specdeploy.api import labels
from specdeploy.api.models import SpeculativeDeployment, SpeculativeDeploymentStatus
from specdeploy.plan.rollout.collapse import RESUME_ANNOTATION
from specdeploy.plan.rollout.retry import retry_refusal


class NotApplicableError(Exception):
    """The verb does not apply; the message is the one line that says why."""


@dataclass(frozen=True)
class Request:
    """An annotation to set (a value) or remove (None), and what it asks, for the person."""

    annotation: str
    value: str | None
    said: str
    #: The annotation already holds this value: nothing to write.
    already: bool = False
    #: Other annotations the request removes (stale requests of the same revision).
    removes: tuple[str, ...] = ()


def _status(sd: SpeculativeDeployment) -> SpeculativeDeploymentStatus:
    return sd.status or SpeculativeDeploymentStatus()


def _request(sd: SpeculativeDeployment, annotation: str, value: str | None, said: str) -> Request:
    current = sd.metadata.annotations.get(annotation)
    return Request(annotation, value, said, already=current == value)


def _asked_again(honoured: str) -> str:
    """The next value of a request honoured once per value: `<revision>-2`, `-3`, ..."""
    base, _, count = honoured.partition("-")
    return f"{base}-{int(count) + 1 if count.isdigit() else 2}"


def _canary(sd: SpeculativeDeployment, verb: str) -> str:
    """The canary under way, else a refusal naming what serves."""
    status = _status(sd)
    canary = status.canary_revision
    analysis = status.analysis
    if canary is None or (
        analysis is not None
        and analysis.revision == canary
        and analysis.outcome in ("Promote", "Rollback")
    ):
        serving = f"revision {status.stable_revision} serves" if status.stable_revision else ""
        raise NotApplicableError(
            f"nothing to {verb}: no canary is under way; {serving}".rstrip("; ")
        )
    return canary


def promote(sd: SpeculativeDeployment, *, full: bool = False) -> Request:
    """Promote the canary now; at its probe (without `full`) only skip the probe."""
    canary = _canary(sd, "promote")
    analysis = _status(sd).analysis
    at_probe = analysis is not None and analysis.revision == canary and analysis.stage == "Probe"
    if at_probe and not full:
        return _request(
            sd,
            labels.PROMOTE,
            f"{canary}/probe",
            f"canary {canary}: its probe is skipped; live traffic judges it",
        )
    return _request(sd, labels.PROMOTE, canary, f"canary {canary} promoted")


def abort(sd: SpeculativeDeployment) -> Request:
    canary = _canary(sd, "abort")
    return _request(
        sd,
        labels.ABORT,
        canary,
        f"canary {canary} rolled back; revision {_status(sd).stable_revision} keeps serving",
    )


def pause(sd: SpeculativeDeployment) -> Request:
    canary = _canary(sd, "pause")
    return _request(sd, labels.PAUSE, canary, f"canary {canary} paused: no verdict is taken")


def resume(sd: SpeculativeDeployment) -> Request:
    paused = sd.metadata.annotations.get(labels.PAUSE)
    if paused is None:
        raise NotApplicableError("nothing to resume: no canary is paused")
    return _request(sd, labels.PAUSE, None, f"canary {paused} resumed: judged again")


def resume_speculation(sd: SpeculativeDeployment) -> Request:
    collapse = _status(sd).collapse
    asked = sd.metadata.annotations.get(RESUME_ANNOTATION)
    if collapse is not None and not collapse.triggered and collapse.resumed_with == asked:
        return Request(
            RESUME_ANNOTATION,
            asked,
            f"speculation of revision {collapse.revision} resumed: the pair comes back",
            already=True,
        )
    if collapse is None or not collapse.triggered:
        raise NotApplicableError("nothing to resume: the collapse guard has not fired")
    if collapse.resumed_with is not None and collapse.resumed_with == sd.metadata.annotations.get(
        RESUME_ANNOTATION
    ):
        # Resumed before: a later resume of the same revision needs a new value.
        value = _asked_again(collapse.resumed_with)
    else:
        value = collapse.revision
    return _request(
        sd,
        RESUME_ANNOTATION,
        value,
        f"speculation of revision {collapse.revision} resumed: the pair comes back",
    )


def undo(
    sd: SpeculativeDeployment, records: Mapping[int, str], *, to_record: int | None = None
) -> Request:
    """Serve an earlier revision until the spec changes. `records` maps revision record numbers
    (`kubectl specdeploy history`) to revisions kept; None: the one that served before the
    stable revision."""
    status = _status(sd)
    kept = {r.revision: r for r in status.revisions}
    if to_record is not None:
        if to_record not in records:
            numbers = ", ".join(str(n) for n in sorted(records)) or "none"
            raise NotApplicableError(
                f"revision record {to_record} does not exist (pruned beyond revisionHistoryLimit "
                f"{sd.spec.revision_history_limit}, or never made); kept: {numbers}"
            )
        target = records[to_record]
    else:
        stable = status.stable_revision
        order = [r.revision for r in status.revisions]
        earlier = order[: order.index(stable)] if stable in order else order
        served = [r for r in earlier if kept[r].phase in ("Superseded", "Stable")]
        if not served:
            raise NotApplicableError("nothing to undo: no earlier revision that served is kept")
        target = served[-1]
    record = kept.get(target)
    if record is None:
        raise NotApplicableError(f"revision {target} is not in status.revisions: it was pruned")
    if record.phase == "Failed":
        raise NotApplicableError(
            f"revision {target} was rolled back: undo serves only a revision that served"
        )
    if target == status.stable_revision and status.canary_revision is None:
        raise NotApplicableError(f"nothing to undo: revision {target} already serves")
    value = f"{target}@{sd.metadata.generation or 0}"
    return _request(
        sd,
        labels.UNDO,
        value,
        f"revision {target} serves until the spec changes (generation {sd.metadata.generation})",
    )


def retry(sd: SpeculativeDeployment) -> Request:
    """Try the spec's rolled-back revision again as a new canary, when no failed verdict of its
    probe or live traffic rolled it back (plan.rollout.retry); a person's abort or pause of it
    is removed with the request."""
    status = _status(sd)
    progress = status.progress
    revision = progress.revision if progress is not None else None
    record = next((r for r in status.revisions if r.revision == revision), None)
    if record is None:
        raise NotApplicableError("nothing to retry: the spec's revision is not in status.revisions")
    asked = sd.metadata.annotations.get(labels.RETRY)
    said = f"revision {record.revision} tried again as a new canary"
    if record.phase != "Failed" and record.retried is not None and record.retried == asked:
        return Request(labels.RETRY, asked, said, already=True)
    refusal = retry_refusal(record)
    if refusal is not None:
        raise NotApplicableError(f"nothing to retry: {refusal}")
    # Retried before (the value honoured is of this revision): a later retry needs a new value.
    value = record.revision if record.retried is None else _asked_again(record.retried)
    stale = tuple(
        key
        for key in (labels.ABORT, labels.PAUSE)
        if sd.metadata.annotations.get(key) == record.revision
    )
    return Request(labels.RETRY, value, said, removes=stale)


def annotation_patch(request: Request) -> dict[str, Any]:
    """The merge patch (RFC 7386) of the SD that carries the request."""
    annotations: dict[str, Any] = dict.fromkeys(request.removes)
    annotations[request.annotation] = request.value
    return {"metadata": {"annotations": annotations}}
