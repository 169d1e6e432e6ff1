"""Label and annotation keys the operator writes, as docs/contracts.md lists them."""

from __future__ import annotations

from typing import Final

NAME: Final = "specdeploy.dev/name"
REVISION: Final = "specdeploy.dev/revision"
PAIR_VERSION: Final = "specdeploy.dev/pair-version"
MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE: Final = "specdeploy"
# Pod template annotation: the test bed's process kubelet runs these pods as local processes.
LOCAL_PROCESS: Final = "specdeploy.dev/local-process"
# The worker pods of a replica across nodes carry this in place of NAME: they serve no API, so
# the SD's Service (selecting NAME) must not send them requests, nor Prometheus scrape them.
WORKER_OF: Final = "specdeploy.dev/worker-of"

KUEUE_QUEUE_NAME: Final = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_CLASS: Final = "kueue.x-k8s.io/priority-class"
# Kueue gates each pod with this scheduling gate until its workload is admitted.
KUEUE_ADMISSION_GATE: Final = "kueue.x-k8s.io/admission"
