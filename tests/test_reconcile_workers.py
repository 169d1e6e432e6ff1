"""The workers on the work queue (handlers.workers): bounded, one worker per SD at a time, a key
added meanwhile reconciled once more after, failures backed off per SD, verdicts scheduled, the
periodic round adding every SD. Waits are for conditions, never for an amount of time."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from specdeploy.adapters import watch_cache
from specdeploy.handlers.work_queue import Backoff, WorkQueue
from specdeploy.handlers.workers import (
    call_every,
    check_stores,
    enqueue_every_round,
    reconcile_from,
    relist_from,
)

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
Key = tuple[str, str]


class InlineExecutor(Executor):
    """Runs each reconcile at once in the calling thread: the test's steps stay in order."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as error:
            future.set_exception(error)
        return future


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def until(condition: Callable[[], bool], what: str) -> None:
    """Lets the loop run until `condition` holds (a guard, not a timing: 10 s is never near)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while not condition():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.001)


def settled(queue: WorkQueue[Key]) -> Callable[[], bool]:
    return lambda: len(queue) == 0 and not queue.processing


def test_a_failing_sd_backs_off_alone_and_a_success_resets_its_backoff() -> None:
    clock = Clock()
    queue: WorkQueue[Key] = WorkQueue(clock=clock, backoff=Backoff(base=1.0, cap=60))
    calls: Counter[str] = Counter()
    failing = {"broken": 2}

    def reconcile(namespace: str, name: str) -> datetime | None:
        calls[name] += 1
        if failing.get(name, 0) > 0:
            failing[name] -= 1
            raise ValueError("an SD the plan cannot read")
        return None

    async def main() -> None:
        worker = asyncio.create_task(
            reconcile_from(queue, reconcile, lambda: NOW, InlineExecutor())
        )
        queue.add(("ns", "broken"))
        queue.add(("ns", "chat"))
        await until(settled(queue), "both reconciled once")
        assert calls == {"broken": 1, "chat": 1}
        assert queue.failures(("ns", "broken")) == 1
        assert queue.next_due() == 1.0  # its first backoff
        clock.now += 1.0
        queue.add(("ns", "other"))  # wakes the worker, which finds the broken one due too
        await until(lambda: calls["broken"] == 2 and settled(queue)(), "the retry")
        assert queue.next_due() == 2.0  # doubled
        clock.now += 2.0
        queue.add(("ns", "other"))
        await until(lambda: calls["broken"] == 3 and settled(queue)(), "the second retry")
        assert queue.failures(("ns", "broken")) == 0, "a success resets the backoff"
        assert queue.next_due() is None
        assert calls["chat"] == 1, "the other SD was not retried with it"
        queue.shutdown()
        await asyncio.wait_for(worker, 5)

    asyncio.run(main())


def test_the_moment_a_verdict_falls_due_is_scheduled_on_the_queue() -> None:
    clock = Clock()
    queue: WorkQueue[Key] = WorkQueue(clock=clock)

    def reconcile(namespace: str, name: str) -> datetime | None:
        return NOW + timedelta(seconds=42) if name == "canary" else None

    async def main() -> None:
        worker = asyncio.create_task(
            reconcile_from(queue, reconcile, lambda: NOW, InlineExecutor())
        )
        queue.add(("ns", "canary"))
        queue.add(("ns", "steady"))
        await until(settled(queue), "both reconciled")
        assert queue.is_delayed(("ns", "canary"))
        assert not queue.is_delayed(("ns", "steady"))
        assert queue.next_due() == 42
        queue.shutdown()
        await asyncio.wait_for(worker, 5)

    asyncio.run(main())


class Gate:
    """A reconcile that holds each call until the test lets it go, and counts who is in."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.inside: Counter[str] = Counter()
        self.most_at_once = 0
        self.most_of_one = 0
        self.calls: Counter[str] = Counter()
        self.open = False

    def reconcile(self, namespace: str, name: str) -> datetime | None:
        with self.lock:
            self.inside[name] += 1
            self.calls[name] += 1
            self.most_at_once = max(self.most_at_once, sum(self.inside.values()))
            self.most_of_one = max(self.most_of_one, self.inside[name])
            self.lock.notify_all()
            self.lock.wait_for(lambda: self.open, timeout=10)
            self.inside[name] -= 1
        return None

    def entered(self) -> int:
        with self.lock:
            return sum(self.inside.values())

    def release(self) -> None:
        with self.lock:
            self.open = True
            self.lock.notify_all()


def test_workers_bound_the_reconciles_and_never_hold_one_sd_twice() -> None:
    queue: WorkQueue[Key] = WorkQueue()
    gate = Gate()

    async def main() -> None:
        with ThreadPoolExecutor(8) as executor:
            workers = [
                asyncio.create_task(reconcile_from(queue, gate.reconcile, lambda: NOW, executor))
                for _ in range(2)
            ]
            for name in ("a", "b", "c", "d"):
                queue.add(("ns", name))
            await until(lambda: gate.entered() == 2, "two reconciles running")
            # While both are held: more adds of a held SD, and the others still waiting.
            for _ in range(3):
                queue.add(("ns", "a"))
            for _ in range(50):
                await asyncio.sleep(0)
            assert gate.entered() == 2, "a third reconcile started beside two workers"
            gate.release()
            await until(settled(queue), "every SD reconciled")
            queue.shutdown()
            await asyncio.wait_for(asyncio.gather(*workers), 5)
        assert gate.most_at_once == 2
        assert gate.most_of_one == 1, "one SD in two reconciles at once"
        assert gate.calls == {"a": 2, "b": 1, "c": 1, "d": 1}, (
            "a is reconciled once more for the adds made while it was held, once in all"
        )

    asyncio.run(main())


def test_the_periodic_round_adds_every_sd_each_round() -> None:
    queue: WorkQueue[Key] = WorkQueue()
    ticks: asyncio.Queue[None] = asyncio.Queue()
    rounds = 0

    def list_keys() -> list[Key]:
        nonlocal rounds
        rounds += 1
        if rounds == 2:
            raise OSError("the API unreachable")
        return [("ns", "a"), ("ns", "b")]

    async def sleep(_: float) -> None:
        await ticks.get()

    async def main() -> None:
        task = asyncio.create_task(enqueue_every_round(queue, list_keys, 30, sleep=sleep))
        await ticks.put(None)
        await until(lambda: len(queue) == 2, "the first round's SDs")
        assert [queue.get_nowait(), queue.get_nowait()] == [("ns", "a"), ("ns", "b")]
        await ticks.put(None)  # a round whose listing fails adds nothing
        await until(lambda: rounds == 2, "the failed round")
        await ticks.put(None)  # and the next round goes on
        await until(lambda: rounds == 3, "the third round")
        assert len(queue) == 0, "held keys are added again only after they are done"
        queue.done(("ns", "a"))
        queue.done(("ns", "b"))
        assert [queue.get_nowait(), queue.get_nowait()] == [("ns", "a"), ("ns", "b")]
        task.cancel()

    asyncio.run(main())


def test_a_kind_to_relist_is_listed_and_what_it_removed_is_handed_on() -> None:
    clock = Clock()
    relists: WorkQueue[str] = WorkQueue(clock=clock, backoff=Backoff(base=1.0))
    refreshed: list[str] = []
    handed: list[tuple[str, list[dict[str, Any]]]] = []
    broken = {watch_cache.PODS.name}
    gone = [{"metadata": {"name": "svc", "namespace": "ns"}}]

    def refresh(kind: watch_cache.Kind) -> list[dict[str, Any]]:
        refreshed.append(kind.name)
        if kind.name in broken:
            broken.discard(kind.name)
            raise OSError("connection refused")
        return gone if kind is watch_cache.SERVICES else []

    def removed(kind: watch_cache.Kind, objects: list[dict[str, Any]]) -> None:
        handed.append((kind.name, objects))

    async def main() -> None:
        task = asyncio.create_task(relist_from(relists, refresh, removed))
        await asyncio.sleep(0)
        assert relists.next_due() is None, "no kind is listed unless named"
        relists.add(watch_cache.PODS.name)  # a relist of the pods' watch stream was seen
        await until(lambda: refreshed == ["pods"], "the pods listed")
        assert relists.next_due() == 1.0, "a failed LIST is tried again after its backoff"
        clock.now += 1.0
        relists.add(watch_cache.SERVICES.name)
        await until(lambda: sorted(refreshed) == ["pods", "pods", "services"], "the retry")
        assert handed == [("services", gone)], "only what a LIST removed is handed on"
        assert relists.next_due() is None
        task.cancel()

    asyncio.run(main())


def test_the_stores_check_names_each_stale_kind_every_round_and_outlives_a_failure() -> None:
    relists: WorkQueue[str] = WorkQueue()
    rounds: asyncio.Queue[None] = asyncio.Queue()
    asked: list[str] = []

    def stale(kind: watch_cache.Kind) -> bool:
        asked.append(kind.name)
        if kind is watch_cache.NODES and asked.count(kind.name) == 1:
            raise OSError("the API unreachable")
        return kind in (watch_cache.SERVICES, watch_cache.NODES)

    async def sleep(_: float) -> None:
        await rounds.get()

    async def main() -> None:
        task = asyncio.create_task(check_stores(relists, stale, 60, sleep=sleep))
        rounds.put_nowait(None)
        await until(lambda: len(asked) == len(watch_cache.KINDS), "the first round")
        assert [relists.get_nowait(), relists.get_nowait()] == ["services", None]
        relists.done("services")
        rounds.put_nowait(None)
        await until(lambda: len(asked) == 2 * len(watch_cache.KINDS), "the second round")
        assert {relists.get_nowait(), relists.get_nowait()} == {"nodes", "services"}
        task.cancel()

    asyncio.run(main())


def test_a_periodic_call_comes_every_interval_and_outlives_a_failure() -> None:
    ticks: asyncio.Queue[None] = asyncio.Queue()
    calls = 0

    def check() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("the API unreachable")

    async def sleep(_: float) -> None:
        await ticks.get()

    async def main() -> None:
        task = asyncio.create_task(call_every(check, 300, sleep=sleep))
        await asyncio.sleep(0.05)
        assert calls == 0, "nothing before the first interval"
        await ticks.put(None)
        await until(lambda: calls == 1, "the first call (it fails)")
        await ticks.put(None)
        await until(lambda: calls == 2, "the next call all the same")
        task.cancel()

    asyncio.run(main())
