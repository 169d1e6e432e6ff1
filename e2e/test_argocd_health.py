"""The Argo CD health check on SpeculativeDeployments the real operator left in each phase.

The operator runs on the test bed, and for each phase it can reach cheaply the test takes the SD
as the API server returns it and runs `examples/argocd/health/health.lua` on it (Lua 5.1 with
Argo CD's libraries only, `hack/argocd_health.py`). The verdict each phase must get is the one
in `tests/fixtures/health/health_test.yaml` (Argo CD's own health test format); the recorded
fixture of that phase must still look like the live object (phase, and the status and reason of
Ready, Progressing and Degraded), so the unit tests' fixtures cannot drift from the operator.

KWOK pods (no engine) give: no status yet, Serving, a spec not yet observed, scaled to zero,
waiting for Kueue quota, unschedulable, a canary holding on inconclusive verdicts (Prometheus has
no data for KWOK pods) and a canary rolled back on them. A pair the launcher refuses and a draft
it cannot find need the launcher itself: the process kubelet runs it, and it exits before vLLM
starts, so no engine is loaded.

`SPECDEPLOY_RECORD_HEALTH=1` writes each live object to tests/fixtures/health/<phase>.yaml (the
test namespace renamed `serving`, managedFields dropped, the checkout's path written as
`/srv/specdeploy`): that is how the fixtures were made.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from argocd_health import health_of
from engine_cluster import (
    OperatorProcess,
    get_sd,
    kwok_operator_config,
    operator_config,
    operator_in_namespace,
    stop_after_deleting_sds,
    tiny_sd,
)
from engine_harness import engine_python, tiny_models
from sd_bodies import llama_8b
from testbed import ClusterEnv, Kubectl, eventually
from testbed.conditions import condition

pytestmark = pytest.mark.e2e

__all__ = ["engine_python", "tiny_models"]  # session fixtures used here

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "health"
#: The checkout's path as the fixtures write it.
FIXTURE_ROOT = "/srv/specdeploy"
RECORD = os.environ.get("SPECDEPLOY_RECORD_HEALTH") == "1"
FIXTURE_NAMESPACE = "serving"
SUMMARY_CONDITIONS = ("Ready", "Progressing", "Degraded")


def expected_health() -> dict[str, str]:
    """The status each recorded phase must get, from health_test.yaml, by phase name."""
    cases = yaml.safe_load((FIXTURES / "health_test.yaml").read_text())["tests"]
    return {Path(c["inputPath"]).stem: c["healthStatus"]["status"] for c in cases}


def summary(sd: dict[str, Any]) -> dict[str, Any]:
    """What makes an SD this phase: the fields the health check reads."""
    status = sd.get("status") or {}
    return {
        "observed": status.get("observedGeneration") == sd["metadata"].get("generation"),
        "phase": status.get("phase"),
        "conditions": {
            t: (condition(sd, t).get("status"), condition(sd, t).get("reason"))
            for t in SUMMARY_CONDITIONS
        },
    }


def as_fixture(sd: dict[str, Any], namespace: str) -> str:
    """The SD as a fixture file: without managedFields, in the namespace `serving`, with the
    checkout's path (in the engine's PYTHONPATH) written as a neutral one."""
    kept = {**sd, "metadata": {k: v for k, v in sd["metadata"].items() if k != "managedFields"}}
    text = yaml.safe_dump(kept, sort_keys=False, width=100)
    return text.replace(namespace, FIXTURE_NAMESPACE).replace(str(REPO_ROOT), FIXTURE_ROOT)


class Recorder:
    """Checks the health of each live SD against the expected one, and its fixture."""

    def __init__(self, kubectl: Kubectl, namespace: str) -> None:
        self.kubectl = kubectl
        self.namespace = namespace
        self.expected = expected_health()
        self.seen: list[str] = []

    def check(self, phase: str, name: str) -> None:
        """Runs the health check on the SD as it is now."""
        sd = get_sd(self.kubectl, self.namespace, name)
        health = health_of(sd)
        print(f"{phase}: {health.status}: {health.message}")
        assert health.status == self.expected[phase], f"{phase}: {health} for {summary(sd)}"
        path = FIXTURES / f"{phase}.yaml"
        if RECORD:
            path.write_text(as_fixture(sd, self.namespace))
        recorded = yaml.safe_load(path.read_text())
        assert summary(recorded) == summary(sd), f"{path.name} is stale: re-record it"
        self.seen.append(phase)

    def wait(self, name: str, reached: Callable[[dict[str, Any]], bool], what: str) -> None:
        """Waits until `reached` holds for the SD."""
        eventually(lambda: reached(get_sd(self.kubectl, self.namespace, name)), 120, what)

    def when(self, phase: str, name: str, reached: Callable[[dict[str, Any]], bool]) -> None:
        """Waits until the SD is in `phase` (`reached` says so), then checks it."""
        self.wait(name, reached, f"{name}: {phase}")
        self.check(phase, name)


def reason_of(sd: dict[str, Any], type_: str) -> str | None:
    return condition(sd, type_).get("reason")


def serving(sd: dict[str, Any]) -> bool:
    return reason_of(sd, "Ready") == "AllReplicasReady"


def phase_is(phase: str) -> Callable[[dict[str, Any]], bool]:
    return lambda sd: (sd.get("status") or {}).get("phase") == phase


def with_canary(body: dict[str, Any], on_inconclusive: str) -> dict[str, Any]:
    """`body` judged as a canary every 2 s; KWOK pods give Prometheus no data: inconclusive."""
    body["spec"]["rollout"] = {
        "canary": {"replicas": 1},
        "analysis": {"interval": "2s", "window": "10s", "onInconclusive": on_inconclusive},
    }
    return body


@pytest.fixture
def kwok_operator(
    cluster: ClusterEnv, kubectl: Kubectl, namespace: str, tmp_path: Path, sd_crd: None
) -> Iterator[OperatorProcess]:
    """The operator for KWOK pods (no engine), not started: the test starts it."""
    config = kwok_operator_config(cluster.prometheus_url)
    running = OperatorProcess(cluster.kubeconfig, config, tmp_path, (namespace,))
    try:
        yield running
    finally:
        stop_after_deleting_sds(running, kubectl, namespace)


def test_health_of_each_phase_with_kwok_pods(
    kubectl: Kubectl, namespace: str, kwok_operator: OperatorProcess
) -> None:
    record = Recorder(kubectl, namespace)
    # Applied before the operator runs: no status at all.
    kubectl.apply([llama_8b("chat", namespace)])
    record.check("no-status", "chat")

    kwok_operator.start()
    record.when("serving", "chat", serving)

    # A spec change the operator has not seen yet (it is stopped).
    kwok_operator.stop()
    patch = ("patch", "sd", "chat", "-n", namespace, "--type=merge", "-p")
    kubectl.run(*patch, '{"spec":{"replicas":2}}')
    record.check("spec-not-observed", "chat")
    kwok_operator.start()

    kubectl.run(*patch, '{"spec":{"replicas":0}}')
    record.when("scaled-to-zero", "chat", lambda sd: reason_of(sd, "Ready") == "ScaledToZero")

    # 9 pods on mig-3g.40gb: the interactive queue has 6 and may borrow 2.
    kubectl.apply([llama_8b("crowd", namespace, replicas=9)])
    # Admitted is Unknown for the first seconds pods wait (Kueue admits new pods in a moment),
    # then False with what the queue lacks.
    record.when(
        "waiting-for-quota",
        "crowd",
        lambda sd: (
            condition(sd, "Admitted").get("status") == "False"
            and "lacks" in condition(sd, "Admitted").get("message", "")
        ),
    )
    kubectl.run("delete", "sd", "crowd", "-n", namespace, "--timeout=60s", timeout=70)

    huge = llama_8b("huge", namespace)
    huge["spec"]["pair"] = {
        "version": "3.1",
        "target": {"model": "meta-llama/Llama-3.1-405B-Instruct", "revision": "main"},
        "draft": {"method": "none"},
    }
    huge["spec"]["placement"]["gpu"] = {"product": "NVIDIA-H100-80GB-HBM3"}
    kubectl.apply([huge])
    record.when("unschedulable", "huge", phase_is("Failed"))

    # Two canaries, judged on no data: one holds, one is rolled back.
    policies = {"holding": "Hold", "undone": "Rollback"}
    for name, policy in policies.items():
        kubectl.apply([with_canary(llama_8b(name, namespace, draft_revision="eagle3-r1"), policy)])
    for name in policies:
        record.wait(name, serving, f"{name}: its first revision Ready")
    for name, policy in policies.items():
        kubectl.apply([with_canary(llama_8b(name, namespace, draft_revision="eagle3-r2"), policy)])
    record.when(
        "canary-analysing",
        "holding",
        lambda sd: reason_of(sd, "Progressing") == "AnalysisInconclusive",
    )
    record.when("rolled-back", "undone", phase_is("RolledBack"))
    assert len(record.seen) == 8


@pytest.fixture
def launcher_bed(
    cluster: ClusterEnv,
    kubectl: Kubectl,
    engine_python: Path,
    tmp_path: Path,
    sd_crd: None,
) -> Iterator[str]:
    """A namespace whose pods the process kubelet runs as the real launcher; its operator."""
    namespace = f"e2e-health-launcher-{uuid.uuid4().hex[:5]}"
    config = operator_config(str(engine_python), cluster.prometheus_url, interval=2)
    with operator_in_namespace(kubectl, cluster.kubeconfig, namespace, config, tmp_path):
        yield namespace


@pytest.mark.engine
def test_health_when_the_launcher_refuses_the_pair_or_cannot_find_a_model(
    kubectl: Kubectl, launcher_bed: str, tiny_models: dict[str, str]
) -> None:
    namespace = launcher_bed
    record = Recorder(kubectl, namespace)
    kubectl.apply([tiny_sd("refused", namespace, tiny_models, "eagle3-wrong-hidden", "1")])
    missing = tiny_sd("missing", namespace, tiny_models, "eagle3", "1")
    missing["spec"]["pair"]["draft"]["model"] = tiny_models["eagle3"] + "-missing"
    kubectl.apply([missing])

    record.when(
        "pair-refused",
        "refused",
        lambda sd: reason_of(sd, "PairCompatible") == "PairIncompatible",
    )
    record.when("model-not-found", "missing", lambda sd: reason_of(sd, "Ready") == "ModelNotFound")
