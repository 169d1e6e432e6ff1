"""Simulator profiles through the engine launcher, and the contract's family comparison."""

from __future__ import annotations

import json

import pytest

from sim_contract import families, family_differences
from specdeploy.api.contract import EXIT_MODEL_UNAVAILABLE
from specdeploy.engine import launcher
from specdeploy.sim.metrics import EngineMetrics
from specdeploy.sim.profiles import ProfileError, load_catalog, parse_catalog

TARGET = "sim/llama-3.1-70b-h100"


def args(draft: str, method: str = "eagle3") -> list[str]:
    spec = {"method": method, "model": draft, "num_speculative_tokens": 3}
    return [TARGET, "--port", "8000", "--speculative-config", json.dumps(spec)]


def test_the_launcher_checks_a_sim_pair_on_the_configs_its_profiles_declare() -> None:
    results = launcher.check_serve_args(args("sim/eagle3-good"), {})
    assert results
    assert not [r for r in results if r.failed]
    refused = launcher.check_serve_args(args("sim/eagle3-8b-good"), {})
    messages = " ".join(r.message for r in refused if r.failed)
    assert "trained for verifier sim/llama-3.1-8b-h100" in messages


def test_the_launcher_execs_the_simulator_for_a_sim_target_and_vllm_otherwise() -> None:
    sim = launcher.vllm_command(launcher.parse_serve_args(args("sim/eagle3-good")), "cli", "py")
    assert sim[:3] == ["py", "-m", "specdeploy.sim"]
    assert sim[3:] == args("sim/eagle3-good")
    real = launcher.parse_serve_args(["/models/target", "--port", "8000"])
    assert launcher.vllm_command(real, "cli", "py")[:2] == ["vllm", "serve"]


def test_an_unknown_profile_is_a_missing_model() -> None:
    with pytest.raises(launcher.LaunchError) as refused:
        launcher.check_serve_args(args("sim/no-such-head"), {})
    assert refused.value.code == EXIT_MODEL_UNAVAILABLE
    assert "no simulator profile sim/no-such-head" in refused.value.message


def test_a_catalog_file_adds_and_replaces_profiles(tmp_path: object) -> None:
    catalog = parse_catalog(
        [
            {"targets": {TARGET: {"stepMs": 20, "prefillTokensPerSecond": 1, "kvTokens": 16}}},
            {
                "drafts": {
                    "sim/flaky": {
                        "method": "eagle3",
                        "verifier": TARGET,
                        "acceptance": [0.5],
                        "draftMs": 1,
                        "faults": {"errorRates": {503: 0.2}, "crashAfterRequests": 9},
                    }
                }
            },
        ]
    )
    flaky = catalog.draft("sim/flaky")
    assert flaky.faults.error_rates == {503: 0.2}
    assert flaky.faults.crash_after_requests == 9
    with pytest.raises(ProfileError, match="unknown fault knob"):
        parse_catalog(
            [
                {
                    "drafts": {
                        "sim/x": {
                            **{"method": "ngram", "acceptance": [0.1]},
                            "draftMs": 0,
                            "faults": {"bogus": 1},
                        }
                    }
                }
            ]
        )


def test_the_family_comparison_names_a_renamed_and_a_relabelled_family() -> None:
    text = EngineMetrics("m", 512, 3, cache_info={}).exposition().decode()
    real = families(text)
    assert family_differences(real, families(text)) == []
    renamed = families(text.replace("vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_percent"))
    assert family_differences(real, renamed) == [
        "missing in the simulator: vllm:kv_cache_usage_perc (gauge)",
        "not exported by vLLM: vllm:kv_cache_usage_percent (gauge)",
    ]
    relabelled = families(text.replace('finished_reason="', 'finish_reason="'))
    assert (
        "vllm:request_success: labels ['engine', 'finish_reason', 'model_name'], vLLM's are "
        "['engine', 'finished_reason', 'model_name']" in family_differences(real, relabelled)
    )


def test_every_builtin_profile_parses_and_its_drafts_name_a_known_target() -> None:
    catalog = load_catalog()
    for draft in catalog.drafts.values():
        verifier = draft.config.get("speculators_config", {}).get("verifier", {})
        if verifier:
            assert verifier["name_or_path"] in catalog.targets, draft.name
