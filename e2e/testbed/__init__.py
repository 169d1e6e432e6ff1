"""The specdeploy test bed: a real Kubernetes control plane, KWOK GPU nodes, Kueue and Prometheus,
run as local processes (see docs/testbed.md)."""

from testbed.cluster import (
    LOCAL_PROCESS_ANNOTATION,
    POD_SECURITY_LABELS,
    QUEUE_NAMES,
    RESTRICTED_CONTAINER_SECURITY,
    RESTRICTED_POD_SECURITY,
    ClusterEnv,
    audit_log,
    create_namespace_with_queues,
    down,
    health,
    queued_namespace,
    run_dir,
    up,
)
from testbed.kubectl import Kubectl, KubectlError
from testbed.polling import eventually

__all__ = [
    "LOCAL_PROCESS_ANNOTATION",
    "POD_SECURITY_LABELS",
    "QUEUE_NAMES",
    "RESTRICTED_CONTAINER_SECURITY",
    "RESTRICTED_POD_SECURITY",
    "ClusterEnv",
    "Kubectl",
    "KubectlError",
    "audit_log",
    "create_namespace_with_queues",
    "down",
    "eventually",
    "health",
    "queued_namespace",
    "run_dir",
    "up",
]
