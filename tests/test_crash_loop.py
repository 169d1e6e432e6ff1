"""An engine that keeps exiting, read from its pods (plan.status.crash_loop)."""

from __future__ import annotations

from typing import Any

import pytest

from specdeploy.plan.status.crash_loop import read_crash_loop


def pod(
    revision: str,
    exit_code: int | None,
    restarts: int,
    *,
    waiting: str | None = None,
    message: str = "",
    deleting: bool = False,
) -> dict[str, Any]:
    status: dict[str, Any] = {"name": "engine", "restartCount": restarts, "state": {}}
    if waiting:
        status["state"] = {"waiting": {"reason": waiting}}
    if exit_code is not None:
        status["lastState"] = {"terminated": {"exitCode": exit_code, "message": message}}
    metadata: dict[str, Any] = {
        "name": f"p-{revision}",
        "labels": {"specdeploy.dev/revision": revision},
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": metadata, "status": {"containerStatuses": [status]}}


def test_an_engine_in_crash_loop_back_off_is_named_with_its_exit_and_message() -> None:
    found = read_crash_loop(
        [pod("r1", 1, 1, waiting="CrashLoopBackOff", message="No module named x")], "r1"
    )
    assert found is not None
    assert (found.pod, found.exit_code, found.restarts) == ("p-r1", 1, 1)
    assert found.describe("r1") == (
        "revision r1: the engine of pod p-r1 keeps exiting (exit 1, 1 restarts): No module named x"
    )


def test_restarts_alone_count_once_there_are_enough() -> None:
    assert read_crash_loop([pod("r1", 139, 1)], "r1") is None
    assert read_crash_loop([pod("r1", 139, 2)], "r1") is not None


@pytest.mark.parametrize("code", [None, 0, 2, 3, 4])
def test_a_clean_exit_or_the_launchers_verdict_is_not_a_crash_loop(code: int | None) -> None:
    assert read_crash_loop([pod("r1", code, 5, waiting="CrashLoopBackOff")], "r1") is None


def test_only_the_asked_revision_and_live_pods_count() -> None:
    pods = [
        pod("old", 1, 9, waiting="CrashLoopBackOff"),
        pod("r1", 1, 9, waiting="CrashLoopBackOff", deleting=True),
    ]
    assert read_crash_loop(pods, "r1") is None
    assert read_crash_loop(pods, None) is None
    assert read_crash_loop(pods, "old") is not None
