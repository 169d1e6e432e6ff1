"""Waiting for the cluster to reach a state: used by the e2e tests and the demo."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(
    probe: Callable[[], T | None],
    timeout: float,
    what: str,
    *,
    retry_on: tuple[type[Exception], ...] = (),
) -> T:
    """Polls `probe` every half second until it returns something truthy and returns that value.

    An exception of a type in `retry_on` counts as "not yet". Raises TimeoutError naming `what`
    (and the last such exception) when `timeout` seconds pass first.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = probe()
        except retry_on as error:
            last_error, value = error, None
        if value:
            return value
        if time.monotonic() > deadline:
            why = f" (last error: {last_error})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{why}")
        time.sleep(0.5)
