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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from background import Background
from engine_cluster import complete, engine_url, revision_pods
from testbed import ClusterEnv, Kubectl
from testbed.conditions import is_serving

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
            if is_serving(pod):
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
            # Every pod gets the same prompt in a round: the revisions compared see the same
            # prompt mix (a prompt per pod in turn gave each pod its own share of prompts, and
            # the same draft a live acceptance 0.18 below the stable's).
            prompt = self.prompts[turn % len(self.prompts)]
            turn += 1
            for revision, url in pods:
                began = time.monotonic()
                try:
                    complete(url, self.model, prompt, max_tokens=self.max_tokens)
                    self.first_sent.setdefault(revision, began)
                    self.sent[revision] += 1
                except Exception as error:  # a pod stopping under us
                    self.errors.append(f"{revision}: {error}")


@dataclass
class PerPodLoad(Background):
    """`clients_per_pod` clients per ready pod of the SD (one by default), each sending greedy
    completions back to back, so every engine stays busy at that many sequences at a time;
    `prompts_for(revision)` picks the prompts each revision's pods get (the same for all by
    default: the prompt mix is the test's choice). Counts what each revision answered; bounded
    in time, only ever to 127.0.0.1."""

    kubectl: Kubectl
    namespace: str
    name: str
    model: str
    cluster: ClusterEnv
    prompts_for: Callable[[str], Sequence[str]] = field(default=lambda _revision: PREDICTABLE)
    max_tokens: int = 48
    max_seconds: float = 1800.0
    #: Clients per pod, each one request at a time: the running batch each engine sees.
    clients_per_pod: int = 1
    sent: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    thread_name = "per-pod load"
    join_seconds = 120.0

    def _ready(self) -> dict[str, tuple[str, str]]:
        """pod name → (revision, url) of each ready pod not being deleted."""
        found: dict[str, tuple[str, str]] = {}
        for pod in revision_pods(self.kubectl, self.namespace, self.name):
            if is_serving(pod):
                revision = pod["metadata"]["labels"].get(LABEL_REVISION, "")
                found[pod["metadata"]["name"]] = (revision, engine_url(self.cluster, pod))
        return found

    def _client(
        self, pod: str, revision: str, url: str, active: set[str], stop: threading.Event
    ) -> None:
        prompts = list(self.prompts_for(revision))
        turn = 0
        while not stop.is_set() and pod in active:
            try:
                complete(url, self.model, prompts[turn % len(prompts)], max_tokens=self.max_tokens)
                self.sent[revision] += 1
            except Exception as error:  # the pod stopping under us
                self.errors.append(f"{revision}: {error}")
                stop.wait(0.5)
            turn += 1

    def run_loop(self, stop: threading.Event) -> None:
        deadline = time.monotonic() + self.max_seconds
        active: set[str] = set()
        clients: dict[tuple[str, int], threading.Thread] = {}
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                ready = self._ready()
            except Exception as error:  # the API briefly away: try again
                self.errors.append(f"listing pods: {error}")
                ready = None
            if ready is not None:
                active.clear()
                active.update(ready)
                for pod, (revision, url) in ready.items():
                    for number in range(self.clients_per_pod):
                        key = (pod, number)
                        if key not in clients or not clients[key].is_alive():
                            clients[key] = threading.Thread(
                                target=self._client,
                                args=(pod, revision, url, active, stop),
                                name=f"load {pod} {number}",
                                daemon=True,
                            )
                            clients[key].start()
            stop.wait(1.0)
        active.clear()
        for client in clients.values():
            client.join(timeout=60)
