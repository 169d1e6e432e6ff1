"""Which revision is the canary, and what its analysis concludes for the revisions around it.

A new pair is a canary when `spec.rollout.canary` or `.analysis` is set: it runs beside the
stable revision with `rollout.canary.replicas` pods until its verdicts promote or roll it back.
A revision an analysis rolled back is not tried again until the spec names another pair (or,
when no failed verdict rolled it back, a person retries it: plan.rollout.retry), and
the collapse guard's RollbackToPrevious serves the revision that served before the collapsed
pair. `judge_revisions` puts these together for one reconcile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

from specdeploy.api import labels
from specdeploy.api.conditions import Reason, RevisionPhase
from specdeploy.api.config import AnalysisSettings
from specdeploy.api.models import (
    AutotuneStatus,
    ProbeFigures,
    SpeculativeDeploymentSpec,
    SpeculativeDeploymentStatus,
)
from specdeploy.api.times import RFC3339, parse_time
from specdeploy.plan.children.vllm_args import probe_of
from specdeploy.plan.rollout.analysis import Measurement, Outcome, Result
from specdeploy.plan.rollout.lifecycle import (
    CanaryJudgement,
    CanaryView,
    PersonRequests,
    judge_canary,
    progress_deadline_passed,
)
from specdeploy.plan.rollout.probe import (
    ProbeResult,
    container_restarts,
    containers_ready_pods,
    gates_to_open,
    pods_ready_since,
    probe_figures,
)
from specdeploy.plan.rollout.revisions import RevisionDeployment, RolloutEvent, resolve_stable


def analysed(spec: SpeculativeDeploymentSpec) -> bool:
    """Whether a new pair is a canary judged by its measurements (spec.rollout.canary or
    .analysis set), rather than replacing the stable one as soon as it is ready."""
    return spec.rollout.canary is not None or spec.rollout.analysis is not None


def watches_acceptance(spec: SpeculativeDeploymentSpec) -> bool:
    """Whether the SD needs its revisions measured: a canary analysis, a collapse guard, or a
    pair that speculates, whose payoff (status.acceptanceRate, the ACCEPTANCE column) is shown
    however it is rolled out."""
    return (
        analysed(spec)
        or spec.rollout.collapse_guard is not None
        or spec.pair.draft.method != "none"
    )


def rolled_back(status: SpeculativeDeploymentStatus | None) -> frozenset[str]:
    """Revisions an analysis rolled back: not tried again until the spec names another pair or
    a person's retry is read into the status (plan.rollout.retry)."""
    if status is None:
        return frozenset()
    # Failed with verdicts: the rollout stopped it (its analysis, a deadline, a person); the
    # launcher's refusals are remembered by plan.status.pair_check.
    return frozenset(
        r.revision for r in status.revisions if r.phase == RevisionPhase.FAILED and r.verdicts
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
        and desired.replicas >= canary_replicas
        and desired.has_ready(canary_replicas)
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
    #: When the desired revision became the desired one (the progress deadline counts from it).
    since: str | None = None
    #: A new revision that is no canary, past its progress deadline: why (it is held at zero
    #: when a stable revision serves; without one it keeps trying and the status says so).
    overdue: str | None = None
    #: Every revision's probe figures (status kept, else Prometheus' reading now).
    probes: Mapping[str, ProbeFigures] = field(default_factory=dict)
    #: Pods whose probe readiness gate opens now (their revision's probe was judged).
    gates_to_open: tuple[str, ...] = ()
    #: The revision the spec asks for (None: unschedulable).
    desired: str | None = None
    #: The revision a person's undo serves in place of the spec's (kubectl specdeploy undo).
    undone: str | None = None

    @property
    def promoted(self) -> bool:
        return self.judgement.outcome == Outcome.PROMOTE


def desired_since(
    status: SpeculativeDeploymentStatus | None, desired_revision: str | None, now: str
) -> str | None:
    """When the desired revision became the one the spec asks for (status.progress): kept
    while it stays the desired one, now when it becomes it (again)."""
    if desired_revision is None:
        return None
    progress = status.progress if status else None
    if progress is not None and progress.revision == desired_revision:
        return progress.since
    return now


def _seconds(stamp: str | None) -> float | None:
    if stamp is None:
        return None
    return parse_time(stamp).timestamp()


def undo_target(
    annotations: Mapping[str, str],
    generation: int | None,
    revisions: Sequence[RevisionDeployment],
) -> str | None:
    """The revision `specdeploy.dev/undo: <revision>@<generation>` asks to serve, while the spec
    is still that generation and the revision's Deployment is kept (None otherwise)."""
    value = annotations.get(labels.UNDO)
    if not value or "@" not in value:
        return None
    revision, _, at = value.rpartition("@")
    if not at.isdigit() or int(at) != (generation or 0):
        return None
    return revision if any(r.revision == revision for r in revisions) else None


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
    pods: Sequence[Mapping[str, Any]] = (),
    annotations: Mapping[str, str] = MappingProxyType({}),
    generation: int | None = None,
    probes_measured: Mapping[str, ProbeResult] = MappingProxyType({}),
    requests: PersonRequests | None = None,
    deadline_seconds: float = 1800.0,
) -> CanaryDecision:
    """The stable and canary revisions of this reconcile and the canary's verdict.

    `pair_revision` is the revision of the spec's pair while it speculates (what the collapse
    guard watches); `guard_action` the guard's action when it fired now or before. `pods` are the
    SD's pods (their readiness and probe gates), `probes_measured` what Prometheus reads of each
    revision's probe, `requests` a person's `kubectl specdeploy` annotations.
    """
    stamp = now.strftime(RFC3339)
    status_stable = status.stable_revision if status else None
    held = refused_by_launcher | (rolled_back(status) & {desired_revision})
    recorded_stable = status_stable
    # A person's undo: an earlier revision serves, the spec's pair waits for the next spec.
    undone = undo_target(annotations, generation, revisions)
    if undone is not None and desired_revision is not None:
        if undone != desired_revision:
            held = held | {desired_revision}
        recorded_stable = undone
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
    since = desired_since(status, desired_revision, stamp)
    recorded = {r.revision: r.probe for r in (status.revisions if status else []) if r.probe}
    probes = probe_figures(recorded, probes_measured, stamp)
    stable_record = next((r for r in revisions if r.revision == stable), None)
    canary_record = next((r for r in revisions if r.revision == canary), None)
    view = None
    if canary is not None:
        wanted = canary_replicas or 1
        view = CanaryView(
            revision=canary,
            since_seconds=_seconds(since),
            ready=canary_ready(canary, revisions, wanted),
            containers_ready=containers_ready_pods(pods, canary) >= wanted,
            has_draft=_has_draft(canary_record),
            ready_pods=canary_record.ready_replicas if canary_record else 0,
            wanted_pods=wanted,
            ready_since_seconds=pods_ready_since(pods, canary),
            restarts=container_restarts(pods, canary),
        )
    judgement = judge_canary(
        status.analysis if status else None,
        canary=view,
        stable=stable,
        stable_has_draft=_has_draft(stable_record),
        measurements=measurements,
        probes=probes,
        probe_configured=probe_of(spec) is not None,
        requests=requests or PersonRequests(),
        settings=settings,
        deadline_seconds=deadline_seconds,
        now=now,
        tuned=tuned_only(canary, tuning, stable_record, canary_record),
    )
    if judgement.outcome == Outcome.ROLLBACK and canary is not None:
        held = held | {canary}
    overdue = _overdue(
        desired_revision,
        canary=canary,
        stable=stable,
        held=held,
        revisions=revisions,
        since=since,
        deadline_seconds=deadline_seconds,
        now=now,
    )
    if overdue is not None and stable is not None and desired_revision is not None:
        held = held | {desired_revision}
    # Every revision's pods take requests once its probe is judged; a canary's only when its
    # judgement opens the gate.
    closed = {canary} if canary is not None and not judgement.open_gate else set()
    return CanaryDecision(
        recorded_stable=recorded_stable,
        stable=stable,
        canary=canary,
        canary_replicas=canary_replicas,
        judgement=judgement,
        held=held,
        since=since,
        overdue=overdue,
        probes=probes,
        desired=desired_revision,
        undone=undone if undone != desired_revision else None,
        gates_to_open=gates_to_open(
            pods,
            gated={r.revision for r in revisions if r.probe_gate},
            closed=closed | set(held),
        ),
    )


def _overdue(
    desired_revision: str | None,
    *,
    canary: str | None,
    stable: str | None,
    held: frozenset[str],
    revisions: Sequence[RevisionDeployment],
    since: str | None,
    deadline_seconds: float,
    now: datetime,
) -> str | None:
    """Why a new revision that is no canary missed its progress deadline (None: it did not).

    A canary's deadline is its analysis' (plan.rollout.lifecycle)."""
    if desired_revision is None or canary is not None or desired_revision in held:
        return None
    desired = next((r for r in revisions if r.revision == desired_revision), None)
    if desired is not None and desired.fully_ready and desired.replicas > 0:
        return None
    if stable == desired_revision or not progress_deadline_passed(
        _seconds(since), now, deadline_seconds
    ):
        return None
    ready = desired.ready_replicas if desired else 0
    wanted = desired.replicas if desired else 0
    return (
        f"progress deadline of {deadline_seconds:.0f}s exceeded: revision {desired_revision} "
        f"has {ready}/{wanted} pods ready"
    )


#: How soon a canary waiting for its probe's figures in Prometheus is looked at again.
PROBE_POLL = timedelta(seconds=5)
#: Past the deadline: it has surely passed (status times are whole seconds).
DEADLINE_MARGIN = timedelta(milliseconds=500)


def wake_moments(
    decision: CanaryDecision, deadline_seconds: float, now: datetime
) -> tuple[datetime | None, ...]:
    """Moments the rollout has something to decide that no event announces: the desired
    revision's progress deadline (while it is not judged, or not ready), and, while a canary
    waits for its probe's figures, a short poll."""
    state = decision.judgement.state
    since = _seconds(decision.since)
    final = state is not None and state.outcome in (Outcome.PROMOTE, Outcome.ROLLBACK)
    deadline = None
    if (
        since is not None
        and decision.desired not in (None, decision.stable)
        and decision.desired not in decision.held
        and not final
        and (state is None or state.judged_at is None or decision.canary is None)
    ):
        deadline = datetime.fromtimestamp(since + deadline_seconds, UTC) + DEADLINE_MARGIN
    probing = (
        decision.canary is not None
        and state is not None
        and state.stage == "Probe"
        and not final
        and not state.paused
    )
    return (deadline, now + PROBE_POLL if probing else None)


_VERDICT_REASONS = {
    Result.PASS: Reason.ANALYSIS_PASSED,
    Result.FAIL: Reason.ANALYSIS_FAILED,
    Result.INCONCLUSIVE: Reason.ANALYSIS_INCONCLUSIVE,
    Result.ERROR: Reason.METRICS_UNAVAILABLE,
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
            warning=verdict.result in (Result.FAIL, Result.ERROR),
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
