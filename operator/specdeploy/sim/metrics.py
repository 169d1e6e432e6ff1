"""vLLM 0.32's Prometheus families, as the simulator's engine records them.

Names, types, label names (`model_name`, `engine`, and `finished_reason`, `position`, ...) and
buckets are those of vLLM's `v1/metrics/loggers.py`, `v1/spec_decode/metrics.py` and
`v1/metrics/buckets.py`, and of the HTTP families its API server gets from
prometheus-fastapi-instrumentator. What each observation means is vLLM's too: one
inter-token latency per decode step of each running request (however many tokens the step
emitted), one time to first token per request, generation tokens counting the first token,
finished requests by reason, per-position acceptance sized to the largest k.
e2e/test_sim_contract.py compares them with a real engine's.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Summary,
)
from prometheus_client.exposition import generate_latest

if TYPE_CHECKING:
    from specdeploy.sim.engine import SimRequest

LABELS = ("model_name", "engine")
#: vLLM's FinishReason values as request_success_total labels them.
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
REQUEST_NUM_PREEMPTIONS_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100)
BUCKETS: dict[str, Sequence[float]] = {
    "request_latency": REQUEST_LATENCY_BUCKETS,
    "time_to_first_token": TIME_TO_FIRST_TOKEN_BUCKETS,
    "inter_token_latency": INTER_TOKEN_LATENCY_BUCKETS,
    "iteration_tokens": ITERATION_TOKENS_BUCKETS,
    "request_params_n": REQUEST_PARAMS_N_BUCKETS,
    "request_num_preemptions": REQUEST_NUM_PREEMPTIONS_BUCKETS,
}
FAMILY_TABLE = Path(__file__).with_name("vllm_families.yaml")


@functools.cache
def family_table() -> dict[str, Any]:
    """vllm_families.yaml: the families of one engine, in vLLM's order."""
    loaded: dict[str, Any] = yaml.safe_load(FAMILY_TABLE.read_text(encoding="utf-8"))
    return loaded


def one_two_five_buckets(max_value: int) -> list[float]:
    """vLLM's request_tokens buckets: 1, 2, 5, 10, 20, 50, ... up to max_value."""
    buckets: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


#: vLLM's cache_config_info labels (its CacheConfig), with the values a GPU engine shows;
#: the simulator fills in its own block size, blocks and memory share.
CACHE_CONFIG_INFO: dict[str, str] = {
    "_block_size_resolved": "True",
    "block_size": "128",
    "cache_dtype": "auto",
    "cache_hit_alignment_tokens": "None",
    "effective_attention_block_size": "128",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "enable_prefix_caching": "True",
    "gpu_memory_utilization": "0.92",
    "hash_block_size": "None",
    "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]",
    "kv_cache_layout": "None",
    "kv_cache_max_concurrency": "409.5",
    "kv_cache_memory_bytes": "1073741824",
    "kv_cache_size_tokens": "209664",
    "kv_offloading_backend": "native",
    "kv_offloading_size": "None",
    "kv_sharing_fast_prefill": "False",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "float32",
    "num_cpu_blocks": "None",
    "num_gpu_blocks": "1638",
    "num_gpu_blocks_override": "None",
    "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None",
    "replayssm_buffer_len": "16",
    "skip_page_size_padded": "None",
    "sliding_window": "None",
    "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False",
    "use_replayssm": "False",
    "user_specified_block_size": "False",
}


def process_registry() -> CollectorRegistry:
    """A registry with the process, platform and garbage collector families vLLM's has."""
    registry = CollectorRegistry()
    for collector in (GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR):
        registry.register(collector)
    return registry


class EngineMetrics:
    """The families of one engine (engine index 0) serving one model name."""

    running: Any
    waiting: Any
    kv_usage: Any
    prefix_queries: Any
    prefix_hits: Any
    preemptions: Any
    prompt_tokens: Any
    generation_tokens: Any
    request_prompt_tokens: Any
    request_generation_tokens: Any
    iteration_tokens: Any
    request_max_generation: Any
    request_n: Any
    request_max_tokens: Any
    ttft: Any
    itl: Any
    tpot: Any
    e2e: Any
    queue_time: Any
    inference_time: Any
    prefill_time: Any
    decode_time: Any
    request_preemptions: Any
    prefill_kv_computed: Any

    def __init__(
        self,
        model_name: str,
        max_model_len: int,
        largest_k: int,
        registry: CollectorRegistry | None = None,
        cache_info: Mapping[str, str] | None = None,
    ) -> None:
        self.registry = registry or process_registry()
        r = self.registry
        values = (model_name, "0")
        tokens = one_two_five_buckets(max_model_len)
        table = family_table()
        for row in table["families"]:
            family: Any
            name, doc = row["name"], row["help"]
            if row["type"] == "gauge":
                family = Gauge(name, doc, LABELS, registry=r)
            elif row["type"] == "counter":
                family = Counter(name, doc, LABELS, registry=r)
            else:
                buckets = BUCKETS.get(row["buckets"]) or tokens
                family = Histogram(name, doc, LABELS, buckets=buckets, registry=r)
            child = family.labels(*values)
            if row.get("attribute"):
                setattr(self, row["attribute"], child)
        self.labelled: dict[str, dict[str, Any]] = {}
        for row in table["labelled"]:
            cls = Gauge if row["type"] == "gauge" else Counter
            family = cls(row["name"], row["help"], (*LABELS, row["label"]), registry=r)
            self.labelled[row["name"]] = {
                str(v): family.labels(*values, str(v)) for v in row["values"]
            }
        self.labelled["vllm:engine_sleep_state"]["awake"].set(1)
        self.success = self.labelled["vllm:request_success"]
        rejections = Counter(
            "vllm:admission_rejections",
            "Number of requests rejected at admission.",
            ("model_name", "reason"),
            registry=r,
        )
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            rejections.labels(model_name, reason)
        info = {**CACHE_CONFIG_INFO, **(cache_info or {}), "engine": "0"}
        Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            sorted(info),
            registry=r,
        ).labels(**info).set(1)
        self.largest_k = largest_k
        self.drafts = self.draft_tokens = self.accepted = None
        self.accepted_per_pos: list[Any] = []
        if largest_k > 0:
            spec = {
                name: Counter(name, doc, LABELS, registry=r).labels(*values)
                for name, doc in (
                    ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
                    ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
                    ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."),
                )
            }
            self.drafts = spec["vllm:spec_decode_num_drafts"]
            self.draft_tokens = spec["vllm:spec_decode_num_draft_tokens"]
            self.accepted = spec["vllm:spec_decode_num_accepted_tokens"]
            per_pos = Counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                (*LABELS, "position"),
                registry=r,
            )
            self.accepted_per_pos = [per_pos.labels(*values, str(p)) for p in range(largest_k)]
        self.http = HttpMetrics(r)

    # --- what the engine records ------------------------------------------------------------

    def set_queues(self, running: int, waiting: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.labelled["vllm:num_requests_waiting_by_reason"]["capacity"].set(waiting)

    def set_kv_usage(self, share: float) -> None:
        self.kv_usage.set(min(1.0, share))

    def preempted(self) -> None:
        self.preemptions.inc()

    def drafted(self, k: int, accepted: int) -> None:
        """One request's draft verified in one step: k proposed, the first `accepted` taken."""
        if self.drafts is None or self.draft_tokens is None or self.accepted is None:
            return
        self.drafts.inc()
        self.draft_tokens.inc(k)
        self.accepted.inc(accepted)
        for position in range(accepted):
            self.accepted_per_pos[position].inc()

    def inter_token(self, seconds: float) -> None:
        self.itl.observe(seconds)

    def first_token(self, seconds: float, prompt_tokens: int) -> None:
        self.ttft.observe(seconds)
        self.prompt_tokens.inc(prompt_tokens)
        self.labelled["vllm:prompt_tokens_by_source"]["local_compute"].inc(prompt_tokens)
        self.prefix_queries.inc(prompt_tokens)

    def iteration(self, prompt_tokens: int, generated: int) -> None:
        """One step: `generated` tokens emitted, `prompt_tokens` the prompts of the requests
        that got their first token in it; a step without an output is not observed."""
        self.generation_tokens.inc(generated)
        if generated:
            self.iteration_tokens.observe(prompt_tokens + generated)

    def finished(self, request: SimRequest) -> None:
        """A request the engine finished. A request aborted (its client went away) is counted
        nowhere, as in vLLM: its first token was, its end is not."""
        if request.finished_reason in (None, "abort"):
            return
        self.success[request.finished_reason].inc()
        end = request.finished_at if request.finished_at is not None else request.arrival
        scheduled = request.scheduled_at if request.scheduled_at is not None else end
        first = request.first_token_at if request.first_token_at is not None else end
        last = request.last_token_at if request.last_token_at is not None else first
        generated = len(request.output)
        self.e2e.observe(end - request.arrival)
        self.queue_time.observe(scheduled - request.arrival)
        self.prefill_time.observe(first - scheduled)
        self.decode_time.observe(last - first)
        self.inference_time.observe(last - scheduled)
        self.request_prompt_tokens.observe(request.prompt_tokens)
        self.request_generation_tokens.observe(generated)
        self.request_max_generation.observe(request.max_tokens)
        self.request_max_tokens.observe(request.max_tokens)
        self.request_n.observe(request.n)
        self.request_preemptions.observe(request.preemptions)
        self.prefill_kv_computed.observe(request.prompt_tokens)
        if generated > 1:
            self.tpot.observe((last - first) / (generated - 1))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class HttpMetrics:
    """prometheus-fastapi-instrumentator's default families, as vLLM's API server exports them."""

    HIGHR_BUCKETS = (
        0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5,
        5.0, 7.5, 10.0, 30.0, 60.0,
    )  # fmt: skip
    #: Handlers the API server leaves out of them (vLLM's attach_router), and the simulator's
    #: own fault endpoint.
    EXCLUDED = frozenset(
        {"/metrics", "/health", "/load", "/ping", "/version", "/server_info", "/sim/faults"}
    )

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "http_requests",
            "Total number of requests by method, status and handler.",
            ("method", "status", "handler"),
            registry=registry,
        )
        self.request_size = Summary(
            "http_request_size_bytes",
            "Content length of incoming requests by handler. Only value of header is respected. "
            "Otherwise ignored. No percentile calculated. ",
            ("handler",),
            registry=registry,
        )
        self.response_size = Summary(
            "http_response_size_bytes",
            "Content length of outgoing responses by handler. Only value of header is respected. "
            "Otherwise ignored. No percentile calculated. ",
            ("handler",),
            registry=registry,
        )
        self.highr = Histogram(
            "http_request_duration_highr_seconds",
            "Latency with many buckets but no API specific labels. Made for more accurate "
            "percentile calculations. ",
            buckets=self.HIGHR_BUCKETS,
            registry=registry,
        )
        self.duration = Histogram(
            "http_request_duration_seconds",
            "Latency with only few buckets by handler. Made to be only used if aggregation by "
            "handler is important. ",
            ("method", "handler"),
            buckets=(0.1, 0.5, 1.0),
            registry=registry,
        )

    def observe(
        self, method: str, handler: str, status: int, seconds: float, sizes: tuple[int, int]
    ) -> None:
        if handler in self.EXCLUDED:
            return
        self.requests.labels(method, f"{status // 100}xx", handler).inc()
        self.request_size.labels(handler).observe(sizes[0])
        self.response_size.labels(handler).observe(sizes[1])
        self.highr.observe(seconds)
        self.duration.labels(method, handler).observe(seconds)
