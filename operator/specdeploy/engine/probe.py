"""The probe: the same prompts sent by every engine pod to its own vLLM before it serves.

With `spec.rollout.analysis.probe`, the operator passes vLLM `--middleware
specdeploy.engine.probe.ProbeGate`, the probe's settings (`SPECDEPLOY_PROBE`) and its prompts
(`SPECDEPLOY_PROBE_PROMPTS`, from the ConfigMap key the spec names), and points the pod's
readiness probe at `/specdeploy/ready`. Inside vLLM's API server the middleware then:

- runs the probe once, in a thread, as soon as vLLM answers: each prompt once, in order, one
  at a time, as a completion of `maxTokens` tokens (end of text ignored) at the spec's
  temperature, to this very server;
- measures it with vLLM's own counters: `/metrics` read before and after, so the figures are
  exactly the probe's (no user request reaches a pod that is not Ready);
- answers `/specdeploy/ready` with 503 until the probe is over, then as vLLM's `/health`
  does; and
- appends the probe's figures to `/metrics` as `specdeploy_probe_*` gauges labelled with the
  prompt set's fingerprint, so Prometheus reads them under the pod's own labels.

Nothing here imports vLLM: the middleware is plain ASGI, the probe plain HTTP to 127.0.0.1.
The results go to a file named by `SPECDEPLOY_PROBE_RUN` (set by the launcher before it execs
vLLM), so several API server processes share one probe.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from specdeploy.api.contract import (
    PORT_ENV,
    PROBE_ENV,
    PROBE_GAUGES,
    PROBE_METRIC_PREFIX,
    PROBE_PER_POSITION_GAUGE,
    PROBE_PROMPTS_ENV,
    PROBE_READY_PATH,
    PROBE_RUN_ENV,
)

# vLLM's counters and histograms the probe's figures come from (v1/metrics/loggers.py).
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
STEP_SUM = "vllm:inter_token_latency_seconds_sum"
STEP_COUNT = "vllm:inter_token_latency_seconds_count"
FIRST_TOKEN_SUM = "vllm:time_to_first_token_seconds_sum"
FIRST_TOKEN_COUNT = "vllm:time_to_first_token_seconds_count"
REQUEST_SUCCESS = "vllm:request_success_total"
#: vLLM's finish reasons (v1/engine FinishReason) that mean the request did not complete.
FAILED_REASONS = frozenset({"error", "abort"})
#: A prompt set may reach the engine only through one environment variable (Linux caps one
#: argument or variable at 128 KiB).
MAX_PROMPTS_BYTES = 128 * 1024


@dataclass(frozen=True)
class ProbeSettings:
    """The probe as the spec sets it (spec.rollout.analysis.probe, less the ConfigMap)."""

    prompts: tuple[str, ...]
    max_tokens: int = 64
    temperature: float = 0.0
    timeout_seconds: float = 600.0

    @property
    def prompt_set(self) -> str:
        """A fingerprint of the prompts and sampling settings: two revisions compare on the
        probe only when theirs are equal."""
        canonical = json.dumps(
            {
                "prompts": list(self.prompts),
                "maxTokens": self.max_tokens,
                "temperature": self.temperature,
            },
            sort_keys=True,
            ensure_ascii=False,
        )
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def parse_prompts(text: str) -> tuple[str, ...]:
    """The prompts of a ConfigMap value: a JSON list of strings, else one per non-empty line."""
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            loaded = json.loads(stripped)
        except json.JSONDecodeError as error:
            raise ValueError(f"the probe's prompts are not a JSON list: {error}") from error
        if not isinstance(loaded, list) or not all(isinstance(p, str) for p in loaded):
            raise ValueError("the probe's prompts must be a JSON list of strings")
        prompts = tuple(p for p in loaded if p)
    else:
        prompts = tuple(line for line in (raw.strip() for raw in text.splitlines()) if line)
    if not prompts:
        raise ValueError("the probe has no prompts")
    return prompts


def settings_from_env(env: Mapping[str, str]) -> ProbeSettings | None:
    """The probe the operator configured for this pod, or None (no probe)."""
    raw = env.get(PROBE_ENV)
    if not raw:
        return None
    options = json.loads(raw)
    text = env.get(PROBE_PROMPTS_ENV, "")
    if len(text.encode()) > MAX_PROMPTS_BYTES:
        raise ValueError(f"the probe's prompts exceed {MAX_PROMPTS_BYTES} bytes")
    return ProbeSettings(
        prompts=parse_prompts(text),
        max_tokens=int(options.get("maxTokens", 64)),
        temperature=float(options.get("temperature", 0.0)),
        timeout_seconds=float(options.get("timeoutSeconds", 600)),
    )


# --- figures from vLLM's own counters --------------------------------------------------------


@dataclass(frozen=True)
class CounterSnapshot:
    """vLLM's counters at one moment, summed over their labels (engines, models)."""

    totals: Mapping[str, float]
    accepted_per_position: Mapping[int, float]
    finished_by_reason: Mapping[str, float]


def read_counters(metrics_text: str) -> CounterSnapshot:
    """vLLM's /metrics (Prometheus text) as the sums the probe needs."""
    wanted = {
        DRAFTS,
        DRAFT_TOKENS,
        ACCEPTED_TOKENS,
        GENERATION_TOKENS,
        STEP_SUM,
        STEP_COUNT,
        FIRST_TOKEN_SUM,
        FIRST_TOKEN_COUNT,
    }
    totals: dict[str, float] = dict.fromkeys(wanted, 0.0)
    per_position: dict[int, float] = {}
    by_reason: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in wanted:
                totals[sample.name] += sample.value
            elif sample.name == ACCEPTED_PER_POSITION:
                position = sample.labels.get("position", "")
                if position.isdigit():
                    per_position[int(position)] = per_position.get(int(position), 0.0) + (
                        sample.value
                    )
            elif sample.name == REQUEST_SUCCESS:
                reason = sample.labels.get("finished_reason", "")
                by_reason[reason] = by_reason.get(reason, 0.0) + sample.value
    return CounterSnapshot(totals, per_position, by_reason)


@dataclass
class ProbeFigures:
    """What one pod measured on the probe: deltas of vLLM's counters over it."""

    prompt_set: str
    prompts: int
    complete: bool = False
    #: Requests the probe sent / that did not finish with a completion.
    requests: int = 0
    errors: int = 0
    output_tokens: float = 0.0
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    accepted_per_position: dict[int, float] = field(default_factory=dict)
    #: Sum and count of vLLM's inter-token latency (one observation per decode step of a
    #: sequence) and of its time to first token.
    decode_seconds: float = 0.0
    decode_steps: float = 0.0
    first_token_seconds: float = 0.0
    first_tokens: float = 0.0

    def as_json(self) -> dict[str, Any]:
        found = dict(self.__dict__)
        found["accepted_per_position"] = {str(k): v for k, v in self.accepted_per_position.items()}
        return found

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProbeFigures:
        found = dict(data)
        found["accepted_per_position"] = {
            int(k): float(v) for k, v in (found.get("accepted_per_position") or {}).items()
        }
        return cls(**found)


def probe_figures(
    settings: ProbeSettings,
    before: CounterSnapshot,
    after: CounterSnapshot,
    *,
    sent: int,
    failed: int,
    complete: bool,
) -> ProbeFigures:
    """The probe's figures: what vLLM counted between `before` and `after`, and what the
    probe itself saw (`failed`: requests without a completion)."""

    def delta(name: str) -> float:
        return max(0.0, after.totals.get(name, 0.0) - before.totals.get(name, 0.0))

    engine_failed = sum(
        max(0.0, after.finished_by_reason.get(r, 0.0) - before.finished_by_reason.get(r, 0.0))
        for r in FAILED_REASONS
    )
    positions = set(after.accepted_per_position) | set(before.accepted_per_position)
    return ProbeFigures(
        prompt_set=settings.prompt_set,
        prompts=len(settings.prompts),
        complete=complete,
        requests=sent,
        errors=max(failed, int(engine_failed)),
        output_tokens=delta(GENERATION_TOKENS),
        drafts=delta(DRAFTS),
        draft_tokens=delta(DRAFT_TOKENS),
        accepted_tokens=delta(ACCEPTED_TOKENS),
        accepted_per_position={
            p: max(
                0.0,
                after.accepted_per_position.get(p, 0.0) - before.accepted_per_position.get(p, 0.0),
            )
            for p in sorted(positions)
        },
        decode_seconds=delta(STEP_SUM),
        decode_steps=delta(STEP_COUNT),
        first_token_seconds=delta(FIRST_TOKEN_SUM),
        first_tokens=delta(FIRST_TOKEN_COUNT),
    )


def render_probe_metrics(figures: ProbeFigures) -> str:
    """The figures as Prometheus text: one gauge per figure, labelled with the prompt set."""
    label = f'prompt_set="{figures.prompt_set}"'
    lines: list[str] = []
    for suffix in PROBE_GAUGES:
        name = PROBE_METRIC_PREFIX + suffix
        value = float(getattr(figures, suffix))
        lines += [f"# TYPE {name} gauge", f"{name}{{{label}}} {value!r}"]
    name = PROBE_METRIC_PREFIX + PROBE_PER_POSITION_GAUGE
    lines.append(f"# TYPE {name} gauge")
    for position, value in sorted(figures.accepted_per_position.items()):
        lines.append(f'{name}{{{label},position="{position}"}} {float(value)!r}')
    return "\n".join(lines) + "\n"


def append_to_exposition(body: bytes, extra: str) -> bytes:
    """`extra` added to a /metrics answer: before OpenMetrics' closing `# EOF`, if any."""
    text = body.decode()
    marker = "# EOF"
    if text.rstrip().endswith(marker):
        head = text.rstrip()[: -len(marker)]
        return (head + extra + marker + "\n").encode()
    if text and not text.endswith("\n"):
        text += "\n"
    return (text + extra).encode()


# --- running it ------------------------------------------------------------------------------

#: (method, url, JSON body or None, timeout) -> (HTTP status, body text)
Fetch = Callable[[str, str, dict[str, Any] | None, float], tuple[int, str]]


def http_fetch(
    method: str, url: str, body: dict[str, Any] | None, timeout: float
) -> tuple[int, str]:
    """One HTTP request with the standard library; (status, text), status 0 when unreachable."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url,
        data=data,
        method=method,
        headers={"Content-Type": "application/json"} if data is not None else {},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode(errors="replace")
    except (OSError, urllib.error.URLError):
        return 0, ""


def run_probe(
    settings: ProbeSettings,
    base_url: str,
    fetch: Fetch = http_fetch,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> ProbeFigures:
    """Waits for vLLM at `base_url` to answer, then sends each prompt once and measures it.

    Stops early (figures marked incomplete) once `timeout_seconds` have passed since the
    engine first answered; a request the timeout cut (no answer by the deadline) counts as not
    sent, not as an error.
    """
    while fetch("GET", base_url + "/health", None, 5.0)[0] != 200:
        sleep(1.0)
    status, text = fetch("GET", base_url + "/v1/models", None, 10.0)
    model = json.loads(text)["data"][0]["id"] if status == 200 else ""
    deadline = clock() + settings.timeout_seconds
    before = read_counters(fetch("GET", base_url + "/metrics", None, 10.0)[1])
    sent = failed = 0
    for prompt in settings.prompts:
        if clock() >= deadline:
            break
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": settings.max_tokens,
            "temperature": settings.temperature,
            "ignore_eos": True,
        }
        status, text = fetch(
            "POST", base_url + "/v1/completions", body, max(1.0, deadline - clock())
        )
        if status == 0 and clock() >= deadline:
            # Cut by the probe's own timeout, not failed by the engine: the probe is
            # incomplete (live traffic decides), never a canary's error.
            break
        sent += 1
        if status != 200 or _finish_reason(text) not in ("length", "stop"):
            failed += 1
    # vLLM records a request's stats as its output is processed: give the last one a moment.
    sleep(0.5)
    after = read_counters(fetch("GET", base_url + "/metrics", None, 10.0)[1])
    return probe_figures(
        settings,
        before,
        after,
        sent=sent,
        failed=failed,
        complete=sent == len(settings.prompts),
    )


def _finish_reason(text: str) -> str | None:
    with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
        reason = json.loads(text)["choices"][0]["finish_reason"]
        return str(reason) if reason is not None else None
    return None


def results_path(env: Mapping[str, str]) -> Path:
    """Where this run's probe results live (one file per engine start)."""
    run = env.get(PROBE_RUN_ENV) or str(os.getppid())
    return Path(tempfile.gettempdir()) / f"specdeploy-probe-{run}.json"


def read_results(path: Path) -> ProbeFigures | None:
    """The finished probe's figures, None while it runs."""
    try:
        return ProbeFigures.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def write_results(path: Path, figures: ProbeFigures) -> None:
    staging = path.with_suffix(".tmp")
    staging.write_text(json.dumps(figures.as_json()))
    staging.replace(path)


_started = threading.Lock()
_runner: threading.Thread | None = None


def start_probe_once(env: Mapping[str, str], fetch: Fetch = http_fetch) -> None:
    """Starts the probe in a daemon thread, once per run: one process of the run takes the
    results file's lock and probes; the others find the results when it is done."""
    global _runner  # noqa: PLW0603 (one probe per process)
    settings = settings_from_env(env)
    if settings is None:
        return
    path = results_path(env)
    with _started:
        if _runner is not None:
            return

        def probe() -> None:
            lock_path = path.with_suffix(".lock")
            with open(lock_path, "w") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    return  # another API server process of this run probes
                if read_results(path) is not None:
                    return
                port = env.get(PORT_ENV, "8000")
                figures = run_probe(settings, f"http://127.0.0.1:{port}", fetch)
                write_results(path, figures)
                print(
                    f"specdeploy-engine: probe {figures.prompt_set}: {figures.requests} of "
                    f"{figures.prompts} prompts, {figures.errors} errors, "
                    f"{figures.output_tokens:.0f} tokens, {figures.draft_tokens:.0f} draft tokens",
                    flush=True,
                )

        _runner = threading.Thread(target=probe, name="specdeploy-probe", daemon=True)
        _runner.start()


# --- the ASGI middleware ---------------------------------------------------------------------

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class ProbeGate:
    """vLLM `--middleware`: runs the probe, gates `/specdeploy/ready` on it and adds its figures
    to `/metrics`. Every other request passes through untouched."""

    def __init__(self, app: App, env: Mapping[str, str] | None = None) -> None:
        self.app = app
        self.env = dict(os.environ if env is None else env)
        self.results = results_path(self.env)
        start_probe_once(self.env)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path")
        if path == PROBE_READY_PATH:
            await self._ready(scope, receive, send)
        elif path == "/metrics":
            await self._metrics(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _ready(self, scope: Scope, receive: Receive, send: Send) -> None:
        if read_results(self.results) is None:
            await _plain(send, 503, "the probe is running\n")
            return
        # Probe over: ready as long as vLLM says it is healthy.
        await self.app({**scope, "path": "/health", "raw_path": b"/health"}, receive, send)

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        figures = read_results(self.results)
        if figures is None:
            await self.app(scope, receive, send)
            return
        # Uncompressed, so the figures can be appended to the text.
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"accept-encoding"]
        start: Message = {}
        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    body = append_to_exposition(b"".join(chunks), render_probe_metrics(figures))
                    kept = [
                        (k, v)
                        for k, v in start.get("headers", [])
                        if k.lower() != b"content-length"
                    ]
                    kept.append((b"content-length", str(len(body)).encode()))
                    await send({**start, "headers": kept})
                    await send({"type": "http.response.body", "body": body})

        await self.app({**scope, "headers": headers}, receive, capture)


async def _plain(send: Send, status: int, text: str) -> None:
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def figure_names() -> Sequence[str]:
    """Every gauge the probe exports (for the operator's queries and the docs)."""
    return [PROBE_METRIC_PREFIX + s for s in (*PROBE_GAUGES, PROBE_PER_POSITION_GAUGE)]
