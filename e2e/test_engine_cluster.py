"""The operator with the real engine: SD pods run the launcher and CPU vLLM through the test bed.

The operator runs with `localProcess: true` and the engine venv's python as the engine command, so
the process kubelet runs each pod the operator builds as a real launcher + vLLM process (on the
CPU; the pod holds the smallest MIG slice of a KWOK node). One SD serves the tiny target with
`draft-small`; a draft-less SD of the same target gives the reference output; the same SD is then
pointed at each mismatched draft in turn, which the launcher refuses before vLLM starts while
the good revision keeps serving. Prometheus scrapes the pods through their scrape annotations,
or, once the Prometheus Operator's real PodMonitor CRD is served, through the operator's
PodMonitor. At most two engines run at once.
"""

from __future__ import annotations

import re
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_cluster import (
    complete,
    engine_url,
    events_of,
    get_sd,
    operator_config,
    operator_in_namespace,
    prometheus_value,
    ready_pod,
    revision_pods,
    spec_decode_queries,
    tiny_sd,
)
from engine_harness import DRAFT_TOKENS, engine_python, http_json, tiny_models
from testbed import ClusterEnv, Kubectl, eventually
from testbed.conditions import condition, is_ready
from testbed.prometheus_operator import (
    POD_MONITOR_CRD_NAME,
    VERSION_ANNOTATION,
    pinned_version,
    served_pod_monitor_crd,
)

pytestmark = [pytest.mark.e2e, pytest.mark.engine]

__all__ = ["engine_python", "tiny_models"]  # session fixtures used here

SD = "chat"
PLAIN = "chat-plain"
MONITORED = "chat-monitored"
ENGINE_READY_S = 420
PROMPTS = ["The cat sat on the", "In the morning the queue", "A node sees"]
# Each refusal names what does not match, as the launcher words it (docs/engine.md).
MISMATCHES = {
    "eagle3-wrong-hidden": r"hidden size",
    "eagle3-other-verifier": r"specdeploy-tiny/other-target",
    "draft-other-tokenizer": r"tokenizer",
}


class Bed:
    """The namespace, the operator and the handles the tests share."""

    def __init__(
        self, cluster: ClusterEnv, kubectl: Kubectl, namespace: str, models: dict[str, str]
    ) -> None:
        self.cluster = cluster
        self.kubectl = kubectl
        self.namespace = namespace
        self.models = models

    def sd(self, name: str = SD) -> dict[str, Any]:
        return get_sd(self.kubectl, self.namespace, name)

    def wait_ready(self, name: str) -> tuple[str, dict[str, Any]]:
        """Waits for Ready=True; returns the serving revision and its ready pod."""

        def ready() -> dict[str, Any] | None:
            sd = self.sd(name)
            return sd if is_ready(sd) else None

        sd = eventually(ready, ENGINE_READY_S, f"SD {name} Ready")
        revision = sd["status"]["stableRevision"]
        pod = ready_pod(self.kubectl, self.namespace, name, revision)
        assert pod is not None, f"SD {name} is Ready but no pod of {revision} is"
        return revision, pod

    def token_ids(self, url: str, prompt: str) -> list[int]:
        answer = complete(url, self.models["target"], prompt, max_tokens=32)
        ids: list[int] = answer["choices"][0]["token_ids"]
        return ids


@pytest.fixture(scope="module")
def bed(
    cluster: ClusterEnv,
    kubectl: Kubectl,
    engine_python: Path,
    tiny_models: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Bed]:
    namespace = f"e2e-engine-cluster-{uuid.uuid4().hex[:5]}"
    # A timer far beyond every wait below: the operator must act on the watch events of its
    # Deployments and of pods whose launcher exited, not on its periodic reconcile.
    config = operator_config(str(engine_python), cluster.prometheus_url, interval=600)
    workdir = tmp_path_factory.mktemp("operator")
    with operator_in_namespace(kubectl, cluster.kubeconfig, namespace, config, workdir):
        yield Bed(cluster, kubectl, namespace, tiny_models)


def scraped_counters(bed: Bed, queries: dict[str, str], what: str) -> dict[str, float]:
    """The draft and accepted token counts, once Prometheus has scraped some drafts."""

    def scraped() -> dict[str, float] | None:
        values = {k: prometheus_value(bed.cluster.prometheus_url, q) for k, q in queries.items()}
        if values["draft"] and values["accepted"] is not None:
            return {k: v or 0.0 for k, v in values.items()}
        return None

    return eventually(scraped, 60, what)


@pytest.fixture(scope="module")
def serving(bed: Bed) -> tuple[str, dict[str, Any], str]:
    """The good pair (draft-small) Ready: its revision, its pod and the engine's local URL."""
    bed.kubectl.apply([tiny_sd(SD, bed.namespace, bed.models, "draft-small", "1-small")])
    revision, pod = bed.wait_ready(SD)
    return revision, pod, engine_url(bed.cluster, pod)


def test_the_good_pair_is_served_by_vllm_with_its_draft_and_scraped(
    bed: Bed, serving: tuple[str, dict[str, Any], str]
) -> None:
    revision, pod, url = serving
    sd = bed.sd()
    assert condition(sd, "PairCompatible")["status"] == "True"
    assert condition(sd, "PairCompatible")["reason"] == "PairVerified"
    assert sd["status"]["phase"] == "Serving"
    # The pod holds the smallest MIG slice of a KWOK node; its process runs here.
    assert sd["status"]["sizing"]["resourceName"] == "nvidia.com/mig-1g.10gb"
    assert pod["spec"]["nodeName"].startswith("kwok-")
    container = pod["spec"]["containers"][0]
    assert container["args"][:2] == ["serve", "--"]
    assert "--speculative-config" in container["args"]

    answer = complete(url, bed.models["target"], PROMPTS[0], max_tokens=32)
    assert answer["usage"]["completion_tokens"] == 32
    assert answer["choices"][0]["text"]

    # No PodMonitor CRD is served: the operator's scrape annotations on the pod.
    queries = spec_decode_queries(
        bed.namespace, pod["metadata"]["name"], revision, job="kubernetes-pods"
    )
    counters = scraped_counters(bed, queries, "spec-decode counters under the pod's labels")
    assert counters["draft"] > 0
    assert 0 < counters["accepted"] <= counters["draft"]
    print(f"acceptance in Prometheus: {counters['accepted']:.0f}/{counters['draft']:.0f}")


def test_greedy_output_with_speculation_equals_output_without(
    bed: Bed, serving: tuple[str, dict[str, Any], str]
) -> None:
    _, _, url = serving
    bed.kubectl.apply([tiny_sd(PLAIN, bed.namespace, bed.models, None, "1-plain")])
    try:
        _, plain_pod = bed.wait_ready(PLAIN)
        plain_url = engine_url(bed.cluster, plain_pod)
        assert "--speculative-config" not in plain_pod["spec"]["containers"][0]["args"]
        for prompt in PROMPTS:
            assert bed.token_ids(url, prompt) == bed.token_ids(plain_url, prompt), prompt
    finally:
        bed.kubectl.run("delete", "sd", PLAIN, "-n", bed.namespace, "--timeout=60s", check=False)


@pytest.mark.parametrize("draft", list(MISMATCHES))
def test_a_mismatched_draft_is_refused_and_the_good_pair_keeps_serving(
    bed: Bed, serving: tuple[str, dict[str, Any], str], draft: str
) -> None:
    stable, _, url = serving
    bed.kubectl.apply([tiny_sd(SD, bed.namespace, bed.models, draft, f"2-{draft}")])

    def refused() -> dict[str, Any] | None:
        sd = bed.sd()
        pair = condition(sd, "PairCompatible")
        bad = pair.get("status") == "False" and sd["status"].get("stableRevision") == stable
        return sd if bad and re.search(MISMATCHES[draft], pair.get("message", "")) else None

    sd = eventually(refused, 90, f"PairCompatible=False for {draft}")
    pair = condition(sd, "PairCompatible")
    assert pair["reason"] == "PairIncompatible"
    print(f"{draft}: {pair['message']}")
    failed = [r for r in sd["status"]["revisions"] if r["phase"] == "Failed"]
    [refused_revision] = [r["revision"] for r in failed if r["draft"]["model"].endswith(draft)]
    assert sd["status"]["phase"] == "Degraded"
    # Ready means serving: the good pair serves every replica; Degraded says why.
    ready = condition(sd, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "AllReplicasReady"), ready
    assert "stopped (PairIncompatible" in ready["message"]

    warnings = [
        e
        for e in events_of(bed.kubectl, bed.namespace, SD)
        if e["type"] == "Warning" and e["reason"] == "PairIncompatible"
    ]
    assert any(
        refused_revision in e["message"] and pair["message"] in e["message"] for e in warnings
    )

    # Stopped, not crash-looping: the revision is at zero and its pod is gone.
    deployment = f"{SD}-{refused_revision}"

    def stopped() -> bool:
        replicas = bed.kubectl.get_json("deployment", deployment, "-n", bed.namespace)["spec"][
            "replicas"
        ]
        pods = revision_pods(bed.kubectl, bed.namespace, SD, refused_revision)
        for pod in pods:
            for status in pod["status"].get("containerStatuses") or []:
                assert status.get("restartCount", 0) <= 1, "the refused pod crash-loops"
        return replicas == 0 and not pods

    eventually(stopped, 60, f"revision {refused_revision} scaled to zero with no pod left")

    # The good pair still serves, from the same pod.
    assert bed.sd()["status"]["stableRevision"] == stable
    assert ready_pod(bed.kubectl, bed.namespace, SD, stable) is not None
    assert complete(url, bed.models["target"], PROMPTS[1], max_tokens=8)["choices"][0]["text"]

    # Steady: the refusal stays remembered without its pods.
    again = bed.sd()
    assert condition(again, "PairCompatible")["message"] == pair["message"]
    assert (
        bed.kubectl.get_json("deployment", deployment, "-n", bed.namespace)["spec"]["replicas"] == 0
    )


def test_a_missing_draft_is_told_apart_from_a_refused_pair(
    bed: Bed, serving: tuple[str, dict[str, Any], str]
) -> None:
    stable, _, url = serving
    body = tiny_sd(SD, bed.namespace, bed.models, "eagle3", "3-missing")
    missing = bed.models["eagle3"] + "-missing"
    body["spec"]["pair"]["draft"]["model"] = missing
    bed.kubectl.apply([body])

    def unknown() -> dict[str, Any] | None:
        sd = bed.sd()
        pair = condition(sd, "PairCompatible")
        return sd if pair.get("reason") == "ModelNotFound" and missing in pair["message"] else None

    sd = eventually(unknown, 90, "PairCompatible=Unknown with reason ModelNotFound")
    assert condition(sd, "PairCompatible")["status"] == "Unknown"
    assert condition(sd, "Ready")["reason"] == "ModelNotFound"
    print(f"missing draft: {condition(sd, 'PairCompatible')['message']}")
    warnings = [
        e
        for e in events_of(bed.kubectl, bed.namespace, SD)
        if e["type"] == "Warning" and e["reason"] == "ModelNotFound"
    ]
    assert warnings
    # Not a verdict on the pair: the revision keeps its pod (under back-off), not marked Failed.
    [record] = [r for r in sd["status"]["revisions"] if r["draft"].get("model") == missing]
    assert record["phase"] != "Failed"
    deployment = f"{SD}-{record['revision']}"
    assert (
        bed.kubectl.get_json("deployment", deployment, "-n", bed.namespace)["spec"]["replicas"] == 1
    )
    assert bed.sd()["status"]["stableRevision"] == stable
    assert complete(url, bed.models["target"], PROMPTS[2], max_tokens=8)["choices"][0]["text"]


def test_with_the_pod_monitor_crd_prometheus_scrapes_the_pair_through_the_operators_podmonitor(
    bed: Bed,
) -> None:
    with served_pod_monitor_crd(bed.kubectl):
        # The Prometheus Operator's own CRD, not a stand-in that keeps any field.
        live_crd = bed.kubectl.get_json("crd", POD_MONITOR_CRD_NAME)
        served_version = (live_crd["metadata"].get("annotations") or {}).get(VERSION_ANNOTATION)
        assert served_version == pinned_version().removeprefix("v")
        try:
            bed.kubectl.apply(
                [tiny_sd(MONITORED, bed.namespace, bed.models, "draft-small", "1-monitored")]
            )
            revision, pod = bed.wait_ready(MONITORED)
            monitor = bed.kubectl.get_json("podmonitor", MONITORED, "-n", bed.namespace)
            assert monitor["metadata"]["ownerReferences"][0]["name"] == MONITORED
            url = engine_url(bed.cluster, pod)
            answer = complete(url, bed.models["target"], PROMPTS[0], max_tokens=32)
            assert answer["usage"]["completion_tokens"] == 32

            # The job names the PodMonitor: these series cannot come from the annotations.
            job = f"{bed.namespace}/{MONITORED}"
            queries = spec_decode_queries(bed.namespace, pod["metadata"]["name"], revision, job)
            counters = scraped_counters(
                bed, queries, f"spec-decode counters under job {job} and revision {revision}"
            )
            assert counters["draft"] > 0
            assert 0 < counters["accepted"] <= counters["draft"]
            print(f"through {job}: {counters['accepted']:.0f}/{counters['draft']:.0f} accepted")

            # Labelled as the Prometheus Operator does: the endpoint, and of the pod's labels
            # only the podTargetLabels (no pod-template-hash, no Kueue queue name).
            labels = f'namespace="{bed.namespace}",pod="{pod["metadata"]["name"]}",job="{job}"'
            query = urllib.parse.urlencode({"query": f"{DRAFT_TOKENS}{{{labels}}}"})
            prometheus = bed.cluster.prometheus_url
            [series] = http_json(f"{prometheus}/api/v1/query?{query}")["data"]["result"]
            metric = series["metric"]
            assert metric["endpoint"] == "http"
            assert metric["specdeploy_dev_name"] == MONITORED
            assert metric["specdeploy_dev_revision"] == revision
            assert "pod-template-hash" in pod["metadata"]["labels"]
            assert "pod_template_hash" not in metric
            assert not [k for k in metric if k.startswith("kueue")]
        finally:
            bed.kubectl.run(
                "delete", "sd", MONITORED, "-n", bed.namespace, "--timeout=90s", check=False
            )
