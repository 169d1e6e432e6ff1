"""How `run_operator` ends: at once on a signal, with exit 1 when the Lease is lost.

kopf itself is replaced by a coroutine here (this tests our wiring around it, not kopf): kopf
waits 5 s on a signal for every task still pending, a waiter on an unset `stop_flag` among
them, so the operator must give kopf no stop flag and cancel it when the Lease is lost.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any, cast

import kopf
import pytest

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


def _fake_kopf(monkeypatch: pytest.MonkeyPatch, runs_for: float | None) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def operator(**kwargs: Any) -> None:
        seen.update(kwargs)
        try:
            if runs_for is None:
                await asyncio.Event().wait()
            else:
                await asyncio.sleep(runs_for)  # then returns, as kopf does after a signal
        except asyncio.CancelledError:
            seen["cancelled"] = True
            raise

    monkeypatch.setattr(kopf, "operator", operator)
    return seen


class _Kube:
    cache = None

    def list_speculative_deployments(self, namespaces: list[str]) -> list[tuple[str, str]]:
        return []


class _Reconciler:
    """Notes what it reconciles; the periodic round sleeps through every test."""

    def __init__(self) -> None:
        self.kube = _Kube()
        self.reconciled: list[tuple[str, str]] = []
        self.kueue_checks = 0

    def check_kueue(self) -> None:
        self.kueue_checks += 1

    def clock(self) -> datetime:
        return datetime.now(UTC)

    def reconcile(self, namespace: str, name: str) -> None:
        self.reconciled.append((namespace, name))


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
