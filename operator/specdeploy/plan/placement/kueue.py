"""Kueue: the labels of a SpeculativeDeployment's Deployments, and whether the cluster's Kueue
manages the kinds the operator relies on (pods and Deployments)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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


# --- Does Kueue manage the kinds the operator relies on? ------------------------------------

#: The names Kueue gives its mutating webhooks for pods and Deployments (kubebuilder markers in
#: pkg/controller/jobs/{pod,deployment}); Kueue registers them in its
#: MutatingWebhookConfiguration, whatever its configuration's `integrations.frameworks` enables.
KUEUE_POD_WEBHOOK = "mpod.kb.io"
KUEUE_DEPLOYMENT_WEBHOOK = "mdeployment.kb.io"
#: The CRD whose presence says Kueue's API is installed.
KUEUE_WORKLOAD_CRD = "workloads.kueue.x-k8s.io"


@dataclass(frozen=True)
class KueueWebhooks:
    """What the cluster shows of Kueue at the operator's start: its API, and the mutating
    webhooks through which its pod and deployment integrations gate the pods it admits.

    A registered webhook is necessary, not sufficient: Kueue registers a no-op webhook for an
    integration its configuration leaves out (jobframework.SetupWebhooks), and that
    configuration is a file in Kueue's pod, no API object. So this can say for sure only that
    quota *would be bypassed*; that it is enforced shows on the pods (judge_admission)."""

    installed: bool
    #: Name of the MutatingWebhookConfiguration holding each webhook, or None.
    pods: str | None
    deployments: str | None

    @property
    def bypassed_because(self) -> str | None:
        """Why pods of an SD with a queue would schedule without Kueue's admission; None when
        nothing here says so."""
        if not self.installed:
            return f"Kueue is not installed (no CustomResourceDefinition {KUEUE_WORKLOAD_CRD})"
        missing = [
            f"{kind} ({name})"
            for kind, name, found in (
                ("Deployments", KUEUE_DEPLOYMENT_WEBHOOK, self.deployments),
                ("pods", KUEUE_POD_WEBHOOK, self.pods),
            )
            if found is None
        ]
        if missing:
            return f"Kueue's mutating webhook for {' and '.join(missing)} is not registered"
        return None

    def describe(self) -> str:
        """The start-up log line."""
        why = self.bypassed_because
        if why is not None:
            return (
                f"{why}: SpeculativeDeployments with spec.placement.queue would bypass quota "
                "(their pods schedule without Kueue's admission); each says so in Admitted"
            )
        return (
            f"Kueue's mutating webhooks for pods ({self.pods}) and Deployments "
            f"({self.deployments}) are registered; Kueue also registers them for integrations "
            "its configuration leaves out, so the first pods of each queued SD confirm its pod "
            "and deployment integrations (Admitted=False QuotaBypassed when they do not)"
        )


def _is_kueues(configuration: Mapping[str, Any], webhook: Mapping[str, Any]) -> bool:
    """Whether a webhook is Kueue's: its configuration or its Service is named for Kueue."""
    config_name = str((configuration.get("metadata") or {}).get("name", ""))
    service = ((webhook.get("clientConfig") or {}).get("service") or {}).get("name", "")
    return "kueue" in config_name or "kueue" in str(service)


def _covers(webhook: Mapping[str, Any], group: str, resource: str) -> bool:
    for rule in webhook.get("rules") or []:
        if (
            group in (rule.get("apiGroups") or [])
            and resource in (rule.get("resources") or [])
            and {"CREATE", "*"} & set(rule.get("operations") or [])
        ):
            return True
    return False


def read_kueue_webhooks(
    configurations: Sequence[Mapping[str, Any]], workload_crd_served: bool
) -> KueueWebhooks:
    """KueueWebhooks from the cluster's MutatingWebhookConfigurations and whether Kueue's
    Workload CRD is served."""
    found: dict[str, str] = {}
    for configuration in configurations:
        name = str((configuration.get("metadata") or {}).get("name", ""))
        for webhook in configuration.get("webhooks") or []:
            if not _is_kueues(configuration, webhook):
                continue
            if webhook.get("name") == KUEUE_POD_WEBHOOK and _covers(webhook, "", "pods"):
                found.setdefault("pods", name)
            if webhook.get("name") == KUEUE_DEPLOYMENT_WEBHOOK and _covers(
                webhook, "apps", "deployments"
            ):
                found.setdefault("deployments", name)
    return KueueWebhooks(
        installed=workload_crd_served,
        pods=found.get("pods"),
        deployments=found.get("deployments"),
    )
