"""A context manager that runs one loop in a daemon thread for the length of a `with` block."""

from __future__ import annotations

import threading
from typing import Self


class Background:
    """Runs `self.run_loop(stop)` in a daemon thread from `__enter__` until `__exit__` sets
    `stop` (and joins the thread, waiting at most `join_seconds`)."""

    thread_name = "background"
    join_seconds = 60.0

    def __enter__(self) -> Self:
        self.stop_event = threading.Event()
        self.thread = threading.Thread(
            target=self.run_loop, args=(self.stop_event,), name=self.thread_name, daemon=True
        )
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop_event.set()
        self.thread.join(timeout=self.join_seconds)

    def run_loop(self, stop: threading.Event) -> None:
        raise NotImplementedError
