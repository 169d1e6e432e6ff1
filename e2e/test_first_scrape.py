"""Requests a pod serves before Prometheus first scrapes it count, in status and in the analysis.

Real CPU vLLM pods (process kubelet) and the test bed's Prometheus. The test bed's Prometheus
is frozen (SIGSTOP) from the moment a new pod runs, before its engine opens its port, until
completions sent straight to the pod have finished: the pod's counters are born in Prometheus
at their final value, as when a pod is Ready and takes traffic before the next scrape. The
operator must still read them: the first revision's acceptance in `status.acceptanceRate`, and
a canary's in its analysis verdicts, each equal to what the pod's own /metrics counted. The
operator is stalled (SIGSTOP) from the canary's start until after its first scrape, so it sees
the canary's pod Ready only then: the analysis must still start at the pod's readiness, or the
window leaves out the requests of that scrape.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_api_client import PrometheusConnect

from engine_cluster import (
    OperatorProcess,
    complete,
    engine_url,
    get_sd,
    operator_config,
    operator_running,
    revision_pods,
    tiny_sd,
    what_the_operator_measured,
)
from engine_harness import (
    ACCEPTED_TOKENS,
    DRAFT_TOKENS,
    engine_python,
    http_text,
    parse_counters,
    tiny_models,
)
from specdeploy.api.times import parse_time
from testbed import ClusterEnv, Kubectl, eventually
from testbed.conditions import condition, is_ready
from testbed.faults import paused

pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.usefixtures("sd_crd")]

__all__ = ["engine_python", "tiny_models"]  # session fixtures used here

SD = "first-scrape"
ENGINE_READY_S = 420
MIN_DRAFT_TOKENS = 60
# A window long enough that a reconcile every 2 s reads the born counters many times over.
ANALYSIS = {
    "interval": "10s",
    "window": "60s",
    "minDraftTokens": MIN_DRAFT_TOKENS,
    "minAcceptanceRate": 0.5,
    "maxDropVsStable": 0.3,
    "maxLatencyIncrease": 3.0,
    "failureLimit": 2,
    "promoteAfter": 2,
    "onInconclusive": "Hold",
}
PROMPTS = ["The cat sat on the", "In the morning the queue", "A node sees the", "The draft and"]


def first_scrape_sd(namespace: str, models: dict[str, str], version: str) -> dict[str, Any]:
    body = tiny_sd(SD, namespace, models, "draft-small", version)
    body["spec"]["rollout"] = {"canary": {"replicas": 1}, "analysis": dict(ANALYSIS)}
    return body


@dataclass
class Bed:
    cluster: ClusterEnv
    kubectl: Kubectl
    namespace: str
    models: dict[str, str]
    prometheus: PrometheusConnect
    operator: OperatorProcess

    def status(self) -> dict[str, Any]:
        found: dict[str, Any] = get_sd(self.kubectl, self.namespace, SD).get("status") or {}
        return found

    def measured(self, probe: Callable[[], Any], timeout: float, what: str) -> Any:
        """`eventually`, and when it runs out, what the operator wrote, measured and read."""
        try:
            return eventually(probe, timeout, what)
        except TimeoutError as error:
            explained = what_the_operator_measured(
                self.kubectl,
                self.cluster.prometheus_url,
                self.operator.log_text(),
                self.namespace,
                SD,
            )
            raise AssertionError(f"{error}\n{explained}") from None


@pytest.fixture
def bed(
    cluster: ClusterEnv,
    kubectl: Kubectl,
    namespace: str,
    *,
    engine_python: Path,
    tiny_models: dict[str, str],
    tmp_path: Path,
) -> Iterator[Bed]:
    """The operator watching a fresh namespace, its engines run by the process kubelet."""
    config = operator_config(str(engine_python), cluster.prometheus_url, interval=2)
    running = OperatorProcess(cluster.kubeconfig, config, tmp_path, (namespace,))
    with operator_running(running, kubectl, namespace):
        prometheus = PrometheusConnect(url=cluster.prometheus_url, disable_ssl=True)
        yield Bed(cluster, kubectl, namespace, tiny_models, prometheus, running)


def running_pod(kubectl: Kubectl, namespace: str, other_than: str | None) -> dict[str, Any]:
    """The first pod of the SD in phase Running whose revision is not `other_than`: its engine
    process has started, and loads the models for many seconds before its port opens."""

    def running() -> dict[str, Any] | None:
        for pod in revision_pods(kubectl, namespace, SD):
            revision = pod["metadata"]["labels"]["specdeploy.dev/revision"]
            if revision != other_than and (pod.get("status") or {}).get("phase") == "Running":
                return pod
        return None

    found: dict[str, Any] = eventually(running, ENGINE_READY_S, f"a new pod of {SD} running")
    return found


def answers(url: str) -> bool:
    try:
        http_text(url + "/health")
    except OSError:
        return False
    return True


def served(cluster: ClusterEnv, pod: dict[str, Any], model: str) -> dict[str, float]:
    """Sends completions to the pod; returns its own counters once they finished."""
    url = engine_url(cluster, pod)
    # A canary's analysis starts (stage Starting) before its vLLM listens: wait for it to answer.
    eventually(lambda: answers(url), ENGINE_READY_S, "the pod's vLLM answering /health")
    for prompt in PROMPTS:
        complete(url, model, prompt, max_tokens=64)
    return parse_counters(http_text(url + "/metrics"))


def live_analysis(status: dict[str, Any], canary: str) -> dict[str, Any] | None:
    """The canary's analysis once it is live (its pods Ready, its window started), else None."""
    analysis: dict[str, Any] = status.get("analysis") or {}
    live = analysis.get("revision") == canary and analysis.get("stage") == "Live"
    return analysis if live and analysis.get("startedAt") else None


def ready_since(kubectl: Kubectl, namespace: str, pod: str) -> str | None:
    """The pod's Ready condition's lastTransitionTime, once it is Ready."""
    ready = condition(kubectl.get_json("pod", pod, "-n", namespace), "Ready")
    return str(ready["lastTransitionTime"]) if ready.get("status") == "True" else None


def seconds(stamp: str) -> float:
    return parse_time(stamp).timestamp()


def first_sample(prometheus: PrometheusConnect, namespace: str, revision: str) -> float:
    """The value of the revision's first draft-token sample in Prometheus, once it has one."""
    query = f'{DRAFT_TOKENS}{{namespace="{namespace}",specdeploy_dev_revision="{revision}"}}[10m]'

    def sampled() -> float | None:
        found = prometheus.custom_query(query)
        return float(found[0]["values"][0][1]) if found else None

    value: float = eventually(sampled, 60, f"Prometheus' first sample of revision {revision}")
    return value


def test_requests_served_before_the_first_scrape_count_in_status_and_in_the_analysis(
    bed: Bed,
) -> None:
    cluster, kubectl, namespace, models = bed.cluster, bed.kubectl, bed.namespace, bed.models
    status, prometheus = bed.status, bed.prometheus

    # The first revision: served before its first scrape, its acceptance in status.
    kubectl.apply([first_scrape_sd(namespace, models, "1-small")])
    pod = stable_pod = running_pod(kubectl, namespace, other_than=None)
    stable = pod["metadata"]["labels"]["specdeploy.dev/revision"]
    with paused(cluster, "prometheus"):
        eventually(
            lambda: is_ready(get_sd(kubectl, namespace, SD)),
            ENGINE_READY_S,
            "the first revision Ready",
        )
        counted = served(cluster, pod, models["target"])
    drafted, accepted = counted[DRAFT_TOKENS], counted[ACCEPTED_TOKENS]
    print(f"\nrevision {stable} before its first scrape: {accepted:.0f} of {drafted:.0f} accepted")
    assert drafted > 0
    assert first_sample(prometheus, namespace, stable) == drafted, "scraped before the requests"
    acceptance = bed.measured(
        lambda: status().get("acceptanceRate"), 60, "the operator's status.acceptanceRate"
    )
    assert acceptance == round(accepted / drafted, 3), (acceptance, accepted, drafted)

    # A canary: served before its first scrape, its figures in its analysis verdicts; the
    # operator frozen from its Starting stage until after that scrape, so it sees the canary's
    # pod Ready only then: the analysis still starts at the pod's readiness.
    kubectl.apply([first_scrape_sd(namespace, models, "2-small")])
    pod = running_pod(kubectl, namespace, other_than=stable)
    canary = pod["metadata"]["labels"]["specdeploy.dev/revision"]
    eventually(
        lambda: (status().get("analysis") or {}).get("revision") == canary, 60, "its analysis"
    )
    with bed.operator.frozen():
        with paused(cluster, "prometheus"):
            ready_at = eventually(
                lambda: ready_since(kubectl, namespace, pod["metadata"]["name"]),
                ENGINE_READY_S,
                "the canary's pod Ready",
            )
            counted = served(cluster, pod, models["target"])
            # Its requests come after its readiness, as a Ready canary's do, and the first
            # scrape (after this block) after the window's start, the second after it.
            time.sleep(max(0.0, seconds(ready_at) + 2.0 - time.time()))
        drafted, accepted = counted[DRAFT_TOKENS], counted[ACCEPTED_TOKENS]
        print(f"canary {canary} before its first scrape: {accepted:.0f} of {drafted:.0f} accepted")
        assert drafted >= MIN_DRAFT_TOKENS
        assert first_sample(prometheus, namespace, canary) == drafted, "scraped before the requests"
        # The stable serves inside the canary's window too: its own requests of before may be
        # older than the window by now (the canary's engine took that long to start), and a
        # stable that decoded nothing in the window leaves the verdict Inconclusive.
        served(cluster, stable_pod, models["target"])
        assert (status().get("analysis") or {}).get("stage") == "Starting", "seen while frozen"
        thawed = time.time()
    live = eventually(lambda: live_analysis(status(), canary), 60, "the canary's analysis live")
    print(f"canary Ready at {ready_at}, the operator back at {thawed:.1f}: live from {live}")
    assert seconds(live["startedAt"]) == seconds(ready_at) + 1, (live, ready_at)

    def counted_verdict() -> dict[str, Any] | None:
        for record in status().get("revisions") or []:
            if record["revision"] == canary:
                for verdict in record.get("verdicts") or []:
                    compared = verdict.get("stableTimePerOutputTokenSeconds") is not None
                    if verdict.get("draftTokens") and compared:
                        return dict(verdict)
        return None

    verdict = bed.measured(
        counted_verdict, 90, "a verdict of the canary that counted draft tokens beside the stable"
    )
    assert verdict["draftTokens"] == int(drafted), verdict
    assert verdict["acceptanceRate"] == round(accepted / drafted, 3), (verdict, accepted, drafted)
    assert verdict["result"] == "Pass", verdict
    print(f"status.acceptanceRate {acceptance}; the canary's first counted verdict {verdict}")
