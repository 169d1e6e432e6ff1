"""Kueue placement labels for a SpeculativeDeployment's Deployments."""

from __future__ import annotations

from specdeploy.api import labels
from specdeploy.api.models import SpeculativeDeploymentSpec as Spec


def kueue_labels(spec: Spec) -> dict[str, str]:
    """The Kueue labels for the Deployment object: queue name and priority class, when set.

    They go on the Deployment object, where Kueue's Deployment integration reads them (and
    passes the queue on to the pods itself), not into the pod template the operator renders:
    moving to another queue relabels the Deployments instead of making a new revision.
    """
    result: dict[str, str] = {}
    if spec.placement.queue:
        result[labels.KUEUE_QUEUE_NAME] = spec.placement.queue
    if spec.placement.priority_class:
        result[labels.KUEUE_PRIORITY_CLASS] = spec.placement.priority_class
    return result
