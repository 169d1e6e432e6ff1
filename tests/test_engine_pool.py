"""The e2e engine pool (e2e/engine_harness.py): engines keyed by pair, shared, at most two.

The engines are stand-ins here (no vLLM): what is tested is which engines the pool starts,
reuses and stops."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import engine_harness
from engine_harness import EnginePool


class FakeEngine:
    def __init__(self, name: str, args: list[str]) -> None:
        self.name, self.args = name, args
        self.ready_after_s: float | None = None
        self.stopped = False

    def wait_ready(self) -> float:
        self.ready_after_s = 1.0
        return 1.0

    def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[FakeEngine]:
    engines: list[FakeEngine] = []

    def start(python: Path, name: str, args: list[str], log_dir: Path, **_: Any) -> FakeEngine:
        engines.append(FakeEngine(name, list(args)))
        return engines[-1]

    monkeypatch.setattr(engine_harness, "start_engine", start)
    return engines


def pool() -> EnginePool:
    models = {n: f"/m/{n}" for n in ("target", "draft-good", "draft-small", "draft-bad")}
    return EnginePool(Path("/py"), models, Path("/logs"))


def test_two_names_for_the_same_pair_share_one_engine(started: list[FakeEngine]) -> None:
    engines = pool()
    engines.define(
        "good-by-hand",
        lambda port: engine_harness.vllm_args(
            "/m/target",
            port,
            speculative={
                "method": "draft_model",
                "model": "/m/draft-good",
                "num_speculative_tokens": 3,
            },
        ),
        "tiny",
    )
    first = engines.get("draft-good")
    assert engines.get("good-by-hand") is first
    assert len(started) == 1
    assert engines.reused == {"good-by-hand": 1}


def test_at_most_two_run_and_the_least_recently_used_stops(started: list[FakeEngine]) -> None:
    engines = pool()
    plain, good = engines.get("plain"), engines.get("draft-good")
    engines.get("plain")  # plain used last: draft-good is the least recently used
    engines.get("draft-small")
    assert getattr(good, "stopped", None) is True
    assert getattr(plain, "stopped", None) is False
    assert [e.name for e in started] == ["plain", "draft-good", "draft-small"]


def test_prestart_starts_without_waiting_and_get_waits(started: list[FakeEngine]) -> None:
    engines = pool()
    engines.prestart("plain", "draft-good")
    assert [e.ready_after_s for e in started] == [None, None]
    assert engines.get("draft-good").ready_after_s == 1.0
    assert len(started) == 2, "nothing started twice"
    assert engines.startup_seconds == {"draft-good": 1.0}


def test_close_stops_every_engine(started: list[FakeEngine]) -> None:
    engines = pool()
    engines.start("plain", "draft-good")
    engines.close()
    assert all(e.stopped for e in started)
    assert not engines.running
