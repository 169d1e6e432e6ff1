"""The simulator's engine, stepped by hand with a clock of the test's choosing."""

from __future__ import annotations

import statistics

import pytest

from specdeploy.sim.engine import SimEngine, SimRequest, SpeculationSchedule, count_tokens
from specdeploy.sim.metrics import EngineMetrics
from specdeploy.sim.profiles import Catalog, DraftProfile, Faults, load_catalog

TARGET = "sim/llama-3.1-70b-h100"
GOOD = "sim/eagle3-good"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def engine(
    catalog: Catalog,
    draft: str | None = GOOD,
    k: int = 3,
    ranges: tuple[tuple[int, int, int], ...] = (),
    **options: object,
) -> SimEngine:
    schedule = SpeculationSchedule(k, [list(r) for r in ranges]) if draft else SpeculationSchedule()
    metrics = EngineMetrics("m", 8192, schedule.largest if draft else 0)
    return SimEngine(
        catalog.target(TARGET),
        catalog.draft(draft) if draft else None,
        schedule,
        metrics,
        **options,  # type: ignore[arg-type]
    )


def request(eng: SimEngine, prompt: str, max_tokens: int = 32, at: float = 0.0) -> SimRequest:
    req = SimRequest(
        request_id=f"r-{prompt}-{at}",
        prompt=prompt,
        prompt_tokens=count_tokens(prompt),
        max_tokens=max_tokens,
        arrival=at,
        seed=eng.request_seed(prompt, greedy=True, counter=0),
    )
    eng.add(req)
    return req


def run(eng: SimEngine, now: float = 0.0, until_idle: int = 10_000) -> float:
    """Steps until nothing runs or waits; returns the clock after the last step."""
    for _ in range(until_idle):
        if not eng.running and not eng.waiting:
            return now
        plan = eng.plan_step(now)
        now += eng.step_seconds(plan) or 0.001
        eng.finish_step(plan, now)
    raise AssertionError("the engine never went idle")


def sample(eng: SimEngine, name: str, **labels: str) -> float:
    value = eng.metrics.registry.get_sample_value(
        name, {"model_name": "m", "engine": "0", **labels}
    )
    return float(value or 0.0)


def test_the_same_prompt_gets_the_same_text_and_acceptance_on_any_engine(catalog: Catalog) -> None:
    first, second = engine(catalog), engine(catalog)
    a, b = request(first, "The cat sat on the"), request(second, "The cat sat on the")
    run(first)
    run(second)
    assert a.output == b.output
    assert len(a.output) == 32
    for name in ("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_drafts_total"):
        assert sample(first, name) == sample(second, name)


def test_inter_token_latency_is_one_observation_per_step_whatever_it_emitted(
    catalog: Catalog,
) -> None:
    eng = engine(catalog)
    req = request(eng, "one prompt", max_tokens=64)
    run(eng)
    steps = sample(eng, "vllm:inter_token_latency_seconds_count")
    drafts = sample(eng, "vllm:spec_decode_num_drafts_total")
    accepted = sample(eng, "vllm:spec_decode_num_accepted_tokens_total")
    generated = sample(eng, "vllm:generation_tokens_total")
    assert steps == drafts  # k > 0 on every decode step
    assert sample(eng, "vllm:time_to_first_token_seconds_count") == 1
    assert generated == len(req.output) == 64
    # The first token, then each step's bonus token and its accepted drafts (the last step cut
    # short by max_tokens).
    assert 1 + steps <= generated <= 1 + steps + accepted
    assert sample(eng, "vllm:spec_decode_num_draft_tokens_total") == 3 * drafts
    # Each observation is the step's length: 20 ms, 3 verified tokens more, 3 draft tokens
    # for one sequence.
    step = 0.020 + 3 * 0.00003 + 3 * (0.0018 + 0.00055)
    mean = sample(eng, "vllm:inter_token_latency_seconds_sum") / steps
    assert mean == pytest.approx(step, rel=1e-6)


def test_acceptance_by_position_follows_the_profile(catalog: Catalog) -> None:
    eng = engine(catalog, k=3)
    prompts = [f"prompt number {i} about serving" for i in range(60)]
    for prompt in prompts:
        request(eng, prompt, max_tokens=64)
    run(eng)
    drafts = sample(eng, "vllm:spec_decode_num_drafts_total")
    per_pos = [
        sample(eng, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(p))
        for p in range(3)
    ]
    draft = catalog.draft(GOOD)
    expected, alive = [], 1.0
    for p in range(3):
        alive *= draft.accept_chance(p)
        expected.append(alive)
    observed = [count / drafts for count in per_pos]
    assert observed == pytest.approx(expected, abs=0.04)
    assert per_pos == sorted(per_pos, reverse=True)


def test_a_batch_schedule_turns_speculation_off_above_its_range(catalog: Catalog) -> None:
    # k=3 up to 4 requests a step, off from 5 on (vLLM's [lo, hi, k], k=0 off).
    eng = engine(catalog, k=3, ranges=((1, 4, 3), (5, 256, 0)))
    for i in range(8):
        request(eng, f"busy prompt {i}", max_tokens=16)
    run(eng)
    assert sample(eng, "vllm:spec_decode_num_drafts_total") < sample(
        eng, "vllm:inter_token_latency_seconds_count"
    )
    alone = engine(catalog, k=3, ranges=((1, 4, 3), (5, 256, 0)))
    request(alone, "alone", max_tokens=16)
    run(alone)
    assert sample(alone, "vllm:spec_decode_num_drafts_total") == sample(
        alone, "vllm:inter_token_latency_seconds_count"
    )


def test_a_good_draft_is_faster_per_token_than_the_target_alone_at_batch_one(
    catalog: Catalog,
) -> None:
    timings = {}
    for draft in (None, GOOD, "sim/draft-heavy"):
        eng = engine(catalog, draft=draft)
        request(eng, "a long answer please", max_tokens=256)
        timings[draft] = run(eng)
    assert timings[GOOD] < timings[None] / 1.6
    assert timings[GOOD] < timings["sim/draft-heavy"] < timings[None]


def test_max_num_seqs_bounds_the_batch_and_the_rest_wait(catalog: Catalog) -> None:
    eng = engine(catalog, draft=None, max_num_seqs=4)
    for i in range(10):
        request(eng, f"prompt {i}", max_tokens=8)
    plan = eng.plan_step(0.0)
    assert plan.scheduled == 4
    assert len(eng.waiting) == 6
    eng.finish_step(plan, eng.step_seconds(plan))
    assert sample(eng, "vllm:num_requests_waiting") == 6
    assert sample(eng, "vllm:num_requests_running") == 4


def test_a_full_kv_cache_preempts_the_newest_request(catalog: Catalog) -> None:
    eng = engine(catalog, draft=None)
    eng.kv_blocks = 6  # 96 tokens
    first = request(eng, "x " * 30, max_tokens=60)
    second = request(eng, "y " * 30, max_tokens=60)
    run(eng)
    assert first.finished_reason == second.finished_reason == "length"
    assert sample(eng, "vllm:num_preemptions_total") >= 1
    assert second.preemptions >= 1
    assert first.preemptions == 0


def test_a_preempted_request_resumes_with_one_token_whose_latency_spans_the_stall(
    catalog: Catalog,
) -> None:
    eng = engine(catalog, draft=None)
    eng.kv_blocks = 6  # 96 tokens: the second request is preempted once the first grows
    request(eng, "x " * 30, max_tokens=60)
    second = request(eng, "y " * 30, max_tokens=60)
    run(eng)
    assert second.preemptions >= 1
    # Without speculation every output is one token: the first, then one per observation,
    # the resumed request's recomputed step included.
    generated = sample(eng, "vllm:generation_tokens_total")
    first_tokens = sample(eng, "vllm:time_to_first_token_seconds_count")
    assert generated == first_tokens + sample(eng, "vllm:inter_token_latency_seconds_count")
    buckets = eng.metrics.registry.get_sample_value(
        "vllm:inter_token_latency_seconds_bucket", {"model_name": "m", "engine": "0", "le": "0.025"}
    )
    steps = sample(eng, "vllm:inter_token_latency_seconds_count")
    assert buckets is not None
    assert buckets < steps, "the stall is one latency longer than any step"


def test_a_step_without_an_output_is_not_an_iteration(catalog: Catalog) -> None:
    eng = engine(catalog, draft=None, max_num_batched_tokens=100)
    request(eng, "word " * 250, max_tokens=2)
    run(eng)
    # Three prefill chunks (the last emits the first token), then one decode step.
    assert sample(eng, "vllm:iteration_tokens_total_count") == 2
    assert sample(eng, "vllm:iteration_tokens_total_sum") == 250 + 1 + 1


def test_chunked_prefill_splits_a_long_prompt_over_steps(catalog: Catalog) -> None:
    eng = engine(catalog, draft=None, max_num_batched_tokens=100)
    req = request(eng, "word " * 250, max_tokens=4)
    plans = []
    now = 0.0
    while req.first_token_at is None:
        plan = eng.plan_step(now)
        plans.append(plan)
        now += eng.step_seconds(plan)
        eng.finish_step(plan, now)
    assert [chunk for p in plans for _, chunk in p.prefill] == [100, 100, 50]
    assert sample(eng, "vllm:time_to_first_token_seconds_sum") == pytest.approx(now)


def test_acceptance_drifts_after_the_profiles_time(catalog: Catalog) -> None:
    eng = engine(catalog, draft="sim/eagle3-drifting")
    request(eng, "before the drift", max_tokens=128)
    end = run(eng, now=0.0)
    before = sample(eng, "vllm:spec_decode_num_accepted_tokens_total") / sample(
        eng, "vllm:spec_decode_num_draft_tokens_total"
    )
    drifting = catalog.draft("sim/eagle3-drifting")
    assert end < (drifting.faults.drift_after_s or 0)
    late = engine(catalog, draft="sim/eagle3-drifting")
    request(late, "before the drift", max_tokens=128, at=61.0)
    run(late, now=61.0)
    after = sample(late, "vllm:spec_decode_num_accepted_tokens_total") / sample(
        late, "vllm:spec_decode_num_draft_tokens_total"
    )
    assert after < before / 2


def test_an_aborted_request_counts_its_first_token_and_not_its_end(catalog: Catalog) -> None:
    eng = engine(catalog)
    req = request(eng, "abandoned", max_tokens=100)
    plan = eng.plan_step(0.0)
    eng.finish_step(plan, 0.05)
    eng.abort(req, 0.06)
    assert req.finished_reason == "abort"
    assert sample(eng, "vllm:time_to_first_token_seconds_count") == 1
    assert sample(eng, "vllm:request_success_total", finished_reason="abort") == 0
    assert sample(eng, "vllm:e2e_request_latency_seconds_count") == 0
    assert not eng.running


def test_tokens_per_step_is_one_plus_the_cumulative_acceptance() -> None:
    draft = DraftProfile("sim/x", "eagle3", {}, (0.7,), 1.0, 0.0, faults=Faults())
    # k=3 at a per-token 0.7: 1 + 0.7 + 0.49 + 0.343 = 2.533 tokens a step, while the
    # acceptance rate (accepted / draft tokens) reads 0.511.
    assert draft.tokens_per_step(3) == pytest.approx(2.533)
    assert (draft.tokens_per_step(3) - 1) / 3 == pytest.approx(0.511, abs=1e-3)


def test_engine_error_rate_finishes_that_share_with_error(catalog: Catalog) -> None:
    eng = engine(catalog, draft=None)
    eng.faults = Faults(engine_error_rate=0.5)
    requests = [request(eng, f"p{i}", max_tokens=4) for i in range(200)]
    run(eng)
    errors = sum(r.finished_reason == "error" for r in requests)
    assert 70 < errors < 130
    assert sample(eng, "vllm:request_success_total", finished_reason="error") == errors
    assert statistics.mean(len(r.output) for r in requests) <= 4
