"""An operator upgrade restarts no pod: a revision keeps the hash schema, name and pods it was made
with (plan.children.revision.revision_for, plan.children.writes), and the pod defaults of schema
3 reach only revisions made after it (plan.children.pod_defaults)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from specdeploy.api.config import OperatorConfig
from specdeploy.api.models import SizingDecision, SpeculativeDeployment, SpeculativeDeploymentSpec
from specdeploy.plan.children import pod_defaults
from specdeploy.plan.children.drift import APPLIED_HASH_ANNOTATION, with_applied_hash
from specdeploy.plan.children.manifests import build_revision_child, deployment_from_record
from specdeploy.plan.children.revision import HASH_SCHEMA, revision_for, revision_hash
from specdeploy.plan.decide import stages
from test_reconcile import condition, sd_body, setup, status

GIB_8B = {"targetWeightsGiB": 14.96, "draftWeightsGiB": 0.78}


def sizing(count: int = 1, **memory: float) -> SizingDecision:
    weights = {**GIB_8B, **memory}
    return SizingDecision.model_validate(
        {
            "resourceName": "nvidia.com/gpu",
            "count": count,
            "tensorParallelSize": count,
            "memory": {
                **weights,
                "kvCacheGiB": 8.0,
                "overheadGiB": 2.0,
                "requiredGiB": 30.0,
                "perDeviceGiB": 30.0,
            },
        }
    )


def spec(resources: dict[str, str] | None = None) -> SpeculativeDeploymentSpec:
    body = copy.deepcopy(sd_body()["spec"])
    if resources is not None:
        body["engine"]["resources"] = resources
    return SpeculativeDeploymentSpec.model_validate(body)


def old_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator before schema 3: every revision it makes is hashed and built with schema 2."""
    monkeypatch.setattr(
        stages,
        "revision_for",
        lambda spec, sizing, config, existing: (revision_hash(spec, sizing, config, 2), 2),
    )


def engine(kube: Any, name: str) -> dict[str, Any]:
    container: dict[str, Any] = kube.objects[("Deployment", "ns", name)]["spec"]["template"][
        "spec"
    ]["containers"][0]
    return container


def defaults(spec: SpeculativeDeploymentSpec, sizing: SizingDecision) -> dict[str, str]:
    return pod_defaults.default_resources(spec, sizing, OperatorConfig())


def test_gpu_pods_ask_for_cpu_and_memory_sized_from_the_pair() -> None:
    # One H100, an 8B target and its head: 2 + 1 cores; 8 + 4 + 15.7 GiB of weights + 2 GiB of
    # /dev/shm = 29.7, rounded up to 32 GiB.
    assert defaults(spec(), sizing()) == {
        "cpu": "3",
        "memory": "32Gi",
    }
    # Tensor parallel 4 of a 70B: 2 + 4 cores; 8 + 16 + 131 + 8 = 163, so 168 GiB.
    tp4 = sizing(4, targetWeightsGiB=131.0, draftWeightsGiB=2.0)
    assert defaults(spec(), tp4) == {
        "cpu": "6",
        "memory": "168Gi",
    }
    assert pod_defaults.shm_size_gib(tp4) == 8
    # Across two nodes each pod holds half the target's stages and the draft.
    across = tp4.model_copy(update={"nodes_per_replica": 2})
    assert defaults(spec(), across)["memory"] == "104Gi"
    # What the spec sets is the spec's; CPU serving keeps its sized host memory.
    assert defaults(spec({"cpu": "16"}), sizing()) == {"memory": "32Gi"}
    assert (
        pod_defaults.default_resources(
            spec({"cpu": "16", "memory": "1Ti"}), sizing(), OperatorConfig()
        )
        == {}
    )
    cpu = sizing().model_copy(update={"host_memory": "12Gi", "resource_name": "memory"})
    assert defaults(spec(), cpu) == {}


def test_the_pod_gets_a_cpu_request_and_a_memory_ceiling_unless_the_config_says_no() -> None:
    served = SpeculativeDeployment.from_body(sd_body())
    pod = build_revision_child(served, "abc", sizing(), OperatorConfig())
    resources = pod["spec"]["template"]["spec"]["containers"][0]["resources"]
    # Burstable: CPU reserved with no limit (a limit throttles the tokenizer), memory capped.
    assert resources == {
        "requests": {"cpu": "3", "memory": "32Gi", "ephemeral-storage": "19Gi"},
        "limits": {"memory": "32Gi", "nvidia.com/gpu": 1},
    }
    off = OperatorConfig(podResourceDefaults=False)
    pod = build_revision_child(served, "abc", sizing(), off)
    template = pod["spec"]["template"]["spec"]
    assert template["containers"][0]["resources"] == {
        "requests": {"ephemeral-storage": "19Gi"},
        "limits": {"nvidia.com/gpu": 1},
    }
    # The /dev/shm bound stays: it is not a request Kueue counts.
    assert template["volumes"][-1]["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
    # Whether the defaults apply is in the hash: the pods differ.
    assert revision_hash(served.spec, sizing(), off) != revision_hash(
        served.spec, sizing(), OperatorConfig()
    )


def test_a_weights_estimate_across_a_memory_step_is_a_new_revision() -> None:
    config = OperatorConfig()
    # Weights on a volume (a hub download sizes its disk request from them too).
    body = copy.deepcopy(sd_body()["spec"])
    body["modelSource"] = {"pvc": {"claimName": "models"}}
    on_volume = SpeculativeDeploymentSpec.model_validate(body)
    base = revision_hash(on_volume, sizing(), config)
    # 15.5 GiB of target weights: 30.3 GiB, the same 32 GiB step, the same pods.
    assert revision_hash(on_volume, sizing(targetWeightsGiB=15.5), config) == base
    # 20 GiB: 34.8 GiB, the next step: other pods, another revision.
    assert revision_hash(on_volume, sizing(targetWeightsGiB=20.0), config) != base


def test_revision_for_keeps_a_live_revision_of_an_older_schema() -> None:
    config = OperatorConfig()
    served, size = spec(), sizing()
    new = revision_hash(served, size, config)
    old = revision_hash(served, size, config, 2)
    assert new != old
    assert revision_for(served, size, config, {}) == (new, HASH_SCHEMA)
    assert revision_for(served, size, config, {old: 2}) == (old, 2)
    # The same name under another schema is not the same revision.
    assert revision_for(served, size, config, {old: 3}) == (new, HASH_SCHEMA)
    # A spec the old revision no longer matches gets a new revision of the current schema.
    other = spec({"cpu": "4"})
    assert revision_for(other, size, config, {old: 2}) == (
        revision_hash(other, size, config),
        HASH_SCHEMA,
    )


def test_an_operator_upgrade_writes_nothing_for_a_revision_an_older_schema_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with monkeypatch.context() as old:
        old_operator(old)
        kube, reconciler, events = setup(sd_body())
        reconciler.reconcile("ns", "chat")
        kube.make_ready()
        reconciler.reconcile("ns", "chat")
    [name] = kube.deployments()
    stable = status(kube)["stableRevision"]
    assert name == f"chat-{stable}"
    deployment = kube.objects[("Deployment", "ns", name)]
    annotations = deployment["metadata"]["annotations"]
    assert "specdeploy.dev/hash-schema" not in annotations, "schema 2 writes no schema annotation"
    assert "cpu" not in engine(kube, name)["resources"].get("requests", {})
    template = copy.deepcopy(deployment["spec"]["template"])
    revisions_before = len([r for r, _ in events if r == "NewRevision"])

    # The upgraded operator: the spec's schema-3 hash names other pods, yet the revision keeps
    # its name, its pods and its record; nothing is written, however often it reconciles.
    writes = kube.write_requests
    for _ in range(3):
        reconciler.reconcile("ns", "chat")
    assert kube.write_requests == writes, "an upgrade writes nothing"
    assert kube.deployments() == {name: 1}
    assert kube.objects[("Deployment", "ns", name)]["spec"]["template"] == template
    assert status(kube)["stableRevision"] == stable
    assert condition(kube, "Ready")["status"] == "True"
    assert len([r for r, _ in events if r == "NewRevision"]) == revisions_before

    # A change to the spec is a new revision, of the new schema, with the pod defaults.
    body = kube.objects[("SpeculativeDeployment", "ns", "chat")]
    body["spec"]["pair"]["draft"]["revision"] = "r2"
    reconciler.reconcile("ns", "chat")
    [new] = [n for n in kube.deployments() if n != name]
    made = kube.objects[("Deployment", "ns", new)]
    assert made["metadata"]["annotations"]["specdeploy.dev/hash-schema"] == str(HASH_SCHEMA)
    assert engine(kube, new)["resources"]["requests"]["cpu"] == "3"
    kube.make_ready()
    reconciler.reconcile("ns", "chat")
    assert kube.deployments() == {name: 0, new: 1}

    # Back to the old spec: the old revision (its record, schema 2) serves again, unchanged.
    body["spec"]["pair"]["draft"]["revision"] = "r1"
    reconciler.reconcile("ns", "chat")
    assert kube.deployments()[name] == 1
    assert kube.objects[("Deployment", "ns", name)]["spec"]["template"] == template


def test_a_recorded_revision_keeps_its_pods_when_the_builder_moves_without_a_schema() -> None:
    # An operator whose pod builder changed without a new schema (a mistake the record makes
    # harmless): the revision's Deployment and record hold pods this builder would not make.
    kube, reconciler, _ = setup(sd_body())
    reconciler.reconcile("ns", "chat")
    kube.make_ready()
    reconciler.reconcile("ns", "chat")
    [name] = kube.deployments()
    record = next(obj for (kind, _, _), obj in kube.objects.items() if kind == "ControllerRevision")
    older = {"name": "FROM_AN_OLDER_BUILDER", "value": "1"}
    live = kube.objects[("Deployment", "ns", name)]
    for template in (live["spec"]["template"], record["data"]["spec"]["template"]):
        template["spec"]["containers"][0]["env"].append(older)
    # As that operator applied it: its applied-hash annotation is of these pods.
    applied = with_applied_hash(deployment_from_record(record, 1))["metadata"]["annotations"]
    live["metadata"]["annotations"][APPLIED_HASH_ANNOTATION] = applied[APPLIED_HASH_ANNOTATION]
    writes = kube.write_requests
    for _ in range(2):
        reconciler.reconcile("ns", "chat")
    assert kube.write_requests == writes, "the recorded pods are the revision's"
    assert older in engine(kube, name)["env"]
