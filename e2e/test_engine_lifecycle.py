"""Engine pods with the real engine: what a real cluster does to them, and what they survive.

The operator runs in local-process mode with the engine venv's python as the engine command, so
the process kubelet runs each pod as the real launcher + CPU vLLM, with kubelet's environment
(Service link variables included), its memory limit and its preStop hook and grace period.

- An SD named `vllm` serves: its Service `vllm` would give its pods `VLLM_PORT=tcp://...`,
  which vLLM refuses to start with, were the pods not made without Service links.
- Streamed completions running on a revision when it is replaced (and again when the SD goes
  back to it, a rollback) complete: the stopping pod keeps serving through its preStop pause,
  then vLLM drains them within the grace period.
- An engine over its memory limit is OOM-killed, and Ready names the pod and why.
At most two engines run at once.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from engine_cluster import (
    complete,
    engine_url,
    get_pod,
    get_sd,
    operator_config,
    operator_in_namespace,
    ready_pod,
    revision_pods,
    tiny_sd,
)
from engine_harness import engine_python, tiny_models
from testbed import ClusterEnv, Kubectl, eventually
from testbed.conditions import condition, is_ready

pytestmark = [pytest.mark.e2e, pytest.mark.engine]

__all__ = ["engine_python", "tiny_models"]  # session fixtures used here

ENGINE_READY_S = 420
#: The preStop pause of engine pods (plan.children.lifecycle.PRE_STOP_SECONDS).
PRE_STOP_S = 5
#: Clients streaming completions back to back, and each completion's length: with one sequence
#: at a time (maxNumSeqs 1), what is queued when the pod is deleted keeps the engine busy beyond
#: the preStop pause, however fast it runs, so SIGTERM finds completions running or queued.
CLIENTS = 3
STREAM_TOKENS = 1900
#: The test SD's grace period: long enough to drain that work on a loaded 2-core machine.
GRACE_S = 600


@dataclass
class Bed:
    cluster: ClusterEnv
    kubectl: Kubectl
    namespace: str
    models: dict[str, str]

    def wait_ready(self, name: str, revision_not: str | None = None) -> tuple[str, dict[str, Any]]:
        """Waits for Ready=True (on a revision other than `revision_not`); returns the serving
        revision and its ready pod."""

        def ready() -> dict[str, Any] | None:
            sd = get_sd(self.kubectl, self.namespace, name)
            serving = (sd.get("status") or {}).get("stableRevision")
            ok = is_ready(sd) and serving != revision_not
            return sd if ok else None

        sd = eventually(ready, ENGINE_READY_S, f"SD {name} Ready")
        revision = sd["status"]["stableRevision"]
        pod = ready_pod(self.kubectl, self.namespace, name, revision)
        assert pod is not None, f"SD {name} is Ready but no pod of {revision} is"
        return revision, pod


@pytest.fixture(scope="module")
def bed(
    cluster: ClusterEnv,
    kubectl: Kubectl,
    engine_python: Path,
    tiny_models: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Bed]:
    namespace = f"e2e-engine-lifecycle-{uuid.uuid4().hex[:5]}"
    config = operator_config(str(engine_python), cluster.prometheus_url)
    workdir = tmp_path_factory.mktemp("operator")
    with operator_in_namespace(kubectl, cluster.kubeconfig, namespace, config, workdir):
        yield Bed(cluster, kubectl, namespace, tiny_models)


# --- streams --------------------------------------------------------------------------------


@dataclass
class Stream:
    """One streamed completion, read to its end in a thread of its own."""

    url: str
    model: str
    started: float = 0.0
    ended: float = 0.0
    tokens: int | None = None
    finish_reason: str | None = None
    done: bool = False
    error: str = ""
    _thread: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> Stream:
        self._thread = threading.Thread(target=self._read, daemon=True)
        self.started = time.time()
        self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        assert self._thread is not None
        self._thread.join(timeout)

    def _read(self) -> None:
        body = {
            "model": self.model,
            "prompt": "The queue moved on and",
            "max_tokens": STREAM_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        request = urllib.request.Request(
            self.url + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=GRACE_S) as response:
                for raw in response:
                    line = raw.decode().strip()
                    if not line.startswith("data: "):
                        continue
                    data = line.removeprefix("data: ")
                    if data == "[DONE]":
                        self.done = True
                        continue
                    chunk = json.loads(data)
                    for choice in chunk.get("choices") or []:
                        self.finish_reason = choice.get("finish_reason") or self.finish_reason
                    if chunk.get("usage"):
                        self.tokens = chunk["usage"]["completion_tokens"]
        except Exception as error:  # a cut stream: recorded, asserted on below
            self.error = f"{type(error).__name__}: {error}"
        self.ended = time.time()

    def complete(self) -> bool:
        return (
            self.done and self.tokens == STREAM_TOKENS and self.finish_reason == "length"
        ) and not self.error


def deletion_seen(kubectl: Kubectl, namespace: str, name: str) -> float | None:
    """When the pod got its deletionTimestamp, as seen by polling (None: gone unseen)."""
    deadline = time.monotonic() + ENGINE_READY_S
    while time.monotonic() < deadline:
        found = get_pod(kubectl, namespace, name)
        if found is None:
            return None
        if found["metadata"].get("deletionTimestamp"):
            return time.time()
        time.sleep(0.2)
    raise AssertionError(f"pod {name} was not deleted within {ENGINE_READY_S}s")


def streams_across_the_stop_of(
    bed: Bed, old_pod: dict[str, Any], new_revision_pods: Any
) -> tuple[list[Stream], float]:
    """From the moment the new revision's engine answers (its readiness, then the deletion of
    the old pod, follow within seconds) CLIENTS clients stream completions from `old_pod` back
    to back, until they see the pod deleted (as the Service stops sending it requests); returns
    every stream once read to its end, and when the deletion was seen."""
    url = engine_url(bed.cluster, old_pod)
    streams: list[Stream] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            stream = Stream(url, bed.models["target"]).start()
            streams.append(stream)
            stream.join(timeout=GRACE_S)

    def new_engine_answers() -> bool:
        for pod in new_revision_pods():
            try:
                with urllib.request.urlopen(engine_url(bed.cluster, pod) + "/health", timeout=2):
                    return True
            except OSError:
                continue
        return False

    eventually(new_engine_answers, ENGINE_READY_S, "the new revision's engine answering")
    clients = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
    for thread in clients:
        thread.start()
    try:
        deleted = deletion_seen(bed.kubectl, bed.namespace, old_pod["metadata"]["name"])
    finally:
        stop.set()
    assert deleted is not None, "the old pod went without being seen in deletion"
    for thread in clients:
        thread.join(timeout=GRACE_S)
    return list(streams), deleted


def assert_completed_across_sigterm(streams: list[Stream], deleted: float) -> None:
    report = [
        f"started +{s.started - deleted:.1f}s ended +{s.ended - deleted:.1f}s tokens {s.tokens} "
        f"finish {s.finish_reason} done {s.done} {s.error}"
        for s in streams
    ]
    assert all(s.complete() for s in streams), "\n".join(report)
    # Some were running or queued when the pod was signalled (after its preStop pause), and
    # finished all the same.
    assert max(s.ended for s in streams) > deleted + PRE_STOP_S + 1, "\n".join(report)
    assert min(s.started for s in streams) < deleted, "\n".join(report)


def test_an_sd_named_vllm_serves_and_streams_survive_their_revision_going(bed: Bed) -> None:
    body = tiny_sd("vllm", bed.namespace, bed.models, None, "1")
    body["spec"]["engine"]["maxModelLen"] = 2048
    body["spec"]["engine"]["maxNumSeqs"] = 1
    body["spec"]["engine"]["terminationGracePeriodSeconds"] = GRACE_S
    bed.kubectl.apply([body])
    first, first_pod = bed.wait_ready("vllm")
    # The Service `vllm` is there, and its link variables did not reach the engine.
    assert bed.kubectl.get_json("service", "vllm", "-n", bed.namespace)["spec"]["clusterIP"]
    assert first_pod["spec"]["enableServiceLinks"] is False
    answer = complete(engine_url(bed.cluster, first_pod), bed.models["target"], "A node sees", 8)
    assert answer["choices"][0]["text"]

    # A new pair version: a new revision replaces the first; streams on the first complete.
    body["spec"]["pair"]["version"] = "2"
    bed.kubectl.apply([body])
    streams, deleted = streams_across_the_stop_of(
        bed,
        first_pod,
        lambda: [
            p
            for p in revision_pods(bed.kubectl, bed.namespace, "vllm")
            if p["metadata"]["labels"]["specdeploy.dev/revision"] != first
        ],
    )
    assert_completed_across_sigterm(streams, deleted)
    second, second_pod = bed.wait_ready("vllm", revision_not=first)

    # Back to the first pair (a rollback): its revision scales up again; streams on the
    # second complete as it goes.
    body["spec"]["pair"]["version"] = "1"
    bed.kubectl.apply([body])
    streams, deleted = streams_across_the_stop_of(
        bed,
        second_pod,
        lambda: revision_pods(bed.kubectl, bed.namespace, "vllm", first),
    )
    assert_completed_across_sigterm(streams, deleted)
    assert bed.wait_ready("vllm", revision_not=second)[0] == first


def test_an_engine_over_its_memory_limit_is_oom_killed_and_named(bed: Bed) -> None:
    body = tiny_sd("small", bed.namespace, bed.models, None, "1")
    # The engine needs some GiB; a 600 MiB limit is passed while vLLM is imported.
    body["spec"]["engine"]["resources"] = {"memory": "600Mi"}
    bed.kubectl.apply([body])

    def named() -> dict[str, Any] | None:
        ready = condition(get_sd(bed.kubectl, bed.namespace, "small"), "Ready")
        return ready if ready.get("reason") == "OOMKilled" else None

    ready = eventually(named, 60, "Ready=False OOMKilled")
    [pod] = revision_pods(bed.kubectl, bed.namespace, "small")
    assert ready["status"] == "False"
    assert f"the engine of pod {pod['metadata']['name']} ran out of memory" in ready["message"]
    assert "OOMKilled (exit 137)" in ready["message"]
    bed.kubectl.run("delete", "sd", "small", "-n", bed.namespace)
