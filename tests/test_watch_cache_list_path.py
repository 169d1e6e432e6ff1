"""The LIST path of the watch-fed stores (KubeAdapter._list_kind and WatchCache.refresh) against
tests/fake_api_server.py served over HTTP: the kubernetes client's own requests, pages of
LIST_PAGE objects from one snapshot, a continue token that expired, and the start's LIST made
before kopf's (a deletion in between is shown by neither kopf's listing nor its watch).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fake_api_server import FakeApiServer, serve_http
from specdeploy.adapters import kube as kube_module
from specdeploy.adapters import watch_cache as wc
from specdeploy.adapters.kube import CHECK_PAGE, LIST_PAGE, KubeAdapter
from specdeploy.api import labels
from specdeploy.handlers.workers import confirm_first_listings
from test_watch_cache_listing import Operator

KIND = wc.DEPLOYMENTS


@pytest.fixture
def server() -> FakeApiServer:
    return FakeApiServer()


@pytest.fixture
def kube(server: FakeApiServer) -> Iterator[KubeAdapter]:
    with serve_http(server) as url:
        configuration = client.Configuration()
        configuration.host = url
        yield KubeAdapter(client.ApiClient(configuration), cache=wc.WatchCache(["ns"]))


def names(kube: KubeAdapter) -> list[str]:
    assert kube.cache is not None
    held = kube.cache.store(KIND).keys()
    return [name for _, name in held]


def test_a_large_kind_is_listed_in_pages_of_one_snapshot(
    server: FakeApiServer, kube: KubeAdapter
) -> None:
    for index in range(250):
        server.create(f"d{index:03}")
    pages = 0

    def meanwhile() -> None:
        # Between the pages: one listed object deleted, one not yet listed deleted, one made.
        nonlocal pages
        pages += 1
        if pages == 2:
            server.delete("d000")
            server.delete("d200")
            server.create("late")

    server.before_list = meanwhile
    kube.refresh_kind(KIND)
    assert [(limit, token is None) for _, _, limit, token in server.requests] == [
        (LIST_PAGE, True),
        (LIST_PAGE, False),
        (LIST_PAGE, False),
    ]
    # The LIST is the snapshot of its first page: what changed after it is the watch's to show.
    assert names(kube) == [f"d{index:03}" for index in range(250)]
    assert kube.cache is not None
    held = kube.cache.store(KIND).get("ns", "d100")
    assert held is not None
    assert (held["apiVersion"], held["kind"]) == ("apps/v1", "Deployment")

    server.requests.clear()
    server.before_list = lambda: None
    kube.refresh_kind(KIND)  # made after the changes: they show
    assert "d000" not in names(kube)
    assert "d200" not in names(kube)
    assert "late" in names(kube)
    assert len(server.requests) == 3


def test_a_labelled_kind_is_listed_with_its_label_and_checked_with_one_metadata_list(
    server: FakeApiServer, kube: KubeAdapter
) -> None:
    """The stores of SDs' children LIST only what carries `specdeploy.dev/name` (the API server
    filters); the check of a store is one LIST of such objects' metadata, and none at all for
    a store that holds nothing."""
    for index in range(150):
        server.create(f"d{index:03}")
    server.create("theirs", owner=None)
    kube.refresh_kind(KIND)
    assert "theirs" not in names(kube)
    assert len(names(kube)) == 150
    assert set(server.selectors) == {labels.NAME}
    server.requests.clear()
    server.selectors.clear()
    server.metadata_only.clear()
    assert not kube.kind_is_stale(KIND)
    assert [(limit, token) for _, _, limit, token in server.requests] == [(CHECK_PAGE, None)]
    assert server.selectors == [labels.NAME]
    assert server.metadata_only == [True]
    server.delete("d042")  # one of ours gone, unseen, the others still there
    assert kube.kind_is_stale(KIND)
    assert kube.refresh_kind(KIND)[0]["metadata"]["name"] == "d042"
    assert not kube.kind_is_stale(KIND)
    made = server.create("made-since")
    assert kube.cache is not None
    kube.cache.store(KIND).write_through(made)
    server.delete("made-since")
    server.create("after")  # the LIST is newer than what the store holds of made-since
    assert kube.kind_is_stale(KIND)
    kube.refresh_kind(KIND)
    for index in range(150):
        if index != 42:
            server.delete(f"d{index:03}")  # all but one of ours gone, unseen
    assert kube.kind_is_stale(KIND)
    assert len(kube.refresh_kind(KIND)) == 149, "the LIST removes each and says which"
    assert names(kube) == ["after"]
    server.delete("after")
    kube.refresh_kind(KIND)
    assert names(kube) == []
    server.requests.clear()
    assert not kube.kind_is_stale(KIND)
    assert server.requests == [], "an empty store asks the API server nothing"


def test_the_check_of_a_kind_larger_than_its_page_reads_every_page_of_one_snapshot(
    server: FakeApiServer, kube: KubeAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kube_module, "CHECK_PAGE", 40)
    for index in range(100):
        server.create(f"d{index:03}")
    kube.refresh_kind(KIND)
    server.requests.clear()
    assert not kube.kind_is_stale(KIND)
    assert [(limit, token is None) for _, _, limit, token in server.requests] == [
        (40, True),
        (40, False),
        (40, False),
    ]
    server.delete("d099")  # on the last page
    assert kube.kind_is_stale(KIND)
    kube.refresh_kind(KIND)
    pages = 0

    def meanwhile() -> None:
        # Made between the pages, and stored (its watch event) before the check ends: newer
        # than the LIST's snapshot, so not called stale for being missing from it.
        nonlocal pages
        pages += 1
        if pages == 2:
            assert kube.cache is not None
            kube.cache.store(KIND).write_through(server.create("d100"))

    server.before_list = meanwhile
    assert not kube.kind_is_stale(KIND)
    assert pages == 3
    assert kube.cache is not None
    assert kube.cache.store(KIND).get("ns", "d100") is not None


def test_a_kind_whose_list_answers_404_is_stale_and_its_store_emptied(
    server: FakeApiServer, kube: KubeAdapter
) -> None:
    """Discovery still names the kind, but its LIST answers 404 (its CRD just deleted, say):
    the check calls the store stale, and the LIST it asks for empties it and hands on what it
    held, as for a kind discovery no longer names."""
    assert kube.cache is not None
    store = kube.cache.store(wc.PODS)  # served by discovery here, never by a LIST
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u1",
            "resourceVersion": "5",
            "labels": {labels.NAME: "sd"},
        },
    }
    store.vanish()  # synced and empty, as after a start that found no pod
    store.write_through(pod)  # then one came
    assert kube.kind_is_stale(wc.PODS)
    removed = kube.refresh_kind(wc.PODS)
    assert [o["metadata"]["name"] for o in removed] == ["p"]
    assert store.synced
    assert store.keys() == []
    assert not kube.kind_is_stale(wc.PODS), "an empty store is not checked"


def test_a_continue_token_that_expired_fails_the_list_and_keeps_the_store(
    server: FakeApiServer, kube: KubeAdapter
) -> None:
    for index in range(150):
        server.create(f"d{index:03}")
    kube.refresh_kind(KIND)
    server.delete("d007")
    calls = 0

    def compact_after_the_first_page() -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            server.tick()  # other kinds change, and etcd compacts past the LIST's snapshot
            server.compact()

    server.before_list = compact_after_the_first_page
    with pytest.raises(ApiException) as raised:
        kube.refresh_kind(KIND)
    assert raised.value.status == 410
    # Nothing of the failed LIST is half-applied as removals: every object is still held.
    assert len(names(kube)) == 150


def confirm(started: Operator, rounds: int = 1) -> None:
    async def no_wait(_: float) -> None:
        return None

    asyncio.run(
        confirm_first_listings(
            started.cache.stores, started.queues.relists, 5.0, rounds, sleep=no_wait
        )
    )


def test_a_delete_between_our_first_list_and_kopfs_goes_with_the_confirming_list() -> None:
    server = FakeApiServer()
    for name in ("a", "b"):
        server.create(name)
    started = Operator(server)
    started.merge(started.our_list())
    server.delete("a")  # before kopf's LIST: in neither its listing nor its watch
    started.stream.start()
    started.stream.catch_up()
    assert sorted(started.held()) == ["a", "b"], "nothing the stream shows removes it"
    assert started.store.awaiting_stream() == 1
    confirm(started)
    assert started.serve_relists() == 1
    assert sorted(started.held()) == ["b"]
    assert started.store.awaiting_stream() == 0
    confirm(started)
    assert started.serve_relists() == 0, "nothing waits: no LIST more"


def test_after_a_start_with_no_change_between_the_lists_nothing_is_listed_again() -> None:
    for kopf_first in (False, True):
        server = FakeApiServer()
        for name in ("a", "b"):
            server.create(name)
        started = Operator(server)
        if kopf_first:
            started.stream.start()
            started.merge(started.our_list())
        else:
            started.merge(started.our_list())
            started.stream.start()
        server.update("a", replicas=2)
        started.stream.pump()
        assert started.store.awaiting_stream() == 0
        confirm(started)
        assert started.serve_relists() == 0
        assert sorted(started.held()) == ["a", "b"]


def test_an_object_kopf_cannot_show_is_listed_again_a_bounded_number_of_times() -> None:
    server = FakeApiServer()
    server.create("a")
    started = Operator(server)
    started.merge(started.our_list())  # kopf's watch never lists (its kind forbidden to it, say)
    confirm(started, rounds=3)
    assert started.serve_relists() == 1  # a kind is queued once until a worker takes it
    assert started.store.awaiting_stream() == 1
    assert sorted(started.held()) == ["a"], "what exists stays"


def test_kinds_are_listed_side_by_side_while_one_of_them_is_not_served(
    server: FakeApiServer,
) -> None:
    """The start lists every kind at once (handlers.run.fill_stores). Looking up a kind the
    server does not serve makes the kubernetes client drop its discovery cache and read it
    again, which a lookup in another thread must not see half done."""
    server.create("a")
    with serve_http(server) as url:
        for _ in range(5):
            configuration = client.Configuration()
            configuration.host = url
            kube = KubeAdapter(client.ApiClient(configuration), cache=wc.WatchCache(["ns"]))
            errors: list[BaseException] = []

            def refresh(
                kind: wc.Kind, kube: KubeAdapter = kube, errors: list[BaseException] = errors
            ) -> None:
                try:
                    kube.refresh_kind(kind)
                except Exception as error:
                    errors.append(error)

            kinds = [wc.POD_MONITORS, wc.DEPLOYMENTS] * 4
            threads = [threading.Thread(target=refresh, args=(kind,)) for kind in kinds]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert errors == []
            assert kube.cache is not None
            assert kube.cache.store(wc.DEPLOYMENTS).keys() == [("ns", "a")]
            assert kube.cache.store(wc.POD_MONITORS).synced, "not served: empty, and whole"
