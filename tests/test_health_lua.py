"""The Argo CD health check (examples/argocd/health/health.lua), run on Lua 5.1 as Argo CD does.

The inputs are SpeculativeDeployments the real operator wrote on the test bed
(tests/fixtures/health/, recorded by e2e/test_argocd_health.py); the expected statuses and
messages are in tests/fixtures/health/health_test.yaml, Argo CD's own health test format.
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from argocd_health import (
    ARGOCD_CM,
    HEALTH_KEY,
    HEALTH_LUA,
    HEALTH_STATUSES,
    health_of,
    render_argocd_cm,
)
from specdeploy.api.conditions import ConditionType, Phase, Reason

FIXTURES = Path(__file__).parent / "fixtures" / "health"
CASES = yaml.safe_load((FIXTURES / "health_test.yaml").read_text())["tests"]


def fixture(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((FIXTURES / name).read_text())
    return loaded


def set_condition(sd: dict[str, Any], type_: str, status: str, reason: str, message: str) -> None:
    for item in sd["status"]["conditions"]:
        if item["type"] == type_:
            item.update(status=status, reason=reason, message=message)


@pytest.mark.parametrize("case", CASES, ids=[c["inputPath"] for c in CASES])
def test_recorded_phase_gets_its_health(case: dict[str, Any]) -> None:
    health = health_of(fixture(case["inputPath"]))
    assert (health.status, health.message) == (
        case["healthStatus"]["status"],
        case["healthStatus"]["message"],
    )


def test_every_health_status_the_check_gives_has_a_recorded_phase() -> None:
    assert {c["healthStatus"]["status"] for c in CASES} == {
        "Healthy",
        "Progressing",
        "Degraded",
        "Suspended",
    }
    assert sorted(p.name for p in FIXTURES.glob("*.yaml") if p.name != "health_test.yaml") == (
        sorted(c["inputPath"] for c in CASES)
    )


def test_argocd_cm_carries_the_script_as_it_is() -> None:
    assert ARGOCD_CM.read_text() == render_argocd_cm(HEALTH_LUA.read_text()), (
        "examples/argocd/argocd-cm-health.yaml is stale: run python hack/argocd_health.py"
    )
    config_map = yaml.safe_load(ARGOCD_CM.read_text())
    assert config_map["metadata"]["name"] == "argocd-cm"
    assert config_map["data"] == {HEALTH_KEY: HEALTH_LUA.read_text()}


def test_a_collapsed_acceptance_rate_is_degraded_while_ready() -> None:
    """The collapse guard fired: the pair serves (Ready) without its draft; Degraded says so."""
    sd = fixture("serving.yaml")
    message = "acceptance 0.12 below the floor 0.5 for 10m; DisableSpeculation"
    set_condition(sd, ConditionType.DEGRADED, "True", Reason.ACCEPTANCE_COLLAPSED, message)
    health = health_of(sd)
    assert (health.status, health.message) == ("Degraded", message)


def test_a_status_without_conditions_is_progressing() -> None:
    sd = fixture("serving.yaml")
    sd["status"] = {"observedGeneration": sd["metadata"]["generation"]}
    assert health_of(sd).status == "Progressing"


PHASES = [v for k, v in vars(Phase).items() if k.isupper()]


@pytest.mark.parametrize(
    ("phase", "ready", "degraded"),
    list(itertools.product(PHASES, ("True", "False", "Unknown"), ("True", "False"))),
)
def test_every_phase_and_condition_mix_gets_a_status(phase: str, ready: str, degraded: str) -> None:
    sd = copy.deepcopy(fixture("serving.yaml"))
    sd["status"]["phase"] = phase
    set_condition(sd, ConditionType.READY, ready, Reason.REPLICAS_NOT_READY, "")
    set_condition(sd, ConditionType.DEGRADED, degraded, Reason.HEALTHY, "")
    health = health_of(sd)
    assert health.status in HEALTH_STATUSES
    if degraded == "True" or phase in (Phase.FAILED, Phase.DEGRADED, Phase.ROLLED_BACK):
        assert health.status == "Degraded"
    elif ready == "True":
        assert health.status == "Healthy"
    else:
        assert health.status == "Progressing"
    assert health.message, "an empty message tells an Argo CD user nothing"


def test_the_runner_gives_scripts_only_what_argo_cd_gives() -> None:
    """Argo CD opens no string library: a script calling it must fail here too."""
    with pytest.raises(Exception, match="string"):
        health_of({"metadata": {}}, 'return {status = string.upper("healthy")}')
    with pytest.raises(Exception, match="index a string"):
        health_of({"metadata": {}}, 'return {status = ("Healthy"):lower()}')
    with pytest.raises(ValueError, match="status 'Fine'"):
        health_of({"metadata": {}}, 'return {status = "Fine"}')
