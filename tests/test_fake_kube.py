"""The in-memory API (e2e/fake_kube.py) behaves as the API server does where a reconcile's
outcome depends on it: label selectors, a LocalQueue that does not exist, and fields a
server-side apply stops setting. Each case runs through the reconcile and looks at what a user
would see (a condition, a Deployment's labels); the contract test (e2e/test_convergence.py)
compares the fake with the real API server on whole scenarios."""

from __future__ import annotations

from typing import Any

from fake_kube import FakeKube, field_paths, remove_field, selected
from test_reconcile import NODES, condition, sd_body, setup
from test_reconcile_pair_check import refused_pod


def test_a_selector_matches_labels_by_equality_inequality_and_existence() -> None:
    pod = {"metadata": {"labels": {"app": "a", "tier": "b"}}}
    assert selected(pod, "app=a")
    assert selected(pod, "app=a,tier=b")
    assert selected(pod, "app==a,tier!=c,tier")
    assert not selected(pod, "app=x")
    assert not selected(pod, "tier!=b")
    assert not selected(pod, "missing")
    assert selected(pod, "")


def test_pods_are_listed_by_namespace_and_selector() -> None:
    kube = FakeKube(NODES)
    mine = refused_pod("abc")
    elsewhere = refused_pod("abc")
    elsewhere["metadata"]["namespace"] = "other"
    another_sd = refused_pod("abc")
    another_sd["metadata"]["labels"]["specdeploy.dev/name"] = "other"
    kube.pods = [mine, elsewhere, another_sd]
    assert kube.list_pods("ns", "specdeploy.dev/name=chat") == [mine]


def test_a_refused_pod_of_another_namespace_does_not_stop_this_revision() -> None:
    """The same SD name and revision in another namespace is another SD: its launcher's
    refusal says nothing about this one's pair."""
    kube, reconciler, _ = setup(sd_body())
    reconciler.reconcile("ns", "chat")
    [name] = kube.deployments()
    revision = name.removeprefix("chat-")
    elsewhere = refused_pod(revision)
    elsewhere["metadata"]["namespace"] = "other"
    kube.pods = [elsewhere]
    reconciler.reconcile("ns", "chat")
    assert condition(kube, "PairCompatible")["status"] != "False"
    assert kube.deployments()[name] == 1


def test_workloads_are_listed_by_namespace() -> None:
    kube = FakeKube(NODES)
    kube.workloads = [{"metadata": {"namespace": "ns", "name": "a"}}]
    kube.workloads.append({"metadata": {"namespace": "other", "name": "b"}})
    assert [w["metadata"]["name"] for w in kube.list_workloads("ns")] == ["a"]


def test_a_missing_local_queue_is_named_in_admitted() -> None:
    kube = FakeKube(NODES)
    kube.local_queues.discard("interactive")
    kube, reconciler, _ = setup(sd_body(), kube)
    reconciler.reconcile("ns", "chat")
    admitted = condition(kube, "Admitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "LocalQueueNotFound")
    assert "LocalQueue interactive does not exist" in admitted["message"]

    kube.local_queues.add("interactive")
    reconciler.reconcile("ns", "chat")
    assert condition(kube, "Admitted")["reason"] != "LocalQueueNotFound"


def test_a_label_the_operator_stops_applying_leaves_the_deployment() -> None:
    """placement.priorityClass is a Kueue label on the Deployment, outside the revision: taken
    out of the spec, the next apply leaves it out and server-side apply removes it."""
    body = sd_body()
    body["spec"]["placement"]["priorityClass"] = "high"
    kube, reconciler, _ = setup(body)
    reconciler.reconcile("ns", "chat")
    [name] = kube.deployments()
    labels = kube.objects[("Deployment", "ns", name)]["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/priority-class"] == "high"

    del kube.objects[("SpeculativeDeployment", "ns", "chat")]["spec"]["placement"]["priorityClass"]
    reconciler.reconcile("ns", "chat")
    assert list(kube.deployments()) == [name], "the same revision"
    labels = kube.objects[("Deployment", "ns", name)]["metadata"]["labels"]
    assert "kueue.x-k8s.io/priority-class" not in labels


def test_a_field_another_client_set_stays_when_the_operator_stops_applying_it() -> None:
    kube = FakeKube(NODES)
    first: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "s", "namespace": "ns", "labels": {"ours": "1", "shared": "1"}},
        "spec": {"ports": [{"port": 80}, {"port": 81}]},
    }
    kube.apply(first)
    kube.edit("Service", "ns", "s", {"metadata": {"labels": {"shared": "2"}}})
    second = {**first, "metadata": {"name": "s", "namespace": "ns", "labels": {}}}
    second["spec"] = {"ports": [{"port": 80}]}
    kube.apply(second)
    live = kube.objects[("Service", "ns", "s")]
    assert live["metadata"]["labels"] == {"shared": "2"}
    assert [p["port"] for p in live["spec"]["ports"]] == [80]


def test_fields_of_lists_merged_by_key_are_tracked_by_item() -> None:
    manifest = {"spec": {"containers": [{"name": "engine", "env": [{"name": "A", "value": "1"}]}]}}
    paths = field_paths(manifest)
    item = ("spec", "containers", (("name", "engine"),))
    assert (*item, "env", (("name", "A"),), "value") in paths
    remove_field(manifest, (*item, "env", (("name", "A"),)))
    assert manifest["spec"]["containers"][0]["env"] == []
