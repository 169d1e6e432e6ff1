"""The periodic round that replaces kopf's timer: every SD every interval, one failure stopping
neither the others nor the next rounds."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, cast

from specdeploy.adapters.watch_cache import WatchCache
from specdeploy.handlers.reconcile import Reconciler
from specdeploy.handlers.run import reconcile_periodically


class CountingKube:
    def __init__(self) -> None:
        self.asked: list[list[str]] = []
        self.cache = WatchCache(["ns"])
        self.refreshed = 0

    def refresh_cache(self) -> None:
        self.refreshed += 1

    def list_speculative_deployments(self, namespaces: list[str]) -> list[tuple[str, str]]:
        self.asked.append(list(namespaces))
        return [("ns", "broken"), ("ns", "chat")]


class CountingReconciler:
    def __init__(self) -> None:
        self.kube = CountingKube()
        self.done: Counter[str] = Counter()

    def reconcile(self, namespace: str, name: str) -> None:
        self.done[name] += 1
        if name == "broken":
            raise ValueError("an SD the plan cannot read")


def run_rounds(reconciler: Any, seconds: float, resync: float = 300) -> None:
    async def main() -> None:
        task = asyncio.create_task(
            reconcile_periodically(cast(Reconciler, reconciler), ["ns"], 0.02, resync)
        )
        await asyncio.sleep(seconds)
        assert not task.done(), "the round ended"
        task.cancel()

    asyncio.run(main())


def test_every_sd_is_reconciled_every_round_despite_a_failing_one() -> None:
    reconciler = CountingReconciler()
    run_rounds(reconciler, 0.5)
    assert reconciler.done["chat"] >= 3
    assert reconciler.done["broken"] == reconciler.done["chat"]
    assert reconciler.kube.asked[0] == ["ns"]


def test_the_round_lists_the_cached_kinds_afresh_every_resync_interval() -> None:
    reconciler = CountingReconciler()
    run_rounds(reconciler, 0.1)
    assert reconciler.kube.refreshed == 0  # not yet due
    run_rounds(reconciler, 0.3, resync=0.05)
    assert reconciler.kube.refreshed >= 1
