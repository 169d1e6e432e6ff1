"""Revision transitions as pure functions: which revision Deployments exist and how many pods each.

Each pair revision is one Deployment whose pod template never changes, so a pod can only ever
run the pair of its own revision. A new revision is created alongside the serving (stable) one;
the stable one scales to zero only once the new one has all its replicas ready, or, with a
surge limit (spec.rollout.maxSurge), step by step: one stable pod for each new one that is
ready. Revisions at zero replicas are kept, newest first, up to the history limit, so going back
is a scale-up.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specdeploy.api.conditions import Reason
from specdeploy.api.contract import PAIR_ENV
from specdeploy.api.labels import PAIR_VERSION, PROBE_GATE, REVISION


@dataclass(frozen=True)
class RevisionDeployment:
    """The observed state of one revision's Deployment."""

    name: str
    revision: str
    replicas: int
    ready_replicas: int
    created: str
    pair_version: str = ""
    pair: Mapping[str, Any] = field(default_factory=dict)
    pods: int = 0
    # False while the Deployment controller has not yet seen the latest spec (its status is old).
    observed: bool = True
    #: Deployment, or LeaderWorkerSet for a revision whose replicas span nodes (then replicas
    #: and ready_replicas count groups).
    kind: str = "Deployment"
    #: Its pods carry the probe's readiness gate (spec.rollout.analysis.probe).
    probe_gate: bool = False
    #: Its Ready pods, not being deleted, in the pod store (a Deployment's; a LeaderWorkerSet
    #: counts groups, from its status alone).
    ready_pods: int = 0

    def has_ready(self, wanted: int) -> bool:
        """Whether at least `wanted` of its replicas are ready: its own Ready pods show it, which
        needs no word from the controller, or its status says so once the controller has seen
        its latest spec (a status of an older spec may count pods a scale-down since removed)."""
        return 0 < wanted <= self.ready_pods or (self.observed and self.ready_replicas >= wanted)

    @property
    def fully_ready(self) -> bool:
        return self.has_ready(self.replicas)


def _pod_template(child: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pod template of a revision's child: a Deployment's, or a LeaderWorkerSet's leader's."""
    spec = child.get("spec") or {}
    if "leaderWorkerTemplate" in spec:
        group = spec.get("leaderWorkerTemplate") or {}
        return group.get("leaderTemplate") or group.get("workerTemplate") or {}
    return spec.get("template") or {}


def pod_conditions(pod: Mapping[str, Any]) -> dict[str, str]:
    """A pod's condition statuses by type ("Ready": "True", ...)."""
    found = (pod.get("status") or {}).get("conditions") or []
    return {str(c.get("type")): str(c.get("status")) for c in found}


def live_revision_of(pod: Mapping[str, Any]) -> str | None:
    """The revision label of a pod not being deleted (None: no label, or being deleted)."""
    metadata = pod.get("metadata") or {}
    if metadata.get("deletionTimestamp"):
        return None
    revision = (metadata.get("labels") or {}).get(REVISION)
    return str(revision) if revision else None


def pod_is_ready(pod: Mapping[str, Any]) -> bool:
    """Whether a pod counts as ready: its Ready condition is True (readiness gates included)
    and it is not being deleted."""
    deleting = (pod.get("metadata") or {}).get("deletionTimestamp")
    return not deleting and pod_conditions(pod).get("Ready") == "True"


def ready_pods_by_revision(pods: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Ready pods per revision label, from the pod store."""
    found: dict[str, int] = {}
    for pod in pods:
        revision = live_revision_of(pod)
        if revision and pod_conditions(pod).get("Ready") == "True":
            found[revision] = found.get(revision, 0) + 1
    return found


def read_revision_deployment(
    deployment: Mapping[str, Any], ready_pods: Mapping[str, int] | None = None
) -> RevisionDeployment | None:
    """Reads a revision's child (a Deployment, or a LeaderWorkerSet whose replicas are groups)
    into its revision state; None if it carries no revision label.

    A Deployment's ready replicas are the larger of its status's `readyReplicas` and its
    revision's ready pods in `ready_pods` (ready_pods_by_revision): a pod is seen Ready before
    the Deployment controller counts it, or has even seen the Deployment's spec, so a revision
    is ready as soon as its pods are (RevisionDeployment.has_ready), and never less ready than
    its Deployment says. A LeaderWorkerSet counts groups: its status alone."""
    metadata = deployment.get("metadata") or {}
    labels = metadata.get("labels") or {}
    revision = labels.get(REVISION)
    if not revision:
        return None
    spec = deployment.get("spec") or {}
    status = deployment.get("status") or {}
    pair: Mapping[str, Any] = {}
    pod_spec = _pod_template(deployment).get("spec") or {}
    containers = pod_spec.get("containers") or []
    gates = {g.get("conditionType") for g in pod_spec.get("readinessGates") or []}
    for container in containers:
        for env in container.get("env") or []:
            if env.get("name") == PAIR_ENV and env.get("value"):
                try:
                    pair = json.loads(env["value"])
                except ValueError:
                    pair = {}
    kind = "LeaderWorkerSet" if "leaderWorkerTemplate" in spec else "Deployment"
    pods_ready = (ready_pods or {}).get(str(revision), 0) if kind == "Deployment" else 0
    ready = max(int(status.get("readyReplicas") or 0), pods_ready)
    return RevisionDeployment(
        name=str(metadata.get("name", "")),
        revision=str(revision),
        replicas=int(spec.get("replicas", 1) or 0),
        ready_replicas=ready,
        created=str(metadata.get("creationTimestamp") or ""),
        pair_version=str(labels.get(PAIR_VERSION, "")),
        pair=pair,
        pods=max(int(status.get("replicas") or 0), ready),
        observed=int(status.get("observedGeneration") or 0) >= int(metadata.get("generation") or 0),
        kind=kind,
        probe_gate=PROBE_GATE in gates,
        ready_pods=pods_ready,
    )


@dataclass(frozen=True)
class RolloutEvent:
    """A decision a person would look for in `kubectl describe`."""

    reason: str
    message: str
    warning: bool = False


@dataclass(frozen=True)
class RolloutPlan:
    """Desired replicas per revision, what to create and delete, and who serves."""

    replicas: Mapping[str, int]
    create_desired: bool
    delete: tuple[str, ...]
    stable_revision: str | None
    desired_ready: bool
    events: tuple[RolloutEvent, ...] = ()
    #: The desired revision runs as a canary beside the stable one, waiting for its analysis.
    canary: bool = False


def resolve_stable(
    stable_revision: str | None,
    existing: Sequence[RevisionDeployment],
    desired_revision: str | None,
) -> str | None:
    """The stable revision: the one status names while its Deployment exists, else (status lost
    track, or never had one) the other revision serving the most ready pods."""
    if stable_revision in {d.revision for d in existing}:
        return stable_revision
    serving = [d for d in existing if d.ready_replicas > 0 and d.revision != desired_revision]
    return max(serving, key=lambda d: (d.ready_replicas, d.created)).revision if serving else None


def plan_rollout(
    desired_revision: str | None,
    existing: Sequence[RevisionDeployment],
    spec_replicas: int,
    stable_revision: str | None,
    history_limit: int,
    *,
    held: frozenset[str] = frozenset(),
    canary_replicas: int | None = None,
    promoted: bool = False,
    max_surge: int | None = None,
) -> RolloutPlan:
    """Decides the replicas of every revision Deployment.

    - The desired revision (None when it cannot be sized) runs `spec_replicas` pods; it is
      created when missing.
    - Once every desired pod is ready, it becomes the stable revision and all others go to 0.
    - Until then the stable revision keeps serving `spec_replicas` pods and every other revision
      (say, an earlier attempt that never got ready) goes to 0.
    - Zero-replica revisions beyond `history_limit`, oldest first, are deleted.
    - Revisions in `held` (refused by the engine launcher, or rolled back by the analysis) stay
      at zero, never crash-looping, unless one is the stable revision.
    - With `canary_replicas` (spec.rollout set), a desired revision beside a stable one is a
      canary: it runs `canary_replicas` pods while the stable keeps `spec_replicas`, until its
      analysis promotes it (`promoted`); then it scales to `spec_replicas` and, once all are
      ready, becomes stable. The first revision of an SD has nothing to be compared with and
      is promoted when ready.
    - With `max_surge` (spec.rollout.maxSurge), a desired revision replacing a stable one
      (not as a canary, or once promoted) runs `max_surge` pods more than it has ready, up to
      `spec_replicas`, and the stable revision gives up one pod for each ready one: never more
      than `spec_replicas + max_surge` pods, never fewer than `spec_replicas` ready ones while
      the stable's are ready.
    """
    by_revision = {d.revision: d for d in existing}
    desired = by_revision.get(desired_revision) if desired_revision else None
    events: list[RolloutEvent] = []
    create = desired_revision is not None and desired is None
    stable_revision = resolve_stable(stable_revision, existing, desired_revision)
    canary = (
        canary_replicas is not None
        and desired_revision is not None
        and stable_revision is not None
        and stable_revision != desired_revision
        and not promoted
    )
    if create:
        beside = f" alongside revision {stable_revision}" if stable_revision else ""
        what = f" as a canary ({canary_replicas} pods)" if canary else ""
        events.append(
            RolloutEvent(Reason.NEW_REVISION, f"created revision {desired_revision}{what}{beside}")
        )

    desired_ready = (
        not canary
        and desired is not None
        and desired.replicas == spec_replicas
        and desired.fully_ready
    )
    surging = (
        max_surge is not None
        and not canary
        and desired_revision is not None
        and stable_revision not in (None, desired_revision)
        and not desired_ready
    )
    ready_new = min(desired.ready_replicas, spec_replicas) if desired is not None else 0
    replicas: dict[str, int] = {}
    if desired_revision is not None:
        replicas[desired_revision] = (
            canary_replicas if canary and canary_replicas is not None else spec_replicas
        )
        if surging and max_surge is not None:
            replicas[desired_revision] = min(spec_replicas, ready_new + max_surge)
    if desired_ready:
        if stable_revision != desired_revision:
            then = f"; revision {stable_revision} scales to zero" if stable_revision else ""
            events.append(
                RolloutEvent(Reason.ROLLOUT_COMPLETE, f"revision {desired_revision} is ready{then}")
            )
        stable_revision = desired_revision
    for deployment in existing:
        if deployment.revision == desired_revision:
            continue
        is_stable = deployment.revision == stable_revision
        keep = spec_replicas if is_stable else 0
        if surging and is_stable:
            keep = spec_replicas - ready_new
        replicas[deployment.revision] = keep
        if keep == 0 and deployment.replicas > 0 and not desired_ready and not is_stable:
            events.append(
                RolloutEvent(
                    Reason.SCALED_TO_ZERO,
                    f"revision {deployment.revision} never served; scaled to zero",
                )
            )
    retired = sorted(
        (
            d
            for d in existing
            if replicas.get(d.revision, 0) == 0
            and d.revision not in (desired_revision, stable_revision)
        ),
        key=lambda d: d.created,
        reverse=True,
    )
    delete = tuple(d.name for d in retired[history_limit:])
    for name in delete:
        events.append(RolloutEvent(Reason.REVISION_PRUNED, f"deleted {name}: beyond history limit"))
    for name in delete:
        gone = next(d.revision for d in existing if d.name == name)
        replicas.pop(gone, None)
    for revision in held:
        if revision in replicas and revision != stable_revision:
            replicas[revision] = 0
    return RolloutPlan(
        replicas=replicas,
        create_desired=create,
        delete=delete,
        stable_revision=stable_revision,
        desired_ready=desired_ready,
        events=tuple(events),
        canary=canary,
    )


def pods_of(existing: Sequence[RevisionDeployment]) -> tuple[int, int]:
    """(pods, ready pods) across all revisions, for the scale subresource and printer columns."""
    return sum(d.pods for d in existing), sum(d.ready_replicas for d in existing)
