"""The reconcile loop against an in-memory API: children, rollout, status, and no idle writes."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from fake_kube import FakeKube, kwok_gpu_nodes
from specdeploy.api.config import OperatorConfig
from specdeploy.api.times import RFC3339
from specdeploy.handlers.reconcile import Reconciler
from specdeploy.plan.decide import Decision, settle
from specdeploy.plan.rollout.revisions import RolloutEvent
from specdeploy.plan.status.first_status import FIRST_STATUS_GRACE

H100 = "NVIDIA-H100-80GB-HBM3"


def sd_body(draft_revision: str = "r1", replicas: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "specdeploy.dev/v1alpha1",
        "kind": "SpeculativeDeployment",
        "metadata": {"name": "chat", "namespace": "ns", "uid": "u-1", "generation": 1},
        "spec": {
            "replicas": replicas,
            "pair": {
                "version": "1",
                "target": {"model": "meta-llama/Llama-3.1-8B-Instruct"},
                "draft": {
                    "method": "eagle3",
                    "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                    "revision": draft_revision,
                    "numSpeculativeTokens": 3,
                },
            },
            "engine": {"maxModelLen": 8192, "maxNumSeqs": 8},
            "placement": {"queue": "interactive"},
        },
    }


NODES = [
    {
        "metadata": {"name": "mig", "labels": {"nvidia.com/gpu.product": H100}},
        "status": {"allocatable": {"nvidia.com/mig-3g.40gb": "2"}},
    }
]


def setup(
    body: dict[str, Any],
    kube: FakeKube | None = None,
    clock: Callable[[], datetime] | None = None,
) -> tuple[FakeKube, Reconciler, list[tuple[str, str]]]:
    kube = kube or FakeKube(NODES)
    kube.objects[("SpeculativeDeployment", "ns", "chat")] = body
    events: list[tuple[str, str]] = []
    reconciler = Reconciler(
        kube,  # type: ignore[arg-type]
        OperatorConfig(),
        lambda _body, _type, reason, message: events.append((reason, message)),
        clock=clock or (lambda: datetime.now(UTC)),
    )
    return kube, reconciler, events


def status(kube: FakeKube) -> dict[str, Any]:
    body: dict[str, Any] = kube.objects[("SpeculativeDeployment", "ns", "chat")]
    result: dict[str, Any] = body["status"]
    return result


def condition(kube: FakeKube, type_: str) -> dict[str, Any]:
    return next(c for c in status(kube)["conditions"] if c["type"] == type_)


def test_an_sd_becomes_a_ready_revision_with_service_and_monitor_and_then_goes_quiet() -> None:
    kube, reconciler, events = setup(sd_body())
    reconciler.reconcile("ns", "chat")
    [name] = kube.deployments()
    assert name.startswith("chat-")
    deployment = kube.objects[("Deployment", "ns", name)]
    resources = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]
    # The slice, and the pod defaults (plan.children.pod_defaults): 3 cores requested, memory
    # requested and limited.
    assert resources["limits"] == {"nvidia.com/mig-3g.40gb": "1", "memory": "32Gi"}
    assert resources["requests"] == {
        "cpu": "3",
        "memory": "32Gi",
        "ephemeral-storage": "19Gi",
        "nvidia.com/mig-3g.40gb": "1",
    }
    assert deployment["metadata"]["annotations"]["specdeploy.dev/hash-schema"] == "3"
    assert deployment["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "interactive"
    assert ("Service", "ns", "chat") in kube.objects
    assert ("PodMonitor", "ns", "chat") in kube.objects
    assert condition(kube, "Ready")["status"] == "False"
    assert status(kube)["sizing"]["resourceName"] == "nvidia.com/mig-3g.40gb"
    assert "NewRevision" in [reason for reason, _ in events]

    kube.make_ready()
    reconciler.reconcile("ns", "chat")
    assert condition(kube, "Ready")["status"] == "True"
    assert status(kube)["phase"] == "Serving"
    assert status(kube)["stableRevision"] == name.removeprefix("chat-")

    writes = kube.write_requests
    for _ in range(3):
        reconciler.reconcile("ns", "chat")
    assert kube.write_requests == writes, "a steady SD sees no writes"


def test_a_new_draft_revision_rolls_forward_only_once_ready() -> None:
    kube, reconciler, _ = setup(sd_body("r1"))
    reconciler.reconcile("ns", "chat")
    kube.make_ready()
    reconciler.reconcile("ns", "chat")
    [first] = kube.deployments()

    kube.objects[("SpeculativeDeployment", "ns", "chat")]["spec"]["pair"]["draft"]["revision"] = (
        "r2"
    )
    reconciler.reconcile("ns", "chat")
    assert len(kube.deployments()) == 2
    assert kube.deployments()[first] == 1, "old revision serves until the new one is ready"
    second = next(n for n in kube.deployments() if n != first)

    kube.make_ready()
    reconciler.reconcile("ns", "chat")
    assert kube.deployments() == {first: 0, second: 1}
    assert status(kube)["stableRevision"] == second.removeprefix("chat-")


class StatusWrites(FakeKube):
    """Records every status patch."""

    def __init__(self) -> None:
        super().__init__(NODES)
        self.patches: list[dict[str, Any]] = []

    def patch_status(self, namespace: str, name: str, patch: Any) -> None:
        self.patches.append(dict(patch))
        super().patch_status(namespace, name, patch)


def test_the_reconcile_that_creates_a_revision_writes_one_status_that_already_names_it() -> None:
    # Between an SD's create and its Ready stand the reconcile that writes the Deployment and
    # the one its readiness starts; the Deployment's earlier watch events (the controller's own
    # status writes) start reconciles too, and a status write by one of them just to name the
    # new revision holds the SD when the readiness event comes.
    kube = StatusWrites()
    _, reconciler, _ = setup(sd_body(), kube)
    reconciler.reconcile("ns", "chat")
    [name] = kube.deployments()
    assert len(kube.patches) == 1, "one status write"
    [revision] = status(kube)["revisions"]
    assert revision["revision"] == name.removeprefix("chat-")
    assert revision["phase"] == "Pending"

    writes = kube.write_requests
    reconciler.reconcile("ns", "chat")
    assert kube.write_requests == writes, "the next reconcile, nothing changed, writes nothing"


class Clock:
    """A clock the test moves."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


CREATED = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)
CREATE_GRACE_END = CREATED + FIRST_STATUS_GRACE


def new_sd(body: dict[str, Any]) -> dict[str, Any]:
    """`body` as the API server holds it right after the create: stamped, no status."""
    body["metadata"]["creationTimestamp"] = CREATED.strftime(RFC3339)
    return body


def test_a_new_sds_first_status_waits_for_its_pods_and_comes_whole_with_ready() -> None:
    # While a new SD's pods come up, its first status (only "not ready yet") is left for the
    # reconcile their readiness starts, which would otherwise wait behind that write.
    kube = StatusWrites()
    clock = Clock(CREATED + timedelta(milliseconds=300))
    _, reconciler, events = setup(new_sd(sd_body()), kube, clock)
    wake = reconciler.reconcile("ns", "chat")
    assert kube.deployments(), "the children are written at once"
    assert kube.patches == [], "no status while the pods come up"
    assert wake == CREATE_GRACE_END, "reconciled again when the grace ends"
    reasons = [reason for reason, _ in events]
    assert "NewRevision" in reasons, "the Event of a child write is posted at once"
    assert "Sized" not in reasons, "a condition's Event would be told with its status"

    clock.now += timedelta(milliseconds=100)
    assert reconciler.reconcile("ns", "chat") == CREATE_GRACE_END
    assert kube.patches == [], "another event before the pods are ready: still nothing"

    kube.make_ready()
    clock.now += timedelta(milliseconds=100)
    reconciler.reconcile("ns", "chat")
    assert len(kube.patches) == 1, "one status write, the whole status"
    assert condition(kube, "Ready")["status"] == "True"
    assert condition(kube, "Sized")["status"] == "True"
    # A healthy start posts three Events; its conditions (sized, no queue, speculating, ready)
    # say the rest.
    assert [reason for reason, _ in events] == ["NewRevision", "RolloutComplete", "PairVerified"]


def test_a_new_sds_first_status_is_written_when_the_grace_ends_whatever_its_pods() -> None:
    kube = StatusWrites()
    clock = Clock(CREATED + timedelta(milliseconds=300))
    _, reconciler, _ = setup(new_sd(sd_body()), kube, clock)
    reconciler.reconcile("ns", "chat")
    assert kube.patches == []
    clock.now = CREATE_GRACE_END
    reconciler.reconcile("ns", "chat")
    assert len(kube.patches) == 1
    ready = condition(kube, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ReplicasNotReady")
    [revision] = status(kube)["revisions"]
    assert revision["phase"] == "Pending"


def test_a_new_sds_bad_news_is_written_at_once() -> None:
    body = sd_body()
    body["spec"]["pair"]["target"]["model"] = "meta-llama/Llama-3.1-405B-Instruct"
    body["spec"]["pair"]["draft"] = {"method": "none"}
    kube = StatusWrites()
    _, reconciler, events = setup(new_sd(body), kube, Clock(CREATED))
    assert reconciler.reconcile("ns", "chat") is None
    sized = condition(kube, "Sized")
    assert (sized["status"], sized["reason"]) == ("False", "Unschedulable")
    assert "Unschedulable" in [reason for reason, _ in events]


def test_a_decision_is_not_settled_by_one_that_would_still_write_or_tell_something_new() -> None:
    news = RolloutEvent("NewRevision", "revision abc created")
    ready = RolloutEvent("AllReplicasReady", "Ready=True: 1/1")
    first = Decision(
        applies=({"kind": "Deployment"},),
        status_patch={"phase": "Pending"},
        events=(news,),
    )
    settled = Decision(
        status_patch={"phase": "Progressing"}, events=(ready,), status_events=(ready,)
    )
    assert settle(first, settled) == Decision(
        applies=first.applies,
        status_patch={"phase": "Progressing"},
        events=(news, ready),
        status_events=(ready,),
    )
    still_writing = Decision(applies=({"kind": "Service"},), status_patch={"phase": "x"})
    assert settle(first, still_writing) is first
    telling_more = Decision(status_patch={"phase": "x"}, events=(RolloutEvent("Other", "o"),))
    assert settle(first, telling_more) is first


class PodsAskedFor(FakeKube):
    """Records how many pods the revision Deployments ask for after every write."""

    def __init__(self) -> None:
        super().__init__(NODES)
        self.asked: list[int] = []

    def apply(self, manifest: Any) -> None:
        super().apply(manifest)
        self.asked.append(sum(self.deployments().values()))


def test_with_max_surge_no_write_asks_for_more_pods_than_replicas_plus_the_surge() -> None:
    body = sd_body("r1", replicas=3)
    body["spec"]["rollout"] = {"maxSurge": 1}
    kube = PodsAskedFor()
    _, reconciler, _ = setup(body, kube)
    reconciler.reconcile("ns", "chat")
    kube.make_ready()
    reconciler.reconcile("ns", "chat")
    [first] = kube.deployments()

    body["spec"]["pair"]["draft"]["revision"] = "r2"
    kube.asked.clear()
    for _ in range(6):
        reconciler.reconcile("ns", "chat")
        kube.make_ready()
    second = next(n for n in kube.deployments() if n != first)
    assert kube.deployments() == {first: 0, second: 3}
    # Step by step (the stable one shrinks before the new one grows): at most 3 + 1 at any
    # moment between two writes.
    assert max(kube.asked) == 4, kube.asked


def test_a_missing_workload_priority_class_is_named_in_admitted_until_it_exists() -> None:
    body = sd_body()
    body["spec"]["placement"]["priorityClass"] = "urgent"
    kube, reconciler, events = setup(body)
    kube.priority_classes = {"high", "low"}
    reconciler.reconcile("ns", "chat")
    admitted = condition(kube, "Admitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "PriorityClassNotFound")
    assert "WorkloadPriorityClass urgent does not exist" in admitted["message"]
    assert "PriorityClassNotFound" in [reason for reason, _ in events]

    kube.priority_classes.add("urgent")
    reconciler.reconcile("ns", "chat")
    assert condition(kube, "Admitted")["reason"] != "PriorityClassNotFound"


def test_unschedulable_pair_creates_nothing_and_says_how_much_memory() -> None:
    body = sd_body()
    body["spec"]["pair"]["target"]["model"] = "meta-llama/Llama-3.1-405B-Instruct"
    body["spec"]["pair"]["draft"] = {"method": "none"}
    kube, reconciler, events = setup(body)
    reconciler.reconcile("ns", "chat")
    assert kube.deployments() == {}
    sized = condition(kube, "Sized")
    assert (sized["status"], sized["reason"]) == ("False", "Unschedulable")
    assert "GiB" in sized["message"]
    assert status(kube)["phase"] == "Failed"
    assert "Unschedulable" in [reason for reason, _ in events]


def test_scaling_the_sd_scales_its_revision() -> None:
    kube, reconciler, _ = setup(sd_body(replicas=1))
    reconciler.reconcile("ns", "chat")
    kube.make_ready()
    reconciler.reconcile("ns", "chat")
    kube.objects[("SpeculativeDeployment", "ns", "chat")]["spec"]["replicas"] = 3
    reconciler.reconcile("ns", "chat")
    assert list(kube.deployments().values()) == [3]
    kube.make_ready()
    reconciler.reconcile("ns", "chat")
    assert status(kube)["replicas"] == 3
    assert status(kube)["readyReplicas"] == 3


def test_a_model_outside_the_catalog_is_sized_from_its_config_json() -> None:
    requests: list[str] = []
    config_json = {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "torch_dtype": "bfloat16",
    }

    class Hub(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            known = self.path == "/acme/llama-clone/resolve/v7/config.json"
            self.send_response(200 if known else 404)
            self.end_headers()
            if known:
                self.wfile.write(json.dumps(config_json).encode())

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        body = sd_body()
        body["spec"]["pair"]["target"] = {"model": "acme/llama-clone", "revision": "v7"}
        body["spec"]["pair"]["draft"] = {
            "method": "draft_model",
            "model": "acme/unknown-draft",
            "numSpeculativeTokens": 3,
        }
        kube, _, _ = setup(body)
        url = f"http://127.0.0.1:{server.server_port}/{{model}}/resolve/{{revision}}/config.json"
        reconciler = Reconciler(
            kube,  # type: ignore[arg-type]
            OperatorConfig.model_validate({"modelConfigUrl": url}),
            lambda *_: None,
        )
        reconciler.reconcile("ns", "chat")
        sized = condition(kube, "Sized")
        assert sized["status"] == "False", "the draft's shape is unknown"
        assert "acme/unknown-draft" in sized["message"]
        reconciler.reconcile("ns", "chat")
        # The clone was read once; the unknown draft is not asked again right away.
        assert sorted(requests) == [
            "/acme/llama-clone/resolve/v7/config.json",
            "/acme/unknown-draft/resolve/main/config.json",
        ]

        body["spec"]["pair"]["draft"] = {"method": "ngram", "numSpeculativeTokens": 3}
        kube.objects[("SpeculativeDeployment", "ns", "chat")]["spec"] = body["spec"]
        reconciler.reconcile("ns", "chat")
        assert condition(kube, "Sized")["status"] == "True"
        assert status(kube)["sizing"]["memory"]["targetWeightsGiB"] == pytest.approx(
            14.96, abs=0.02
        )
    finally:
        server.shutdown()
        server.server_close()


def test_cordoning_the_mig_node_keeps_the_serving_revision_and_its_slice() -> None:
    """Draining the node under a `mig: Auto` SD changes the inventory, not the pair: no new
    revision is made, and none when the node comes back."""
    kube, reconciler, _ = setup(sd_body())
    kube.nodes = kwok_gpu_nodes()
    reconciler.reconcile("ns", "chat")
    kube.make_ready()
    reconciler.reconcile("ns", "chat")
    [serving] = kube.deployments()
    assert status(kube)["sizing"]["resourceName"] == "nvidia.com/mig-3g.40gb"

    for node in kube.nodes:
        if node["metadata"]["name"] == "kwok-h100-mig-0":
            node["spec"] = {"unschedulable": True}
    for _ in range(2):
        reconciler.reconcile("ns", "chat")
    assert list(kube.deployments()) == [serving]
    assert status(kube)["sizing"]["resourceName"] == "nvidia.com/mig-3g.40gb"

    for node in kube.nodes:
        node["spec"] = {}
    reconciler.reconcile("ns", "chat")
    assert list(kube.deployments()) == [serving]


def test_a_spec_change_while_the_mig_node_is_cordoned_is_sized_afresh() -> None:
    kube, reconciler, _ = setup(sd_body("r1"))
    reconciler.reconcile("ns", "chat")
    kube.make_ready()
    reconciler.reconcile("ns", "chat")
    kube.nodes = [
        {**NODES[0], "spec": {"unschedulable": True}},
        {
            "metadata": {"name": "whole", "labels": {"nvidia.com/gpu.product": H100}},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}},
        },
    ]
    kube.objects[("SpeculativeDeployment", "ns", "chat")]["spec"]["pair"]["draft"]["revision"] = (
        "r2"
    )
    reconciler.reconcile("ns", "chat")
    assert len(kube.deployments()) == 2
    assert status(kube)["sizing"]["resourceName"] == "nvidia.com/gpu"


def kueue_webhooks(*names: str) -> list[dict[str, Any]]:
    rules = {
        "mpod.kb.io": ("", "pods"),
        "mdeployment.kb.io": ("apps", "deployments"),
    }
    return [
        {
            "metadata": {"name": "kueue-mutating-webhook-configuration"},
            "webhooks": [
                {
                    "name": name,
                    "rules": [
                        {
                            "apiGroups": [rules[name][0]],
                            "resources": [rules[name][1]],
                            "operations": ["CREATE", "UPDATE"],
                        }
                    ],
                }
                for name in names
            ],
        }
    ]


def test_quota_that_kueue_would_not_enforce_is_logged_at_start_and_named_in_admitted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube, reconciler, events = setup(sd_body())
    kube.webhook_configurations = kueue_webhooks("mpod.kb.io")
    with caplog.at_level("INFO", logger="specdeploy.reconcile"):
        reconciler.check_kueue()
    assert "quota would be bypassed: Kueue's mutating webhook for Deployments" in caplog.text
    reconciler.reconcile("ns", "chat")
    admitted = condition(kube, "Admitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "QuotaBypassed")
    assert "LocalQueue interactive does not hold back pods" in admitted["message"]
    assert ("QuotaBypassed", f"Admitted=False: {admitted['message']}") in events

    # Kueue's webhooks back: the next look (a resync) takes the claim back.
    kube.webhook_configurations = kueue_webhooks("mpod.kb.io", "mdeployment.kb.io")
    caplog.clear()
    with caplog.at_level("INFO", logger="specdeploy.reconcile"):
        reconciler.check_kueue()
    assert "are registered" in caplog.text
    reconciler.reconcile("ns", "chat")
    assert condition(kube, "Admitted")["reason"] != "QuotaBypassed"
