"""How `run_operator` ends: at once on a signal, with exit 1 when the Lease is lost.

kopf itself is replaced by a coroutine here (this tests our wiring around it, not kopf), one
that ends as kopf does after a signal: it runs the registry's cleanup activity, then waits (5 s
in kopf, `HUNG_WAIT_S` here) for every task made after it started and cancels what is left. A
waiter on an unset `stop_flag` would be among those tasks, so the operator gives kopf no stop
flag; its own reconcile workers and periodic rounds are among them too, so its cleanup handler
stops them; and a lost Lease cancels kopf, which then runs no cleanup.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any, cast

import kopf
import pytest
from kopf._core.intents import causes

from specdeploy.api.config import OperatorConfig
from specdeploy.handlers import run


class _Elector:
    def __init__(self, lose_after: float | None) -> None:
        self.lose_after = lose_after
        self.released = False

    async def acquire(self) -> None:
        return None

    async def keep(self, lost: asyncio.Event) -> None:
        if self.lose_after is None:
            await asyncio.Event().wait()
        else:
            await asyncio.sleep(self.lose_after)
            lost.set()

    def release(self) -> None:
        self.released = True
        self.released_at = time.monotonic()


#: kopf's wait for the tasks made after it started, scaled down: ours end within a few turns of
#: the event loop once cancelled, and never without it.
HUNG_WAIT_S = 0.5


def _fake_kopf(monkeypatch: pytest.MonkeyPatch, runs_for: float | None) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def operator(registry: kopf.OperatorRegistry, **kwargs: Any) -> None:
        seen.update(kwargs)
        existing = asyncio.all_tasks()
        try:
            if runs_for is None:
                await asyncio.Event().wait()
            else:
                await asyncio.sleep(runs_for)  # the signal
        except asyncio.CancelledError:
            seen["cancelled"] = True
            raise
        for handler in registry._activities.get_handlers(activity=causes.Activity.CLEANUP):
            cleanup: Any = handler.fn  # kopf passes more keywords; ours takes them as **_
            await cleanup()
        made_since = asyncio.all_tasks() - existing
        if made_since:
            _, hung = await asyncio.wait(made_since, timeout=HUNG_WAIT_S)
            seen["hung"] = sorted(task.get_coro().__qualname__ for task in hung)  # type: ignore[union-attr]
            for task in hung:
                task.cancel()

    monkeypatch.setattr(kopf, "operator", operator)
    return seen


class _Kube:
    cache = None

    def list_speculative_deployments(self, namespaces: list[str]) -> list[tuple[str, str]]:
        return []


class _Reconciler:
    """Notes what it reconciles; the periodic round sleeps through every test."""

    def __init__(self, takes: float = 0.0) -> None:
        self.kube = _Kube()
        self.takes = takes
        self.reconciled: list[tuple[str, str]] = []
        self.ended: list[float] = []
        self.kueue_checks = 0

    def check_kueue(self) -> None:
        self.kueue_checks += 1

    def clock(self) -> datetime:
        return datetime.now(UTC)

    def reconcile(self, namespace: str, name: str) -> None:
        self.reconciled.append((namespace, name))
        time.sleep(self.takes)
        self.ended.append(time.monotonic())


def _run(elector: _Elector | None, reconciler: _Reconciler | None = None) -> int:
    config = OperatorConfig()
    queues = run.Queues()
    queues.reconciles.add(("ns", "sd"))
    return asyncio.run(
        asyncio.wait_for(
            run.run_operator(
                cast(Any, reconciler or _Reconciler()),
                kopf.OperatorRegistry(),
                queues,
                config,
                [],
                cast(Any, elector),
            ),
            timeout=5,
        )
    )


def test_kopf_gets_no_stop_flag_and_a_stop_releases_the_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = _fake_kopf(monkeypatch, runs_for=0.05)
    elector = _Elector(lose_after=None)
    assert _run(elector) == 0
    assert seen.get("stop_flag") is None
    assert "cancelled" not in seen
    assert elector.released


def test_on_a_signal_nothing_of_ours_is_left_for_kopf_to_wait_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The workers and the periodic round, made after kopf started, are stopped by the cleanup:
    # kopf has nothing to wait 5 s for.
    seen = _fake_kopf(monkeypatch, runs_for=0.05)
    assert _run(_Elector(lose_after=None)) == 0
    assert seen["hung"] == []


def test_the_lease_is_released_once_the_reconcile_under_way_has_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The signal comes while a reconcile (0.3 s) runs in its thread: its writes end before
    # another operator may take the Lease.
    _fake_kopf(monkeypatch, runs_for=0.05)
    elector, reconciler = _Elector(lose_after=None), _Reconciler(takes=0.3)
    assert _run(elector, reconciler) == 0
    assert reconciler.ended, "the reconcile under way ran to its end"
    assert elector.released_at >= reconciler.ended[0]


def test_a_lost_lease_cancels_kopf_and_exits_1_without_releasing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = _fake_kopf(monkeypatch, runs_for=None)
    elector = _Elector(lose_after=0.05)
    assert _run(elector) == 1
    assert seen.get("cancelled") is True
    assert not elector.released


def test_without_leader_election_a_stop_returns_0(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_kopf(monkeypatch, runs_for=0.05)
    assert _run(None) == 0


def test_an_sd_on_the_work_queue_is_reconciled_while_kopf_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_kopf(monkeypatch, runs_for=0.3)
    reconciler = _Reconciler()
    assert _run(None, reconciler) == 0
    assert reconciler.reconciled == [("ns", "sd")]
