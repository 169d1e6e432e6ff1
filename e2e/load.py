"""A load source for the demo and the e2e suite: completions to every serving pod of an SD.

The canary analysis judges what Prometheus measured, so the canary and the stable revision both
need traffic. `CompletionLoad` runs in a thread and, round after round, sends one greedy
completion to each ready pod of the SD (found through the API, reached at the local address the
process kubelet gave it), until it is stopped or its time is up. Bounded in count and time, and
only ever to 127.0.0.1.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from background import Background
from engine_cluster import complete, engine_url, revision_pods
from testbed import ClusterEnv, Kubectl

#: Prompts the tiny drafts made for the tiny target predict well (they share its training text).
PREDICTABLE = (
    "The cat sat on the",
    "In the morning the queue",
    "A node sees",
    "The scheduler places the pod on",
)
LABEL_REVISION = "specdeploy.dev/revision"


@dataclass
class CompletionLoad(Background):
    """Completions to each ready pod of one SD, in a background thread."""

    kubectl: Kubectl
    namespace: str
    name: str
    model: str
    cluster: ClusterEnv
    prompts: Sequence[str] = PREDICTABLE
    max_tokens: int = 48
    max_seconds: float = 900.0
    sent: Counter[str] = field(default_factory=Counter)
    #: When (monotonic) the first request each revision answered was sent: when it began serving.
    first_sent: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    thread_name = "completion load"
    join_seconds = 120.0

    def _ready_pods(self) -> list[tuple[str, str]]:
        """(revision, url) of each ready pod."""
        found = []
        for pod in revision_pods(self.kubectl, self.namespace, self.name):
            conditions = (pod.get("status") or {}).get("conditions") or []
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
            if ready and not pod["metadata"].get("deletionTimestamp"):
                revision = pod["metadata"]["labels"].get(LABEL_REVISION, "")
                found.append((revision, engine_url(self.cluster, pod)))
        return found

    def run_loop(self, stop: threading.Event) -> None:
        deadline = time.monotonic() + self.max_seconds
        turn = 0
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                pods = self._ready_pods()
            except Exception as error:  # the API or a pod going away: try the next round
                self.errors.append(f"listing pods: {error}")
                pods = []
            if not pods:
                stop.wait(1.0)
                continue
            for revision, url in pods:
                prompt = self.prompts[turn % len(self.prompts)]
                turn += 1
                began = time.monotonic()
                try:
                    complete(url, self.model, prompt, max_tokens=self.max_tokens)
                    self.first_sent.setdefault(revision, began)
                    self.sent[revision] += 1
                except Exception as error:  # a pod stopping under us
                    self.errors.append(f"{revision}: {error}")
