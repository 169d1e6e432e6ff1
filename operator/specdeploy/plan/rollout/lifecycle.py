"""A canary's life as a pure function: its stages, the person's requests, and its deadlines.

One canary (the desired revision beside a stable one, with spec.rollout.canary or .analysis)
goes through stages kept in status.analysis, so a restarted operator resumes where it was:

1. **Starting**: its pods are being placed, pulled, loaded. The progress deadline runs.
2. **Probe** (with spec.rollout.analysis.probe): every canary pod ran the probe; its readiness
   gate keeps it out of the Service until the probe's figures are compared with the stable's
   (plan/probe.py). A Fail rolls it back at once, before any user request reached it; a Pass
   or an Inconclusive opens the gate.
3. **Live**: one verdict per interval on live traffic (plan/analysis.py), counted once each:
   promoted after `promoteAfter` passes in a row, rolled back when failures reach
   `failureLimit`, held on Inconclusive for at most `inconclusiveLimit` verdicts in a row.

Deadlines, so a canary never keeps its GPUs for ever: until its first conclusive verdict, a
canary older than the progress deadline (from when it became the desired revision) is rolled
back with reason ProgressDeadlineExceeded; a Hold longer than `inconclusiveLimit` verdicts
with reason InconclusiveLimitReached.

A person steers it through annotations on the SD (`kubectl specdeploy`), each naming the
canary's revision so a request never outlives the canary it was meant for, and each idempotent
(acting on it again changes nothing): `specdeploy.dev/promote: <rev>` promotes now,
`<rev>/probe` only skips the probe; `specdeploy.dev/abort: <rev>` rolls back now;
`specdeploy.dev/pause: <rev>` takes no verdict and lets no deadline run while it is set.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from specdeploy.api import labels
from specdeploy.api.config import AnalysisSettings
from specdeploy.api.models import AnalysisStatus, ProbeFigures
from specdeploy.api.times import RFC3339, parse_time
from specdeploy.plan.rollout.analysis import (
    AnalysisState,
    IntervalVerdict,
    Measurement,
    Outcome,
    Result,
    advance,
    duration_seconds,
    interval_number,
    judge_interval,
    standing,
)
from specdeploy.plan.rollout.probe import judge_probe, probe_tokens


class Stage:
    STARTING = "Starting"
    PROBE = "Probe"
    LIVE = "Live"


class EndReason:
    """Why an analysis ended (status.analysis.reason)."""

    ANALYSIS = "Analysis"
    PROGRESS_DEADLINE = "ProgressDeadlineExceeded"
    INCONCLUSIVE_LIMIT = "InconclusiveLimitReached"
    ABORTED = "Aborted"
    PROMOTED = "Promoted"


@dataclass(frozen=True)
class PersonRequests:
    """The `kubectl specdeploy` annotations on the SD (values as set)."""

    promote: str | None = None
    abort: str | None = None
    pause: str | None = None

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str]) -> PersonRequests:
        return cls(
            promote=annotations.get(labels.PROMOTE),
            abort=annotations.get(labels.ABORT),
            pause=annotations.get(labels.PAUSE),
        )


def spent_requests(
    annotations: Mapping[str, str], analysis: AnalysisStatus | None
) -> tuple[tuple[str, str], ...]:
    """The person's requests (promote, abort, pause) made for a canary whose analysis has
    ended (`analysis`: status.analysis as recorded), as (annotation, value). The reconcile
    removes each while it still holds that value, so no request outlives its canary: revision
    hashes are deterministic, and a revision that comes back later is judged afresh, not
    promoted, aborted or held by a request made for an earlier turn of it."""
    if analysis is None or analysis.outcome not in (Outcome.PROMOTE, Outcome.ROLLBACK):
        return ()
    spent = []
    for key in (labels.PROMOTE, labels.ABORT, labels.PAUSE):
        value = annotations.get(key)
        if value is not None and value.partition("/")[0] == analysis.revision:
            spent.append((key, value))
    return tuple(spent)


@dataclass(frozen=True)
class CanaryView:
    """What the reconcile saw of the canary revision."""

    revision: str
    #: When it last became the desired revision (status.revisions[].since), in seconds.
    since_seconds: float | None
    #: All its canary pods are Ready (in the Service).
    ready: bool
    #: All its canary pods ran their containers up to readiness: with a probe, the probe is
    #: over (the readiness gate may still hold them out of the Service).
    containers_ready: bool
    has_draft: bool
    #: Ready pods / wanted pods, for messages.
    ready_pods: int = 0
    wanted_pods: int = 1
    #: When the last of its Ready pods turned Ready (the kubelet's stamp, cut to the second),
    #: in seconds; None when unknown.
    ready_since_seconds: float | None = None
    #: Its pods' container restarts (restartCount, summed over their containers).
    restarts: int = 0


@dataclass(frozen=True)
class CanaryJudgement:
    """What this reconcile concluded about the canary: the analysis state to keep in status,
    the verdict counted now (if any), and what follows."""

    state: AnalysisStatus | None
    outcome: Outcome | None = None
    verdict: IntervalVerdict | None = None
    #: What the verdict judged: Probe, Live, Person or Deadline.
    source: str = "Live"
    measured: Measurement | None = None
    stable_measured: Measurement | None = None
    #: The canary's pods may take user requests (its probe was judged, or it has none).
    open_gate: bool = False


def _stamp(now: datetime) -> str:
    return now.strftime(RFC3339)


def _start_stamp(moment: datetime) -> str:
    """The stamp of a window that starts at `moment`: the whole second at or after it. A stamp
    holds whole seconds, and one cut down would open the window before `moment`, counting
    what came before it (a canary's time before it was Ready)."""
    return _stamp(datetime.fromtimestamp(math.ceil(moment.timestamp()), UTC))


def _as_state(status: AnalysisStatus) -> AnalysisState:
    return AnalysisState(
        last_interval=status.last_interval,
        passes_in_a_row=status.passes_in_a_row,
        failures=status.failures,
        inconclusive_in_a_row=status.inconclusive_in_a_row,
        errors_in_a_row=status.errors_in_a_row,
    )


def _ended(
    state: AnalysisStatus,
    outcome: Outcome,
    reason: str,
    verdict: IntervalVerdict,
    source: str,
    *,
    failures: int | None = None,
) -> CanaryJudgement:
    ended = state.model_copy(
        update={
            "outcome": str(outcome),
            "reason": reason,
            "message": verdict.message,
            "paused": False,
            **({"failures": failures} if failures is not None else {}),
        }
    )
    return CanaryJudgement(state=ended, outcome=outcome, verdict=verdict, source=source)


def judge_canary(
    previous: AnalysisStatus | None,
    *,
    canary: CanaryView | None,
    stable: str | None,
    stable_has_draft: bool,
    measurements: Mapping[str, Measurement],
    probes: Mapping[str, ProbeFigures],
    probe_configured: bool,
    requests: PersonRequests,
    settings: AnalysisSettings,
    deadline_seconds: float,
    now: datetime,
    tuned: bool = False,
) -> CanaryJudgement:
    """Advances the analysis of `canary` (None: no canary now) by what `now` brings.

    A finished analysis (Promote or Rollback) stays as it ended; the analysis of an earlier
    canary is kept in status until a new one starts.
    """
    if canary is None:
        return CanaryJudgement(state=previous)
    revision = canary.revision
    state = previous if previous is not None and previous.revision == revision else None
    if (
        state is not None
        and canary.since_seconds is not None
        and parse_time(state.started_at).timestamp() < canary.since_seconds
    ):
        # An analysis of an earlier turn of this revision (promoted long ago, now asked for
        # again, e.g. after its speculation collapsed): it is judged afresh.
        state = None
    if state is not None and state.outcome in (Outcome.PROMOTE, Outcome.ROLLBACK):
        gate = state.outcome == Outcome.PROMOTE or state.stage == Stage.LIVE
        return CanaryJudgement(state=state, outcome=Outcome(state.outcome), open_gate=gate)
    if state is None:
        state = AnalysisStatus(revision=revision, started_at=_stamp(now), stage=Stage.STARTING)

    # A person's requests first: they name this canary's revision.
    if requests.abort == revision:
        verdict = IntervalVerdict(Result.FAIL, "aborted by a person (kubectl specdeploy abort)")
        return _ended(state, Outcome.ROLLBACK, EndReason.ABORTED, verdict, "Person")
    if requests.promote == revision:
        verdict = IntervalVerdict(Result.PASS, "promoted by a person (kubectl specdeploy promote)")
        judgement = _ended(state, Outcome.PROMOTE, EndReason.PROMOTED, verdict, "Person")
        return CanaryJudgement(
            state=judgement.state,
            outcome=judgement.outcome,
            verdict=verdict,
            source="Person",
            open_gate=True,
        )
    if requests.pause == revision:
        paused = state.model_copy(update={"paused": True})
        return CanaryJudgement(
            state=paused,
            outcome=Outcome.HOLD,
            open_gate=state.stage == Stage.LIVE or not probe_configured,
        )
    state = state.model_copy(update={"paused": False})

    if state.stage == Stage.STARTING:
        if probe_configured and canary.containers_ready:
            state = state.model_copy(update={"stage": Stage.PROBE})
        elif not probe_configured and canary.ready:
            warmed = _live_start(canary, now) + timedelta(seconds=_warmup(settings))
            live = {
                "stage": Stage.LIVE,
                "started_at": _start_stamp(warmed),
                "restarts_at_live": canary.restarts,
            }
            state = state.model_copy(update=live)
    skip_probe = requests.promote == f"{revision}/probe"
    if state.stage == Stage.PROBE:
        return _probe_stage(
            state,
            canary=canary,
            stable=stable,
            stable_has_draft=stable_has_draft,
            probes=probes,
            settings=settings,
            deadline_seconds=deadline_seconds,
            now=now,
            skip=skip_probe,
        )
    if state.stage == Stage.STARTING:
        return _deadline(state, canary, deadline_seconds, now) or CanaryJudgement(state=state)
    return _live_stage(
        state,
        canary=canary,
        stable=stable,
        stable_has_draft=stable_has_draft,
        measurements=measurements,
        probes=probes,
        settings=settings,
        deadline_seconds=deadline_seconds,
        now=now,
        tuned=tuned,
    )


def _warmup(settings: AnalysisSettings) -> float:
    """Seconds of live traffic before the first counted window (analysis.warmup)."""
    return duration_seconds(settings.warmup)


def _live_start(canary: CanaryView, now: datetime) -> datetime:
    """When a canary without a probe went live: the second after its last pod turned Ready
    (the kubelet's stamp is cut to the second, so never before it), not when this reconcile
    saw it, so a late look (an operator restarted, a busy queue) neither leaves the canary's
    first requests out of its window nor delays its verdicts. Never before it became the
    desired revision (its pods may be Ready from an earlier turn), never after now (which
    `_start_stamp` then rounds up to its whole second, never down to before it was Ready)."""
    if canary.ready_since_seconds is None:
        return now
    start = canary.ready_since_seconds + 1
    if canary.since_seconds is not None:
        start = max(start, canary.since_seconds)
    return min(now, datetime.fromtimestamp(start, UTC))


def _deadline(
    state: AnalysisStatus, canary: CanaryView, deadline_seconds: float, now: datetime
) -> CanaryJudgement | None:
    """The rollback of a canary past its progress deadline before its first conclusive
    verdict, else None."""
    if state.judged_at is not None or canary.since_seconds is None:
        return None
    age = now.timestamp() - canary.since_seconds
    if age <= deadline_seconds:
        return None
    if state.stage == Stage.STARTING:
        what = f"{canary.ready_pods}/{canary.wanted_pods} canary pods ready"
    elif state.stage == Stage.PROBE:
        what = "its probe not judged"
    else:
        what = f"no conclusive verdict ({state.message or 'none yet'})"
    verdict = IntervalVerdict(
        Result.FAIL,
        f"progress deadline of {deadline_seconds:.0f}s exceeded after {age:.0f}s: {what}",
    )
    return _ended(state, Outcome.ROLLBACK, EndReason.PROGRESS_DEADLINE, verdict, "Deadline")


def _probe_stage(
    state: AnalysisStatus,
    *,
    canary: CanaryView,
    stable: str | None,
    stable_has_draft: bool,
    probes: Mapping[str, ProbeFigures],
    settings: AnalysisSettings,
    deadline_seconds: float,
    now: datetime,
    skip: bool,
) -> CanaryJudgement:
    live: dict[str, object] = {
        "stage": Stage.LIVE,
        "started_at": _stamp(now + timedelta(seconds=_warmup(settings))),
        "restarts_at_live": canary.restarts,
    }
    if skip:
        verdict = IntervalVerdict(
            Result.INCONCLUSIVE, "probe skipped by a person (kubectl specdeploy promote)"
        )
        opened = state.model_copy(update={**live, "message": verdict.message})
        return CanaryJudgement(state=opened, verdict=verdict, source="Person", open_gate=True)
    figures = probes.get(canary.revision)
    if figures is None:
        # Its pods ran the probe; Prometheus has not scraped the figures yet.
        waiting = state.model_copy(update={"message": "waiting for the probe's figures"})
        return _deadline(waiting, canary, deadline_seconds, now) or CanaryJudgement(state=waiting)
    verdict = judge_probe(
        figures,
        probes.get(stable) if stable else None,
        canary_has_draft=canary.has_draft,
        stable_has_draft=stable_has_draft,
        criteria=settings,
    )
    if verdict.result == Result.FAIL:
        # Decisive: the same prompts give the same answer again (plan/probe.py).
        judged = state.model_copy(update={"judged_at": _stamp(now), "last_interval": -1})
        return _ended(
            judged,
            Outcome.ROLLBACK,
            EndReason.ANALYSIS,
            verdict,
            "Probe",
            failures=max(state.failures + 1, settings.failure_limit),
        )
    update = {**live, "message": verdict.message, "outcome": str(Outcome.CONTINUE)}
    if verdict.result == Result.PASS:
        update["judged_at"] = _stamp(now)
    return CanaryJudgement(
        state=state.model_copy(update=update), verdict=verdict, source="Probe", open_gate=True
    )


def _live_stage(
    state: AnalysisStatus,
    *,
    canary: CanaryView,
    stable: str | None,
    stable_has_draft: bool,
    measurements: Mapping[str, Measurement],
    probes: Mapping[str, ProbeFigures],
    settings: AnalysisSettings,
    deadline_seconds: float,
    now: datetime,
    tuned: bool,
) -> CanaryJudgement:
    baseline = state.restarts_at_live
    if baseline is not None and canary.restarts < baseline:
        # A pod replaced (its restarts start again from 0): count from what is there now.
        state = state.model_copy(update={"restarts_at_live": canary.restarts})
    elif baseline is not None and canary.restarts > baseline:
        # A crash loses every request the engine held, which no counter of its shows (they
        # restart from 0): decisive, as a failed probe is.
        crashed = canary.restarts - baseline
        verdict = IntervalVerdict(
            Result.FAIL,
            f"the canary's engine restarted {crashed} time{'s' if crashed > 1 else ''} during "
            "its analysis (a crash loses the requests it held)",
        )
        judged = state.model_copy(update={"judged_at": state.judged_at or _stamp(now)})
        return _ended(
            judged,
            Outcome.ROLLBACK,
            EndReason.ANALYSIS,
            verdict,
            "Live",
            failures=max(state.failures + 1, settings.failure_limit),
        )
    started = parse_time(state.started_at).timestamp()
    number = interval_number(started, now.timestamp(), duration_seconds(settings.interval))
    if number <= state.last_interval:
        late = _deadline(state, canary, deadline_seconds, now)
        if late is not None:
            return late
        return CanaryJudgement(
            state=state, outcome=standing(_as_state(state), settings), open_gate=True
        )
    measured = measurements.get(canary.revision) or Measurement(error="the canary was not measured")
    stable_measured = (
        (measurements.get(stable) or Measurement(error="the stable was not measured"))
        if stable
        else None
    )
    verdict = judge_interval(
        measured,
        stable_measured,
        stable_has_draft,
        settings,
        tuned=tuned,
        canary_has_draft=canary.has_draft,
        probe=probe_tokens(probes.get(canary.revision), probes.get(stable) if stable else None),
    )
    counted, outcome = advance(_as_state(state), number, verdict, settings)
    update: dict[str, object] = {
        "last_interval": counted.last_interval,
        "passes_in_a_row": counted.passes_in_a_row,
        "failures": counted.failures,
        "inconclusive_in_a_row": counted.inconclusive_in_a_row,
        "errors_in_a_row": counted.errors_in_a_row,
        "outcome": str(outcome),
        "message": verdict.message,
    }
    if verdict.result in (Result.PASS, Result.FAIL) and state.judged_at is None:
        update["judged_at"] = _stamp(now)
    reason = None
    if outcome == Outcome.ROLLBACK:
        limited = (
            counted.failures < settings.failure_limit
            and settings.on_inconclusive == "Hold"
            and verdict.result == Result.INCONCLUSIVE
        )
        reason = EndReason.INCONCLUSIVE_LIMIT if limited else EndReason.ANALYSIS
        if verdict.result == Result.INCONCLUSIVE and settings.on_inconclusive == "Rollback":
            update["message"] = f"inconclusive, and onInconclusive is Rollback: {verdict.message}"
        if limited:
            update["message"] = (
                f"{counted.inconclusive_in_a_row} inconclusive verdicts in a row (inconclusive"
                f"Limit {settings.inconclusive_limit}): rolled back to free the canary's pods; "
                f"last: {verdict.message}"
            )
    elif outcome == Outcome.PROMOTE:
        reason = EndReason.ANALYSIS
    if reason is not None:
        update["reason"] = reason
    judged = state.model_copy(update=update)
    if outcome not in (Outcome.PROMOTE, Outcome.ROLLBACK):
        late = _deadline(judged, canary, deadline_seconds, now)
        if late is not None:
            return CanaryJudgement(
                state=late.state,
                outcome=late.outcome,
                verdict=late.verdict,
                source="Deadline",
                measured=measured,
                stable_measured=stable_measured,
            )
    return CanaryJudgement(
        state=judged,
        outcome=outcome,
        verdict=verdict,
        source="Live",
        measured=measured,
        stable_measured=stable_measured,
        open_gate=True,
    )


def progress_deadline_passed(
    since_seconds: float | None, now: datetime, deadline_seconds: float
) -> bool:
    """Whether a new revision (not a canary) that became the desired one at `since_seconds`
    has had longer than the deadline to get all its pods ready."""
    return since_seconds is not None and now.timestamp() - since_seconds > deadline_seconds
