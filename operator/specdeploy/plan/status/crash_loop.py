"""An engine that starts, exits and is restarted again and again, read from its pods.

The launcher's own exits (2, 3, 4) are its verdict on the spec and handled in `pair_check`.
Any other exit of the engine container (vLLM crashing after start, an exit 1 from a broken
environment) leaves Kubernetes restarting it with back-off, and the revision never gets ready.
Such a revision is not promoted and no new revision is made for it (the spec did not change);
this only puts into words what the pods show: Ready False with reason `EngineCrashLooping`, the
pod, the exit code, the restart count and the engine's termination message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specdeploy.api import labels
from specdeploy.api.contract import EXIT_MODEL_UNAVAILABLE, EXIT_PAIR_INCOMPATIBLE, EXIT_USAGE

ENGINE_CONTAINER = "engine"
CRASH_LOOP_BACK_OFF = "CrashLoopBackOff"
#: Exits that are the launcher's verdict, not a crash (see pair_check).
LAUNCHER_EXITS = frozenset({EXIT_USAGE, EXIT_PAIR_INCOMPATIBLE, EXIT_MODEL_UNAVAILABLE})
#: Restarts after which an engine that keeps exiting counts as crash-looping even before the
#: kubelet says CrashLoopBackOff.
RESTARTS = 2
MESSAGE_LIMIT = 300


@dataclass(frozen=True)
class CrashLoop:
    """One engine container of the revision that keeps exiting."""

    pod: str
    exit_code: int
    restarts: int
    message: str

    def describe(self, revision: str) -> str:
        said = f": {self.message}" if self.message else ""
        return (
            f"revision {revision}: the engine of pod {self.pod} keeps exiting "
            f"(exit {self.exit_code}, {self.restarts} restarts){said}"
        )


def read_crash_loop(pods: Sequence[Mapping[str, Any]], revision: str | None) -> CrashLoop | None:
    """The first engine container of `revision` in a crash loop, if any.

    A container counts when its last exit is neither 0 nor one of the launcher's verdicts and
    the kubelet waits to restart it (CrashLoopBackOff) or it already restarted `RESTARTS` times.
    """
    if revision is None:
        return None
    for pod in pods:
        metadata = pod.get("metadata") or {}
        if (metadata.get("labels") or {}).get(labels.REVISION) != revision:
            continue
        if metadata.get("deletionTimestamp"):
            continue
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if status.get("name") != ENGINE_CONTAINER:
                continue
            last = (status.get("lastState") or {}).get("terminated") or {}
            code = last.get("exitCode")
            if code is None or code == 0 or code in LAUNCHER_EXITS:
                continue
            restarts = int(status.get("restartCount") or 0)
            waiting = (status.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") != CRASH_LOOP_BACK_OFF and restarts < RESTARTS:
                continue
            said = str(last.get("message") or last.get("reason") or "").strip()
            return CrashLoop(
                pod=str(metadata.get("name", "")),
                exit_code=int(code),
                restarts=restarts,
                message=said[-MESSAGE_LIMIT:],
            )
    return None
