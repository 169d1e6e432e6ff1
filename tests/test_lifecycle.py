"""A canary's life: its probe, a person's requests, its deadlines (plan.rollout.lifecycle)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from specdeploy.api import labels
from specdeploy.api.config import AnalysisSettings
from specdeploy.api.models import AnalysisStatus, ProbeFigures
from specdeploy.plan.rollout.analysis import Measurement, Outcome
from specdeploy.plan.rollout.canary import (
    DEADLINE_MARGIN,
    PROBE_POLL,
    CanaryDecision,
    wake_moments,
)
from specdeploy.plan.rollout.lifecycle import (
    CanaryJudgement,
    CanaryView,
    EndReason,
    PersonRequests,
    Stage,
    judge_canary,
)
from specdeploy.plan.rollout.probe import pods_ready_since
from vllm_windows import figures

START = datetime(2026, 11, 26, 8, 0, tzinfo=UTC)
SETTINGS = AnalysisSettings(interval="10s", min_draft_tokens=100)
GOOD = figures(0.8, 3.4, 0.010)
BAD = figures(0.05, 1.1, 0.010)
TARGET_ALONE = figures(None, 1.0, 0.008)


def probe(acceptance: float | None, prompt_set: str = "p1", **changes: object) -> ProbeFigures:
    values: dict[str, object] = {
        "prompt_set": prompt_set,
        "prompts": 8,
        "pods": 1,
        "complete": True,
        "requests": 8,
        "errors": 0,
        "output_tokens": 512,
        "draft_tokens": 600 if acceptance is not None else 0,
        "acceptance_rate": acceptance,
        "mean_acceptance_length": None if acceptance is None else 1 + 3 * acceptance,
        "tokens_per_step": 1.0 if acceptance is None else 1 + 3 * acceptance,
    }
    values.update(changes)
    return ProbeFigures.model_validate(values)


def view(
    *,
    ready: bool = True,
    containers_ready: bool = True,
    since: datetime = START,
    ready_since: datetime | None = None,
    restarts: int = 0,
) -> CanaryView:
    return CanaryView(
        revision="canary",
        since_seconds=since.timestamp(),
        ready=ready,
        containers_ready=containers_ready,
        has_draft=True,
        ready_pods=1 if ready else 0,
        ready_since_seconds=ready_since.timestamp() if ready_since else None,
        restarts=restarts,
    )


class Run:
    """One canary judged reconcile after reconcile, its status carried over like status is."""

    def __init__(
        self,
        *,
        probe_configured: bool = False,
        settings: AnalysisSettings = SETTINGS,
        deadline: float = 1800,
    ) -> None:
        self.state: AnalysisStatus | None = None
        self.now = START
        self.probe_configured = probe_configured
        self.settings = settings
        self.deadline = deadline
        self.judgements: list[CanaryJudgement] = []

    def step(
        self,
        seconds: float = 0,
        *,
        canary: CanaryView | None = None,
        measured: dict[str, Measurement] | None = None,
        probes: dict[str, ProbeFigures] | None = None,
        requests: PersonRequests | None = None,
    ) -> CanaryJudgement:
        self.now += timedelta(seconds=seconds)
        judgement = judge_canary(
            self.state,
            canary=canary or view(),
            stable="stable",
            stable_has_draft=True,
            measurements=measured if measured is not None else {"canary": GOOD, "stable": GOOD},
            probes=probes or {},
            probe_configured=self.probe_configured,
            requests=requests or PersonRequests(),
            settings=self.settings,
            deadline_seconds=self.deadline,
            now=self.now,
        )
        self.state = judgement.state
        self.judgements.append(judgement)
        return judgement


def test_an_engine_restart_during_the_analysis_rolls_the_canary_back_at_once() -> None:
    # Its pod restarted once before going live (a slow first start): that is the baseline.
    run = Run()
    assert run.step(canary=view(restarts=1)).state.restarts_at_live == 1  # type: ignore[union-attr]
    assert run.step(10, canary=view(restarts=1)).outcome == Outcome.CONTINUE
    # Its engine crashes mid-analysis, though every window's figures pass.
    crashed = run.step(10, canary=view(restarts=2))
    assert crashed.outcome == Outcome.ROLLBACK
    assert crashed.verdict is not None
    assert crashed.verdict.message == (
        "the canary's engine restarted 1 time during its analysis (a crash loses the requests "
        "it held)"
    )
    assert run.state is not None
    assert run.state.failures >= SETTINGS.failure_limit
    # A pod replaced (its count starts again from 0) is no crash: counted from there.
    replaced = Run()
    replaced.step(canary=view(restarts=3))
    assert replaced.step(10, canary=view(restarts=0)).outcome == Outcome.CONTINUE
    assert replaced.step(10, canary=view(restarts=0)).outcome == Outcome.CONTINUE
    assert replaced.step(10, canary=view(restarts=0)).outcome == Outcome.PROMOTE


def test_a_warm_up_holds_the_first_counted_window_back() -> None:
    # 30 s of live traffic first: its gate is open (it takes requests, its caches warm), and
    # the intervals count from the warm-up's end, so no window reads the cold start.
    run = Run(settings=SETTINGS.model_copy(update={"warmup": "30s"}))
    first = run.step()
    assert first.state is not None
    assert first.open_gate
    assert first.state.started_at == "2026-11-26T08:00:30Z"
    cold = {"canary": BAD, "stable": GOOD}
    for _ in range(3):
        during = run.step(10, measured=cold)
        assert during.outcome == Outcome.CONTINUE
        assert during.verdict is None
        assert during.open_gate
    outcomes = [run.step(10).outcome for _ in range(SETTINGS.promote_after)]
    assert outcomes[-1] == Outcome.PROMOTE
    # Without a warm-up the same cold windows are judged, and fail.
    cold_run = Run()
    cold_run.step()
    judged = [cold_run.step(10, measured=cold).outcome for _ in range(2)]
    assert judged[-1] == Outcome.ROLLBACK
    # After a probe, the warm-up starts when the gate opens.
    probed = Run(probe_configured=True, settings=SETTINGS.model_copy(update={"warmup": "30s"}))
    probed.step(canary=view(ready=False))
    opened = probed.step(
        5, canary=view(ready=False), probes={"canary": probe(0.8), "stable": probe(0.8)}
    )
    assert opened.open_gate
    assert opened.state is not None
    assert opened.state.started_at == "2026-11-26T08:00:35Z"


def test_a_good_canary_is_promoted_after_its_passes_and_takes_requests_all_along() -> None:
    run = Run()
    first = run.step()
    assert first.state is not None
    assert first.state.stage == Stage.LIVE
    assert first.open_gate
    outcomes = [run.step(10).outcome for _ in range(3)]
    assert outcomes == [Outcome.CONTINUE, Outcome.CONTINUE, Outcome.PROMOTE]
    assert run.state is not None
    assert run.state.reason == EndReason.ANALYSIS


def test_a_failed_stable_query_holds_the_canary_and_counts_neither_way() -> None:
    # Prometheus does not answer for the stable past the inconclusive limit: no rollback, no
    # promotion; the canary is held, and judged again once Prometheus answers.
    run = Run(settings=SETTINGS.model_copy(update={"inconclusive_limit": 4}))
    run.step()
    broken = {"canary": GOOD, "stable": Measurement(error="timed out")}
    outcomes = [run.step(10, measured=broken).outcome for _ in range(6)]
    assert outcomes == [Outcome.HOLD] * 6
    assert run.state is not None
    assert run.state.errors_in_a_row == 6
    assert run.state.inconclusive_in_a_row == 0
    assert run.state.reason is None
    assert "the stable's figures could not be read: timed out" in run.state.message
    assert run.state.judged_at is None
    healed = [run.step(10).outcome for _ in range(SETTINGS.promote_after)]
    assert healed[-1] == Outcome.PROMOTE
    assert run.state.errors_in_a_row == 0


def test_a_canary_seen_ready_late_goes_live_when_its_pods_turned_ready() -> None:
    # Its pod turned Ready at 08:00:20 (the kubelet's stamp, cut to the second); the operator
    # saw it 30 s later (restarted, or busy): the window starts the second after the stamp, so
    # the requests of those 30 s count, and its first verdicts are due at once.
    run = Run()
    run.now = START + timedelta(seconds=50)
    seen = run.step(canary=view(ready_since=START + timedelta(seconds=20)))
    assert seen.state is not None
    assert (seen.state.stage, seen.state.started_at) == (Stage.LIVE, "2026-11-26T08:00:21Z")
    assert seen.state.last_interval == 1  # 08:00:21 + 2 intervals of 10 s have closed
    # Seen within the second of the stamp: from when it was seen, never sooner.
    run = Run()
    on_time = run.step(canary=view(ready_since=START))
    assert on_time.state is not None
    assert on_time.state.started_at == "2026-11-26T08:00:00Z"
    # Seen 0.65 s into the stamp's second: a stamp holds whole seconds, and the window opens on
    # the next one, not on the second it began in, before the pod was Ready (where a bad
    # canary's verdicts came up to a second sooner than its intervals allow).
    run = Run()
    run.now = START + timedelta(seconds=0.65)
    within = run.step(canary=view(ready_since=START))
    assert within.state is not None
    assert within.state.started_at == "2026-11-26T08:00:01Z"
    assert run.step(9.8).state.last_interval == -1  # type: ignore[union-attr]
    assert run.step(0.6).state.last_interval == 0  # type: ignore[union-attr]
    # Its pods Ready since an earlier turn of the revision: from when it was asked for again.
    run = Run()
    run.now = START + timedelta(seconds=40)
    again = run.step(canary=view(ready_since=START - timedelta(hours=1)))
    assert again.state is not None
    assert again.state.started_at == "2026-11-26T08:00:00Z"
    # No stamp on its pods: when the operator saw it.
    run = Run()
    run.now = START + timedelta(seconds=40)
    unknown = run.step(canary=view())
    assert unknown.state is not None
    assert unknown.state.started_at == "2026-11-26T08:00:40Z"


def pod(revision: str, ready: str, at: str | None, *, deleting: bool = False) -> dict[str, Any]:
    condition = {"type": "Ready", "status": ready}
    if at is not None:
        condition["lastTransitionTime"] = at
    metadata: dict[str, Any] = {"labels": {labels.REVISION: revision}}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-26T08:00:00Z"
    return {"metadata": metadata, "status": {"conditions": [condition]}}


def test_a_revision_is_ready_since_its_last_ready_pod_turned_ready() -> None:
    pods = [
        pod("canary", "True", "2026-11-26T08:00:05Z"),
        pod("canary", "True", "2026-11-26T08:00:09Z"),
        pod("canary", "False", "2026-11-26T08:00:30Z"),  # not Ready: not counted
        pod("canary", "True", "2026-11-26T08:00:40Z", deleting=True),  # leaving: not counted
        pod("stable", "True", "2026-11-26T08:00:50Z"),  # another revision
    ]
    assert pods_ready_since(pods, "canary") == (START + timedelta(seconds=9)).timestamp()
    assert pods_ready_since(pods, "none") is None
    # A Ready pod that does not say since when: unknown, the analysis starts when seen.
    assert pods_ready_since([*pods, pod("canary", "True", None)], "canary") is None
    assert pods_ready_since([*pods, pod("canary", "True", "soon")], "canary") is None


def test_a_canary_that_never_gets_ready_is_rolled_back_at_its_deadline() -> None:
    run = Run(deadline=600)
    waiting = view(ready=False, containers_ready=False)
    assert run.step(canary=waiting).outcome is None
    assert run.step(599, canary=waiting).outcome is None
    late = run.step(2, canary=waiting)
    assert late.outcome == Outcome.ROLLBACK
    assert late.source == "Deadline"
    assert late.state is not None
    assert late.state.reason == EndReason.PROGRESS_DEADLINE
    assert late.state.message == (
        "progress deadline of 600s exceeded after 601s: 0/1 canary pods ready"
    )


def test_the_deadline_counts_until_the_first_conclusive_verdict_only() -> None:
    run = Run(deadline=30)
    run.step()
    assert run.step(10).outcome == Outcome.CONTINUE  # a pass: judged
    nothing = {"canary": Measurement(), "stable": GOOD}
    assert run.step(30, measured=nothing).outcome == Outcome.HOLD  # past 30 s, but judged
    # Never judged: only inconclusive verdicts until the deadline.
    run = Run(deadline=30)
    run.step()
    assert run.step(10, measured=nothing).outcome == Outcome.HOLD
    late = run.step(30, measured=nothing)
    assert late.outcome == Outcome.ROLLBACK
    assert late.state is not None
    assert late.state.reason == EndReason.PROGRESS_DEADLINE
    assert "no conclusive verdict" in late.state.message


def test_a_bad_draft_is_rolled_back_on_the_probe_before_its_gate_opens() -> None:
    run = Run(probe_configured=True)
    probed = view(ready=False, containers_ready=True)
    # Its pods ran the probe; Prometheus has not scraped the figures yet: wait, gate closed.
    waiting = run.step(canary=probed)
    assert waiting.state is not None
    assert waiting.state.stage == Stage.PROBE
    assert not waiting.open_gate
    assert waiting.outcome is None
    judged = run.step(2, canary=probed, probes={"canary": probe(0.02), "stable": probe(0.8)})
    assert judged.outcome == Outcome.ROLLBACK
    assert not judged.open_gate
    assert judged.source == "Probe"
    assert judged.state is not None
    assert judged.state.message.startswith(
        "probe: first-position acceptance 0.02 < 0.60 on the probe's 8 prompts"
    )
    assert judged.state.failures >= SETTINGS.failure_limit


def test_a_draft_as_good_as_the_stable_s_on_the_probe_opens_its_gate_and_goes_live() -> None:
    run = Run(probe_configured=True)
    probed = view(ready=False, containers_ready=True)
    judged = run.step(canary=probed, probes={"canary": probe(0.8), "stable": probe(0.82)})
    assert judged.open_gate
    assert judged.outcome is None
    assert judged.state is not None
    assert judged.state.stage == Stage.LIVE
    assert judged.state.judged_at is not None
    assert judged.verdict is not None
    assert judged.verdict.message == (
        "probe: acceptance 0.80 on the probe's 8 prompts; the stable's 0.82 on the same prompts"
    )
    # Live verdicts count from the gate's opening.
    outcomes = [run.step(10).outcome for _ in range(3)]
    assert outcomes[-1] == Outcome.PROMOTE


@pytest.mark.parametrize(
    ("stable", "why"),
    [
        (None, "the stable ran no probe"),
        (probe(0.8, prompt_set="other"), "the stable ran another prompt set"),
        (probe(0.8, complete=False), "the stable's probe was incomplete"),
    ],
)
def test_a_probe_that_cannot_be_compared_opens_the_gate_and_live_traffic_decides(
    stable: ProbeFigures | None, why: str
) -> None:
    run = Run(probe_configured=True)
    probes = {"canary": probe(0.75)} | ({"stable": stable} if stable else {})
    judged = run.step(canary=view(ready=False), probes=probes)
    assert judged.open_gate
    assert judged.verdict is not None
    assert why in judged.verdict.message
    assert judged.state is not None
    assert judged.state.judged_at is None


def test_the_probe_fails_a_drop_below_the_stable_on_the_same_prompts_and_errors() -> None:
    run = Run(probe_configured=True)
    dropped = run.step(
        canary=view(ready=False), probes={"canary": probe(0.65), "stable": probe(0.9)}
    )
    assert dropped.outcome == Outcome.ROLLBACK
    assert dropped.verdict is not None
    assert "0.25 below the stable's 0.90 on the same prompts" in (dropped.verdict.message)
    run = Run(probe_configured=True)
    failing = probe(0.8, errors=4)
    erred = run.step(canary=view(ready=False), probes={"canary": failing, "stable": probe(0.8)})
    assert erred.outcome == Outcome.ROLLBACK
    assert erred.verdict is not None
    assert "errors on 50% of the probe's 8 requests" in erred.verdict.message


def test_the_probe_compares_another_k_on_the_positions_both_draft() -> None:
    # The same draft, k=1 beside k=6: its rate is lower by 0.2, its first position as good.
    k1 = probe(0.88, acceptance_per_position=[0.88])
    k6 = probe(0.68, acceptance_per_position=[0.88, 0.80, 0.72, 0.64, 0.56, 0.48])
    longer = Run(probe_configured=True).step(
        canary=view(ready=False), probes={"canary": k6, "stable": k1}
    )
    assert longer.open_gate
    assert longer.verdict is not None
    assert longer.verdict.message == (
        "probe: acceptance 0.68 on the probe's 8 prompts; 0.88 over the first position (the "
        "canary drafts 6, the stable 1) against the stable's 0.88 on the same prompts"
    )
    # A worse draft at k=3 fails on the first position still.
    worse = probe(0.62, acceptance_per_position=[0.70, 0.62, 0.54])
    dropped = Run(probe_configured=True).step(
        canary=view(ready=False), probes={"canary": worse, "stable": k1}
    )
    assert dropped.outcome == Outcome.ROLLBACK
    assert dropped.verdict is not None
    assert (
        "acceptance 0.70 over the first position (the canary drafts 3, the stable 1) is 0.18 "
        "below the stable's 0.88 on the same prompts" in dropped.verdict.message
    )


def test_a_long_draft_passes_the_probe_s_floor_on_its_first_position() -> None:
    # k=3 at 0.7 a token beside the target alone: an acceptance rate of 0.51, under the 0.6
    # floor, for 2.53 tokens a step; its first position reads 0.70.
    long = probe(0.511, acceptance_per_position=[0.7, 0.49, 0.343])
    passed = Run(probe_configured=True).step(
        canary=view(ready=False), probes={"canary": long, "stable": probe(None)}
    )
    assert passed.open_gate
    assert passed.outcome != Outcome.ROLLBACK
    # Its first position under the floor rolls it back before any request reaches it.
    short = probe(0.45, acceptance_per_position=[0.55, 0.45, 0.35])
    failed = Run(probe_configured=True).step(
        canary=view(ready=False), probes={"canary": short, "stable": probe(None)}
    )
    assert failed.outcome == Outcome.ROLLBACK
    assert failed.verdict is not None
    assert "first-position acceptance 0.55 < 0.60" in failed.verdict.message


def test_a_person_aborts_promotes_skips_the_probe_or_pauses() -> None:
    aborted = Run().step(requests=PersonRequests(abort="canary"))
    assert aborted.outcome == Outcome.ROLLBACK
    assert aborted.state is not None
    assert aborted.state.reason == EndReason.ABORTED
    promoted = Run().step(requests=PersonRequests(promote="canary"))
    assert promoted.outcome == Outcome.PROMOTE
    assert promoted.open_gate
    # A request for another revision (an earlier canary) is not for this one.
    assert Run().step(requests=PersonRequests(abort="earlier")).outcome == Outcome.CONTINUE

    run = Run(probe_configured=True)
    probed = view(ready=False)
    assert not run.step(canary=probed).open_gate
    skipped = run.step(canary=probed, requests=PersonRequests(promote="canary/probe"))
    assert skipped.open_gate
    assert skipped.state is not None
    assert skipped.state.stage == Stage.LIVE

    run = Run(deadline=30)
    run.step()
    pause = PersonRequests(pause="canary")
    paused = [run.step(10, requests=pause) for _ in range(5)]
    assert all(p.verdict is None and p.outcome == Outcome.HOLD for p in paused)
    assert run.state is not None
    assert run.state.paused
    assert run.state.last_interval == -1
    # Resumed: judged again from the interval that closes next, no deadline counted meanwhile.
    resumed = run.step(10)
    assert resumed.verdict is not None
    assert resumed.outcome == Outcome.CONTINUE
    assert run.state is not None
    assert not run.state.paused


def test_the_operator_wakes_for_a_canary_s_deadline_and_polls_for_its_probe() -> None:
    def decision(state: AnalysisStatus | None, canary: str | None = "canary") -> CanaryDecision:
        return CanaryDecision(
            recorded_stable="stable",
            stable="stable",
            canary=canary,
            canary_replicas=1,
            judgement=CanaryJudgement(state=state),
            held=frozenset(),
            since="2026-11-26T08:00:00Z",
            desired="canary",
        )

    starting = AnalysisStatus(
        revision="canary", started_at="2026-11-26T08:00:00Z", stage="Starting"
    )
    deadline, poll = wake_moments(decision(starting), 600, START)
    assert deadline == START + timedelta(seconds=600) + DEADLINE_MARGIN
    assert poll is None
    probing = starting.model_copy(update={"stage": Stage.PROBE})
    _, poll = wake_moments(decision(probing), 600, START)
    assert poll == START + PROBE_POLL
    judged = starting.model_copy(update={"stage": Stage.LIVE, "judged_at": "2026-11-26T08:01:00Z"})
    assert wake_moments(decision(judged), 600, START) == (None, None)
    # A plain new revision (no canary) beside the stable: its deadline too.
    plain, _ = wake_moments(decision(None, canary=None), 600, START)
    assert plain == START + timedelta(seconds=600) + DEADLINE_MARGIN


def test_a_revision_asked_for_again_is_judged_afresh_not_by_its_old_promotion() -> None:
    old = AnalysisStatus(
        revision="canary",
        started_at="2026-11-26T07:00:00Z",
        stage=Stage.LIVE,
        outcome="Promote",
        reason="Analysis",
    )
    run = Run()
    run.state = old
    again = run.step(canary=view(ready=False, containers_ready=False, since=START))
    assert again.outcome is None
    assert again.state is not None
    assert (again.state.stage, again.state.outcome) == (Stage.STARTING, "Continue")
    # The analysis of this turn, once final, stands.
    run = Run()
    run.state = old.model_copy(update={"started_at": "2026-11-26T08:00:00Z"})
    assert run.step().outcome == Outcome.PROMOTE
