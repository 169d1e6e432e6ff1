"""A rolled-back revision tried again (`kubectl specdeploy retry`), when nothing it measured
failed it.

A rollback on a failed verdict of the probe or of live traffic says the pair does not pay: the
revision is not tried again while the spec names it. A rollback without one says nothing of the
pair: its progress deadline (a slow pull, a GPU node scale-up), its inconclusive limit (no
traffic), `onInconclusive: Rollback` on a Prometheus blip, a person's abort. Such a revision
stays retryable: `specdeploy.dev/retry: <revision>[-n]` starts it again as a new canary, its
analysis and progress deadline from the start and its probe measured again on its new pods.

Each value is honoured once: `status.revisions[].retried` records it, so a retried revision
that is rolled back again stays so until a new value (`<revision>-2`) asks again.
"""

from __future__ import annotations

from collections.abc import Mapping

from specdeploy.api import labels
from specdeploy.api.conditions import RevisionPhase
from specdeploy.api.models import RevisionStatus, SpeculativeDeploymentStatus

#: Verdict sources that measured the pair: a Fail from one of them is a quality signal.
MEASURED = frozenset({"Probe", "Live"})


def retry_refusal(record: RevisionStatus) -> str | None:
    """Why the revision cannot be retried (one line), or None: it can."""
    revision = record.revision
    if record.phase != RevisionPhase.FAILED:
        return f"revision {revision} was not rolled back (it is {record.phase})"
    if not record.verdicts:
        return (
            f"revision {revision} was refused by the engine launcher: "
            "the spec must name another pair"
        )
    last = record.verdicts[-1]
    if last.result == "Fail" and last.source in MEASURED:
        return (
            f"revision {revision} was rolled back on a failed {last.source.lower()} verdict "
            f"({last.message}): it is tried again only when the spec names another pair"
        )
    return None


def retried_revision(value: str | None) -> str | None:
    """The revision a `specdeploy.dev/retry` value names (`<revision>` or `<revision>-<n>`)."""
    if not value:
        return None
    return value.partition("-")[0] or None


def honour_retry(
    status: SpeculativeDeploymentStatus | None, annotations: Mapping[str, str]
) -> SpeculativeDeploymentStatus | None:
    """The status as the reconcile reads it when a retry is asked and not yet honoured: the
    revision's record no longer Failed (its verdicts kept, its probe figures dropped, the value
    recorded), its analysis and progress gone, so it is a new canary from now. `status` as it
    is otherwise."""
    value = annotations.get(labels.RETRY)
    revision = retried_revision(value)
    if status is None or revision is None:
        return status
    index = next((i for i, r in enumerate(status.revisions) if r.revision == revision), None)
    if index is None:
        return status
    record = status.revisions[index]
    if record.retried == value or retry_refusal(record) is not None:
        return status
    records = list(status.revisions)
    records[index] = record.model_copy(
        update={"phase": RevisionPhase.PENDING, "probe": None, "retried": value}
    )
    analysis = status.analysis
    progress = status.progress
    return status.model_copy(
        update={
            "revisions": records,
            "analysis": None
            if analysis is not None and analysis.revision == revision
            else analysis,
            "progress": None
            if progress is not None and progress.revision == revision
            else progress,
        }
    )
