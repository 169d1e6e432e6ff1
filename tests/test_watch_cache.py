"""The watch-fed stores: what events, our own writes and priming LISTs leave in them."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from specdeploy.adapters import watch_cache as wc
from specdeploy.adapters.kube import KubeAdapter
from specdeploy.api import labels


def obj(
    name: str,
    version: int,
    *,
    namespace: str = "ns",
    owner: str | None = "sd",
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "resourceVersion": str(version),
        "labels": {labels.NAME: owner} if owner else {},
        "managedFields": [{"manager": "specdeploy", "fieldsV1": {"f:spec": {}}}],
        "annotations": {
            "kubectl.kubernetes.io/last-applied-configuration": "{...}",
            "specdeploy.dev/last-handled-configuration": "{...}",
            "kept": "yes",
        },
    }
    return {"metadata": meta, "spec": dict(extra or {})}


def test_strip_drops_managed_fields_and_earlier_copies_and_keeps_the_rest() -> None:
    original = obj("a", 1)
    stripped = wc.strip(original)
    assert "managedFields" not in stripped["metadata"]
    assert stripped["metadata"]["annotations"] == {"kept": "yes"}
    assert "managedFields" in original["metadata"]  # the caller's object is left alone


def test_a_crd_is_kept_without_its_schema() -> None:
    cache = wc.WatchCache()
    crd = obj("podmonitors.monitoring.coreos.com", 1, namespace="", owner=None)
    crd["status"] = {"conditions": [{"type": "Established", "status": "True"}]}
    cache.observe(wc.CRDS, None, crd)
    kept = cache.store(wc.CRDS).get("", "podmonitors.monitoring.coreos.com")
    assert kept is not None
    assert set(kept) == {"metadata", "status"}


def test_a_pod_is_kept_with_its_gates_and_status_only() -> None:
    cache = wc.WatchCache()
    pod = obj(
        "p", 1, extra={"containers": [{"name": "engine"}], "schedulingGates": [{"name": "g"}]}
    )
    pod["status"] = {"phase": "Pending"}
    cache.observe(wc.PODS, "ADDED", pod)
    kept = cache.store(wc.PODS).get("ns", "p")
    assert kept is not None
    assert kept["spec"] == {"schedulingGates": [{"name": "g"}]}
    assert kept["status"] == {"phase": "Pending"}


def test_events_index_children_by_their_sd_label() -> None:
    store = wc.KindStore(labelled=True)
    store.observe(None, obj("a", 1))
    store.observe("ADDED", obj("b", 2))
    store.observe("ADDED", obj("c", 3, owner="other"))
    store.observe("ADDED", obj("d", 4, namespace="elsewhere"))
    assert [o["metadata"]["name"] for o in store.owned("ns", "sd")] == ["a", "b"]
    assert [o["metadata"]["name"] for o in store.owned("ns", "other")] == ["c"]
    store.observe("DELETED", obj("a", 5))
    assert [o["metadata"]["name"] for o in store.owned("ns", "sd")] == ["b"]


def test_an_older_event_does_not_overwrite_a_newer_copy() -> None:
    store = wc.KindStore()
    store.write_through(obj("a", 10, extra={"replicas": 2}))
    store.observe("MODIFIED", obj("a", 9, extra={"replicas": 1}))
    found = store.get("ns", "a")
    assert found is not None
    assert found["spec"]["replicas"] == 2
    store.observe("MODIFIED", obj("a", 11, extra={"replicas": 3}))
    found = store.get("ns", "a")
    assert found is not None
    assert found["spec"]["replicas"] == 3


def test_a_child_whose_label_is_taken_off_leaves_its_sd() -> None:
    store = wc.KindStore(labelled=True)
    store.observe("ADDED", obj("a", 1))
    store.observe("MODIFIED", obj("a", 2, owner=None))
    assert store.owned("ns", "sd") == []
    assert store.get("ns", "a") is None


def test_a_relabelled_child_moves_to_its_new_sd() -> None:
    store = wc.KindStore(labelled=True)
    store.observe("ADDED", obj("a", 1))
    store.observe("MODIFIED", obj("a", 2, owner="other"))
    assert store.owned("ns", "sd") == []
    assert [o["metadata"]["name"] for o in store.owned("ns", "other")] == ["a"]


def test_reads_are_copies() -> None:
    store = wc.KindStore(labelled=True)
    store.observe("ADDED", obj("a", 1, extra={"replicas": 1}))
    got = store.owned("ns", "sd")[0]
    got["spec"]["replicas"] = 99
    again = store.get("ns", "a")
    assert again is not None
    assert again["spec"]["replicas"] == 1


def test_shared_reads_hand_out_objects_a_later_event_replaces_rather_than_changes() -> None:
    store = wc.KindStore()
    store.observe("ADDED", obj("n", 1, namespace="", owner=None, extra={"v": 1}))
    before = store.in_namespace(None, shared=True)[0]
    assert store.in_namespace(None, shared=True)[0] is before
    store.observe("MODIFIED", obj("n", 2, namespace="", owner=None, extra={"v": 2}))
    assert before["spec"] == {"v": 1}
    assert store.in_namespace(None, shared=True)[0]["spec"] == {"v": 2}


def test_status_write_through_does_not_bring_back_a_deleted_sd() -> None:
    store = wc.KindStore()
    store.observe("ADDED", obj("sd", 1))
    store.observe("DELETED", obj("sd", 2))
    store.write_through(obj("sd", 3), only_known=True)
    assert store.get("ns", "sd") is None
    store.observe("ADDED", obj("sd", 4))
    store.write_through(obj("sd", 5, extra={"x": 1}), only_known=True)
    found = store.get("ns", "sd")
    assert found is not None
    assert found["spec"] == {"x": 1}


def test_forget_drops_an_object_we_deleted() -> None:
    store = wc.KindStore(labelled=True)
    store.observe("ADDED", obj("a", 1))
    store.forget("ns", "a")
    assert store.owned("ns", "sd") == []


def test_prime_replaces_the_listed_scope_and_keeps_what_came_after_the_list() -> None:
    store = wc.KindStore()
    store.observe(None, obj("gone", 3))  # deleted before the LIST at version 10
    store.observe("ADDED", obj("new", 12))  # created after it
    store.observe("ADDED", obj("other-ns", 4, namespace="other"))
    store.observe("MODIFIED", obj("kept", 11, extra={"v": "watch"}))
    assert not store.synced
    store.prime([obj("kept", 8, extra={"v": "list"}), obj("listed", 9)], scopes=["ns"], version=10)
    assert store.synced
    assert store.keys() == [("ns", "kept"), ("ns", "listed"), ("ns", "new"), ("other", "other-ns")]
    kept = store.get("ns", "kept")
    assert kept is not None
    assert kept["spec"] == {"v": "watch"}
    store.prime([], scopes=[None], version=20)
    assert store.keys() == []


def test_read_primes_once_then_serves_from_memory() -> None:
    cache = wc.WatchCache(["a", "b"])
    lists: list[str | None] = []

    def lister(scope: str | None) -> list[tuple[list[dict[str, Any]], int]]:
        lists.append(scope)
        return [([obj("x", 1, namespace=scope or "")], 5)]

    def fallback() -> Any:
        raise AssertionError("no fallback once the LIST works")

    def reader(store: wc.KindStore) -> list[wc.Key]:
        return store.keys()

    assert cache.read(wc.DEPLOYMENTS, lister, reader, fallback) == [("a", "x"), ("b", "x")]
    assert cache.read(wc.DEPLOYMENTS, lister, reader, fallback) == [("a", "x"), ("b", "x")]
    assert lists == ["a", "b"]  # one LIST per watched namespace, once
    nodes = [([obj("n", 1, namespace="")], 1)]
    assert cache.read(wc.NODES, lambda s: nodes, reader, fallback) == [("", "n")]


def test_read_falls_back_to_the_api_while_the_kind_cannot_be_listed() -> None:
    cache = wc.WatchCache()

    def lister(scope: str | None) -> list[tuple[list[dict[str, Any]], int]]:
        raise RuntimeError("the server could not find the requested resource")

    assert cache.read(wc.WORKLOADS, lister, lambda s: "cached", lambda: "from the API") == (
        "from the API"
    )
    assert not cache.store(wc.WORKLOADS).synced


@pytest.mark.parametrize(
    ("api_version", "kind", "expected"),
    [
        ("apps/v1", "Deployment", "deployments"),
        ("apps/v1", "ControllerRevision", "records"),
        ("v1", "Service", "services"),
        ("kueue.x-k8s.io/v1beta1", "Workload", "workloads"),
        ("v1", "Secret", None),
    ],
)
def test_writes_find_the_store_of_their_kind(
    api_version: str, kind: str, expected: str | None
) -> None:
    cache = wc.WatchCache()
    store = cache.for_write(api_version, kind)
    assert (store is cache.stores[expected]) if expected else store is None


class ListingKube(KubeAdapter):
    """The adapter's read routing with the API calls recorded instead of sent."""

    def __init__(self, objects: dict[str, list[dict[str, Any]]]) -> None:
        self.cache = wc.WatchCache(["ns"])
        self.objects = objects
        self.calls: list[str] = []

    def _list_kind(
        self, kind: wc.Kind, namespace: str | None
    ) -> Iterator[tuple[list[dict[str, Any]], int]]:
        self.calls.append(f"LIST {kind.kind} {namespace}")
        yield [o for o in self.objects.get(kind.kind, [])], 100

    def _list(
        self, api_version: str, kind: str, namespace: str | None, selector: str | None = None
    ) -> list[dict[str, Any]]:
        self.calls.append(f"list {kind} {namespace} {selector}")
        return []

    def _get(self, api_version: str, kind: str, name: str, namespace: str | None) -> Any:
        self.calls.append(f"get {kind} {namespace}/{name}")
        return None


def test_the_adapter_reads_a_kind_once_then_from_memory() -> None:
    crd = {
        "metadata": {"name": "podmonitors.monitoring.coreos.com", "resourceVersion": "3"},
        "status": {"conditions": [{"type": "Established", "status": "True"}]},
    }
    kube = ListingKube(
        {
            "Deployment": [obj("sd-a", 1), obj("x", 2, owner="other")],
            "CustomResourceDefinition": [crd],
        }
    )
    selector = f"{labels.NAME}=sd"
    for _ in range(3):
        assert [d["metadata"]["name"] for d in kube.list_deployments("ns", selector)] == ["sd-a"]
        assert kube.has_pod_monitor_crd()
    assert kube.calls == ["LIST Deployment ns", "LIST CustomResourceDefinition None"]
    kube.calls.clear()
    # What the stores do not serve still goes to the API server.
    kube.list_deployments("ns", "app=x")
    kube.get("v1", "Secret", "ns", "token")
    assert kube.calls == ["list Deployment ns app=x", "get Secret ns/token"]
    kube.calls.clear()
    assert kube.cache is not None
    kube.cache.observe(wc.CRDS, "DELETED", crd)
    assert not kube.has_pod_monitor_crd()
    assert kube.calls == []


def test_a_refresh_keeps_serving_and_a_failed_one_keeps_the_store() -> None:
    cache = wc.WatchCache()
    store = cache.store(wc.NODES)
    store.prime([obj("old", 1, namespace="", owner=None)], [None], 1)
    cache.refresh(wc.NODES, lambda scope: [([obj("new", 5, namespace="", owner=None)], 5)])
    assert store.synced
    assert store.keys() == [("", "new")]

    def broken(scope: str | None) -> list[tuple[list[dict[str, Any]], int]]:
        raise RuntimeError("forbidden")

    with pytest.raises(RuntimeError, match="forbidden"):
        cache.refresh(wc.NODES, broken)
    assert store.synced, "the watch still feeds it; the caller tries the LIST again"
    assert store.keys() == [("", "new")]


def test_a_kind_no_longer_served_empties_its_store() -> None:
    store = wc.KindStore()
    store.observe(None, obj("a", 3))
    store.vanish()
    assert store.keys() == []
    assert store.synced
    store.observe("ADDED", obj("a", 1))  # served again later: nothing refused
    assert store.keys() == [("ns", "a")]


def test_the_first_listing_then_a_relist_is_told_apart() -> None:
    store = wc.KindStore()
    assert not store.observe(None, obj("a", 3)).relisted  # the stream lists before our LIST
    store.prime([obj("a", 3), obj("b", 4)], [None], 5)  # our first LIST
    assert not store.observe(None, obj("b", 4)).relisted  # the stream's first listing
    assert store.observe(None, obj("a", 3)).relisted  # a listed again: a relist
    assert store.observe(None, obj("b", 4)).relisted
    assert store.observe(None, obj("c", 9)).relisted  # a new object in a relist
    assert not store.observe("MODIFIED", obj("a", 6)).relisted
    store.prime([], [None], 20)  # a later LIST does not expect another first listing
    assert store.observe(None, obj("d", 21)).relisted


@pytest.mark.parametrize(
    ("change", "asks"),
    [
        ({"generation": 2}, True),
        ({"labels": {"team": "x"}}, True),
        ({"annotations": {"specdeploy.dev/resume-speculation": "r1"}}, True),
        ({"deletionTimestamp": "2026-11-26T12:00:00Z"}, True),
        ({"annotations": {"specdeploy.dev/last-handled-configuration": "{}"}}, False),
        ({}, False),
    ],
)
def test_an_sd_event_asks_for_a_reconcile_only_when_more_than_its_status_changed(
    change: dict[str, Any], asks: bool
) -> None:
    store = wc.KindStore()
    before: dict[str, Any] = {
        "metadata": {"name": "sd", "namespace": "ns", "resourceVersion": "1", "generation": 1},
        "spec": {"replicas": 1},
    }
    store.observe("ADDED", before)
    after = copy.deepcopy(before)
    after["metadata"].update(change, resourceVersion="2")
    after["status"] = {"phase": "Serving"}
    seen = store.observe("MODIFIED", after)
    assert seen.news
    assert wc.changed_beyond_status(seen, after) is asks


def test_a_scale_of_ours_is_read_back_at_once() -> None:
    patched: list[dict[str, Any]] = []

    class Scale:
        def patch(self, body: dict[str, Any], name: str, **_: Any) -> dict[str, Any]:
            patched.append(body)
            return {"metadata": {"name": name, "resourceVersion": "9"}, "spec": body["spec"]}

    class Deployments:
        def __init__(self) -> None:
            self.subresources = {"scale": Scale()}

    class ScalingKube(ListingKube):
        def _resource(self, api_version: str, kind: str) -> Any:
            return Deployments()

    kube = ScalingKube({"Deployment": [obj("sd-a", 3, extra={"replicas": 1})]})
    selector = f"{labels.NAME}=sd"
    assert kube.list_deployments("ns", selector)[0]["spec"]["replicas"] == 1
    kube.scale_deployment("ns", "sd-a", 0)
    assert patched == [{"spec": {"replicas": 0}}]
    [scaled] = kube.list_deployments("ns", selector)
    assert scaled["spec"]["replicas"] == 0
    assert scaled["metadata"]["resourceVersion"] == "9"
    assert kube.calls == ["LIST Deployment ns"], "read back from the store, not the API"


def test_a_list_in_pages_removes_only_what_no_page_held() -> None:
    cache = wc.WatchCache()
    store = cache.store(wc.NODES)
    store.prime([obj(n, 1, namespace="", owner=None) for n in ("a", "b", "c", "gone")], [None], 1)
    pages = [
        ([obj("a", 1, namespace="", owner=None), obj("b", 1, namespace="", owner=None)], 10),
        ([obj("c", 1, namespace="", owner=None)], 10),  # a continued page: the same snapshot
    ]
    cache.refresh(wc.NODES, lambda scope: iter(pages))
    assert store.keys() == [("", "a"), ("", "b"), ("", "c")]


def test_objects_are_kept_as_json_and_each_read_is_a_fresh_copy() -> None:
    store = wc.KindStore()
    store.observe("ADDED", obj("a", 1, extra={"replicas": 1}))
    assert 0 < store.size() < 400
    first, second = store.get("ns", "a"), store.get("ns", "a")
    assert first == second
    assert first is not second


def test_a_node_keeps_what_sizing_reads() -> None:
    cache = wc.WatchCache()
    node = obj("n", 1, namespace="", owner=None, extra={"unschedulable": True, "podCIDR": "x"})
    node["status"] = {
        "allocatable": {"nvidia.com/gpu": "8"},
        "capacity": {"nvidia.com/gpu": "8"},
        "images": [{"names": ["registry/engine:1"], "sizeBytes": 1}] * 50,
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    cache.observe(wc.NODES, "ADDED", node)
    [kept] = cache.store(wc.NODES).in_namespace(None, shared=True)
    assert kept["spec"] == {"unschedulable": True}
    assert set(kept["status"]) == {"allocatable", "capacity"}
