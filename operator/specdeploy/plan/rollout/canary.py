"""Which revision is the canary, and what its analysis concludes for the revisions around it.

A new pair is a canary when `spec.rollout.canary` or `.analysis` is set: it runs beside the
stable revision with `rollout.canary.replicas` pods until its verdicts promote or roll it back.
A revision an analysis rolled back is never tried again until the spec names another pair, and
the collapse guard's RollbackToPrevious serves the revision that served before the collapsed
pair. `judge_revisions` puts these together for one reconcile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from specdeploy.api.conditions import Reason, RevisionPhase
from specdeploy.api.config import AnalysisSettings
from specdeploy.api.models import (
    AutotuneStatus,
    SpeculativeDeploymentSpec,
    SpeculativeDeploymentStatus,
)
from specdeploy.plan.rollout.analysis import (
    CanaryJudgement,
    Measurement,
    Outcome,
    Result,
    judge_canary,
)
from specdeploy.plan.rollout.revisions import RevisionDeployment, RolloutEvent, resolve_stable


def analysed(spec: SpeculativeDeploymentSpec) -> bool:
    """Whether a new pair is a canary judged by its measurements (spec.rollout.canary or
    .analysis set), rather than replacing the stable one as soon as it is ready."""
    return spec.rollout.canary is not None or spec.rollout.analysis is not None


def watches_acceptance(spec: SpeculativeDeploymentSpec) -> bool:
    """Whether the SD needs its revisions measured: a canary analysis or a collapse guard."""
    return analysed(spec) or spec.rollout.collapse_guard is not None


def rolled_back(status: SpeculativeDeploymentStatus | None) -> frozenset[str]:
    """Revisions an analysis rolled back: never tried again until the spec names another pair."""
    if status is None:
        return frozenset()
    return frozenset(
        r.revision
        for r in status.revisions
        if r.phase == RevisionPhase.FAILED and any(v.result == "Fail" for v in r.verdicts)
    )


def served_before(
    status: SpeculativeDeploymentStatus | None,
    revisions: Sequence[RevisionDeployment],
    pair_revision: str,
) -> str | None:
    """The newest revision that served before `pair_revision` and whose Deployment is kept."""
    if status is None:
        return None
    kept = {r.revision for r in revisions}
    recorded = [r.revision for r in status.revisions]
    before = recorded[: recorded.index(pair_revision)] if pair_revision in recorded else recorded
    candidates = [
        r
        for r in status.revisions
        if r.revision in before
        and r.revision in kept
        and r.phase in (RevisionPhase.SUPERSEDED, RevisionPhase.STABLE)
    ]
    return candidates[-1].revision if candidates else None


def canary_ready(
    desired_revision: str | None, revisions: Sequence[RevisionDeployment], canary_replicas: int
) -> bool:
    """Whether the desired revision has all its canary pods ready (its analysis may start)."""
    desired = next((r for r in revisions if r.revision == desired_revision), None)
    return (
        desired is not None
        and desired.observed
        and desired.replicas >= canary_replicas
        and desired.ready_replicas >= canary_replicas
    )


def tuned_only(
    canary: str | None,
    tuning: AutotuneStatus | None,
    stable: RevisionDeployment | None,
    candidate: RevisionDeployment | None,
) -> bool:
    """Whether the canary is the autotuner's trial and serves the stable's pair (models and
    version): its only change is then the tuned length, which the canary judges by throughput."""
    if canary is None or tuning is None or tuning.trial_revision != canary:
        return False
    if stable is None or candidate is None or not stable.pair or not candidate.pair:
        return False

    def served(pair: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in pair.items() if k != "revision"}

    return served(stable.pair) == served(candidate.pair)


def _has_draft(record: RevisionDeployment | None) -> bool:
    return bool(record and (record.pair.get("draft") or {}).get("method") not in (None, "none"))


@dataclass(frozen=True)
class CanaryDecision:
    """Who serves, the canary (if any) and its judgement, and every revision held at zero."""

    #: The stable revision as status records it (or the collapse guard's fallback): the
    #: rollout plan's input.
    recorded_stable: str | None
    #: The stable revision resolved against the Deployments that exist.
    stable: str | None
    canary: str | None
    #: Pods of a canary, when new pairs are canaries (None: a new pair replaces the stable).
    canary_replicas: int | None
    judgement: CanaryJudgement
    #: Revisions that stay at zero: refused by the launcher, rolled back, or collapsed.
    held: frozenset[str]

    @property
    def promoted(self) -> bool:
        return self.judgement.outcome == Outcome.PROMOTE


def judge_revisions(
    spec: SpeculativeDeploymentSpec,
    status: SpeculativeDeploymentStatus | None,
    revisions: Sequence[RevisionDeployment],
    *,
    desired_revision: str | None,
    pair_revision: str | None,
    refused_by_launcher: frozenset[str],
    guard_action: str | None,
    tuning: AutotuneStatus | None,
    measurements: Mapping[str, Measurement],
    settings: AnalysisSettings,
    now: datetime,
) -> CanaryDecision:
    """The stable and canary revisions of this reconcile and the canary's verdict.

    `pair_revision` is the revision of the spec's pair while it speculates (what the collapse
    guard watches); `guard_action` the guard's action when it fired now or before.
    """
    status_stable = status.stable_revision if status else None
    held = refused_by_launcher | (rolled_back(status) & {desired_revision})
    recorded_stable = status_stable
    # RollbackToPrevious: the pair that collapsed stops, the revision that served before it
    # serves again (with no such revision left, the guard only alerts).
    if guard_action == "RollbackToPrevious" and pair_revision is not None:
        previous = served_before(status, revisions, pair_revision)
        if previous is not None:
            held = held | {pair_revision}
            recorded_stable = previous
    # The collapse guard's fallback to the target alone is not a canary: it replaces the
    # collapsed pair once ready.
    canary_replicas = (
        (spec.rollout.canary.replicas if spec.rollout.canary else 1)
        if analysed(spec) and guard_action != "DisableSpeculation"
        else None
    )
    stable = resolve_stable(recorded_stable, revisions, desired_revision)
    canary = (
        desired_revision
        if canary_replicas is not None
        and stable is not None
        and desired_revision not in (None, stable)
        and desired_revision not in held
        else None
    )
    stable_record = next((r for r in revisions if r.revision == stable), None)
    canary_record = next((r for r in revisions if r.revision == canary), None)
    judgement = judge_canary(
        status.analysis if status else None,
        canary=canary,
        canary_ready=canary is not None and canary_ready(canary, revisions, canary_replicas or 1),
        stable=stable,
        stable_has_draft=_has_draft(stable_record),
        measurements=measurements,
        settings=settings,
        now=now,
        tuned=tuned_only(canary, tuning, stable_record, canary_record),
    )
    if judgement.outcome == Outcome.ROLLBACK and canary is not None:
        held = held | {canary}
    return CanaryDecision(
        recorded_stable=recorded_stable,
        stable=stable,
        canary=canary,
        canary_replicas=canary_replicas,
        judgement=judgement,
        held=held,
    )


_VERDICT_REASONS = {
    Result.PASS: Reason.ANALYSIS_PASSED,
    Result.FAIL: Reason.ANALYSIS_FAILED,
    Result.INCONCLUSIVE: Reason.ANALYSIS_INCONCLUSIVE,
}


def analysis_events(decision: CanaryDecision) -> list[RolloutEvent]:
    """An Event per verdict counted, and one when the verdicts promote or roll back."""
    judgement, canary, stable = decision.judgement, decision.canary, decision.stable
    verdict, state = judgement.verdict, judgement.state
    if verdict is None or state is None or canary is None:
        return []
    counts = f"{state.passes_in_a_row} passes in a row, {state.failures} failures"
    events = [
        RolloutEvent(
            _VERDICT_REASONS[verdict.result],
            f"canary {canary}: {verdict.message} ({counts})",
            warning=verdict.result == Result.FAIL,
        )
    ]
    if judgement.outcome == Outcome.PROMOTE:
        events.append(
            RolloutEvent(
                Reason.CANARY_PROMOTED,
                f"canary {canary} promoted after {state.passes_in_a_row} passing verdicts; "
                f"it scales up and replaces revision {stable}",
            )
        )
    elif judgement.outcome == Outcome.ROLLBACK:
        events.append(
            RolloutEvent(
                Reason.ROLLED_BACK,
                f"canary {canary} rolled back: {verdict.message}, {state.failures} failed "
                f"verdicts; revision {stable} keeps serving",
                warning=True,
            )
        )
    return events
