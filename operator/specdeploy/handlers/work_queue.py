"""One rate-limited work queue of keys to reconcile, with the guarantees of client-go's workqueue
(util/workqueue: queue.go, delaying_queue.go, rate_limiting_queue.go, default_rate_limiters.go).

- **Deduplicated**: a key added several times before a worker takes it is handed out once.
- **Never two workers on one key**: a key added while a worker holds it waits in `dirty` and is
  handed out once more after that worker calls `done`, so whatever caused the add is seen by a
  reconcile that starts after it.
- **Delayed adds** (`add_after`): the key is added when its time comes; of two delays for one
  key the earlier wins.
- **Per-key backoff** (`add_rate_limited`): each failure of a key doubles its delay, from
  `Backoff.base` up to `Backoff.cap`; `forget` (after a success) starts it again from the base.
- **Bounded concurrency**: as many keys are held at once as there are workers calling `get`.

The state is plain data driven by an injected clock, so every guarantee is tested step by step
(tests/test_work_queue.py); `get` is the only coroutine, and it only waits for the next key.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class QueueShutDownError(Exception):
    """`get` on a queue that was shut down: the worker should end."""


@dataclass(frozen=True)
class Backoff:
    """Per-key exponential backoff: `base * 2**(failures - 1)` seconds, at most `cap`."""

    base: float = 0.5
    cap: float = 300.0

    def delay(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        # The exponent is capped before it is raised: 2**1000 overflows a float.
        return float(min(self.cap, self.base * 2 ** min(failures - 1, 64)))


class WorkQueue(Generic[K]):
    """Keys waiting for a worker (see the module's docstring for the guarantees)."""

    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, backoff: Backoff | None = None
    ) -> None:
        self.clock = clock
        self.backoff = backoff or Backoff()
        self._queue: deque[K] = deque()  # ready, in order; each also in _dirty, none processing
        self._dirty: set[K] = set()  # needs processing (queued, or held and added again)
        self._processing: set[K] = set()  # held by a worker
        self._delayed: dict[K, float] = {}  # key -> when it is due
        self._heap: list[tuple[float, int, K]] = []  # (due, tiebreak, key); stale entries skipped
        self._order = itertools.count()
        self._failures: dict[K, int] = {}
        self._shut = False
        self._changed: asyncio.Event | None = None

    # --- adding -----------------------------------------------------------------------------

    def add(self, key: K) -> None:
        """Marks `key` as needing processing (once, however often it is added meanwhile)."""
        if self._shut or key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            return  # handed out again when its worker is done
        self._queue.append(key)
        self._wake()

    def add_after(self, key: K, delay: float) -> None:
        """Adds `key` once `delay` seconds have passed; an earlier pending delay of it wins."""
        if self._shut:
            return
        if delay <= 0:
            self.add(key)
            return
        due = self.clock() + delay
        pending = self._delayed.get(key)
        if pending is not None and pending <= due:
            return
        self._delayed[key] = due
        heapq.heappush(self._heap, (due, next(self._order), key))
        self._wake()

    def add_rate_limited(self, key: K) -> float:
        """Adds `key` after its backoff (one more failure of it); returns that delay."""
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = self.backoff.delay(failures)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """The key's failures are over (it succeeded, or is gone): its backoff starts afresh."""
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        """How many failures of `key` its current backoff counts."""
        return self._failures.get(key, 0)

    # --- taking -----------------------------------------------------------------------------

    def promote_due(self) -> None:
        """Adds every delayed key whose time has come."""
        now = self.clock()
        while self._heap and self._heap[0][0] <= now:
            due, _, key = heapq.heappop(self._heap)
            if self._delayed.get(key) == due:
                del self._delayed[key]
                self.add(key)

    def get_nowait(self) -> K | None:
        """The next key to process (now held by the caller until `done`), or None."""
        self.promote_due()
        if not self._queue:
            return None
        key = self._queue.popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    async def get(self) -> K:
        """Waits for the next key; QueueShutDownError once the queue is shut down."""
        while True:
            if self._shut:
                raise QueueShutDownError
            key = self.get_nowait()
            if key is not None:
                return key
            changed = self._event()
            changed.clear()
            due = self.next_due()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), None if due is None else max(0.0, due))

    def done(self, key: K) -> None:
        """The worker holding `key` finished; a key added meanwhile is queued again."""
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.append(key)
            self._wake()

    def shutdown(self) -> None:
        """Refuses new keys and ends every `get`."""
        self._shut = True
        self._wake()

    # --- looking ----------------------------------------------------------------------------

    def next_due(self) -> float | None:
        """Seconds until the earliest delayed key is due (0 when one is), None without any."""
        while self._heap and self._delayed.get(self._heap[0][2]) != self._heap[0][0]:
            heapq.heappop(self._heap)  # superseded by an earlier delay of the same key
        if not self._heap:
            return None
        return max(0.0, self._heap[0][0] - self.clock())

    def is_delayed(self, key: K) -> bool:
        return key in self._delayed

    def __len__(self) -> int:
        """Keys ready to be handed out (not counting those held or delayed)."""
        return len(self._queue)

    @property
    def processing(self) -> frozenset[K]:
        return frozenset(self._processing)

    # --- waking a waiting `get` -------------------------------------------------------------

    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
