"""The work queue's guarantees (handlers.work_queue), step by step on a clock the test moves."""

from __future__ import annotations

import asyncio

import pytest

from specdeploy.handlers.work_queue import Backoff, QueueShutDownError, WorkQueue


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def queue_with_clock() -> tuple[WorkQueue[str], Clock]:
    clock = Clock()
    return WorkQueue(clock=clock, backoff=Backoff(base=1.0, cap=8.0)), clock


def drain(queue: WorkQueue[str]) -> list[str]:
    """Takes every ready key, marking each done at once."""
    taken = []
    while (key := queue.get_nowait()) is not None:
        taken.append(key)
        queue.done(key)
    return taken


def test_a_key_added_many_times_before_it_is_taken_is_handed_out_once() -> None:
    queue, _ = queue_with_clock()
    for key in ("a", "b", "a", "a", "c", "b"):
        queue.add(key)
    assert len(queue) == 3
    assert drain(queue) == ["a", "b", "c"]  # in the order first added
    assert drain(queue) == []


def test_a_key_held_by_a_worker_is_not_handed_to_another_and_runs_once_more_after() -> None:
    queue, _ = queue_with_clock()
    queue.add("a")
    assert queue.get_nowait() == "a"
    # Added three times while held: not handed out meanwhile, whoever asks.
    for _ in range(3):
        queue.add("a")
    queue.add("b")
    assert queue.get_nowait() == "b"
    assert queue.get_nowait() is None
    assert queue.processing == {"a", "b"}
    queue.done("b")
    queue.done("a")
    # Once more for the three adds made while it was held, then nothing.
    assert queue.get_nowait() == "a"
    queue.done("a")
    assert queue.get_nowait() is None


def test_a_key_not_added_while_held_is_not_handed_out_again() -> None:
    queue, _ = queue_with_clock()
    queue.add("a")
    assert queue.get_nowait() == "a"
    queue.done("a")
    assert queue.get_nowait() is None


def test_a_delayed_key_waits_for_its_time_and_the_earlier_of_two_delays_wins() -> None:
    queue, clock = queue_with_clock()
    queue.add_after("a", 10)
    queue.add_after("a", 30)  # later: the 10 s one stands
    queue.add_after("b", 20)
    queue.add_after("b", 5)  # earlier: it replaces the 20 s one
    assert queue.get_nowait() is None
    assert queue.next_due() == 5
    clock.now += 5
    assert drain(queue) == ["b"]
    assert queue.next_due() == 5
    clock.now += 5
    assert drain(queue) == ["a"]
    clock.now += 100
    assert drain(queue) == [], "each delay hands its key out once"
    assert queue.next_due() is None


def test_a_delay_that_falls_due_while_the_key_is_held_runs_it_once_more_after() -> None:
    queue, clock = queue_with_clock()
    queue.add("a")
    queue.add_after("a", 1)
    assert queue.get_nowait() == "a"
    clock.now += 1
    assert queue.get_nowait() is None  # due, but held
    queue.done("a")
    assert queue.get_nowait() == "a"


def test_an_immediate_add_does_not_cancel_a_delayed_one() -> None:
    queue, clock = queue_with_clock()
    queue.add_after("a", 60)  # the next verdict
    queue.add("a")  # a watch event meanwhile
    assert drain(queue) == ["a"]
    assert queue.is_delayed("a")
    clock.now += 60
    assert drain(queue) == ["a"]


def test_failures_back_off_per_key_doubling_to_the_cap_and_forget_starts_again() -> None:
    queue, clock = queue_with_clock()
    delays = []
    for _ in range(6):
        assert drain(queue) == []
        delays.append(queue.add_rate_limited("a"))
        clock.now += delays[-1] - 0.001
        assert drain(queue) == [], "not before its backoff"
        clock.now += 0.001
        assert drain(queue) == ["a"]
    assert delays == [1, 2, 4, 8, 8, 8]
    assert queue.failures("a") == 6
    # Another key's failures are its own.
    assert queue.add_rate_limited("b") == 1
    queue.forget("a")
    assert queue.failures("a") == 0
    assert queue.add_rate_limited("a") == 1


def test_the_backoff_of_many_failures_stays_at_the_cap() -> None:
    assert Backoff(base=0.5, cap=300).delay(10_000) == 300
    assert Backoff(base=0.5, cap=300).delay(1) == 0.5
    assert Backoff().delay(0) == 0


def test_get_waits_for_the_next_add() -> None:
    async def main() -> str:
        queue: WorkQueue[str] = WorkQueue()
        waiting = asyncio.create_task(queue.get())
        await asyncio.sleep(0)
        assert not waiting.done()
        queue.add("a")
        return await asyncio.wait_for(waiting, 5)

    assert asyncio.run(main()) == "a"


def test_get_wakes_when_a_delayed_key_falls_due() -> None:
    async def main() -> str:
        queue: WorkQueue[str] = WorkQueue()
        waiting = asyncio.create_task(queue.get())
        await asyncio.sleep(0)
        queue.add_after("a", 0.01)
        return await asyncio.wait_for(waiting, 5)

    assert asyncio.run(main()) == "a"


def test_every_waiting_get_ends_on_shutdown_and_adds_are_refused() -> None:
    async def main() -> None:
        queue: WorkQueue[str] = WorkQueue()
        waiting = [asyncio.create_task(queue.get()) for _ in range(3)]
        await asyncio.sleep(0)
        queue.shutdown()
        for task in waiting:
            with pytest.raises(QueueShutDownError):
                await asyncio.wait_for(task, 5)
        queue.add("a")
        assert len(queue) == 0

    asyncio.run(main())
