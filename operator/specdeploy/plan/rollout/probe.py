"""The probe's figures and its verdict, as pure functions (spec.rollout.analysis.probe).

Every pod of a revision with a probe sends the same prompts to its own vLLM before it serves
(engine/probe.py) and exports what vLLM counted over them as `specdeploy_probe_*` gauges; the
operator sums them over the revision's pods. With a stable revision beside, the canary's pods
are held out of the Service by a readiness gate until the judge compared the two revisions on
those identical prompts:

- Fail (rolled back at once, before any user request reached the canary): first-position
  acceptance (the share of drafts whose first token was accepted) below `minAcceptanceRate`;
  acceptance more than `maxDropVsStable` below a stable with a draft that ran the same prompt
  set; or a share of errors more than `maxErrorRateIncrease` above the stable's. Under greedy
  sampling (temperature 0, the default) each revision's answer to a prompt is deterministic and
  a draft never changes it, so the same probe gives the same acceptance every time: one verdict
  is enough, and repeating it could not change it.
- Inconclusive: the stable ran no probe, another prompt set, or an incomplete one (its timeout
  ran out); the canary's own probe incomplete. The gate opens and live traffic decides, as
  without a probe.
- Pass: the gate opens; live traffic is judged every interval after, with each revision's
  tokens per step taken from the probe (identical prompts) and its step time from the window.

Latency is not judged on the probe: the stable's pods ran theirs when they started, maybe days
ago on other nodes; the live windows measure both revisions at the same moments.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specdeploy.api import labels
from specdeploy.api.config import AnalysisSettings
from specdeploy.api.models import ProbeFigures
from specdeploy.api.times import parse_time
from specdeploy.plan.rollout.analysis import (
    IntervalVerdict,
    ProbeTokens,
    Result,
    acceptance_compared,
    first_position_acceptance,
)
from specdeploy.plan.rollout.revisions import live_revision_of, pod_conditions


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


@dataclass(frozen=True)
class ProbeResult:
    """What a revision's pods measured on the probe, summed over the pods (each pod ran it)."""

    prompt_set: str
    pods: int = 0
    #: Pods whose probe ran every prompt (the others ran out of time).
    complete_pods: int = 0
    prompts: int = 0
    requests: float = 0.0
    errors: float = 0.0
    output_tokens: float = 0.0
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    accepted_per_position: tuple[float, ...] = field(default_factory=tuple)
    decode_seconds: float = 0.0
    decode_steps: float = 0.0
    first_token_seconds: float = 0.0
    first_tokens: float = 0.0
    #: Set when Prometheus could not be asked.
    error: str | None = None

    @property
    def complete(self) -> bool:
        return self.pods > 0 and self.complete_pods == self.pods

    @property
    def acceptance_rate(self) -> float | None:
        return _ratio(self.accepted_tokens, self.draft_tokens)

    @property
    def mean_acceptance_length(self) -> float | None:
        found = _ratio(self.accepted_tokens, self.drafts)
        return None if found is None else 1 + found

    @property
    def decode_tokens(self) -> float:
        return max(0.0, self.output_tokens - self.first_tokens)

    @property
    def tokens_per_step(self) -> float | None:
        return _ratio(self.decode_tokens, self.decode_steps)

    @property
    def time_per_output_token(self) -> float | None:
        return _ratio(self.decode_seconds, self.decode_tokens)

    @property
    def time_to_first_token(self) -> float | None:
        return _ratio(self.first_token_seconds, self.first_tokens)

    @property
    def error_rate(self) -> float | None:
        return _ratio(self.errors, self.requests)


def probe_record(result: ProbeResult, now: str) -> ProbeFigures:
    """The figures as status.revisions[].probe keeps them."""

    def rounded(value: float | None, digits: int = 4) -> float | None:
        return None if value is None else round(value, digits)

    per_position = [
        round(a / result.drafts, 4) if result.drafts else 0.0 for a in result.accepted_per_position
    ]
    tpot = result.time_per_output_token
    per_step = result.tokens_per_step
    return ProbeFigures(
        prompt_set=result.prompt_set,
        prompts=result.prompts,
        pods=result.pods,
        complete=result.complete,
        requests=int(result.requests),
        errors=int(result.errors),
        output_tokens=int(result.output_tokens),
        draft_tokens=int(result.draft_tokens),
        acceptance_rate=rounded(result.acceptance_rate, 3),
        mean_acceptance_length=rounded(result.mean_acceptance_length, 3),
        acceptance_per_position=per_position,
        tokens_per_step=rounded(per_step, 4),
        time_per_output_token_seconds=rounded(tpot, 5),
        time_to_first_token_seconds=rounded(result.time_to_first_token, 5),
        tokens_per_second=rounded(1 / tpot if tpot else None, 1),
        measured_at=now,
    )


def probe_tokens(canary: ProbeFigures | None, stable: ProbeFigures | None) -> ProbeTokens | None:
    """Each revision's tokens per step on the probe, when both ran the same complete probe."""
    if canary is None or stable is None or not comparable(canary, stable):
        return None
    mine, theirs = canary.tokens_per_step, stable.tokens_per_step
    if mine is None or theirs is None:
        return None
    return ProbeTokens(canary=mine, stable=theirs)


def comparable(canary: ProbeFigures, stable: ProbeFigures) -> bool:
    """Both probes are complete and ran the same prompts and settings."""
    return canary.complete and stable.complete and canary.prompt_set == stable.prompt_set


def _error_rate(figures: ProbeFigures) -> float:
    return figures.errors / figures.requests if figures.requests else 0.0


def judge_probe(
    canary: ProbeFigures,
    stable: ProbeFigures | None,
    *,
    canary_has_draft: bool,
    stable_has_draft: bool,
    criteria: AnalysisSettings,
) -> IntervalVerdict:
    """The canary's verdict on the probe, beside the stable's probe (None: it ran none)."""
    if not canary.complete:
        return IntervalVerdict(
            Result.INCONCLUSIVE,
            f"probe incomplete on some of its {canary.pods} pods (its timeout ran out): live "
            "traffic decides",
        )
    failures: list[str] = []
    figures: list[str] = []
    rate = canary.acceptance_rate
    first = first_position_acceptance(canary.acceptance_per_position, rate)
    on = f"the probe's {canary.prompts} prompts"
    if canary_has_draft:
        if rate is None or first is None:
            failures.append(f"no draft token proposed on {on}")
        elif first < criteria.min_acceptance_rate:
            failures.append(
                f"first-position acceptance {first:.2f} < {criteria.min_acceptance_rate:.2f} "
                f"on {on} ({canary.draft_tokens:,} draft tokens)"
            )
        else:
            figures.append(f"acceptance {rate:.2f} on {on}")
    same = stable is not None and comparable(canary, stable)
    theirs = _error_rate(stable) if stable is not None and same else 0.0
    mine = _error_rate(canary)
    if mine - theirs > criteria.max_error_rate_increase:
        failures.append(
            f"errors on {mine:.0%} of the probe's {canary.requests} requests vs the stable's "
            f"{theirs:.0%}"
        )
    if same and stable is not None and stable_has_draft and rate is not None:
        their_rate = stable.acceptance_rate
        if their_rate is not None:
            compared = acceptance_compared(
                rate, their_rate, canary.acceptance_per_position, stable.acceptance_per_position
            )
            over = compared.over
            drop = compared.theirs - compared.mine
            if drop > criteria.max_drop_vs_stable:
                failures.append(
                    f"acceptance {compared.mine:.2f}{over} is {drop:.2f} below the stable's "
                    f"{compared.theirs:.2f} on the same prompts "
                    f"(more than {criteria.max_drop_vs_stable:.2f})"
                )
            elif compared.positions is not None:
                figures.append(
                    f"{compared.mine:.2f}{over} against the stable's {compared.theirs:.2f} on "
                    "the same prompts"
                )
            else:
                figures.append(f"the stable's {their_rate:.2f} on the same prompts")
    if failures:
        return IntervalVerdict(Result.FAIL, "probe: " + "; ".join(failures))
    if not same:
        why = (
            "the stable ran no probe"
            if stable is None
            else "the stable ran another prompt set"
            if stable.prompt_set != canary.prompt_set
            else "the stable's probe was incomplete"
        )
        return IntervalVerdict(
            Result.INCONCLUSIVE,
            "probe: " + "; ".join([*figures, f"{why}: live traffic decides"]),
        )
    return IntervalVerdict(Result.PASS, "probe: " + "; ".join(figures or ["no errors"]))


def probe_figures(
    recorded: Mapping[str, ProbeFigures], measured: Mapping[str, ProbeResult], now: str
) -> dict[str, ProbeFigures]:
    """Each revision's probe: what status kept, else what Prometheus reports now. Kept figures
    win: a revision's pods all ran the same probe, and the first complete reading stands (its
    pods may stop exporting it, replaced or gone)."""
    found = dict(recorded)
    for revision, result in measured.items():
        kept = found.get(revision)
        if result.error is not None or result.pods == 0:
            continue
        if kept is None or (not kept.complete and result.complete):
            found[revision] = probe_record(result, now)
    return found


def containers_ready_pods(pods: Sequence[Mapping[str, Any]], revision: str) -> int:
    """Pods of `revision` whose containers are all ready: with a probe, their probe is over
    (its readiness gate may still hold them out of the Service)."""
    return sum(
        1
        for pod in pods
        if live_revision_of(pod) == revision
        and pod_conditions(pod).get("ContainersReady") == "True"
    )


def pods_ready_since(pods: Sequence[Mapping[str, Any]], revision: str) -> float | None:
    """When the last of `revision`'s Ready pods turned Ready (its Ready condition's
    lastTransitionTime, in seconds), None when none is Ready or one does not say when."""
    times: list[float] = []
    for pod in pods:
        if live_revision_of(pod) != revision:
            continue
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "Ready" and condition.get("status") == "True":
                stamp = condition.get("lastTransitionTime")
                if not isinstance(stamp, str):
                    return None
                try:
                    moment = parse_time(stamp)
                except ValueError:
                    return None
                times.append(moment.timestamp())
    return max(times, default=None)


def container_restarts(pods: Sequence[Mapping[str, Any]], revision: str) -> int:
    """The container restarts of `revision`'s pods (restartCount, summed over containers)."""
    return sum(
        int(status.get("restartCount") or 0)
        for pod in pods
        if live_revision_of(pod) == revision
        for status in (pod.get("status") or {}).get("containerStatuses") or []
    )


def gates_to_open(
    pods: Sequence[Mapping[str, Any]],
    *,
    gated: Collection[str],
    closed: Collection[str],
) -> tuple[str, ...]:
    """The pods whose probe gate the operator opens now: pods of a revision whose template has
    the gate (`gated`), but not of one whose probe is still to be judged or that is held
    (`closed`), and whose gate is not open yet. Names, sorted."""
    return tuple(
        sorted(
            str(pod["metadata"]["name"])
            for pod in pods
            if (revision := live_revision_of(pod)) in gated
            and revision not in closed
            and pod_conditions(pod).get(labels.PROBE_GATE) != "True"
        )
    )
