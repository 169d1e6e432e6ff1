"""The simulator's engine: continuous batching in discrete steps, timed as a GPU would take them.

`SimEngine.plan_step()` schedules one step from the running and waiting requests as vLLM v1's
scheduler does (running requests first, each decoding one token plus its draft tokens; then
waiting ones admitted up to `max_num_seqs`, the step's token budget and the KV cache, their
prompts prefilled in chunks), `step_seconds(plan)` says how long it takes on the profile's GPU,
and `finish_step(plan, now)` applies its outcome: tokens emitted, drafts accepted by position,
first tokens, finished requests, and every metric vLLM would record for it. Nothing here sleeps
or reads a clock: `run_forever` (asyncio, real time) does, so the step logic is tested on its
own with a clock of the test's choosing. Deterministic for a seed.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from specdeploy.sim.metrics import EngineMetrics
from specdeploy.sim.profiles import DraftProfile, Faults, TargetProfile

BLOCK_TOKENS = 16
#: The words the simulator's tokens are drawn from (one word, with its space, a token).
WORDS = [
    "the",
    "a",
    "model",
    "serves",
    "tokens",
    "fast",
    "and",
    "every",
    "draft",
    "guesses",
    "what",
    "target",
    "says",
    "next",
    "while",
    "queue",
    "waits",
    "for",
    "batch",
    "step",
    "on",
    "GPU",
    "memory",
    "reads",
    "weights",
    "once",
    "per",
    "pass",
    "then",
    "writes",
    "cache",
    "of",
    "keys",
    "values",
    "blocks",
    "page",
    "prompt",
    "answer",
    "stream",
    "request",
    "ends",
    "length",
    "stop",
]


def count_tokens(text: str) -> int:
    """The tokens a prompt takes: a word, a run of punctuation, each one; at least one."""
    count = 0
    in_word = False
    for ch in text:
        if ch.isalnum():
            if not in_word:
                count += 1
                in_word = True
        else:
            in_word = False
            if not ch.isspace():
                count += 1
    return max(1, count)


def stable_hash(*parts: object) -> int:
    """A 64-bit number from the parts, the same in every process (Python's hash() is not)."""
    raw = "\0".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.sha256(raw).digest()[:8], "big")


def prompt_scale(prompt: str, spread: float) -> float:
    """How much better or worse than the profile a draft predicts this prompt: a factor in
    [1 - spread, 1 + spread] drawn from the prompt's text, the same on every engine."""
    unit = (stable_hash("prompt", prompt) % 10_000) / 10_000.0
    return 1.0 + spread * (2.0 * unit - 1.0)


@dataclass
class SimRequest:
    """One request in the engine, with what has happened to it so far (times in seconds)."""

    request_id: str
    prompt: str
    prompt_tokens: int
    max_tokens: int
    arrival: float
    #: Greedy (temperature 0) requests draw every choice from the prompt alone, so the same
    #: prompt gets the same text and the same acceptance on every revision of one draft.
    seed: int
    stop: tuple[str, ...] = ()
    n: int = 1
    #: Not scheduled before this time (a slower first token: Faults.first_token_extra_ms).
    not_before: float = 0.0
    prefilled: int = 0
    output: list[str] = field(default_factory=list)
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    finished_reason: str | None = None
    preemptions: int = 0
    #: Called with the new text and the finish reason (None until finished) after each step.
    on_output: Callable[[str, str | None], None] | None = None
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + len(self.output)


@dataclass(frozen=True)
class PlannedStep:
    """What one step runs: requests decoding (with k draft tokens each) and prefill chunks."""

    decode: tuple[SimRequest, ...]
    prefill: tuple[tuple[SimRequest, int], ...]
    k: int

    @property
    def scheduled(self) -> int:
        return len(self.decode) + len(self.prefill)

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill


@dataclass
class SpeculationSchedule:
    """k by running batch size: `ranges` is vLLM's num_speculative_tokens_per_batch_size
    ([low, high, k], from 1), else `k` for every batch size; 0 means no speculation."""

    k: int = 0
    ranges: Sequence[Sequence[int]] = ()

    def tokens_for(self, batch: int) -> int:
        for low, high, tokens in self.ranges:
            if low <= batch <= high:
                return int(tokens)
        return 0 if self.ranges else self.k

    @property
    def largest(self) -> int:
        return max([self.k, *(int(r[2]) for r in self.ranges)])


class SimEngine:
    """One engine: the profile pair, its queues, its KV cache and its metrics."""

    def __init__(
        self,
        target: TargetProfile,
        draft: DraftProfile | None,
        schedule: SpeculationSchedule,
        metrics: EngineMetrics,
        *,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        max_model_len: int = 8192,
        seed: int = 0,
        started_at: float = 0.0,
    ) -> None:
        self.target = target
        self.draft = draft if schedule.largest > 0 else None
        self.schedule = schedule if self.draft is not None else SpeculationSchedule()
        self.metrics = metrics
        self.max_num_seqs = max_num_seqs or target.max_num_seqs
        self.token_budget = max_num_batched_tokens or target.max_num_batched_tokens
        self.max_model_len = max_model_len
        self.seed = seed
        self.started_at = started_at
        self.faults: Faults = target.faults.merged(draft.faults if draft else Faults())
        self.kv_blocks = max(1, target.kv_tokens // BLOCK_TOKENS)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.admitted = 0
        self.steps = 0
        self._wake = asyncio.Event()

    # --- requests ---------------------------------------------------------------------------

    def request_seed(self, prompt: str, greedy: bool, counter: int) -> int:
        return stable_hash(self.seed, prompt, "greedy" if greedy else counter)

    def add(self, request: SimRequest) -> None:
        self.waiting.append(request)
        self.metrics.set_queues(len(self.running), len(self.waiting))
        self._wake.set()

    def abort(self, request: SimRequest, now: float) -> None:
        """The client went away: the request ends as `abort`, counted as vLLM counts it."""
        if request.finished:
            return
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self._finish(request, "abort", now)
        self.metrics.set_queues(len(self.running), len(self.waiting))
        self.metrics.set_kv_usage(self._used_blocks() / self.kv_blocks)

    # --- one step ---------------------------------------------------------------------------

    def _blocks(self, tokens: int) -> int:
        return math.ceil(tokens / BLOCK_TOKENS)

    def _used_blocks(self) -> int:
        return sum(self._blocks(r.context_tokens + self.schedule.largest) for r in self.running)

    def plan_step(self, now: float) -> PlannedStep:
        """The next step: every running request, then waiting ones while they fit."""
        budget = self.token_budget
        decode: list[SimRequest] = []
        prefill: list[tuple[SimRequest, int]] = []
        # A batch's k is chosen from the requests it schedules (prefills too, as vLLM does).
        k_guess = self.schedule.tokens_for(max(1, len(self.running)))
        self._preempt_to_fit()
        for request in self.running:
            if request.prefilled < request.prompt_tokens:
                chunk = min(budget, request.prompt_tokens - request.prefilled)
                if chunk > 0:
                    prefill.append((request, chunk))
                    budget -= chunk
            elif budget >= 1 + k_guess:
                decode.append(request)
                budget -= 1 + k_guess
        free = self.kv_blocks - self._used_blocks()
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            candidate = self.waiting[0]
            if candidate.not_before > now:
                break
            need = self._blocks(candidate.prompt_tokens + 1 + self.schedule.largest)
            if need > free:
                break
            self.waiting.popleft()
            self.running.append(candidate)
            free -= need
            if candidate.scheduled_at is None:
                candidate.scheduled_at = now
            self.admitted += 1
            chunk = min(budget, candidate.prompt_tokens - candidate.prefilled)
            prefill.append((candidate, chunk))
            budget -= chunk
        k = self.schedule.tokens_for(len(decode) + len(prefill)) if decode or prefill else 0
        return PlannedStep(tuple(decode), tuple(prefill), k)

    def _preempt_to_fit(self) -> None:
        """Free KV blocks by sending the newest running requests back to wait (recompute)."""
        while self.running and self._used_blocks() > self.kv_blocks:
            victim = self.running.pop()
            victim.prefilled = 0
            victim.preemptions += 1
            self.waiting.appendleft(victim)
            self.metrics.preempted()

    def step_seconds(self, plan: PlannedStep) -> float:
        """How long the step takes on the profile's GPU."""
        if plan.empty:
            return 0.0
        target = self.target
        decode_tokens = len(plan.decode) * (1 + plan.k)
        prefill_tokens = sum(chunk for _, chunk in plan.prefill)
        ms = target.step_ms + target.step_ms_per_token * max(0, decode_tokens - 1)
        ms += 1000.0 * prefill_tokens / target.prefill_tokens_per_s
        if self.draft is not None and plan.k > 0:
            drafting = len(plan.decode) + len(plan.prefill)
            if self.draft.draft_saturation is not None:
                drafting = min(drafting, self.draft.draft_saturation)
            ms += plan.k * (self.draft.draft_ms + self.draft.draft_ms_per_seq * drafting)
        return ms / 1000.0

    def _acceptance_scale(self, request: SimRequest, now: float) -> float:
        assert self.draft is not None
        scale = prompt_scale(request.prompt, self.draft.prompt_spread)
        drift_at = self.faults.drift_after_s
        if drift_at is not None and now - self.started_at >= drift_at:
            scale *= self.faults.drift_factor
        return scale

    def _next_word(self, request: SimRequest) -> str:
        return " " + WORDS[request.rng.randrange(len(WORDS))]

    def finish_step(self, plan: PlannedStep, now: float) -> None:
        """Apply a step that ran until `now`: tokens, acceptance, first tokens, finishes."""
        self.steps += 1
        new_text: dict[int, list[str]] = {}
        generated = 0
        for request in plan.decode:
            if request.finished or request not in self.running:
                continue
            accepted = 0
            if self.draft is not None and plan.k > 0:
                scale = self._acceptance_scale(request, now)
                while accepted < plan.k and request.rng.random() < self.draft.accept_chance(
                    accepted, scale
                ):
                    accepted += 1
                self.metrics.drafted(plan.k, accepted)
            room = request.max_tokens - len(request.output)
            emitted = min(accepted + 1, room, self.max_model_len - request.context_tokens)
            words = [self._next_word(request) for _ in range(max(0, emitted))]
            request.output.extend(words)
            new_text.setdefault(id(request), []).extend(words)
            generated += len(words)
            if words and request.last_token_at is not None:
                self.metrics.inter_token(now - request.last_token_at)
            request.last_token_at = now
        first_prompts = 0
        for request, chunk in plan.prefill:
            if request.finished or request not in self.running:
                continue
            request.prefilled += chunk
            if request.prefilled < request.prompt_tokens:
                continue
            word = self._next_word(request)
            request.output.append(word)
            new_text.setdefault(id(request), []).append(word)
            generated += 1
            if request.first_token_at is None:
                request.first_token_at = now
                first_prompts += request.prompt_tokens
                self.metrics.first_token(now - request.arrival, request.prompt_tokens)
            elif request.last_token_at is not None:
                # A preempted request recomputed: its next token is an output of this step,
                # and its inter-token latency spans the whole stall, as vLLM records it.
                self.metrics.inter_token(now - request.last_token_at)
            request.last_token_at = now
        # vLLM observes a step's tokens only for steps with an output: the prompts of the
        # requests that got their first token, and every token emitted.
        self.metrics.iteration(first_prompts, generated)
        for request in list(self.running):
            reason = self._finish_reason(request, now)
            if reason is not None:
                self.running.remove(request)
                self._finish(request, reason, now, "".join(new_text.pop(id(request), [])))
        for request in self.running:
            text = "".join(new_text.pop(id(request), []))
            if text and request.on_output is not None:
                request.on_output(text, None)
        self.metrics.set_queues(len(self.running), len(self.waiting))
        self.metrics.set_kv_usage(self._used_blocks() / self.kv_blocks)

    def _finish_reason(self, request: SimRequest, now: float) -> str | None:
        if not request.output:
            return None
        if request.stop and any(s in "".join(request.output) for s in request.stop):
            return "stop"
        if len(request.output) >= request.max_tokens:
            return "length"
        if request.context_tokens >= self.max_model_len:
            return "length"
        rate = self.faults.engine_error_rate
        if rate > 0 and stable_hash("error", request.request_id) % 10_000 < rate * 10_000:
            return "error"
        return None

    def _finish(self, request: SimRequest, reason: str, now: float, text: str = "") -> None:
        request.finished_reason = reason
        request.finished_at = now
        self.metrics.finished(request)
        if request.on_output is not None:
            request.on_output(text, reason)

    # --- real time --------------------------------------------------------------------------

    async def run_forever(self, clock: Callable[[], float]) -> None:
        """Step for as long as there is work, sleeping each step's length in real time."""
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
            now = clock()
            plan = self.plan_step(now)
            if plan.empty:
                # Waiting requests that may not start yet (a slow first token) or that do not
                # fit: look again shortly.
                await asyncio.sleep(0.001)
                continue
            await asyncio.sleep(self.step_seconds(plan))
            self.finish_step(plan, clock())
