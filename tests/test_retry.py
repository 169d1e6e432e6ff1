"""plan.rollout.retry: which rollbacks leave a revision retryable, and what a retry resets."""

from __future__ import annotations

import pytest

from specdeploy.api import labels
from specdeploy.api.models import (
    AnalysisStatus,
    ProbeFigures,
    RevisionDraft,
    RevisionStatus,
    RevisionTarget,
    RolloutProgress,
    SpeculativeDeploymentStatus,
    Verdict,
)
from specdeploy.plan.rollout.retry import honour_retry, retried_revision, retry_refusal

T = "2026-11-23T12:00:00Z"


def record(*verdicts: tuple[str, str], phase: str = "Failed") -> RevisionStatus:
    return RevisionStatus(
        revision="abc1234567",
        pair_version="v2",
        target=RevisionTarget(model="t"),
        draft=RevisionDraft(method="eagle3", model="d"),
        phase=phase,
        verdicts=[Verdict(time=T, source=s, result=r, message="why") for s, r in verdicts],
        probe=ProbeFigures(prompt_set="p1", complete=True, acceptance_rate=0.7),
    )


@pytest.mark.parametrize(
    ("verdicts", "refused"),
    [
        ((("Deadline", "Fail"),), None),
        ((("Probe", "Pass"), ("Live", "Inconclusive")), None),
        ((("Live", "Fail"), ("Person", "Fail")), None),
        ((("Live", "Error"), ("Deadline", "Fail")), None),
        ((("Live", "Pass"), ("Live", "Fail")), "failed live verdict"),
        ((("Probe", "Fail"),), "failed probe verdict"),
        ((), "refused by the engine launcher"),
    ],
)
def test_only_a_failed_measured_verdict_or_the_launcher_makes_a_rollback_final(
    verdicts: tuple[tuple[str, str], ...], refused: str | None
) -> None:
    said = retry_refusal(record(*verdicts))
    assert (said is None) == (refused is None)
    if refused is not None:
        assert said is not None
        assert refused in said
        assert "\n" not in said


def test_a_revision_that_serves_is_not_retried() -> None:
    assert "was not rolled back (it is Stable)" in (retry_refusal(record(phase="Stable")) or "")


def test_a_retry_is_read_as_a_new_canary_once_per_value() -> None:
    status = SpeculativeDeploymentStatus(
        stable_revision="0000000000",
        revisions=[record(("Deadline", "Fail"))],
        analysis=AnalysisStatus(revision="abc1234567", started_at=T, outcome="Rollback"),
        progress=RolloutProgress(revision="abc1234567", since=T),
    )
    asked = {labels.RETRY: "abc1234567"}
    retried = honour_retry(status, asked)
    assert retried is not None
    assert retried is not status
    [again] = retried.revisions
    assert (again.phase, again.retried, again.probe) == ("Pending", "abc1234567", None)
    assert [v.source for v in again.verdicts] == ["Deadline"], "its verdicts are kept"
    assert retried.analysis is None
    assert retried.progress is None
    assert retried.stable_revision == "0000000000"
    # Honoured and rolled back again: the same value is not honoured twice, a new one is.
    failed_again = status.model_copy(
        update={"revisions": [again.model_copy(update={"phase": "Failed"})]}
    )
    assert honour_retry(failed_again, asked) is failed_again
    assert honour_retry(failed_again, {labels.RETRY: "abc1234567-2"}) is not failed_again
    assert honour_retry(status, {labels.RETRY: "ffffffffff"}) is status, "not a revision of it"
    assert honour_retry(status, {}) is status


def test_a_retry_value_names_its_revision() -> None:
    assert retried_revision("abc1234567-3") == "abc1234567"
    assert retried_revision("abc1234567") == "abc1234567"
    assert retried_revision("") is None
    assert retried_revision(None) is None
