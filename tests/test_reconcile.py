"""The reconcile loop against an in-memory API: children, rollout, status, and no idle writes."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from specdeploy.adapters.kube import APPLIED_HASH_ANNOTATION, manifest_hash
from specdeploy.api.config import OperatorConfig
from specdeploy.handlers.reconcile import Reconciler

H100 = "NVIDIA-H100-80GB-HBM3"


class FakeKube:
    """Holds objects by (kind, namespace, name); counts writes like the real adapter."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.nodes = nodes
        self.write_requests = 0
        self.generation = 0

    # reads
    def get_speculative_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.objects.get(("SpeculativeDeployment", namespace, name))
        return copy.deepcopy(found)

    def list_gpu_nodes(self) -> list[dict[str, Any]]:
        return self.nodes

    def list_deployments(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        key, _, value = selector.partition("=")
        return [
            copy.deepcopy(o)
            for (kind, ns, _), o in sorted(self.objects.items())
            if kind == "Deployment"
            and ns == namespace
            and o["metadata"]["labels"].get(key) == value
        ]

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return []

    def list_workloads(self, namespace: str) -> list[dict[str, Any]]:
        return []

    def get_local_queue(self, namespace: str, name: str) -> dict[str, Any] | None:
        return {"spec": {"clusterQueue": "gpu"}}

    def has_pod_monitor_crd(self) -> bool:
        return True

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any:
        return copy.deepcopy(self.objects.get((kind, namespace, name)))

    # writes
    def apply(self, manifest: Mapping[str, Any], live: Mapping[str, Any] | None) -> bool:
        digest = manifest_hash(manifest)
        if live is not None:
            same = live["metadata"].get("annotations", {}).get(APPLIED_HASH_ANNOTATION) == digest
            if same and live.get("spec", {}).get("replicas") == manifest.get("spec", {}).get(
                "replicas"
            ):
                return False
        self.write_requests += 1
        body = copy.deepcopy(dict(manifest))
        body["metadata"].setdefault("annotations", {})[APPLIED_HASH_ANNOTATION] = digest
        key = (body["kind"], body["metadata"]["namespace"], body["metadata"]["name"])
        old = self.objects.get(key)
        self.generation += 1
        body["metadata"]["creationTimestamp"] = (
            old["metadata"]["creationTimestamp"]
            if old
            else f"2026-01-01T00:00:{self.generation:02d}Z"
        )
        body["metadata"]["generation"] = (old["metadata"]["generation"] + 1) if old else 1
        body["status"] = old.get("status", {}) if old else {}
        self.objects[key] = body
        return True

    def scale_deployment(self, namespace: str, name: str, replicas: int) -> None:
        self.write_requests += 1
        deployment = self.objects[("Deployment", namespace, name)]
        deployment["spec"]["replicas"] = replicas
        deployment["metadata"]["generation"] += 1

    def delete_deployment(self, namespace: str, name: str) -> None:
        self.write_requests += 1
        self.objects.pop(("Deployment", namespace, name), None)

    def patch_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        self.write_requests += 1
        sd = self.objects[("SpeculativeDeployment", namespace, name)]
        status = sd.setdefault("status", {})
        for key, value in patch.items():
            if value is None:
                status.pop(key, None)
            else:
                status[key] = copy.deepcopy(value)

    # the cluster's own controllers
    def make_ready(self) -> None:
        for (kind, _, _), obj in self.objects.items():
            if kind == "Deployment":
                replicas = obj["spec"]["replicas"]
                obj["status"] = {
                    "replicas": replicas,
                    "readyReplicas": replicas,
                    "observedGeneration": obj["metadata"]["generation"],
                }

    def deployments(self) -> dict[str, int]:
        return {
            o["metadata"]["name"]: o["spec"]["replicas"]
            for (kind, _, _), o in self.objects.items()
            if kind == "Deployment"
        }


def sd_body(draft_revision: str = "r1", replicas: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "specdeploy.dev/v1alpha1",
        "kind": "SpeculativeDeployment",
        "metadata": {"name": "chat", "namespace": "ns", "uid": "u-1", "generation": 1},
        "spec": {
            "replicas": replicas,
            "pair": {
                "version": "1",
                "target": {"model": "meta-llama/Llama-3.1-8B-Instruct"},
                "draft": {
                    "method": "eagle3",
                    "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                    "revision": draft_revision,
                    "numSpeculativeTokens": 3,
                },
            },
            "engine": {"maxModelLen": 8192, "maxNumSeqs": 8},
            "placement": {"queue": "interactive"},
        },
    }


NODES = [
    {
        "metadata": {"name": "mig", "labels": {"nvidia.com/gpu.product": H100}},
        "status": {"allocatable": {"nvidia.com/mig-3g.40gb": "2"}},
    }
]


def setup(body: dict[str, Any]) -> tuple[FakeKube, Reconciler, list[tuple[str, str]]]:
    kube = FakeKube(NODES)
    kube.objects[("SpeculativeDeployment", "ns", "chat")] = body
    events: list[tuple[str, str]] = []
    reconciler = Reconciler(
        kube,  # type: ignore[arg-type]
        OperatorConfig(),
        lambda _body, _type, reason, message: events.append((reason, message)),
    )
    return kube, reconciler, events


def status(kube: FakeKube) -> dict[str, Any]:
    body: dict[str, Any] = kube.objects[("SpeculativeDeployment", "ns", "chat")]
    result: dict[str, Any] = body["status"]
    return result


def condition(kube: FakeKube, type_: str) -> dict[str, Any]:
    return next(c for c in status(kube)["conditions"] if c["type"] == type_)


def test_an_sd_becomes_a_ready_revision_with_service_and_monitor_and_then_goes_quiet() -> None:
    kube, reconciler, events = setup(sd_body())
    reconciler.reconcile("ns", "chat")
    [name] = kube.deployments()
    assert name.startswith("chat-")
    deployment = kube.objects[("Deployment", "ns", name)]
    limits = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/mig-3g.40gb": 1}
    assert deployment["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "interactive"
    assert ("Service", "ns", "chat") in kube.objects
    assert ("PodMonitor", "ns", "chat") in kube.objects
    assert condition(kube, "Ready")["status"] == "False"
    assert status(kube)["sizing"]["resourceName"] == "nvidia.com/mig-3g.40gb"
    assert "NewRevision" in [reason for reason, _ in events]

    kube.make_ready()
    reconciler.reconcile("ns", "chat")
    assert condition(kube, "Ready")["status"] == "True"
    assert status(kube)["phase"] == "Serving"
    assert status(kube)["stableRevision"] == name.removeprefix("chat-")

    writes = kube.write_requests
    for _ in range(3):
        reconciler.reconcile("ns", "chat")
    assert kube.write_requests == writes, "a steady SD sees no writes"


def test_a_new_draft_revision_rolls_forward_only_once_ready() -> None:
    kube, reconciler, _ = setup(sd_body("r1"))
    reconciler.reconcile("ns", "chat")
    kube.make_ready()
    reconciler.reconcile("ns", "chat")
    [first] = kube.deployments()

    kube.objects[("SpeculativeDeployment", "ns", "chat")]["spec"]["pair"]["draft"]["revision"] = (
        "r2"
    )
    reconciler.reconcile("ns", "chat")
    assert len(kube.deployments()) == 2
    assert kube.deployments()[first] == 1, "old revision serves until the new one is ready"
    second = next(n for n in kube.deployments() if n != first)

    kube.make_ready()
    reconciler.reconcile("ns", "chat")
    assert kube.deployments() == {first: 0, second: 1}
    assert status(kube)["stableRevision"] == second.removeprefix("chat-")


def test_unschedulable_pair_creates_nothing_and_says_how_much_memory() -> None:
    body = sd_body()
    body["spec"]["pair"]["target"]["model"] = "meta-llama/Llama-3.1-405B-Instruct"
    body["spec"]["pair"]["draft"] = {"method": "none"}
    kube, reconciler, events = setup(body)
    reconciler.reconcile("ns", "chat")
    assert kube.deployments() == {}
    sized = condition(kube, "Sized")
    assert (sized["status"], sized["reason"]) == ("False", "Unschedulable")
    assert "GiB" in sized["message"]
    assert status(kube)["phase"] == "Failed"
    assert "Unschedulable" in [reason for reason, _ in events]


def test_scaling_the_sd_scales_its_revision() -> None:
    kube, reconciler, _ = setup(sd_body(replicas=1))
    reconciler.reconcile("ns", "chat")
    kube.make_ready()
    reconciler.reconcile("ns", "chat")
    kube.objects[("SpeculativeDeployment", "ns", "chat")]["spec"]["replicas"] = 3
    reconciler.reconcile("ns", "chat")
    assert list(kube.deployments().values()) == [3]
    kube.make_ready()
    reconciler.reconcile("ns", "chat")
    assert status(kube)["replicas"] == 3
    assert status(kube)["readyReplicas"] == 3


def test_a_model_outside_the_catalog_is_sized_from_its_config_json() -> None:
    requests: list[str] = []
    config_json = {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "torch_dtype": "bfloat16",
    }

    class Hub(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            known = self.path == "/acme/llama-clone/resolve/v7/config.json"
            self.send_response(200 if known else 404)
            self.end_headers()
            if known:
                self.wfile.write(json.dumps(config_json).encode())

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        body = sd_body()
        body["spec"]["pair"]["target"] = {"model": "acme/llama-clone", "revision": "v7"}
        body["spec"]["pair"]["draft"] = {
            "method": "draft_model",
            "model": "acme/unknown-draft",
            "numSpeculativeTokens": 3,
        }
        kube, _, _ = setup(body)
        url = f"http://127.0.0.1:{server.server_port}/{{model}}/resolve/{{revision}}/config.json"
        reconciler = Reconciler(
            kube,  # type: ignore[arg-type]
            OperatorConfig.model_validate({"modelConfigUrl": url}),
            lambda *_: None,
        )
        reconciler.reconcile("ns", "chat")
        sized = condition(kube, "Sized")
        assert sized["status"] == "False", "the draft's shape is unknown"
        assert "acme/unknown-draft" in sized["message"]
        reconciler.reconcile("ns", "chat")
        # The clone was read once; the unknown draft is not asked again right away.
        assert sorted(requests) == [
            "/acme/llama-clone/resolve/v7/config.json",
            "/acme/unknown-draft/resolve/main/config.json",
        ]

        body["spec"]["pair"]["draft"] = {"method": "ngram", "numSpeculativeTokens": 3}
        kube.objects[("SpeculativeDeployment", "ns", "chat")]["spec"] = body["spec"]
        reconciler.reconcile("ns", "chat")
        assert condition(kube, "Sized")["status"] == "True"
        assert status(kube)["sizing"]["memory"]["targetWeightsGiB"] == pytest.approx(
            14.96, abs=0.02
        )
    finally:
        server.shutdown()
        server.server_close()
