"""Engine pods on the test bed without a real engine: a rollout held to spec.rollout.maxSurge
within a quota that has room for only part of a second set of pods, the reasons pods cannot
start named in Ready and Progressing (an image the nodes lack, a missing Secret, a pod no node
takes), and Kueue's integrations checked at the operator's start and on the pods.

GPU pods are KWOK-run, except where the process kubelet must show what a kubelet shows (image
pulls, a missing Secret): there the operator runs in local-process mode, and the pods never get
as far as starting a process.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_cluster import (
    OperatorProcess,
    get_sd,
    kwok_operator_config,
    operator_running,
)
from sd_bodies import llama_8b
from testbed import ClusterEnv, Kubectl, eventually
from testbed.conditions import condition, is_ready

pytestmark = pytest.mark.e2e

NAME_LABEL = "specdeploy.dev/name"
REVISION_LABEL = "specdeploy.dev/revision"
ADMISSION_GATE = "kueue.x-k8s.io/admission"
#: How soon each reason must show in the status.
WITHIN_S = 60


def pods_of(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = kubectl.get_json(
        "pods", "-n", namespace, "-l", f"{NAME_LABEL}={name}"
    )["items"]
    return found


def deployments_of(kubectl: Kubectl, namespace: str, name: str) -> dict[str, tuple[int, int]]:
    """{revision: (replicas, ready replicas)} of an SD's revision Deployments."""
    items = kubectl.get_json("deployments", "-n", namespace, "-l", f"{NAME_LABEL}={name}")["items"]
    return {
        d["metadata"]["labels"][REVISION_LABEL]: (
            int(d["spec"].get("replicas") or 0),
            int((d.get("status") or {}).get("readyReplicas") or 0),
        )
        for d in items
    }


def ready_condition_with(
    kubectl: Kubectl, namespace: str, name: str, reason: str
) -> dict[str, Any]:
    """The SD's Ready condition once it is False with `reason` (within a minute)."""

    def shown() -> dict[str, Any] | None:
        ready = condition(get_sd(kubectl, namespace, name), "Ready")
        return ready if (ready.get("status"), ready.get("reason")) == ("False", reason) else None

    found: dict[str, Any] = eventually(shown, WITHIN_S, f"Ready=False {reason} on SD {name}")
    return found


# --- maxSurge: a rollout within a quota that has room for part of a second set --------------


def surge_queue(namespace: str, slices: int) -> list[dict[str, Any]]:
    """A ClusterQueue of its own for the namespace with `slices` mig-3g.40gb slices (nothing to
    borrow), and the LocalQueue `surge` pointing at it."""
    name = f"surge-{namespace}"[:63]
    return [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "resourceGroups": [
                    {
                        "coveredResources": [
                            "cpu",
                            "memory",
                            "ephemeral-storage",
                            "nvidia.com/mig-3g.40gb",
                        ],
                        "flavors": [
                            {
                                "name": "h100-80gb-mig",
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "100"},
                                    {"name": "memory", "nominalQuota": "1Ti"},
                                    {"name": "ephemeral-storage", "nominalQuota": "10Ti"},
                                    {"name": "nvidia.com/mig-3g.40gb", "nominalQuota": slices},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "surge", "namespace": namespace},
            "spec": {"clusterQueue": name},
        },
    ]


class DeploymentSampler:
    """Samples an SD's revision Deployments every 0.3 s in the background."""

    def __init__(self, kubectl: Kubectl, namespace: str, name: str) -> None:
        self.kubectl, self.namespace, self.name = kubectl, namespace, name
        self.samples: list[dict[str, tuple[int, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> DeploymentSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(deployments_of(self.kubectl, self.namespace, self.name))
            except Exception as error:  # a timed-out kubectl: the next sample counts
                print(f"sample failed: {error}")
            time.sleep(0.3)


def serving_revision(kubectl: Kubectl, namespace: str, name: str) -> str | None:
    sd = get_sd(kubectl, namespace, name)
    ready = is_ready(sd)
    stable: str | None = (sd.get("status") or {}).get("stableRevision")
    return stable if ready else None


def test_max_surge_replaces_a_revision_step_by_step_within_part_of_a_second_set(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    """3 replicas, quota for 4 slices: with maxSurge 1 a new revision replaces the old one pod
    by pod and never asks for more than 4; without it, it asks for 6 and waits for quota."""
    queues = surge_queue(namespace, slices=4)
    kubectl.apply(queues)
    try:
        rollout_within_surge(kubectl, namespace)
    finally:
        # Kueue finalizes it once the namespace and its Workloads are gone.
        name = queues[0]["metadata"]["name"]
        kubectl.run("delete", "clusterqueue", name, "--wait=false", check=False)


def rollout_within_surge(kubectl: Kubectl, namespace: str) -> None:
    body = llama_8b("surge", namespace, replicas=3)
    body["spec"]["placement"]["queue"] = "surge"
    body["spec"]["rollout"] = {"maxSurge": 1}
    kubectl.apply([body])
    first = eventually(
        lambda: serving_revision(kubectl, namespace, "surge"), 120, "the first revision Ready"
    )

    body["spec"]["pair"]["draft"]["revision"] = "eagle3-r2"
    with DeploymentSampler(kubectl, namespace, "surge") as sampler:
        kubectl.apply([body])
        second = eventually(
            lambda: (r := serving_revision(kubectl, namespace, "surge")) != first and r,
            180,
            "the second revision Ready",
        )
        eventually(
            lambda: deployments_of(kubectl, namespace, "surge").get(first) == (0, 0),
            60,
            "the first revision at zero",
        )
    # Never more than replicas + maxSurge pods asked for at any sampled moment: from 3 old
    # pods to 3 new ones that can only be step by step (which steps a 0.3 s sample catches
    # depends on how fast KWOK's pods turn ready, so they are not asserted one by one).
    totals = [sum(replicas for replicas, _ in s.values()) for s in sampler.samples]
    assert max(totals) <= 4, sampler.samples
    assert sorted(deployments_of(kubectl, namespace, "surge").values()) == [(0, 0), (3, 3)]
    # Ready pods of the two never fell below replicas while the old ones went.
    assert min(sum(ready for _, ready in s.values()) for s in sampler.samples[1:]) >= 3

    # Without maxSurge the same change asks for a second full set: 3 more slices than the 4
    # of the quota hold, so the new revision waits for quota and the old one keeps serving.
    del body["spec"]["rollout"]
    body["spec"]["pair"]["draft"]["revision"] = "eagle3-r3"
    kubectl.apply([body])

    def waiting() -> dict[str, Any] | None:
        sd = get_sd(kubectl, namespace, "surge")
        admitted = condition(sd, "Admitted")
        held = re.search(r"\b2 of \d+ pods wait for quota", admitted.get("message", ""))
        return sd if admitted.get("reason") == "WaitingForQuota" and held else None

    # 3 stable pods and 3 new ones: one new pod fits the 4 slices, 2 wait.
    sd = eventually(waiting, 60, "two pods of the third revision waiting for quota")
    assert sd["status"]["stableRevision"] == second
    third = next(r for r in deployments_of(kubectl, namespace, "surge") if r not in (first, second))
    assert deployments_of(kubectl, namespace, "surge")[third][0] == 3


# --- pods that cannot start, named in Ready and Progressing ----------------------------------


@pytest.fixture
def local_operator(
    cluster: ClusterEnv, kubectl: Kubectl, namespace: str, tmp_path: Path, sd_crd: None
) -> Iterator[OperatorProcess]:
    """The operator in local-process mode: the process kubelet runs (or fails to run) its pods.
    Its engine command never gets to run in these tests."""
    config = {
        **kwok_operator_config(cluster.prometheus_url),
        "localProcess": True,
        "engineImage": "specdeploy/engine:e2e",
        "engineCommand": ["python3", "-c", "import time; time.sleep(600)"],
    }
    running = OperatorProcess(cluster.kubeconfig, config, tmp_path, (namespace,))
    with operator_running(running, kubectl, namespace):
        yield running


def test_an_image_the_nodes_lack_is_named_with_the_pod(
    kubectl: Kubectl, namespace: str, local_operator: OperatorProcess
) -> None:
    body = llama_8b("nopull", namespace)
    body["spec"]["engine"]["image"] = "registry.invalid/specdeploy/engine:0.1.0"
    kubectl.apply([body])
    ready = ready_condition_with(kubectl, namespace, "nopull", "ImagePullFailed")
    [pod] = pods_of(kubectl, namespace, "nopull")
    name = pod["metadata"]["name"]
    assert f"pod {name} cannot pull its image" in ready["message"]
    assert "registry.invalid/specdeploy/engine:0.1.0" in ready["message"]
    progressing = condition(get_sd(kubectl, namespace, "nopull"), "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "ImagePullFailed")
    assert name in progressing["message"]
    waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] in ("ErrImagePull", "ImagePullBackOff")


def test_a_missing_secret_is_named_with_the_pod(
    kubectl: Kubectl, namespace: str, local_operator: OperatorProcess
) -> None:
    body = llama_8b("nosecret", namespace)
    body["spec"]["modelSource"] = {"hub": {"tokenSecretRef": {"name": "hf-missing", "key": "t"}}}
    kubectl.apply([body])
    ready = ready_condition_with(kubectl, namespace, "nosecret", "CreateContainerConfigError")
    [pod] = pods_of(kubectl, namespace, "nosecret")
    assert f"pod {pod['metadata']['name']} cannot start its engine" in ready["message"]
    assert 'secret "hf-missing" not found' in ready["message"]


def test_a_pod_no_node_takes_is_named_with_the_schedulers_word(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    body = llama_8b("nowhere", namespace)
    body["spec"]["placement"]["nodeSelector"] = {"e2e.example/pool": "none"}
    kubectl.apply([body])
    ready = ready_condition_with(kubectl, namespace, "nowhere", "PodUnschedulable")
    [pod] = pods_of(kubectl, namespace, "nowhere")
    assert f"pod {pod['metadata']['name']} cannot be scheduled" in ready["message"]
    # The scheduler's own words, from the pod's PodScheduled condition.
    assert "node(s) didn't match Pod's node affinity/selector" in ready["message"]
    # Kueue admitted it: the quota was there, no node is.
    assert condition(get_sd(kubectl, namespace, "nowhere"), "Admitted")["status"] == "True"


# --- Kueue's integrations: checked at the start and on the pods -------------------------------

KUEUE_MUTATING = "kueue-mutating-webhook-configuration"


def without_kueues_deployment_webhook(kubectl: Kubectl) -> dict[str, Any]:
    """Removes Kueue's mutating webhook for Deployments from the test bed (as a Kueue whose
    configuration's integrations leave `deployment` out would not mutate them); returns the
    configuration as it was, to be put back."""
    original: dict[str, Any] = kubectl.get_json("mutatingwebhookconfiguration", KUEUE_MUTATING)
    index = next(i for i, w in enumerate(original["webhooks"]) if w["name"] == "mdeployment.kb.io")
    patch = json.dumps([{"op": "remove", "path": f"/webhooks/{index}"}])
    kubectl.run("patch", "mutatingwebhookconfiguration", KUEUE_MUTATING, "--type=json", "-p", patch)
    return original


def put_back(kubectl: Kubectl, original: dict[str, Any]) -> None:
    restored = {k: v for k, v in original.items() if k in ("apiVersion", "kind", "webhooks")}
    restored["metadata"] = {"name": original["metadata"]["name"]}
    kubectl.run("replace", "-f", "-", stdin=json.dumps(restored))


def test_quota_that_kueue_does_not_enforce_is_said_in_the_log_and_in_admitted(
    cluster: ClusterEnv, kubectl: Kubectl, namespace: str, tmp_path: Path, sd_crd: None
) -> None:
    running = OperatorProcess(
        cluster.kubeconfig, kwok_operator_config(cluster.prometheus_url), tmp_path, (namespace,)
    )
    original = without_kueues_deployment_webhook(kubectl)
    try:
        with operator_running(running, kubectl, namespace):
            # The pods run outside Kueue: no gate, no Workload. The pods say so...
            kubectl.apply([llama_8b("free", namespace)])

            def bypassed() -> dict[str, Any] | None:
                admitted = condition(get_sd(kubectl, namespace, "free"), "Admitted")
                return admitted if admitted.get("reason") == "QuotaBypassed" else None

            admitted = eventually(bypassed, WITHIN_S, "Admitted=False QuotaBypassed")
            # ... and the start-up check said it before any pod: the Deployment webhook.
            assert admitted["status"] == "False"
            assert admitted["message"] == (
                "Kueue's mutating webhook for Deployments (mdeployment.kb.io) is not "
                "registered, so LocalQueue interactive does not hold back pods: they would "
                "bypass quota"
            )
            assert (
                "quota would be bypassed: Kueue's mutating webhook for Deployments "
                "(mdeployment.kb.io) is not registered" in running.log_text()
            )
            pod = eventually(
                lambda: next(iter(pods_of(kubectl, namespace, "free")), None), 30, "a pod"
            )
            assert ADMISSION_GATE not in [
                g["name"] for g in pod["spec"].get("schedulingGates") or []
            ]

            # The operator started again with the webhook back (a resync would see it too):
            # the start-up check is content, but the pod already made runs outside Kueue,
            # and the pods say so, by name.
            put_back(kubectl, original)
            running.kill()
            running.start()

            def named() -> dict[str, Any] | None:
                found = condition(get_sd(kubectl, namespace, "free"), "Admitted")
                return (
                    found if "run without Kueue's admission" in found.get("message", "") else None
                )

            admitted = eventually(named, WITHIN_S, "Admitted naming the pod outside Kueue")
            assert admitted["reason"] == "QuotaBypassed"
            assert pod["metadata"]["name"] in admitted["message"]
            assert "Kueue's mutating webhooks for pods" in running.log_text()
    finally:
        if not any(
            w["name"] == "mdeployment.kb.io"
            for w in kubectl.get_json("mutatingwebhookconfiguration", KUEUE_MUTATING)["webhooks"]
        ):
            put_back(kubectl, original)
