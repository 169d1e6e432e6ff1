"""Label and annotation keys the operator writes, as docs/contracts.md lists them."""

from __future__ import annotations

from typing import Final

NAME: Final = "specdeploy.dev/name"
REVISION: Final = "specdeploy.dev/revision"
PAIR_VERSION: Final = "specdeploy.dev/pair-version"
MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE: Final = "specdeploy"
# On a revision's Deployment or LeaderWorkerSet (and its record): the revision hash schema it was
# made with (plan.children.revision); a revision without it was made with schema 2.
HASH_SCHEMA: Final = "specdeploy.dev/hash-schema"
# Pod template annotation: the test bed's process kubelet runs these pods as local processes.
LOCAL_PROCESS: Final = "specdeploy.dev/local-process"
# The worker pods of a replica across nodes carry this in place of NAME: they serve no API, so
# the SD's Service (selecting NAME) must not send them requests, nor Prometheus scrape them.
WORKER_OF: Final = "specdeploy.dev/worker-of"

KUEUE_QUEUE_NAME: Final = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_CLASS: Final = "kueue.x-k8s.io/priority-class"
# Kueue gates each pod with this scheduling gate until its workload is admitted.
KUEUE_ADMISSION_GATE: Final = "kueue.x-k8s.io/admission"
# The pod readiness gate of a revision with a probe (spec.rollout.analysis.probe): the operator
# sets this pod condition True once the revision's probe was judged, so a canary gets no user
# request before its probe is compared with the stable's.
PROBE_GATE: Final = "specdeploy.dev/probe-judged"

# Requests of `kubectl specdeploy` (annotations on the SD; the pure decide honours them).
#: Promote the canary: `<revision>` now, `<revision>/probe` only past its probe.
PROMOTE: Final = "specdeploy.dev/promote"
#: Roll the canary `<revision>` back now.
ABORT: Final = "specdeploy.dev/abort"
#: Hold the canary `<revision>`: no verdict is taken, nothing promoted or rolled back.
PAUSE: Final = "specdeploy.dev/pause"
#: Serve the revision `<revision>@<generation>` until the spec changes (metadata.generation).
UNDO: Final = "specdeploy.dev/undo"
#: Try the rolled-back revision `<revision>[-n]` again as a new canary, when nothing it
#: measured failed it (plan.rollout.retry).
RETRY: Final = "specdeploy.dev/retry"
