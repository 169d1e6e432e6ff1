"""Why pods of a revision cannot start, read from the pods as the kubelet and the scheduler
left them: an image that cannot be pulled, a Secret or ConfigMap that is missing, an engine
killed for running out of memory, a pod no node can take.

Nothing here acts: the pods stay as Kubernetes keeps them (pulls and restarts go on with
back-off; a Secret created later, a node added, heal them), the revision is never promoted (it
is never ready) and no new revision is made (the spec did not change). This only says which pod
and why, in Ready and Progressing. Crash loops of an engine that starts and exits are
`plan.status.crash_loop`; the launcher's own exits are `plan.status.pair_check`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specdeploy.api import labels
from specdeploy.api.conditions import Reason

ENGINE_CONTAINER = "engine"
MESSAGE_LIMIT = 300
#: The kubelet's waiting reasons of an image that does not come.
IMAGE_PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)
#: The kubelet's waiting reason of a container whose env or volumes name what does not exist.
CONFIG_ERROR_REASONS = frozenset({"CreateContainerConfigError"})
OOM_KILLED = "OOMKilled"
#: The scheduler's reason in PodScheduled when no node fits (not Kueue's SchedulingGated).
UNSCHEDULABLE = "Unschedulable"

#: Most telling first: a kill explains a pod more than the state it waits in afterwards.
_ORDER = (
    Reason.OOM_KILLED,
    Reason.IMAGE_PULL_FAILED,
    Reason.CREATE_CONTAINER_CONFIG_ERROR,
    Reason.POD_UNSCHEDULABLE,
)


@dataclass(frozen=True)
class PodFailure:
    """One pod of the revision that cannot start, and why."""

    pod: str
    #: A Reason: OOMKilled, ImagePullFailed, CreateContainerConfigError or PodUnschedulable.
    reason: str
    #: What the kubelet or the scheduler said.
    message: str

    def describe(self, revision: str) -> str:
        said = f": {self.message}" if self.message else ""
        what = {
            Reason.OOM_KILLED: f"the engine of pod {self.pod} ran out of memory",
            Reason.IMAGE_PULL_FAILED: f"pod {self.pod} cannot pull its image",
            Reason.CREATE_CONTAINER_CONFIG_ERROR: (
                f"pod {self.pod} cannot start its engine (CreateContainerConfigError)"
            ),
            Reason.POD_UNSCHEDULABLE: f"pod {self.pod} cannot be scheduled",
        }[self.reason]
        return f"revision {revision}: {what}{said}"


def _engine_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((s for s in statuses if s.get("name") == ENGINE_CONTAINER), {})


def _oom_killed(engine: Mapping[str, Any]) -> str | None:
    """The OOM kill of a container that is not ready, as the kubelet recorded it."""
    if engine.get("ready"):
        return None
    state, last = engine.get("state") or {}, engine.get("lastState") or {}
    for terminated in (state.get("terminated"), last.get("terminated")):
        if terminated and terminated.get("reason") == OOM_KILLED:
            restarts = int(engine.get("restartCount") or 0)
            return (
                f"OOMKilled (exit {terminated.get('exitCode', 137)}) over its memory limit, "
                f"{restarts} restarts"
            )
    return None


def _waiting(engine: Mapping[str, Any], reasons: frozenset[str]) -> str | None:
    waiting = (engine.get("state") or {}).get("waiting") or {}
    if waiting.get("reason") not in reasons:
        return None
    message = str(waiting.get("message") or "").strip()
    return f"{waiting['reason']}: {message}" if message else str(waiting["reason"])


def _unschedulable(pod: Mapping[str, Any]) -> str | None:
    if (pod.get("spec") or {}).get("nodeName"):
        return None
    conditions = (pod.get("status") or {}).get("conditions") or []
    scheduled = next((c for c in conditions if c.get("type") == "PodScheduled"), None)
    if scheduled is None or scheduled.get("status") != "False":
        return None
    if scheduled.get("reason") != UNSCHEDULABLE:
        return None
    return str(scheduled.get("message") or UNSCHEDULABLE).strip()


def _failures_of(pod: Mapping[str, Any]) -> dict[str, str]:
    engine = _engine_status(pod)
    found = {
        Reason.OOM_KILLED: _oom_killed(engine),
        Reason.IMAGE_PULL_FAILED: _waiting(engine, IMAGE_PULL_REASONS),
        Reason.CREATE_CONTAINER_CONFIG_ERROR: _waiting(engine, CONFIG_ERROR_REASONS),
        Reason.POD_UNSCHEDULABLE: _unschedulable(pod),
    }
    return {reason: said for reason, said in found.items() if said is not None}


def read_pod_failure(pods: Sequence[Mapping[str, Any]], revision: str | None) -> PodFailure | None:
    """The most telling reason a pod of `revision` cannot start, with the first pod (by name)
    that shows it; None when none of its pods shows one. Pods being deleted do not count."""
    if revision is None:
        return None
    found: dict[str, PodFailure] = {}
    ours = [
        pod
        for pod in pods
        if ((pod.get("metadata") or {}).get("labels") or {}).get(labels.REVISION) == revision
        and not (pod.get("metadata") or {}).get("deletionTimestamp")
    ]
    for pod in sorted(ours, key=lambda p: str((p.get("metadata") or {}).get("name", ""))):
        name = str((pod.get("metadata") or {}).get("name", ""))
        for reason, said in _failures_of(pod).items():
            found.setdefault(reason, PodFailure(name, reason, said[:MESSAGE_LIMIT]))
    return next((found[reason] for reason in _ORDER if reason in found), None)
