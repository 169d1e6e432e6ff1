"""The contract that holds the simulator to real vLLM: one scripted workload, the same checks.

`run_workload(url, model)` sends the same client calls to any server (greedy and sampled,
streaming and not, chat, an aborted stream, a prompt longer than the context, an unknown
model, bad fields) and records each answer's status and error shape, with the server's
/metrics before and after. `families(text)` reads a metrics page as {family: (type, label
names)}; `relation_failures(result, k)` lists the relations between counters that vLLM's
semantics promise and this run broke. e2e/test_sim_contract.py runs it against the real CPU
engine and the simulator and requires the same families, the same answers and no broken
relation on either.
"""

from __future__ import annotations

import functools
import itertools
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

#: Families the contract compares: vLLM's own, its API server's HTTP ones, and the process's.
COMPARED_PREFIXES = ("vllm:", "http_", "process_", "python_")
PROMPTS = ("The cat sat on the", "In the morning the queue", "A node sees")


@dataclass(frozen=True)
class Call:
    name: str
    path: str
    body: Mapping[str, Any] | str
    #: What reaches the engine: "complete" (finished by it), "abort" (started, then the
    #: client left), "none" (refused before the engine).
    engine: str = "complete"
    stream: bool = False
    #: For an aborted stream: the chunks read before the client hangs up.
    abort_after: int = 0


def workload(model: str, max_model_len: int) -> tuple[Call, ...]:
    """The scripted client calls, in order."""

    def completion(name: str, engine: str = "complete", **body: Any) -> Call:
        return _call(name, "/v1/completions", model, engine, body)

    def chat(name: str, **body: Any) -> Call:
        messages = [{"role": "user", "content": PROMPTS[0]}]
        return _call(
            name, "/v1/chat/completions", model, "complete", {"messages": messages, **body}
        )

    usage = {"include_usage": True}
    return (
        *(
            completion(f"greedy-{i}", prompt=p, max_tokens=24, temperature=0)
            for i, p in enumerate(PROMPTS)
        ),
        completion("sampled", prompt=PROMPTS[1], max_tokens=16, temperature=0.8, seed=7),
        completion(
            "stream",
            prompt=PROMPTS[2],
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options=usage,
        ),
        chat("chat", max_tokens=12, temperature=0),
        chat("chat-stream", max_tokens=12, temperature=0, stream=True),
        completion(
            "abort",
            "abort",
            prompt=PROMPTS[0],
            max_tokens=max_model_len // 2,
            temperature=0,
            ignore_eos=True,
            stream=True,
        ),
        completion("too-long", "none", prompt="a " * (max_model_len + 40), max_tokens=4),
        completion("too-many-characters", "none", prompt="x" * (10 * max_model_len), max_tokens=4),
        completion(
            "max-tokens-over-context", "none", prompt=PROMPTS[0], max_tokens=max_model_len + 1
        ),
        completion("max-tokens-zero", "none", prompt=PROMPTS[0], max_tokens=0),
        _call(
            "unknown-model",
            "/v1/completions",
            "no-such-model",
            "none",
            {"prompt": PROMPTS[0], "max_tokens": 4},
        ),
        Call("bad-json", "/v1/completions", "{not json", engine="none"),
    )


#: Chunks an aborted stream reads before its client hangs up.
ABORT_AFTER = 3


def _call(name: str, path: str, model: str, engine: str, body: dict[str, Any]) -> Call:
    stream = bool(body.get("stream"))
    abort_after = ABORT_AFTER if engine == "abort" else 0
    return Call(name, path, {"model": model, **body}, engine, stream, abort_after)


@dataclass
class Answer:
    status: int
    #: For an error: (sorted keys of the body's "error", its type, its param).
    error: tuple[tuple[str, ...], str, str | None] | None = None
    #: For a stream: the number of data events before [DONE], and whether [DONE] came.
    events: int = 0
    done: bool = False


@dataclass
class WorkloadResult:
    before: str
    after: str
    answers: dict[str, Answer] = field(default_factory=dict)
    calls: tuple[Call, ...] = ()


def _error_shape(body: Any) -> tuple[tuple[str, ...], str, str | None] | None:
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None
    param = error.get("param")
    return tuple(sorted(error)), str(error.get("type")), None if param is None else str(param)


def send(url: str, call: Call, timeout: float = 120) -> Answer:
    data = call.body if isinstance(call.body, str) else json.dumps(call.body)
    headers = {"Content-Type": "application/json"}
    with requests.post(
        url + call.path, data=data, headers=headers, stream=call.stream, timeout=timeout
    ) as response:
        if not call.stream or response.status_code != 200:
            try:
                body = response.json()
            except ValueError:
                body = None
            return Answer(response.status_code, _error_shape(body))
        answer = Answer(200)
        for line in response.iter_lines():
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                answer.done = True
                break
            answer.events += 1
            if call.abort_after and answer.events >= call.abort_after:
                break  # leaving the block closes the connection mid-stream
        return answer


def metrics_text(url: str) -> str:
    response = requests.get(url + "/metrics", timeout=30)
    response.raise_for_status()
    return response.text


def run_workload(url: str, model: str, max_model_len: int) -> WorkloadResult:
    """The workload against one server; the metrics page read before and after it."""
    calls = workload(model, max_model_len)
    result = WorkloadResult(before=metrics_text(url), after="", calls=calls)
    for call in calls:
        result.answers[call.name] = send(url, call)
    result.after = settled_metrics(url)
    return result


def settled_metrics(url: str, tries: int = 50) -> str:
    """The metrics page once no request runs (an aborted one is freed a step later)."""
    text = metrics_text(url)
    for _ in range(tries):
        running = sum(
            s.value
            for f in text_string_to_metric_families(text)
            if f.name == "vllm:num_requests_running"
            for s in f.samples
        )
        if running == 0:
            break
        time.sleep(0.1)
        text = metrics_text(url)
    return text


# --- reading a metrics page ---------------------------------------------------------------------

Families = dict[str, tuple[str, frozenset[str]]]
_SERIES_LABELS = frozenset({"le", "quantile"})


def families(text: str, prefixes: tuple[str, ...] = COMPARED_PREFIXES) -> Families:
    """{family name: (type, the label names its samples carry)} for the compared prefixes."""
    found: Families = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(prefixes):
            continue
        labels: set[str] = set()
        for sample in family.samples:
            labels.update(set(sample.labels) - _SERIES_LABELS)
        found[family.name] = (family.type, frozenset(labels))
    return found


@functools.lru_cache(maxsize=8)
def sample_values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the page: (sample name, sorted labels) → value; each page parsed once,
    however many deltas are read from it (callers do not change the dict)."""
    values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return values


def delta(result: WorkloadResult, name: str, **labels: str) -> float:
    """The increase of a sample (summed over the series matching `labels`) over the workload."""

    def total(text: str) -> float:
        return sum(
            value
            for (sample, series), value in sample_values(text).items()
            if sample == name and all((k, v) in series for k, v in labels.items())
        )

    return total(result.after) - total(result.before)


def per_position(result: WorkloadResult) -> list[float]:
    name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    positions = sorted(
        {
            int(dict(series)["position"])
            for (sample, series) in sample_values(result.after)
            if sample == name
        }
    )
    return [delta(result, name, position=str(p)) for p in positions]


def relation_failures(result: WorkloadResult, k: int) -> list[str]:
    """The relations vLLM's counters keep over a workload, each broken one said in words.

    With k draft tokens a step (0: no speculation): one inter-token latency per decode step of
    each request, so with speculation one draft per observation; generation tokens count each
    request's first token and every token a step emitted (1 + accepted, or fewer where
    max_tokens cut the step short); accepted <= draft tokens = k * drafts; per-position counts
    non-increasing and adding up to the accepted; one time to first token per request that
    reached the engine; request_success counts the ones it finished, not the aborted one."""
    failures: list[str] = []
    reached = [c for c in result.calls if c.engine != "none"]
    finished = [c for c in result.calls if c.engine == "complete"]
    first_tokens = delta(result, "vllm:time_to_first_token_seconds_count")
    steps = delta(result, "vllm:inter_token_latency_seconds_count")
    generated = delta(result, "vllm:generation_tokens_total")
    succeeded = delta(result, "vllm:request_success_total")
    aborted = delta(result, "vllm:request_success_total", finished_reason="abort")
    if first_tokens != len(reached):
        failures.append(f"time to first token counted {first_tokens}, {len(reached)} reached it")
    if succeeded != len(finished):
        failures.append(f"request_success counted {succeeded}, the engine finished {len(finished)}")
    if aborted != 0:
        failures.append(f"the aborted stream was counted in request_success ({aborted})")
    e2e = delta(result, "vllm:e2e_request_latency_seconds_count")
    if e2e != len(finished):
        failures.append(f"e2e latency observed {e2e} times for {len(finished)} finished requests")
    if k == 0:
        if generated != first_tokens + steps:
            failures.append(
                f"without speculation generation tokens ({generated}) are not first tokens "
                f"({first_tokens}) + decode steps ({steps})"
            )
        return failures
    drafts = delta(result, "vllm:spec_decode_num_drafts_total")
    draft_tokens = delta(result, "vllm:spec_decode_num_draft_tokens_total")
    accepted = delta(result, "vllm:spec_decode_num_accepted_tokens_total")
    if drafts != steps:
        failures.append(f"drafts ({drafts}) differ from decode steps observed ({steps})")
    if draft_tokens != k * drafts:
        failures.append(f"draft tokens {draft_tokens} are not k={k} x drafts {drafts}")
    if not 0 <= accepted <= draft_tokens:
        failures.append(f"accepted {accepted} outside [0, draft tokens {draft_tokens}]")
    if not first_tokens + steps <= generated <= first_tokens + steps + accepted:
        failures.append(
            f"generation tokens {generated} outside [first tokens + steps, + accepted] = "
            f"[{first_tokens + steps}, {first_tokens + steps + accepted}]"
        )
    positions = per_position(result)
    if len(positions) != k:
        failures.append(f"{len(positions)} per-position series for k={k}")
    if any(later > earlier for earlier, later in itertools.pairwise(positions)):
        failures.append(f"per-position accepted counts increase: {positions}")
    if sum(positions) != accepted:
        failures.append(f"per-position counts add up to {sum(positions)}, accepted {accepted}")
    return failures


def http_counts(result: WorkloadResult) -> dict[tuple[str, str], float]:
    """The increase of http_requests_total by (handler, status class) over the workload."""
    counts: dict[tuple[str, str], float] = {}
    for handler in ("/v1/completions", "/v1/chat/completions"):
        for status in ("2xx", "4xx", "5xx"):
            counts[(handler, status)] = delta(
                result, "http_requests_total", handler=handler, status=status
            )
    return counts


def family_differences(real: Families, simulated: Families) -> list[str]:
    """What the simulator exports otherwise than real vLLM: missing, extra, retyped, relabelled."""
    lines: list[str] = []
    for name in sorted(set(real) - set(simulated)):
        lines.append(f"missing in the simulator: {name} ({real[name][0]})")
    for name in sorted(set(simulated) - set(real)):
        lines.append(f"not exported by vLLM: {name} ({simulated[name][0]})")
    for name in sorted(set(real) & set(simulated)):
        (real_type, real_labels), (sim_type, sim_labels) = real[name], simulated[name]
        if real_type != sim_type:
            lines.append(f"{name}: type {sim_type}, vLLM's is {real_type}")
        if real_labels != sim_labels:
            lines.append(f"{name}: labels {sorted(sim_labels)}, vLLM's are {sorted(real_labels)}")
    return lines
