"""The launcher's verdict on a revision's pair, read from its pods, and what reconcile does with it.

The engine launcher checks the pair before vLLM starts. When it refuses, the container ends with
exit code 3 (`EXIT_PAIR_INCOMPATIBLE`) and one line in its termination message; exit code 4
(`EXIT_MODEL_UNAVAILABLE`) means a model could not be found or read. Kubernetes copies both into
the pod's container status (`state.terminated` and, after a restart, `lastState.terminated`).

- Exit 3 is permanent: the checks read the models' own config files at pinned revisions, so a
  restart gives the same answer. The revision is stopped (scaled to zero, marked Failed in
  status.revisions) instead of crash-looping, `PairCompatible` turns False with reason
  `PairIncompatible` and the launcher's line, and a Warning Event says so. A stable revision
  keeps serving. Status remembers the refusal once the pods are gone; only a spec naming
  another pair (another revision) moves on, and a revision that is not the desired one is at
  zero replicas anyway.
- Exit 2 (`EXIT_USAGE`: the vLLM arguments are unusable, said by the launcher or by vLLM's own
  argument parser, which exits 2 too) is permanent as well: the arguments come from the spec and
  a restart gets the same ones. It is handled as exit 3, with reason `ArgumentsRefused`.
- Exit 4 may heal (a volume filled later, the hub reachable again): the revision keeps its pods
  and Kubernetes' back-off; `PairCompatible` is Unknown with reason `ModelNotFound` and the
  launcher's line, with a Warning Event.
- Once the desired revision's pods are ready, the launcher accepted its pair: `PairVerified`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specdeploy.api import labels
from specdeploy.api.conditions import ConditionType, Reason, RevisionPhase
from specdeploy.api.contract import EXIT_MODEL_UNAVAILABLE, EXIT_PAIR_INCOMPATIBLE, EXIT_USAGE
from specdeploy.api.models import Condition, SpeculativeDeploymentStatus
from specdeploy.plan.rollout.revisions import RolloutEvent
from specdeploy.plan.status.conditions import ConditionUpdate

ENGINE_CONTAINER = "engine"
#: The launcher's exits that a restart cannot change: the revision is stopped.
PERMANENT_EXITS = frozenset({EXIT_USAGE, EXIT_PAIR_INCOMPATIBLE})
LAUNCHER_EXITS = PERMANENT_EXITS | {EXIT_MODEL_UNAVAILABLE}
#: The PairCompatible reasons of a permanent exit, by exit code.
PERMANENT_REASONS = {
    EXIT_PAIR_INCOMPATIBLE: Reason.PAIR_INCOMPATIBLE,
    EXIT_USAGE: Reason.ARGUMENTS_REFUSED,
}


@dataclass(frozen=True)
class LauncherExit:
    """One exit of the launcher seen in a pod: which revision, why, and its one line."""

    revision: str
    exit_code: int
    message: str
    pod: str
    restarts: int = 0

    @property
    def permanent(self) -> bool:
        """Whether a restart gets the same answer (exit 2 or 3): the revision is stopped."""
        return self.exit_code in PERMANENT_EXITS

    @property
    def reason(self) -> str:
        return PERMANENT_REASONS.get(self.exit_code, Reason.MODEL_NOT_FOUND)


def _terminations(status: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    for key in ("state", "lastState"):
        terminated = (status.get(key) or {}).get("terminated")
        if terminated:
            yield terminated


def shows_launcher_exit(pod: Mapping[str, Any]) -> bool:
    """Whether this pod's engine container ended with the launcher's exit 2, 3 or 4."""
    return bool(read_launcher_exits([pod]))


def read_launcher_exits(pods: Sequence[Mapping[str, Any]]) -> dict[str, LauncherExit]:
    """The launcher's refusals (exit 3) and missing models (exit 4) per revision, from pods.

    A pod's engine container counts when its current or last termination has one of those exit
    codes (or exit 2, unusable arguments). Per revision a permanent exit (2 or 3) wins over an
    exit 4, since it is the one that stops the revision. Pods without the revision label, and
    other exit codes (a crash of vLLM itself, a kill), are not the launcher's verdict and are
    ignored.
    """
    found: dict[str, LauncherExit] = {}
    for pod in pods:
        metadata = pod.get("metadata") or {}
        revision = (metadata.get("labels") or {}).get(labels.REVISION)
        if not revision:
            continue
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        for status in statuses:
            if status.get("name") != ENGINE_CONTAINER:
                continue
            for terminated in _terminations(status):
                code = terminated.get("exitCode")
                if code not in LAUNCHER_EXITS:
                    continue
                message = str(terminated.get("message") or "").strip()
                if not message and code == EXIT_USAGE:
                    # vLLM's own argument parser exits 2 without a termination message.
                    message = "the engine exited 2: its vLLM arguments are unusable"
                seen = LauncherExit(
                    revision=str(revision),
                    exit_code=int(code),
                    message=message,
                    pod=str(metadata.get("name", "")),
                    restarts=int(status.get("restartCount") or 0),
                )
                before = found.get(seen.revision)
                if before is None or (not before.permanent and seen.permanent):
                    found[seen.revision] = seen
    return found


@dataclass(frozen=True)
class PairVerdict:
    """What reconcile does about the launcher's verdicts in one pass."""

    #: Revisions the launcher refused (seen in pods now, or the desired one in an earlier pass):
    #: kept at zero replicas and marked Failed.
    refused: frozenset[str]
    #: The PairCompatible condition for the desired revision.
    condition: ConditionUpdate
    #: Set when the desired revision is refused or lacks a model: Ready, Progressing, phase.
    desired_problem: LauncherExit | None
    events: tuple[RolloutEvent, ...] = ()


def _remembered_refusal(
    desired_revision: str, status: SpeculativeDeploymentStatus | None, current: Condition | None
) -> bool:
    """Whether an earlier pass refused the desired revision, whose pods are gone since.

    Both marks must be there: the revision Failed in status.revisions (the canary analysis
    marks revisions Failed too) and PairCompatible False for PairIncompatible. Should the
    condition have moved on meanwhile, the revision starts once more and its launcher refuses
    it again within seconds.
    """
    if status is None or current is None:
        return False
    if current.status != "False" or current.reason not in PERMANENT_REASONS.values():
        return False
    return any(
        r.revision == desired_revision and r.phase == RevisionPhase.FAILED for r in status.revisions
    )


def _current_condition(status: SpeculativeDeploymentStatus | None) -> Condition | None:
    if status is None:
        return None
    return next((c for c in status.conditions if c.type == ConditionType.PAIR_COMPATIBLE), None)


def judge_pair(
    desired_revision: str | None,
    desired_ready: bool,
    has_draft: bool,
    pods: Sequence[Mapping[str, Any]],
    status: SpeculativeDeploymentStatus | None,
    *,
    rolled_back: frozenset[str] = frozenset(),
) -> PairVerdict:
    """The PairCompatible verdict for the desired revision and the revisions to keep stopped.

    `desired_ready` says whether every pod of the desired revision is ready (the launcher then
    accepted the pair and vLLM serves it); `status` is the SD's status as last written, whose
    Failed revisions stay refused after their pods are gone.
    """
    exits = read_launcher_exits(pods)
    refused = {r for r, e in exits.items() if e.permanent}
    current = _current_condition(status)
    if desired_revision and _remembered_refusal(desired_revision, status, current):
        refused.add(desired_revision)
    problem = exits.get(desired_revision) if desired_revision else None

    if desired_revision is None:
        # Nothing to run (unschedulable): the last verdict still describes what was tried.
        if current is not None:
            update = ConditionUpdate(
                ConditionType.PAIR_COMPATIBLE, current.status, current.reason, current.message
            )
        else:
            update = ConditionUpdate(
                ConditionType.PAIR_COMPATIBLE,
                "Unknown",
                Reason.PAIR_UNVERIFIED,
                "no revision runs: nothing was checked",
            )
    elif desired_revision in refused:
        if problem is None or not problem.permanent:
            # Its pods are gone: keep the line the launcher wrote when it refused.
            codes = {reason: code for code, reason in PERMANENT_REASONS.items()}
            if current is not None and current.reason in codes:
                problem = LauncherExit(
                    desired_revision, codes[current.reason], current.message, pod=""
                )
            else:
                problem = LauncherExit(
                    desired_revision,
                    EXIT_PAIR_INCOMPATIBLE,
                    f"revision {desired_revision} was refused by the engine launcher",
                    pod="",
                )
        update = ConditionUpdate(
            ConditionType.PAIR_COMPATIBLE, "False", problem.reason, problem.message
        )
    elif problem is not None:
        update = ConditionUpdate(
            ConditionType.PAIR_COMPATIBLE, "Unknown", Reason.MODEL_NOT_FOUND, problem.message
        )
    elif desired_revision in rolled_back:
        # Its pods are gone and stay gone: no launcher to wait for. Keep what was verified.
        verified = (
            current is not None
            and current.reason == Reason.PAIR_VERIFIED
            and desired_revision in current.message
        )
        update = ConditionUpdate(
            ConditionType.PAIR_COMPATIBLE,
            "True" if verified else "Unknown",
            Reason.PAIR_VERIFIED if verified else Reason.PAIR_UNVERIFIED,
            f"revision {desired_revision} was rolled back; "
            + (
                "the engine launcher had checked its pair"
                if verified
                else "its pair is not checked while the spec names it"
            ),
        )
    elif desired_ready:
        checked = (
            "the engine launcher checked the pair" if has_draft else "no draft: nothing to pair"
        )
        update = ConditionUpdate(
            ConditionType.PAIR_COMPATIBLE,
            "True",
            Reason.PAIR_VERIFIED,
            f"revision {desired_revision} serves; {checked}",
        )
    else:
        update = ConditionUpdate(
            ConditionType.PAIR_COMPATIBLE,
            "Unknown",
            Reason.PAIR_UNVERIFIED,
            f"waiting for the engine launcher of revision {desired_revision}",
        )

    events: list[RolloutEvent] = []
    changed = current is None or (current.status, current.reason) != (update.status, update.reason)
    if changed and update.reason in (*PERMANENT_REASONS.values(), Reason.MODEL_NOT_FOUND):
        action = (
            "stopped (scaled to zero)"
            if update.reason in PERMANENT_REASONS.values()
            else "kept under back-off until the model is there"
        )
        events.append(
            RolloutEvent(
                update.reason,
                f"revision {desired_revision} {action}: {update.message}",
                warning=True,
            )
        )
    elif changed and update.reason == Reason.PAIR_VERIFIED:
        events.append(RolloutEvent(update.reason, update.message))
    return PairVerdict(
        refused=frozenset(refused),
        condition=update,
        desired_problem=problem,
        events=tuple(events),
    )
