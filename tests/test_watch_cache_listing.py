"""The watch-fed stores against an API server that behaves like one (tests/fake_api_server.py):
resourceVersions, LISTs made before the events they race with, watches that end in 410 Gone
and list again, bookmarks. The stores are fed exactly as the operator feeds them: kopf's
handlers (handlers.run.route_event) and our own LIST (WatchCache.refresh).
"""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from fake_api_server import FakeApiServer, KopfLikeStream, Obj
from specdeploy.adapters import watch_cache as wc
from specdeploy.api import labels
from specdeploy.handlers.run import Queues, route_event, route_removed

KIND = wc.DEPLOYMENTS


class Operator:
    """A store fed by a kopf-like stream and by our LISTs, as handlers.run wires it."""

    def __init__(self, server: FakeApiServer) -> None:
        self.server = server
        self.cache = wc.WatchCache(["ns"])
        self.queues = Queues()
        self.stream = KopfLikeStream(server, deliver=self.deliver)

    def start(self, *, list_first: bool = True) -> None:
        """The operator's start: kopf's first listing and our first LIST (fill_stores), in
        either order; reconciles start after our LIST."""
        if list_first:
            self.merge(self.our_list())
            self.stream.start()
        else:
            self.stream.start()
            self.merge(self.our_list())

    @property
    def store(self) -> wc.KindStore:
        return self.cache.store(KIND)

    def deliver(self, event_type: str | None, obj: Obj) -> None:
        route_event(self.cache, self.queues, KIND, event_type, obj)

    def our_list(self) -> tuple[list[Obj], int]:
        """Our LIST (of the objects that carry the SD label): made now, merged whenever
        `merge` is called."""
        return self.server.list_objects("ns", labels.NAME)

    def merge(self, listed: tuple[list[Obj], int]) -> list[Obj]:
        return self.cache.refresh(KIND, lambda _scope: [listed])

    def serve_relists(self) -> int:
        """Runs the relists asked for, and reconciles what they removed, as
        handlers.workers.relist_from does."""
        served = 0
        while (name := self.queues.relists.get_nowait()) is not None:
            assert name == KIND.name
            route_removed(self.queues, KIND, self.merge(self.our_list()))
            self.queues.relists.done(name)
            served += 1
        return served

    def check(self) -> bool:
        """One round of handlers.workers.check_stores: a LIST of the objects' keys."""

        def listed(scope: str | None) -> tuple[set[wc.Key], int]:
            items, version = self.server.list_objects(scope, labels.NAME)
            return {wc.key_of(item) for item in items}, version

        stale = self.cache.needs_relist(KIND, listed)
        if stale:
            self.queues.relists.add(KIND.name)
        return stale

    def held(self) -> dict[str, int]:
        return {
            obj["metadata"]["name"]: int(obj["metadata"]["resourceVersion"])
            for obj in self.store.in_namespace("ns")
        }

    def truth(self) -> dict[str, int]:
        return {
            name: int(obj["metadata"]["resourceVersion"])
            for (_, name), obj in self.server.objects.items()
        }

    def asked(self) -> list[tuple[str, str]]:
        """The SDs the events asked to reconcile since the last call."""
        found = []
        while (key := self.queues.reconciles.get_nowait()) is not None:
            found.append(key)
            self.queues.reconciles.done(key)
        return found


def started(*names: str) -> Operator:
    server = FakeApiServer()
    for name in names:
        server.create(name, replicas=1)
    operator = Operator(server)
    operator.start()
    assert operator.store.synced
    return operator


def test_the_first_listing_fills_the_store_and_asks_for_no_reconcile_of_children() -> None:
    for list_first in (True, False):
        server = FakeApiServer()
        for name in ("a", "b"):
            server.create(name)
        operator = Operator(server)
        operator.start(list_first=list_first)
        assert operator.held() == operator.truth()
        assert operator.asked() == [], "children listed at start: their SDs are listed too"
        assert operator.serve_relists() == 0, "the first listing taken for a relist"


def test_a_delete_between_our_list_and_its_merge_stays_deleted() -> None:
    operator = started("a", "b")
    listed = operator.our_list()  # holds a
    operator.server.delete("a")
    operator.stream.pump()  # DELETED a, before the LIST is merged
    operator.merge(listed)
    assert "a" not in operator.held(), "the LIST made before the delete brought it back"
    assert operator.held() == operator.truth()


def test_a_delete_the_watch_has_not_shown_yet_goes_with_a_later_list() -> None:
    operator = started("a", "b")
    operator.server.delete("a")
    operator.merge(operator.our_list())  # the stream lags: DELETED not delivered yet
    assert operator.held() == operator.truth()
    operator.stream.pump()  # the late DELETED changes nothing
    assert operator.held() == operator.truth()


def test_what_changed_after_our_list_is_kept_when_the_list_is_merged() -> None:
    operator = started("a")
    listed = operator.our_list()
    operator.server.create("b")
    operator.server.update("a", replicas=3)
    operator.stream.pump()
    operator.merge(listed)
    assert operator.held() == operator.truth()
    a = operator.store.get("ns", "a")
    assert a is not None
    assert a["spec"]["replicas"] == 3, "an older LIST replaced a newer copy"


def test_a_late_event_older_than_our_list_does_not_roll_the_store_back() -> None:
    operator = started("a")
    operator.server.update("a", replicas=2)
    operator.server.update("a", replicas=3)
    operator.merge(operator.our_list())
    operator.stream.pump(1)  # MODIFIED replicas=2 arrives late
    a = operator.store.get("ns", "a")
    assert a is not None
    assert a["spec"]["replicas"] == 3


def test_deletes_across_a_watch_gap_are_removed_by_the_relist_they_ask_for() -> None:
    operator = started("a", "b", "c")
    # The watch connection ends; meanwhile a and b are deleted, and the server forgets the
    # events (compaction): the reconnect gets 410 and kopf lists again, showing no deletion.
    operator.server.delete("a")
    operator.server.delete("b")
    operator.server.compact()
    operator.stream.reconnect()
    assert operator.stream.relists == 1
    assert set(operator.held()) == {"a", "b", "c"}, "a relist alone shows no deletion"
    assert operator.serve_relists() == 1, "the relist asked for a LIST of our own"
    assert operator.held() == operator.truth() == {"c": operator.truth()["c"]}


def test_a_relist_that_shows_nothing_is_seen_by_the_check_and_reconciles_the_owner() -> None:
    operator = started("a", "b")
    operator.server.create("theirs", owner=None)  # none of ours: kopf lists it, we do not
    operator.stream.pump()
    assert operator.asked() == []
    # Every object of ours goes during the gap: kopf's relist shows only another's.
    operator.server.delete("a")
    operator.server.delete("b")
    operator.server.compact()
    operator.stream.reconnect()
    assert operator.stream.relists == 1
    assert operator.serve_relists() == 0, "a relist of none of ours asks for nothing"
    assert set(operator.held()) == {"a", "b"}, "nothing showed the deletions"
    assert operator.asked() == []
    assert operator.check(), "the store holds objects the server has not"
    assert operator.serve_relists() == 1
    assert operator.held() == {}
    assert operator.asked() == [("ns", "sd")], "the SD whose children went is reconciled"
    assert not operator.check(), "an empty store is not checked"


def test_the_check_leaves_a_store_that_matches_the_server_alone() -> None:
    operator = started("a", "b")
    operator.server.delete("a")
    operator.stream.pump()
    assert not operator.check()
    assert operator.serve_relists() == 0


def test_a_bookmarked_watch_resumes_after_compaction_without_a_relist() -> None:
    operator = started("a")
    operator.server.tick()  # other kinds change
    operator.stream.bookmark()
    operator.server.compact()
    operator.server.delete("a")
    operator.stream.catch_up()
    assert operator.stream.relists == 0
    assert operator.serve_relists() == 0
    assert operator.held() == operator.truth() == {}


def test_a_late_deleted_event_does_not_remove_a_newer_object_of_the_same_name() -> None:
    operator = started("a")
    operator.server.delete("a")
    recreated = operator.server.create("a", replicas=5)
    operator.store.write_through(recreated)  # our create's answer, before the events
    operator.stream.pump(1)  # DELETED of the old a
    assert operator.held() == operator.truth()
    operator.stream.pump()
    assert operator.held() == operator.truth()


def test_our_delete_is_read_at_once_and_stays_until_the_deletion_is_seen() -> None:
    operator = started("a")
    listed = operator.our_list()  # made before our delete
    operator.server.update("a", replicas=2)  # someone's change, still in the stream
    operator.server.delete("a")
    operator.store.forget("ns", "a")  # what KubeAdapter.delete does
    assert operator.held() == {}
    operator.merge(listed)
    operator.stream.pump(1)  # the MODIFIED, newer than what we held
    assert operator.held() == {}, "a copy of the deleted object came back"
    recreated = operator.server.create("a", replicas=7)  # made again under the same name
    operator.stream.pump()
    assert operator.held() == operator.truth()
    held = operator.store.get("ns", "a")
    assert held is not None
    assert held["metadata"]["uid"] == recreated["metadata"]["uid"]


def test_our_writes_are_read_at_once_and_their_echo_asks_for_no_reconcile() -> None:
    operator = started("a")
    written = operator.server.update("a", replicas=4)
    operator.store.write_through(written)
    assert operator.held() == operator.truth()
    operator.stream.pump()
    assert operator.asked() == [], "the echo of our own write asked for a reconcile"
    operator.server.update("a", replicas=1)  # someone else's change
    operator.stream.pump()
    assert operator.asked() == [("ns", "sd")]
    operator.server.delete("a")
    operator.stream.pump()
    assert operator.asked() == [("ns", "sd")], "a child deleted by someone else"


OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "create",
                "update",
                "delete",
                "pump",
                "pump-one",
                "reconnect",
                "bookmark",
                "tick",
                "compact",
                "list",
                "merge",
                "our-create",
                "our-write",
                "our-delete",
                "serve-relists",
                "check",
            ]
        ),
        st.sampled_from(["a", "b", "c"]),
    ),
    max_size=60,
)


def apply(
    operator: Operator, operation: str, name: str, lists: list[Any], ours: dict[str, Obj]
) -> None:
    server = operator.server
    exists = ("ns", name) in server.objects
    if operation == "create" and not exists:
        server.create(name)
    elif operation == "update" and exists:
        server.update(name, replicas=server.rv)
    elif operation == "delete" and exists:
        server.delete(name)
    elif operation == "pump":
        operator.stream.pump()
    elif operation == "pump-one":
        operator.stream.pump(1)
    elif operation == "reconnect":
        operator.stream.reconnect()
    elif operation == "bookmark":
        operator.stream.bookmark()
    elif operation == "tick":
        server.tick()
    elif operation == "compact":
        server.compact()
    elif operation == "list":
        lists.append(operator.our_list())
    elif operation == "merge" and lists:
        operator.merge(lists.pop(0))  # the oldest LIST we made, merged late
    elif operation == "our-create" and not exists:
        ours[name] = server.create(name)
        operator.store.write_through(ours[name])
    elif operation == "our-write" and exists:
        ours[name] = server.update(name, replicas=-server.rv)
        operator.store.write_through(ours[name])
    elif operation == "our-delete" and exists:
        server.delete(name)
        operator.store.forget("ns", name)
        ours.pop(name, None)
    elif operation == "serve-relists":
        operator.serve_relists()
    elif operation == "check":
        operator.check()


@settings(max_examples=400, deadline=None)
@given(operations=OPERATIONS, list_first=st.booleans())
# The hazards the stores once had, always among the cases tried:
# a late DELETED removing a newer object of the same name,
@example(operations=[("delete", "a"), ("our-create", "a"), ("pump-one", "a")], list_first=True)
# a LIST made before a delete bringing the object back,
@example(
    operations=[("list", "a"), ("delete", "a"), ("pump", "a"), ("merge", "a")], list_first=True
)
# a delete during a watch gap never removed,
@example(
    operations=[("create", "b"), ("pump", "b"), ("delete", "a"), ("compact", "a"), ("pump", "a")],
    list_first=True,
)
# every object gone during a watch gap, the relist showing none of them,
@example(
    operations=[("delete", "a"), ("compact", "a"), ("reconnect", "a"), ("serve-relists", "a")],
    list_first=True,
)
# our own delete undone by an event of the deleted object,
@example(operations=[("update", "a"), ("our-delete", "a"), ("pump-one", "a")], list_first=True)
# every object gone during a watch gap, then another made before the stores' check.
@example(
    operations=[("delete", "a"), ("compact", "a"), ("reconnect", "a"), ("create", "b")],
    list_first=False,
)
def test_once_the_watch_caught_up_and_its_relists_ran_the_store_is_the_server(
    operations: list[tuple[str, str]], list_first: bool
) -> None:
    """Whatever the interleaving of changes, watch delivery, 410s, bookmarks, our LISTs
    (merged late) and our own writes and deletes: what we wrote is read back at once and
    until something newer replaces it; once the stream has delivered everything
    and the relists it asked for ran, the store holds exactly the server's objects, each at
    its resourceVersion. A relist that delivered no object at all (every object gone during
    the gap, whatever is made after it) shows nothing to a handler: one round of the stores'
    check (handlers.workers.check_stores) is what asks for the LIST that removes them."""
    server = FakeApiServer()
    server.create("a")
    operator = Operator(server)
    operator.start(list_first=list_first)
    lists: list[Any] = []
    ours: dict[str, Obj] = {}
    for operation, name in operations:
        apply(operator, operation, name, lists, ours)
        for written, obj in ours.items():
            # What we wrote is read back until the server holds something newer.
            live = server.objects.get(("ns", written))
            if live is not None and live["metadata"]["uid"] == obj["metadata"]["uid"]:
                held = operator.store.get("ns", written)
                assert held is not None, f"our write of {written} vanished ({operation})"
                assert held["metadata"]["uid"] == obj["metadata"]["uid"]
                assert wc.version_of(held) >= wc.version_of(obj), f"{written} went back"
    operator.stream.catch_up()
    operator.serve_relists()
    if 0 not in operator.stream.relist_sizes:
        assert operator.held() == operator.truth()
    operator.check()
    operator.serve_relists()
    assert operator.held() == operator.truth()
