"""The operator on the test bed: SDs become revision Deployments on the right (fake) GPUs.

The operator runs as a subprocess (`specdeploy operator run`) watching the test's namespace, with
a 2-second reconcile timer. GPU pods are KWOK-run (no local-process annotation): they never run
a real engine; the real-engine path is covered by the engine suite.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine_cluster import OperatorProcess
from sd_bodies import H100, llama_8b
from testbed import Kubectl, eventually
from testbed.conditions import condition, is_ready

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[1]
NAME_LABEL = "specdeploy.dev/name"
REVISION_LABEL = "specdeploy.dev/revision"
ADMISSION_GATE = "kueue.x-k8s.io/admission"


# --- SpeculativeDeployments used here ----------------------------------------------------------


def llama_70b(name: str, namespace: str) -> dict[str, Any]:
    """Llama 3.1 70B with its EAGLE-3 head on H100s: 4 GPUs, tensor parallel 4."""
    body = llama_8b(name, namespace)
    body["spec"]["pair"] = {
        "version": "3.3",
        "target": {"model": "meta-llama/Llama-3.1-70B-Instruct", "revision": "main"},
        "draft": {
            "method": "eagle3",
            "model": "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B",
            "revision": "main",
            "numSpeculativeTokens": 3,
        },
    }
    body["spec"]["engine"] = {"maxModelLen": 8192, "maxNumSeqs": 32, "gpuMemoryUtilization": 0.92}
    body["spec"]["placement"]["gpu"] = {"product": H100}
    return body


def llama_405b(name: str, namespace: str) -> dict[str, Any]:
    """Llama 3.1 405B in bf16 on H100s: more than 8 x 80 GB, so no node holds it."""
    body = llama_70b(name, namespace)
    body["spec"]["pair"] = {
        "version": "3.1",
        "target": {"model": "meta-llama/Llama-3.1-405B-Instruct", "revision": "main"},
        "draft": {"method": "none"},
    }
    return body


# --- reading the cluster -----------------------------------------------------------------------


def sd_of(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = kubectl.get_json("sd", name, "-n", namespace)
    return found


def items(kubectl: Kubectl, kind: str, namespace: str, name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = kubectl.get_json(
        kind, "-n", namespace, "-l", f"{NAME_LABEL}={name}"
    )["items"]
    return found


def engine_container(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "engine")


def declared_pair(pod: dict[str, Any]) -> tuple[str, str | None]:
    """(revision label, draft revision the pod's args speculate with; None without a draft).

    Asserts the pod carries exactly one pair: one --speculative-config at most, and the pair
    env naming the same revision as the label.
    """
    container = engine_container(pod)
    args = container["args"]
    specs = [args[i + 1] for i, a in enumerate(args) if a == "--speculative-config"]
    assert len(specs) <= 1, f"pod {pod['metadata']['name']} has {len(specs)} drafts"
    env = {e["name"]: e.get("value") for e in container.get("env") or []}
    pair = json.loads(env["SPECDEPLOY_PAIR"])
    label = pod["metadata"]["labels"][REVISION_LABEL]
    assert pair["revision"] == label, f"pod {pod['metadata']['name']}: env {pair} vs label {label}"
    draft = json.loads(specs[0]).get("revision") if specs else None
    if specs:
        assert draft == pair["draft"]["revision"], "args and env name different drafts"
    return label, draft


@dataclass
class PodWatch:
    """Polls an SD's pods and Deployments in the background, recording every pod ever seen."""

    kubectl: Kubectl
    namespace: str
    name: str
    pairs: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    snapshots: list[dict[str, tuple[int, int]]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> PodWatch:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for pod in items(self.kubectl, "pods", self.namespace, self.name):
                    self.pairs[pod["metadata"]["name"]] = declared_pair(pod)
                self.snapshots.append(
                    {
                        d["metadata"]["labels"][REVISION_LABEL]: (
                            int(d["spec"].get("replicas") or 0),
                            int((d.get("status") or {}).get("readyReplicas") or 0),
                        )
                        for d in items(self.kubectl, "deployments", self.namespace, self.name)
                    }
                )
            except AssertionError as error:
                self.errors.append(str(error))
            except Exception as error:
                self.errors.append(f"poll failed: {error}")
            time.sleep(0.3)


def wait_ready(kubectl: Kubectl, namespace: str, name: str, timeout: int = 90) -> None:
    kubectl.run(
        "wait",
        "--for=condition=Ready",
        f"sd/{name}",
        "-n",
        namespace,
        f"--timeout={timeout}s",
        timeout=timeout + 10,
    )


# What each example needs to be placeable on the test bed (quota of the queues), and
# where its pods must land: (patches, resource, count, node name prefix).
EXAMPLE_PLACEMENT: dict[str, tuple[dict[str, Any], str, int, str]] = {
    "llama-8b-eagle3-mig.yaml": (
        {},
        "nvidia.com/mig-3g.40gb",
        1,
        "kwok-h100-mig-",
    ),
    "llama-70b-eagle3-tp4.yaml": (
        {},
        "nvidia.com/gpu",
        4,
        "kwok-h100-",
    ),
    # Its KV budget (32 x 8k tokens) fits one H100: four replicas take the batch queue's 4.
    "llama-8b-batch-queue.yaml": ({}, "nvidia.com/gpu", 1, "kwok-h100-"),
    # 16 x 32k tokens of KV (the default budget) + weights = 49.1 GiB: one H100.
    "qwen-7b-ngram.yaml": ({}, "nvidia.com/gpu", 1, "kwok-h100-"),
    # Two nodes of 8 H100s per replica (a LeaderWorkerSet group): the leader's node and GPUs.
    "llama-405b-multinode.yaml": ({}, "nvidia.com/gpu", 8, "kwok-h100-"),
}


def merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """`base` with `patch` merged in, recursively for mappings."""
    merged = dict(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def example_prerequisites(body: dict[str, Any]) -> list[dict[str, Any]]:
    """What the example refers to: the hub token Secret, the model PVC (bound to a hostPath PV)."""
    namespace = body["metadata"]["namespace"]
    source = body["spec"].get("modelSource") or {}
    objects: list[dict[str, Any]] = []
    token = (source.get("hub") or {}).get("tokenSecretRef")
    if token:
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": token["name"], "namespace": namespace},
                "stringData": {token["key"]: "not-a-real-token"},
            }
        )
    claim = (source.get("pvc") or {}).get("claimName")
    if claim:
        volume = f"{namespace}-{claim}"[:63]
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": volume},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadOnlyMany"],
                    "hostPath": {"path": "/tmp/specdeploy-e2e-models"},
                    "storageClassName": "",
                    "persistentVolumeReclaimPolicy": "Delete",
                    "claimRef": {"namespace": namespace, "name": claim},
                },
            }
        )
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": namespace},
                "spec": {
                    "accessModes": ["ReadOnlyMany"],
                    "resources": {"requests": {"storage": "1Gi"}},
                    "storageClassName": "",
                    "volumeName": volume,
                },
            }
        )
    return objects


def example_sd(filename: str, namespace: str) -> dict[str, Any]:
    """The example's SpeculativeDeployment in `namespace`, patched to fit the test bed."""
    documents = yaml.safe_load_all((REPO_ROOT / "examples" / filename).read_text())
    body = next(d for d in documents if d and d.get("kind") == "SpeculativeDeployment")
    body["metadata"]["namespace"] = namespace
    body["spec"] = merge(body["spec"], EXAMPLE_PLACEMENT[filename][0])
    return dict(body)


def test_every_example_is_placed() -> None:
    """Every example SD in examples/ has a placement case below."""
    shipped = {
        p.name
        for p in (REPO_ROOT / "examples").glob("*.yaml")
        if "kind: SpeculativeDeployment" in p.read_text()
    }
    assert shipped == set(EXAMPLE_PLACEMENT)


@pytest.mark.parametrize("filename", sorted(EXAMPLE_PLACEMENT))
def test_example_becomes_ready_on_the_right_gpus(
    kubectl: Kubectl,
    namespace: str,
    operator: OperatorProcess,
    filename: str,
    request: pytest.FixtureRequest,
) -> None:
    body = example_sd(filename, namespace)
    name = body["metadata"]["name"]
    _, resource, count, node_prefix = EXAMPLE_PLACEMENT[filename]
    prerequisites = example_prerequisites(body)
    kubectl.apply([*prerequisites, body])
    volumes = [o["metadata"]["name"] for o in prerequisites if o["kind"] == "PersistentVolume"]
    request.addfinalizer(
        lambda: [kubectl.run("delete", "pv", v, "--wait=false", check=False) for v in volumes]
    )
    wait_ready(kubectl, namespace, name, timeout=120)

    sd = sd_of(kubectl, namespace, name)
    revision = sd["status"]["stableRevision"]
    assert sd["status"]["sizing"]["resourceName"] == resource
    assert sd["status"]["sizing"]["count"] == count
    assert sd["status"]["phase"] == "Serving"
    across = "nodesPerReplica" in sd["status"]["sizing"]
    [child] = items(kubectl, "leaderworkersets" if across else "deployments", namespace, name)
    assert child["metadata"]["name"] == f"{name}-{revision}"
    kubectl.get_json("service", name, "-n", namespace)
    # A replica across nodes has one pod labelled with the SD: its leader.
    pods = items(kubectl, "pods", namespace, name)
    assert len(pods) == body["spec"]["replicas"]
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        assert pod["spec"]["nodeName"].startswith(node_prefix), pod["spec"]["nodeName"]
        assert engine_container(pod)["resources"]["limits"][resource] == str(count)
        assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
        declared_pair(pod)
    speculating = sd["status"]["speculation"]["state"] == "Enabled"
    args = engine_container(pods[0])["args"]
    assert ("--speculative-config" in args) == speculating
    if body["spec"]["placement"].get("queue") == "batch":
        assert not speculating


# --- the tests -----------------------------------------------------------------------------------


def test_8b_with_eagle3_head_runs_on_a_mig_slice(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    kubectl.apply([llama_8b("chat", namespace)])
    wait_ready(kubectl, namespace, "chat")

    sd = sd_of(kubectl, namespace, "chat")
    revision = sd["status"]["stableRevision"]
    sizing = sd["status"]["sizing"]
    assert sizing["resourceName"] == "nvidia.com/mig-3g.40gb"
    assert sizing["memory"]["requiredGiB"] == pytest.approx(28.2, abs=0.2)
    [deployment] = items(kubectl, "deployments", namespace, "chat")
    assert deployment["metadata"]["name"] == f"chat-{revision}"
    assert deployment["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "interactive"
    assert deployment["metadata"]["ownerReferences"][0]["kind"] == "SpeculativeDeployment"
    kubectl.get_json("service", "chat", "-n", namespace)
    [pod] = items(kubectl, "pods", namespace, "chat")
    assert pod["status"]["phase"] == "Running"
    assert pod["spec"]["nodeName"] == "kwok-h100-mig-0"
    resources = engine_container(pod)["resources"]
    assert resources["limits"]["nvidia.com/mig-3g.40gb"] == "1"
    # The pod defaults (plan.children.pod_defaults), as Kueue admitted them and the API server
    # classed them: 2 + 1 cores, memory for the processes and 15.7 GiB of weights, capped.
    assert resources["requests"]["cpu"] == "3"
    assert resources["requests"]["memory"] == resources["limits"]["memory"] == "32Gi"
    assert pod["status"]["qosClass"] == "Burstable"
    [shm] = [v for v in pod["spec"]["volumes"] if v["name"] == "dshm"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
    assert deployment["metadata"]["annotations"]["specdeploy.dev/hash-schema"] == "3"
    assert declared_pair(pod) == (revision, "eagle3-r1")
    # Monitoring without the Prometheus Operator (its PodMonitor kind is not served here):
    # scrape annotations on the pod (the PodMonitor case has a test of its own).
    served = kubectl.run("api-resources", "--api-group=monitoring.coreos.com", check=False)
    assert "podmonitors" not in served.stdout
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "8000"

    table = kubectl.run("get", "sd", "chat", "-n", namespace).stdout
    header, row = table.strip().splitlines()[:2]
    for column in ("PAIR", "REVISION", "READY", "QUEUE", "PHASE", "AGE"):
        assert column in header, header
    assert revision in row
    assert "interactive" in row
    assert "Serving" in row
    description = kubectl.run("describe", "sd", "chat", "-n", namespace).stdout
    assert "NewRevision" in description


def test_70b_takes_four_h100s_with_tensor_parallel_4(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    kubectl.apply([llama_70b("big", namespace)])
    wait_ready(kubectl, namespace, "big")
    [pod] = items(kubectl, "pods", namespace, "big")
    assert pod["status"]["phase"] == "Running"
    assert pod["spec"]["nodeName"] in ("kwok-h100-0", "kwok-h100-1")
    assert engine_container(pod)["resources"]["limits"]["nvidia.com/gpu"] == "4"
    args = engine_container(pod)["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "4"


def test_405b_bf16_on_h100s_is_unschedulable_and_creates_no_pods(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    offset = len(operator.log_text())
    kubectl.apply([llama_405b("huge", namespace)])

    def unschedulable() -> dict[str, Any] | None:
        sized = condition(sd_of(kubectl, namespace, "huge"), "Sized")
        return sized if sized.get("reason") == "Unschedulable" else None

    sized = eventually(unschedulable, 60, "Sized=False/Unschedulable")
    assert sized["status"] == "False"
    assert re.search(r"target weights 75\d\.\d", sized["message"]), sized["message"]
    assert "GiB" in sized["message"]
    # Two more reconciles after that decision, and still nothing was made.
    decided = operator.reconciles_since(offset, namespace, "huge")
    operator.wait_for_reconciles(offset, namespace, "huge", count=decided + 2)
    assert items(kubectl, "deployments", namespace, "huge") == []
    assert items(kubectl, "pods", namespace, "huge") == []
    assert sd_of(kubectl, namespace, "huge")["status"]["phase"] == "Failed"


def test_batch_queue_serves_the_target_alone(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    body = llama_8b("bulk", namespace)
    body["spec"]["placement"]["queue"] = "batch"
    kubectl.apply([body])
    wait_ready(kubectl, namespace, "bulk")
    sd = sd_of(kubectl, namespace, "bulk")
    assert sd["status"]["speculation"]["state"] == "Disabled"
    assert sd["status"]["speculation"]["reason"] == "BatchQueue"
    [pod] = items(kubectl, "pods", namespace, "bulk")
    assert "--speculative-config" not in engine_container(pod)["args"]


def test_changing_the_draft_rolls_a_new_revision_forward_only_once_ready(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    with PodWatch(kubectl, namespace, "chat") as watch:
        kubectl.apply([llama_8b("chat", namespace, draft_revision="eagle3-r1", replicas=2)])
        wait_ready(kubectl, namespace, "chat")
        first = sd_of(kubectl, namespace, "chat")["status"]["stableRevision"]

        kubectl.apply([llama_8b("chat", namespace, draft_revision="eagle3-r2", replicas=2)])

        def rolled() -> str | None:
            sd = sd_of(kubectl, namespace, "chat")
            stable = sd["status"].get("stableRevision")
            ready = is_ready(sd)
            return stable if stable != first and ready else None

        second = eventually(rolled, 90, "the second revision to serve")
        eventually(
            lambda: dict(watch.snapshots[-1]).get(first, (1, 1))[0] == 0,
            30,
            "the first revision at zero",
        )
        eventually(
            lambda: dict(watch.snapshots[-1]).get(first, (0, 0)) == (0, 0),
            30,
            "the first revision's pods gone",
        )

    assert not watch.errors, watch.errors
    # Every pod ever seen carried exactly one declared pair: its revision's draft.
    drafts = {first: "eagle3-r1", second: "eagle3-r2"}
    assert watch.pairs, "no pods seen"
    for pod, (revision, draft) in watch.pairs.items():
        assert drafts[revision] == draft, f"pod {pod} of {revision} speculates with {draft}"
    assert {revision for revision, _ in watch.pairs.values()} == {first, second}
    # The first revision went to zero only after the second had all its pods ready.
    second_ready_seen = False
    for snapshot in watch.snapshots:
        replicas, ready = snapshot.get(second, (0, 0))
        second_ready_seen = second_ready_seen or (replicas == 2 and ready == 2)
        if snapshot.get(first, (2, 2))[0] == 0:
            assert second_ready_seen, f"first revision scaled down early: {snapshot}"
    # The old revision is kept at zero for going back.
    deployments = {
        d["metadata"]["name"]: d["spec"]["replicas"]
        for d in items(kubectl, "deployments", namespace, "chat")
    }
    assert deployments == {f"chat-{first}": 0, f"chat-{second}": 2}


def test_going_back_to_an_earlier_pair_scales_its_revision_up(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    def serving(revision: str | None = None, other_than: str | None = None) -> str | None:
        sd = sd_of(kubectl, namespace, "chat")
        stable = (sd.get("status") or {}).get("stableRevision")
        ready = is_ready(sd)
        if not ready or stable is None or stable == other_than:
            return None
        return stable if revision in (None, stable) else None

    kubectl.apply([llama_8b("chat", namespace, draft_revision="eagle3-r1")])
    first = eventually(serving, 90, "the first revision to serve")
    kubectl.apply([llama_8b("chat", namespace, draft_revision="eagle3-r2")])
    second = eventually(lambda: serving(other_than=first), 90, "the second revision to serve")

    kubectl.apply([llama_8b("chat", namespace, draft_revision="eagle3-r1")])
    eventually(lambda: serving(first), 90, "the first revision to serve again")

    def settled() -> dict[str, int] | None:
        found = {
            d["metadata"]["name"]: d["spec"]["replicas"]
            for d in items(kubectl, "deployments", namespace, "chat")
        }
        return found if found == {f"chat-{first}": 1, f"chat-{second}": 0} else None

    eventually(settled, 30, "the first revision back at 1 and the second at 0, nothing new")
    pods = items(kubectl, "pods", namespace, "chat")
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    assert declared_pair(pods[0]) == (first, "eagle3-r1")


def test_pod_monitor_when_the_prometheus_operator_crd_is_served(
    kubectl: Kubectl, namespace: str, pod_monitor_crd: None, operator: OperatorProcess
) -> None:
    kubectl.apply([llama_8b("chat", namespace)])
    wait_ready(kubectl, namespace, "chat")
    monitor = kubectl.get_json("podmonitor", "chat", "-n", namespace)
    assert monitor["spec"]["podTargetLabels"] == [NAME_LABEL, REVISION_LABEL]
    assert monitor["spec"]["selector"] == {"matchLabels": {NAME_LABEL: "chat"}}
    assert monitor["metadata"]["ownerReferences"][0]["name"] == "chat"


def test_exhausted_quota_gates_pods_with_a_reason_naming_the_queue(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    # The interactive ClusterQueue has 6 mig-3g.40gb and may borrow the batch queue's 2: 8.
    kubectl.apply([llama_8b("hog", namespace, replicas=8)])
    wait_ready(kubectl, namespace, "hog", timeout=120)
    kubectl.apply([llama_8b("late", namespace)])

    def waiting() -> dict[str, Any] | None:
        # The first reconcile after the pod is made may come before Kueue's Workload for it
        # ("has no Workload for them yet"); the next round, after it, names what is missing.
        admitted = condition(sd_of(kubectl, namespace, "late"), "Admitted")
        named = "lacks" in admitted.get("message", "")
        return admitted if admitted.get("status") == "False" and named else None

    admitted = eventually(waiting, 60, "Admitted=False on the late SD, naming what it lacks")
    assert admitted["reason"] == "WaitingForQuota"
    assert "ClusterQueue interactive" in admitted["message"]
    assert "nvidia.com/mig-3g.40gb" in admitted["message"]
    [pod] = items(kubectl, "pods", namespace, "late")
    assert ADMISSION_GATE in [g["name"] for g in pod["spec"].get("schedulingGates") or []]
    assert pod["status"]["phase"] == "Pending"

    kubectl.run("delete", "sd", "hog", "-n", namespace)
    wait_ready(kubectl, namespace, "late", timeout=120)
    assert condition(sd_of(kubectl, namespace, "late"), "Admitted")["status"] == "True"


def test_restart_makes_no_duplicates_and_an_idle_operator_writes_nothing(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    kubectl.apply([llama_8b("chat", namespace)])
    wait_ready(kubectl, namespace, "chat")
    # Settled before the stop: a reconcile that wrote nothing.
    eventually(
        lambda: f"reconciled {namespace}/chat (0 API writes meanwhile)" in operator.log_text(),
        60,
        "a quiet reconcile before the restart",
    )
    operator.stop()
    restart = len(operator.log_text())
    operator.start()
    # Alive and reconciling (the resume handler, then timer rounds), which a dead operator,
    # also writing nothing, would not show.
    operator.wait_for_reconciles(restart, namespace, "chat", count=3)

    assert len(items(kubectl, "deployments", namespace, "chat")) == 1
    assert len(items(kubectl, "services", namespace, "chat")) == 1

    def footprint() -> dict[str, Any]:
        """Resource versions of the SD and its children, and the namespace's Events."""
        return {
            "sd": sd_of(kubectl, namespace, "chat")["metadata"]["resourceVersion"],
            "children": sorted(
                (o["kind"], o["metadata"]["name"], o["metadata"]["resourceVersion"])
                for kind in ("deployments", "services")
                for o in items(kubectl, kind, namespace, "chat")
            ),
            "events": sorted(
                (e["metadata"]["name"], e.get("count"))
                for e in kubectl.get_json("events", "-n", namespace)["items"]
            ),
        }

    before = footprint()
    # Idle: twelve more reconciles of the 2 s timer (about 24 s), each reading what it would
    # write and writing nothing.
    operator.wait_for_reconciles(len(operator.log_text()), namespace, "chat", count=12)
    writes = operator.writes_since(restart)
    assert writes == [], f"the restarted operator wrote: {writes}"
    assert footprint() == before


def test_scale_and_delete(kubectl: Kubectl, namespace: str, operator: OperatorProcess) -> None:
    kubectl.apply([llama_8b("chat", namespace)])
    wait_ready(kubectl, namespace, "chat")
    kubectl.run("scale", "sd/chat", "-n", namespace, "--replicas=3")

    def three_ready() -> bool:
        sd = sd_of(kubectl, namespace, "chat")
        status = sd.get("status") or {}
        ready = is_ready(sd)
        return ready and status.get("readyReplicas") == 3 and status.get("replicas") == 3

    eventually(three_ready, 90, "3 ready replicas")
    assert len(items(kubectl, "pods", namespace, "chat")) == 3

    kubectl.run("delete", "sd", "chat", "-n", namespace, "--timeout=60s", timeout=70)

    def nothing_left() -> bool:
        kinds = ("deployments", "replicasets", "pods", "services")
        return all(not items(kubectl, kind, namespace, "chat") for kind in kinds)

    eventually(nothing_left, 60, "every child of the deleted SD to be gone")


# --- node operations, model cache, pod options -------------------------------------------------

MIG_NODE = "kwok-h100-mig-0"


def first_deployment(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any] | None:
    deployments = items(kubectl, "deployments", namespace, name)
    return deployments[0] if deployments else None


def revision_names(kubectl: Kubectl, namespace: str, name: str) -> list[str]:
    """The SD's revision Deployments and its recorded revisions, as one sorted list."""
    deployments = [d["metadata"]["name"] for d in items(kubectl, "deployments", namespace, name)]
    recorded = [r["revision"] for r in sd_of(kubectl, namespace, name)["status"]["revisions"]]
    return [*sorted(deployments), "|", *sorted(recorded)]


def test_draining_the_mig_node_under_a_serving_sd_makes_no_new_revision(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, request: pytest.FixtureRequest
) -> None:
    """`mig: Auto` sizes the 8B pair onto a 3g.40gb slice of the MIG node; draining that node
    leaves only whole GPUs schedulable, which a fresh sizing would pick (a new revision that
    uncordoning would move back). The serving revision keeps its slice instead."""
    body = llama_8b("chat", namespace)
    body["spec"]["placement"]["gpu"] = {"mig": "Auto"}
    kubectl.apply([body])
    wait_ready(kubectl, namespace, "chat")
    before = revision_names(kubectl, namespace, "chat")
    [pod] = items(kubectl, "pods", namespace, "chat")
    assert pod["spec"]["nodeName"] == MIG_NODE
    assert sd_of(kubectl, namespace, "chat")["status"]["sizing"]["migProfile"] == "3g.40gb"

    request.addfinalizer(lambda: kubectl.run("uncordon", MIG_NODE, check=False))
    kubectl.run(
        "drain",
        MIG_NODE,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--disable-eviction",
        f"--pod-selector={NAME_LABEL}=chat",
        "--timeout=60s",
        timeout=70,
    )
    assert kubectl.get_json("node", MIG_NODE)["spec"].get("unschedulable") is True

    def replacement_pending() -> dict[str, Any] | None:
        pods = [
            p
            for p in items(kubectl, "pods", namespace, "chat")
            if p["metadata"]["name"] != pod["metadata"]["name"]
        ]
        return pods[0] if pods else None

    replacement = eventually(replacement_pending, 60, "the Deployment's replacement pod")
    offset = len(operator.log_text())
    operator.wait_for_reconciles(offset, namespace, "chat", count=4)
    assert revision_names(kubectl, namespace, "chat") == before
    sd = sd_of(kubectl, namespace, "chat")
    assert sd["status"]["sizing"]["migProfile"] == "3g.40gb"
    # The replacement waits for the slice (no other node has one) rather than moving the pair.
    replacement = kubectl.get_json("pod", replacement["metadata"]["name"], "-n", namespace)
    assert engine_container(replacement)["resources"]["limits"]["nvidia.com/mig-3g.40gb"] == "1"
    assert not replacement["spec"].get("nodeName")

    kubectl.run("uncordon", MIG_NODE)
    wait_ready(kubectl, namespace, "chat", timeout=120)
    offset = len(operator.log_text())
    operator.wait_for_reconciles(offset, namespace, "chat", count=3)
    assert revision_names(kubectl, namespace, "chat") == before
    [pod] = items(kubectl, "pods", namespace, "chat")
    assert pod["spec"]["nodeName"] == MIG_NODE


def test_model_cache_and_pod_options_reach_pods_the_api_server_accepts(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, request: pytest.FixtureRequest
) -> None:
    priority_class = f"{namespace}-serving"[:63]
    kubectl.apply(
        [
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": priority_class},
                "value": 12345,
            },
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "llm", "namespace": namespace},
            },
        ]
    )
    request.addfinalizer(
        lambda: kubectl.run("delete", "priorityclass", priority_class, check=False)
    )
    body = llama_8b(
        "cached",
        namespace,
        modelCache={"ephemeral": {"size": "40Gi"}},
        pod={
            "labels": {"team": "search"},
            "annotations": {"example.com/owner": "search"},
            "serviceAccountName": "llm",
            "imagePullSecrets": [{"name": "registry"}],
            "priorityClassName": priority_class,
        },
    )
    kubectl.apply([body])

    def created() -> dict[str, Any] | None:
        pods = items(kubectl, "pods", namespace, "cached")
        return pods[0] if pods else None

    pod = eventually(created, 90, "a pod of the cached SD")
    assert pod["metadata"]["labels"]["team"] == "search"
    assert pod["metadata"]["annotations"]["example.com/owner"] == "search"
    assert pod["spec"]["serviceAccountName"] == "llm"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["spec"]["priorityClassName"] == priority_class
    # The Priority admission plugin resolved the class: the kube scheduler's priority.
    assert pod["spec"]["priority"] == 12345
    env = {e["name"]: e.get("value") for e in engine_container(pod)["env"]}
    assert env["HF_HOME"] == "/var/cache/specdeploy/huggingface"
    assert "ephemeral-storage" not in engine_container(pod)["resources"].get("requests", {})

    # The ephemeral volume controller made the pod's cache claim from the template.
    claim_name = f"{pod['metadata']['name']}-model-cache"
    claim = eventually(
        lambda: (
            kubectl.get_json("pvc", claim_name, "-n", namespace)
            if kubectl.run("get", "pvc", claim_name, "-n", namespace, check=False).returncode == 0
            else None
        ),
        60,
        f"the cache claim {claim_name}",
    )
    assert claim["spec"]["resources"]["requests"]["storage"] == "40Gi"
    assert claim["metadata"]["ownerReferences"][0]["name"] == pod["metadata"]["name"]

    # The same SD with an existing claim: its Deployment passes the API server (server dry run).
    claimed = llama_8b("claimed", namespace, modelCache={"claimName": "hf-cache"})
    kubectl.apply([claimed])
    deployment = eventually(
        lambda: first_deployment(kubectl, namespace, "claimed"),
        60,
        "the claimed SD's Deployment",
    )
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "hf-cache"}} in volumes
    # Without a cache, a hub download asks for ephemeral storage sized from the weights.
    plain = llama_8b("plain", namespace)
    kubectl.apply([plain])
    deployment = eventually(
        lambda: first_deployment(kubectl, namespace, "plain"),
        60,
        "the plain SD's Deployment",
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    # (14.96 + 0.78) GiB of weights x 1.1 + 1 = 18.3 -> 19Gi.
    assert container["resources"]["requests"]["ephemeral-storage"] == "19Gi"
    wait_ready(kubectl, namespace, "plain", timeout=120)
