"""The simulator held to real vLLM: the same workload, the same families, answers and relations.

The real engines are the pool's (the tiny target alone, and with draft-good at k=3); the
simulator serves GPU-shaped profiles (`sim/llama-3.1-8b-h100`, with `sim/eagle3-8b-good` at
k=3) started through the same launcher, with the same served name and context length. Each
pair gets e2e/sim_contract.py's workload. What must agree: every family vLLM, its HTTP layer
and its process export (name, type, label names); every answer's status, error shape and
stream ending; the HTTP counts by handler and status class. What must hold on both: the
relations between counters of sim_contract.relation_failures. Values are not compared: the
engines are not the same model. When vLLM renames or relabels a family the operator reads,
this fails (docs/simulator.md says how it was shown to).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_harness import EnginePool, EngineServer, start_engine, vllm_args
from sim_contract import (
    WorkloadResult,
    families,
    family_differences,
    http_counts,
    relation_failures,
    run_workload,
)
from testbed.ports import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.engines("plain", "draft-good")]

MAX_MODEL_LEN = 512  # the pool's engines' (engine_harness.FAST_ENGINE_ARGS)
K = 3
SIM_TARGET = "sim/llama-3.1-8b-h100"
SIM_DRAFT = {"method": "eagle3", "model": "sim/eagle3-8b-good", "num_speculative_tokens": K}
CASES = {"plain": (None, "plain"), "speculating": (SIM_DRAFT, "draft-good")}


def start_sim(speculative: dict[str, object] | None, log_dir: Path) -> EngineServer:
    """The simulator through the engine launcher (its pair checks, then exec), as a pod runs."""
    port = free_port()
    args = vllm_args(SIM_TARGET, port, speculative=speculative)
    server = start_engine(Path(sys.executable), f"sim-{port}", args, log_dir, port=port)
    server.wait_ready(60)
    return server


@pytest.fixture(scope="module")
def results(
    engine_pool: EnginePool, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, dict[str, WorkloadResult]]]:
    """The workload's results by case (plain, speculating) and engine (real, sim)."""
    log_dir = tmp_path_factory.mktemp("sim")
    found: dict[str, dict[str, WorkloadResult]] = {}
    sims: list[EngineServer] = []
    try:
        for case, (speculative, pool_name) in CASES.items():
            sim = start_sim(speculative, log_dir)
            sims.append(sim)
            real = engine_pool.get(pool_name)
            found[case] = {
                "real": run_workload(real.url, real.served_name, MAX_MODEL_LEN),
                "sim": run_workload(sim.url, sim.served_name, MAX_MODEL_LEN),
            }
        yield found
    finally:
        for sim in sims:
            print(f"--- {sim.name} ---\n{sim.tail(10)}")
            sim.stop()


@pytest.mark.parametrize("case", CASES)
def test_the_simulator_exports_vllms_families_types_and_labels(
    results: dict[str, dict[str, WorkloadResult]], case: str
) -> None:
    real = families(results[case]["real"].after)
    simulated = families(results[case]["sim"].after)
    assert "vllm:inter_token_latency_seconds" in real
    assert ("vllm:spec_decode_num_drafts" in real) == (case == "speculating")
    assert family_differences(real, simulated) == []


@pytest.mark.parametrize("case", CASES)
def test_every_call_gets_vllms_status_error_shape_and_stream_end(
    results: dict[str, dict[str, WorkloadResult]], case: str
) -> None:
    real, simulated = results[case]["real"], results[case]["sim"]
    for call in real.calls:
        mine, theirs = simulated.answers[call.name], real.answers[call.name]
        assert (mine.status, mine.error) == (theirs.status, theirs.error), call.name
        assert mine.done == theirs.done, call.name
        assert (mine.events > 0) == (theirs.events > 0), call.name
    assert http_counts(simulated) == http_counts(real)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("engine", ["real", "sim"])
def test_the_counters_keep_vllms_relations(
    results: dict[str, dict[str, WorkloadResult]], case: str, engine: str
) -> None:
    k = K if case == "speculating" else 0
    assert relation_failures(results[case][engine], k) == []
