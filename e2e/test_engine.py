"""The engine launcher with the real CPU vLLM and the tiny models, without the operator.

What a pod would run: `python -m specdeploy.engine serve -- <vllm args>`. A matching pair is
served with its draft; a mismatched one is refused with exit 3 and one line before vLLM starts.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engine_cluster import EXTRA_ARGS, tiny_pair
from engine_harness import (
    ACCEPTED_TOKENS,
    DRAFT_TOKENS,
    DRAFTS,
    GENERATED_TOKENS,
    EnginePool,
    EngineServer,
    engine_python,
    run_launcher_until_exit,
    tiny_models,
    vllm_args,
)
from grafana_dashboard import dashboard_metric_names, load_dashboard
from specdeploy.api.models import SpeculativeDeploymentSpec
from specdeploy.plan.children.vllm_args import HOST_ARG, PORT_ARG, build_vllm_args

# The engines this module asks for first, started as the session begins (e2e/conftest.py).
pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.engines("plain", "draft-good")]

__all__ = ["engine_python", "tiny_models"]  # fixtures used below (engine_pool: conftest)

PROMPTS = [
    "The quick fox",
    "A lazy dog sees the river",
    "Every small engine serves",
    "This careful teacher reads the old book at night.",
]

_reference: dict[str, list[Any]] = {}


def greedy_outputs(server: EngineServer) -> list[Any]:
    """Token ids (text when ids are not returned) of greedy completions of PROMPTS."""
    outputs = []
    for prompt in PROMPTS:
        choice = server.complete(prompt)["choices"][0]
        outputs.append(choice.get("token_ids") or choice["text"])
    return outputs


def reference_outputs(pool: EnginePool) -> list[Any]:
    """Greedy outputs of the target served without speculation (computed once)."""
    key = pool.models["target"]
    if key not in _reference:
        plain = pool.get("plain")
        assert plain.counters().get(DRAFT_TOKENS, 0.0) == 0
        _reference[key] = greedy_outputs(plain)
    return _reference[key]


def acceptance(server: EngineServer) -> tuple[float, list[Any]]:
    """Acceptance rate over the greedy completions of PROMPTS, and those completions."""
    before = server.counters()
    outputs = greedy_outputs(server)
    after = server.counters()
    assert DRAFT_TOKENS in after, f"{DRAFT_TOKENS} missing from /metrics"
    assert ACCEPTED_TOKENS in after, f"{ACCEPTED_TOKENS} missing from /metrics"
    drafted = after[DRAFT_TOKENS] - before.get(DRAFT_TOKENS, 0.0)
    accepted = after[ACCEPTED_TOKENS] - before.get(ACCEPTED_TOKENS, 0.0)
    assert drafted > 0, "the engine proposed no draft tokens"
    return accepted / drafted, outputs


# --- served pairs ---------------------------------------------------------------------------


def test_good_draft_model_is_accepted_and_changes_no_output(engine_pool: EnginePool) -> None:
    engine_pool.start("plain", "draft-good")
    reference = reference_outputs(engine_pool)
    rate, outputs = acceptance(engine_pool.get("draft-good"))
    print(f"draft-good acceptance {rate:.3f}")
    assert rate >= 0.9
    assert outputs == reference


def test_completions_answer_through_the_launcher(engine_pool: EnginePool) -> None:
    answer = engine_pool.get("draft-good").complete("The quick fox", max_tokens=8)
    assert answer["model"] == "tiny"
    assert answer["usage"]["completion_tokens"] == 8
    assert answer["choices"][0]["text"]


def test_the_cpu_build_runs_its_one_worker_in_the_engine_core_process(
    engine_pool: EnginePool,
) -> None:
    # The launcher turns vLLM's worker process off (engine.launcher.single_worker_env): vLLM
    # then logs from the API server and the engine core only, never from a worker process.
    log = engine_pool.get("draft-good").log.read_text(errors="replace")
    assert "VLLM_ENABLE_V1_MULTIPROCESSING=0" in log
    assert "(EngineCore pid=" in log
    assert "(Worker pid=" not in log


def test_every_engine_metric_the_grafana_dashboard_reads_is_exported(
    engine_pool: EnginePool,
) -> None:
    """The chart's dashboard names vLLM's metrics as this vLLM exports them, histograms as
    their `_bucket` series (charts/specdeploy/dashboards/specdeploy.json)."""
    server = engine_pool.get("draft-good")
    server.complete("The quick fox", max_tokens=8)
    exported = set(server.counters())
    wanted = {n for n in dashboard_metric_names(load_dashboard()) if n.startswith("vllm:")}
    assert len(wanted) >= 8, wanted
    assert wanted <= exported, f"not exported by the engine: {sorted(wanted - exported)}"


def test_eagle3_head_is_served_and_changes_no_output(engine_pool: EnginePool) -> None:
    reference = reference_outputs(engine_pool)
    engine_pool.start("eagle3", "draft-bad")
    rate, outputs = acceptance(engine_pool.get("eagle3"))
    print(f"eagle3 (random head) acceptance {rate:.3f}")
    assert outputs == reference


def test_bad_draft_is_almost_never_accepted(engine_pool: EnginePool) -> None:
    reference = reference_outputs(engine_pool)
    rate, outputs = acceptance(engine_pool.get("draft-bad"))
    print(f"draft-bad acceptance {rate:.3f}")
    assert rate <= 0.2
    assert outputs == reference


def test_small_draft_is_mostly_accepted_and_changes_no_output(engine_pool: EnginePool) -> None:
    reference = reference_outputs(engine_pool)
    rate, outputs = acceptance(engine_pool.get("draft-small"))
    print(f"draft-small acceptance {rate:.3f}")
    assert rate >= 0.5
    assert outputs == reference


# --- a per-batch-size schedule -----------------------------------------------------------------

SCHEDULED = "draft-small-scheduled"
#: Speculate 3 tokens when one request is scheduled, none from two on (up to maxNumSeqs).
SCHEDULE = [{"maxBatchSize": 1, "tokens": 3}]
CONCURRENCY = 8


def scheduled_spec(models: dict[str, str]) -> SpeculativeDeploymentSpec:
    """The tiny target with draft-small (k=3) and SCHEDULE, as a SpeculativeDeployment spec."""
    pair = tiny_pair(models, "draft-small", "scheduled", tokens=3)
    pair["draft"]["schedule"] = SCHEDULE
    engine = {"maxModelLen": 512, "maxNumSeqs": CONCURRENCY, "extraArgs": EXTRA_ARGS}
    return SpeculativeDeploymentSpec.model_validate({"pair": pair, "engine": engine})


def operator_args(spec: SpeculativeDeploymentSpec, port: int) -> list[str]:
    """The `vllm serve` arguments plan/ builds for the spec, on 127.0.0.1:port."""
    local = {HOST_ARG: "127.0.0.1", PORT_ARG: str(port)}
    return [local.get(arg, arg) for arg in build_vllm_args(spec, None)]


@dataclass
class SpeculationShare:
    """What the engine's own counters say about a batch of completions."""

    generated: float
    drafts: float
    draft_tokens: float
    accepted: float

    @property
    def draft_tokens_per_token(self) -> float:
        return self.draft_tokens / self.generated

    @property
    def speculated_steps(self) -> float:
        """Share of the requests' steps that verified a draft (an estimate: a step without one
        makes one token, a step with one makes 1 + its accepted tokens; tokens accepted past
        max_tokens count as accepted but not generated, so it can exceed 1 by a little)."""
        steps = self.generated - self.accepted
        return self.drafts / steps

    def __str__(self) -> str:
        return (
            f"{self.generated:.0f} tokens, {self.drafts:.0f} drafts, {self.draft_tokens:.0f} "
            f"draft tokens ({self.draft_tokens_per_token:.3f}/token), {self.accepted:.0f} "
            f"accepted; {self.speculated_steps:.0%} of steps speculated"
        )


def speculation_during(
    server: EngineServer, prompts: list[str], *, together: bool, max_tokens: int = 256
) -> SpeculationShare:
    """Counters' increase over greedy completions of the prompts, one after another or all
    released at once (threads held at a barrier, so they reach the engine within a step or two).
    """
    barrier = threading.Barrier(len(prompts) if together else 1)

    def complete(prompt: str) -> dict[str, Any]:
        barrier.wait()
        return server.complete(prompt, max_tokens=max_tokens)

    before = server.counters()
    with ThreadPoolExecutor(len(prompts) if together else 1) as pool:
        answers = list(pool.map(complete, prompts))
    after = server.counters()
    assert all(a["usage"]["completion_tokens"] == max_tokens for a in answers)

    def grew(name: str) -> float:
        assert name in after, f"{name} missing from /metrics"
        return after[name] - before.get(name, 0.0)

    return SpeculationShare(
        grew(GENERATED_TOKENS), grew(DRAFTS), grew(DRAFT_TOKENS), grew(ACCEPTED_TOKENS)
    )


def test_schedule_speculates_single_requests_and_stops_under_concurrency(
    engine_pool: EnginePool,
) -> None:
    spec = scheduled_spec(engine_pool.models)
    engine_pool.define(SCHEDULED, lambda port: operator_args(spec, port), spec.pair.target.model)
    server = engine_pool.get(SCHEDULED)
    given = operator_args(spec, server.port)
    config = json.loads(given[given.index("--speculative-config") + 1])
    print(f"\nspeculative config: {json.dumps(config)}")

    alone = speculation_during(server, PROMPTS, together=False)
    together = speculation_during(server, PROMPTS * (CONCURRENCY // len(PROMPTS)), together=True)
    print(f"scheduled draft-small alone:      {alone}")
    print(f"scheduled draft-small {CONCURRENCY} at once: {together}")

    # One request at a time: batch size 1, k=3 on every step after the prefill (measured:
    # every step, 0.85 draft tokens per generated token).
    assert alone.speculated_steps >= 0.8
    assert alone.draft_tokens_per_token >= 0.5
    # Eight at once: k=0 whenever two or more requests are scheduled in a step (vLLM counts
    # prefills too), so only a step with a lone first arrival or a lone straggler speculates
    # (measured: 0-1 drafts in 2048 tokens; without the schedule 0.85 per token, as alone).
    assert together.speculated_steps <= 0.2
    assert together.draft_tokens_per_token <= alone.draft_tokens_per_token / 4


# --- refused pairs --------------------------------------------------------------------------

REFUSALS = [
    (
        "eagle3",
        "eagle3-wrong-hidden",
        "EAGLE-3 head expects target hidden size 512, target has 256",
    ),
    ("eagle3", "eagle3-bad-layers", "EAGLE-3 head reads target layers [1, 2, 7], target has 4"),
    (
        "eagle3",
        "eagle3-other-verifier",
        "draft was trained for verifier specdeploy-tiny/other-target",
    ),
    ("eagle3", "eagle3-other-arch", "verifier architectures Qwen3ForCausalLM differ"),
    ("draft_model", "draft-other-tokenizer", "draft tokenizer ("),
    ("draft_model", "draft-other-vocab", "draft vocabulary size 640 differs from the target's 512"),
    ("eagle3", "draft-good", "method eagle3 does not fit the draft checkpoint: it is a plain"),
    ("draft_model", "eagle3", "method draft_model does not fit the draft checkpoint: it is an"),
    ("ngram", "draft-good", "method ngram takes no draft model, but one is given"),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[f"{m}-{d}" for m, d, _ in REFUSALS])
def test_mismatched_pair_is_refused_before_vllm_starts(
    engine_python: Path, tiny_models: dict[str, str], tmp_path: Path, case: tuple[str, str, str]
) -> None:
    method, draft, reason = case
    spec = {"method": method, "model": tiny_models[draft], "num_speculative_tokens": 3}
    args = vllm_args(tiny_models["target"], 1, speculative=spec)
    refusal = run_launcher_until_exit(engine_python, args, tmp_path)
    assert refusal.code == 3, refusal.output
    lines = refusal.termination_message.splitlines()
    assert len(lines) == 1
    assert reason in lines[0]
    # vLLM never started: no engine log line, and the refusal took launcher time only.
    assert "vllm.entrypoints" not in refusal.output
    assert "INFO" not in refusal.output
    assert refusal.seconds < 30


def test_missing_draft_is_exit_4(
    engine_python: Path, tiny_models: dict[str, str], tmp_path: Path
) -> None:
    spec = {"method": "eagle3", "model": str(tmp_path / "gone"), "num_speculative_tokens": 3}
    refusal = run_launcher_until_exit(
        engine_python, vllm_args(tiny_models["target"], 1, speculative=spec), tmp_path
    )
    assert refusal.code == 4, refusal.output
    assert refusal.termination_message.strip().endswith("does not exist")


def test_tiny_models_are_named_in_the_factory_output(tiny_models: dict[str, str]) -> None:
    expected = {
        "tokenizer",
        "target",
        "draft-good",
        "draft-bad",
        "draft-small",
        "draft-slow",
        "eagle3",
        "eagle3-wrong-hidden",
        "eagle3-bad-layers",
        "eagle3-other-verifier",
        "eagle3-other-arch",
        "draft-other-tokenizer",
        "draft-other-vocab",
    }
    assert set(tiny_models) == expected
    head = json.loads((Path(tiny_models["eagle3"]) / "config.json").read_text())
    assert head["speculators_config"]["verifier"]["name_or_path"] == "specdeploy-tiny/target"
