"""The tasks that take keys off the work queues: reconcile workers, the periodic round, and the
relists that keep the watch-fed stores whole.

Every reason an SD needs a reconcile adds its key to one `WorkQueue` (handlers.work_queue): a
watch event of the SD or of a child (handlers.run), the moment its next verdict falls due (the
`wake_at` its last reconcile returned), the periodic round, and the operator's start (kopf's
first listing of the SDs). `RECONCILE_WORKERS` workers take keys off it, each reconcile in a
thread of their own pool; a reconcile that raises is added again after its key's backoff.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import Executor
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from specdeploy.adapters import watch_cache
from specdeploy.adapters.kube import NotLeadingError
from specdeploy.handlers.work_queue import QueueShutDownError, WorkQueue

log = logging.getLogger("specdeploy.operator")

SDKey = tuple[str, str]

#: Reconciles at once (threads): reads come from memory, so what they wait on is the API
#: server's answers to their writes.
RECONCILE_WORKERS = 8
#: After the start, how often the stores are checked for objects of the first LIST that kopf's
#: own first listing has not shown (confirm_first_listings), and how many times at most.
CONFIRM_SECONDS = 5.0
CONFIRM_ROUNDS = 12


async def reconcile_from(
    queue: WorkQueue[SDKey],
    reconcile: Callable[[str, str], datetime | None],
    clock: Callable[[], datetime],
    executor: Executor | None = None,
) -> None:
    """One worker: reconciles the keys it takes off `queue` until the queue shuts down.

    A reconcile that returns a moment (its next verdict) adds its key again for then; one that
    raises adds it after its backoff; one that succeeds resets its backoff."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            key = await queue.get()
        except QueueShutDownError:
            return
        namespace, name = key
        try:
            wake_at = await loop.run_in_executor(executor, reconcile, namespace, name)
        except (ApiException, OSError, NotLeadingError) as error:
            # Conflicts and API hiccups: the next attempt reads the world afresh. Not leading:
            # the process stops (handlers.run) before that attempt matters.
            delay = queue.add_rate_limited(key)
            log.warning(
                "reconcile of %s/%s failed (again in %.1fs): %s", namespace, name, delay, error
            )
        except Exception:
            delay = queue.add_rate_limited(key)
            log.exception("reconcile of %s/%s failed (again in %.1fs)", namespace, name, delay)
        else:
            queue.forget(key)
            if wake_at is not None:
                queue.add_after(key, (wake_at - clock()).total_seconds())
        finally:
            queue.done(key)


async def enqueue_every_round(
    queue: WorkQueue[SDKey],
    list_keys: Callable[[], Iterable[SDKey]],
    interval: float,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Every `interval` seconds, adds every SD `list_keys` names (from the SD store): the
    level-based round that picks up what no watch event announces (quota freed, nodes
    changed, metrics to judge)."""
    while True:
        await sleep(interval)
        try:
            keys = await asyncio.to_thread(lambda: list(list_keys()))
        except Exception as error:  # the API unreachable while the store is not filled
            log.warning("listing SpeculativeDeployments failed: %s", error)
            continue
        for key in keys:
            queue.add(key)


async def call_every(
    call: Callable[[], object],
    interval: float,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Calls `call` in a thread every `interval` seconds (after the first interval); a failure
    is logged and the next call comes all the same."""
    while True:
        await sleep(interval)
        try:
            await asyncio.to_thread(call)
        except Exception:
            log.exception("periodic %s failed", getattr(call, "__name__", call))


async def relist_from(
    relists: WorkQueue[str],
    refresh: Callable[[watch_cache.Kind], list[dict[str, Any]]],
    removed: Callable[[watch_cache.Kind, list[dict[str, Any]]], None],
) -> None:
    """Lists each kind named on `relists` afresh (KubeAdapter.refresh_kind) and hands what the
    LIST removed (deletions no watch event showed) to `removed`; a failed LIST is tried again
    after its backoff. Kinds are named by a relist of kopf's stream (handlers.run.route_event),
    by check_stores, and by confirm_first_listings: the stores trust their watch otherwise, as
    client-go's informers do."""
    kinds = {kind.name: kind for kind in watch_cache.KINDS}
    while True:
        try:
            name = await relists.get()
        except QueueShutDownError:
            return
        try:
            gone = await asyncio.to_thread(refresh, kinds[name])
        except Exception as error:
            delay = relists.add_rate_limited(name)
            log.warning("listing %s afresh failed (again in %.1fs): %s", name, delay, error)
        else:
            relists.forget(name)
            if gone:
                log.info("listing %s afresh removed %d deleted unseen", name, len(gone))
                removed(kinds[name], gone)
        finally:
            relists.done(name)


async def check_stores(
    relists: WorkQueue[str],
    stale: Callable[[watch_cache.Kind], bool],
    interval: float,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Every `interval` seconds (`storeCheckSeconds`), asks of each kind whether its store
    holds objects where the API server has none (KubeAdapter.kind_is_stale) and names the
    stale ones on `relists`. The interval bounds how long a deletion during a watch gap that
    kopf's relist could not show (it showed nothing: every object of the kind had gone) goes
    unseen. Its reads are one LIST of the objects' metadata per kind and namespace that holds
    anything, whatever the number of objects; a failed check is logged and the next round
    comes all the same."""
    while True:
        await sleep(interval)
        for kind in watch_cache.KINDS:
            try:
                if await asyncio.to_thread(stale, kind):
                    log.info("the %s store holds objects the API server has not", kind.name)
                    relists.add(kind.name)
            except Exception as error:
                log.warning("checking the %s store failed: %s", kind.name, error)


async def confirm_first_listings(
    stores: Mapping[str, watch_cache.KindStore],
    relists: WorkQueue[str],
    interval: float = CONFIRM_SECONDS,
    rounds: int = CONFIRM_ROUNDS,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Relists each kind whose store still holds objects of its first LIST that kopf's watch
    has not shown (KindStore.awaiting_stream), every `interval` seconds until none is left or
    `rounds` are done. kopf's watch starts from a LIST of its own: an object deleted between
    our first LIST and kopf's is in neither kopf's listing nor its events, and only a LIST
    made after kopf's shows it gone (client-go's informers have no such gap: their watch
    starts from their own LIST). What still waits after the last round was in that round's
    LIST, made after kopf's: it exists, and kopf's watch shows what becomes of it."""
    for _ in range(rounds):
        await sleep(interval)
        waiting = [name for name, store in stores.items() if store.awaiting_stream()]
        if not waiting:
            return
        for name in waiting:
            relists.add(name)
