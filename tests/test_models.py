"""The API models read and write the YAML users write, with camelCase keys."""

from __future__ import annotations

from specdeploy.api.config import OperatorConfig
from specdeploy.api.models import AnalysisSpec, SpeculativeDeploymentSpec

MINIMAL = {
    "pair": {
        "version": "1",
        "target": {"model": "meta-llama/Llama-3.1-8B-Instruct", "revision": "main"},
        "draft": {"method": "ngram", "numSpeculativeTokens": 3},
    }
}


def test_minimal_spec_gets_defaults() -> None:
    spec = SpeculativeDeploymentSpec.model_validate(MINIMAL)
    assert spec.replicas == 1
    assert spec.engine.tensor_parallel_size == "auto"
    assert spec.placement.speculation == "Auto"
    assert spec.pair.draft.num_speculative_tokens == 3


def test_round_trip_uses_yaml_names() -> None:
    body = {
        **MINIMAL,
        "rollout": {"collapseGuard": {"floor": 0.4, "for": "5m"}},
        "modelSource": {"pvc": {"claimName": "models", "path": "llama"}},
    }
    spec = SpeculativeDeploymentSpec.model_validate(body)
    assert spec.rollout.collapse_guard is not None
    assert spec.rollout.collapse_guard.for_ == "5m"
    dumped = spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert dumped["rollout"]["collapseGuard"]["for"] == "5m"
    assert dumped["modelSource"]["pvc"]["claimName"] == "models"
    assert SpeculativeDeploymentSpec.model_validate(dumped) == spec


def test_analysis_spec_values_override_operator_defaults() -> None:
    config = OperatorConfig.from_mapping({"analysisDefaults": {"minDraftTokens": 500}})
    settings = config.analysis_for(AnalysisSpec.model_validate({"failureLimit": 4}))
    assert settings.min_draft_tokens == 500
    assert settings.failure_limit == 4
    assert settings.promote_after == 3
