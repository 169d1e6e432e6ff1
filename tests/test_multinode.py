"""Replicas across nodes: sizing over a parallel layout, the leader's and workers' vLLM launch,
the LeaderWorkerSet of a revision, and the reconcile that makes, judges and prunes them."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from fake_kube import FakeKube, kwok_gpu_nodes
from specdeploy.api.config import OperatorConfig
from specdeploy.api.models import SizingDecision, SpeculativeDeployment
from specdeploy.api.models import SpeculativeDeploymentSpec as Spec
from specdeploy.handlers.reconcile import Reconciler
from specdeploy.plan.children.manifests import build_revision_child, build_service
from specdeploy.plan.children.vllm_args import build_vllm_args
from specdeploy.plan.placement.admission import LWS_NAME_LABEL as LWS_NAME
from specdeploy.plan.placement.admission import judge_admission
from specdeploy.plan.placement.gpu_catalog import read_gpu_inventories
from specdeploy.plan.placement.sizing import (
    GIB,
    Unschedulable,
    size_pair,
)
from specdeploy.plan.rollout.analysis import Measurement
from vllm_windows import figures

CONFIG = OperatorConfig()
H100 = "NVIDIA-H100-80GB-HBM3"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "llama-405b-multinode.yaml"


def example_body() -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return body


def example_spec(**placement: Any) -> Spec:
    body = example_body()
    body["spec"]["placement"].update(placement)
    return Spec.model_validate(body["spec"])


def bed() -> Any:
    """The test bed's nodes (e2e/manifests/nodes.yaml): 2 x 8 H100 in one NVLink clique, a MIG
    node, 8 H200."""
    return read_gpu_inventories(kwok_gpu_nodes())


def sized(spec: Spec) -> SizingDecision:
    result = size_pair(spec, bed(), CONFIG)
    assert isinstance(result, SizingDecision), result.message
    return result


# --- sizing --------------------------------------------------------------------------------------


def test_the_405b_example_spans_two_nodes_of_eight_h100s() -> None:
    decision = sized(example_spec())
    assert (decision.nodes_per_replica, decision.count, decision.gpu_product) == (2, 8, H100)
    assert (decision.pipeline_parallel_size, decision.tensor_parallel_size) == (2, 8)
    assert decision.resource_name == "nvidia.com/gpu"
    # The last stage's GPU: 63 of 126 layers of 756 GiB over 8 ranks, their KV (504 KiB a token,
    # half the layers, 131,072 tokens, over 8), the 8B draft and its KV over 8, 2 GiB overhead.
    weights = 405.85e9 * 2 / GIB * 63 / 126 / 8
    target_kv = 2 * 126 * 8 * 128 * 2 * 63 / 126 / 8 * 131072 / GIB
    draft = 8.03e9 * 2 / GIB / 8
    draft_kv = 2 * 32 * 8 * 128 * 2 / 8 * 131072 / GIB
    per_gpu = (weights + target_kv + draft + draft_kv + 2.0) / 0.9
    assert decision.memory is not None
    assert decision.memory.per_device_gib == pytest.approx(per_gpu, abs=0.01)
    assert per_gpu == pytest.approx(63.4, abs=0.05)
    assert per_gpu < 81559 / 1024
    assert decision.memory.required_gib == pytest.approx(979.9, abs=0.1)
    assert "last pipeline stage (node 2 of 2), tensor parallel 8" in (
        decision.draft_placement or ""
    )
    assert "63 of 126 layers" in decision.message
    assert "63.4 of 79.6 GiB" in decision.message
    # What the most loaded GPU has left after weights and overhead, over its KV bytes a token.
    free = 81559 / 1024 * 0.9 - weights - draft - 2.0
    per_token = (2 * 126 * 8 * 128 * 2 * 63 / 126 + 2 * 32 * 8 * 128 * 2) / 8
    assert decision.kv_cache_tokens == int(free * GIB // per_token)


def test_one_node_stays_the_default_and_says_what_spreading_would_take() -> None:
    result = size_pair(example_spec(nodesPerReplica=1, topologyKey=None), bed(), CONFIG)
    assert isinstance(result, Unschedulable)
    assert "8 x NVIDIA-H100-80GB-HBM3" in result.message
    assert "with placement.nodesPerReplica auto it would span 2 nodes x 8" in result.message


def test_auto_keeps_a_pair_that_fits_one_node_on_one_node() -> None:
    body = example_body()["spec"]
    body["pair"] = {
        "version": "1",
        "target": {"model": "meta-llama/Llama-3.1-70B-Instruct"},
        "draft": {"method": "none"},
    }
    one = sized(Spec.model_validate({**body, "placement": {"gpu": {"product": H100}}}))
    auto = sized(Spec.model_validate(body))
    assert auto.nodes_per_replica is None
    assert auto.pipeline_parallel_size is None
    assert (auto.count, auto.tensor_parallel_size) == (one.count, one.tensor_parallel_size)
    assert build_vllm_args(Spec.model_validate(body), auto) == build_vllm_args(
        Spec.model_validate(body), one
    )


def test_a_pinned_node_count_is_checked_not_chosen() -> None:
    # Three nodes are asked for; the bed has two of eight H100s in the clique.
    result = size_pair(example_spec(nodesPerReplica=3), bed(), CONFIG)
    assert isinstance(result, Unschedulable)
    assert "no 3 nodes sharing a value of nvidia.com/gpu.clique hold it" in result.message


def test_the_topology_key_needs_enough_nodes_in_one_domain() -> None:
    nodes = kwok_gpu_nodes()
    for node in nodes:
        if node["metadata"]["name"] == "kwok-h100-1":
            node["metadata"]["labels"]["nvidia.com/gpu.clique"] = "another-domain.1"
    result = size_pair(example_spec(), read_gpu_inventories(nodes), CONFIG)
    assert isinstance(result, Unschedulable)
    # Without the key, the same two nodes do.
    assert sized(example_spec(topologyKey=None)).nodes_per_replica == 2


def test_tensor_parallel_across_nodes_replicates_kv_heads_beyond_their_count() -> None:
    body = example_body()["spec"]
    body["engine"]["acrossNodes"] = "TensorParallel"
    decision = sized(Spec.model_validate(body))
    assert (decision.nodes_per_replica, decision.count) == (2, 8)
    assert (decision.tensor_parallel_size, decision.pipeline_parallel_size) == (16, 1)
    # Every layer on every GPU, weights over 16 ranks; 8 KV heads over 16 ranks: each rank holds
    # one head, so the KV splits 8 ways, not 16.
    weights = 405.85e9 * 2 / GIB / 16
    target_kv = 2 * 126 * 8 * 128 * 2 / 8 * 131072 / GIB
    draft = 8.03e9 * 2 / GIB / 16
    draft_kv = 2 * 32 * 8 * 128 * 2 / 8 * 131072 / GIB
    assert decision.memory is not None
    assert decision.memory.per_device_gib == pytest.approx(
        (weights + target_kv + draft + draft_kv + 2.0) / 0.9, abs=0.01
    )
    assert "every node (16 ranks), tensor parallel 16" in (decision.draft_placement or "")


def test_a_draft_at_tensor_parallel_one_weighs_whole_on_the_gpu_that_runs_it() -> None:
    body = example_body()["spec"]
    # 4 sequences (32,768 tokens of KV): the whole draft and its KV then still fit one GPU.
    body["engine"]["maxNumSeqs"] = 4
    eight = sized(Spec.model_validate(body))
    body["pair"]["draft"]["draftTensorParallelSize"] = 1
    one = sized(Spec.model_validate(body))
    assert one.memory is not None
    assert eight.memory is not None
    draft = 8.03e9 * 2 / GIB
    draft_kv = 2 * 32 * 8 * 128 * 2 * 32768 / GIB
    extra = (draft + draft_kv) * (1 - 1 / 8) / 0.9
    assert one.memory.per_device_gib - eight.memory.per_device_gib == pytest.approx(extra, abs=0.02)


def test_more_pipeline_stages_than_layers_are_refused() -> None:
    body = example_body()["spec"]
    body["pair"] = {
        "version": "1",
        "target": {
            "model": "org/tiny",
            "shape": {
                "parametersBillion": 900,
                "layers": 2,
                "hiddenSize": 4096,
                "attentionHeads": 32,
                "kvHeads": 8,
                "vocabSize": 32000,
                "dtype": "bfloat16",
            },
        },
        "draft": {"method": "none"},
    }
    body["placement"]["nodesPerReplica"] = 3
    body["placement"].pop("topologyKey")
    result = size_pair(Spec.model_validate(body), bed(), CONFIG)
    assert isinstance(result, Unschedulable)
    assert "no whole GPUs of a product that fits the layout" in result.message


# --- the launch ----------------------------------------------------------------------------------


def test_leader_and_workers_run_the_same_engine_with_their_rank() -> None:
    spec = example_spec()
    decision = sized(spec)
    leader = build_vllm_args(spec, decision, "leader")
    worker = build_vllm_args(spec, decision, "worker")
    common = leader[: leader.index("--distributed-executor-backend")]
    assert worker[: len(common)] == common
    assert common[common.index("--tensor-parallel-size") + 1] == "8"
    assert common[common.index("--pipeline-parallel-size") + 1] == "2"
    launch = [
        "--distributed-executor-backend",
        "mp",
        "--nnodes",
        "2",
        "--node-rank",
    ]
    assert leader[len(common) : len(common) + 6] == [*launch, "0"]
    assert worker[len(common) : len(common) + 6] == [*launch, "$(LWS_WORKER_INDEX)"]
    for args in (leader, worker):
        assert args[args.index("--master-addr") + 1] == "$(LWS_LEADER_ADDRESS)"
        assert args[args.index("--master-port") + 1] == "29501"
        assert '"draft_tensor_parallel_size":8' in args[args.index("--speculative-config") + 1]
    assert "--headless" in worker
    assert "--headless" not in leader


def test_one_node_arguments_are_unchanged() -> None:
    body = example_body()["spec"]
    body["pair"]["target"]["model"] = "meta-llama/Llama-3.1-8B-Instruct"
    spec = Spec.model_validate(body)
    decision = sized(spec)
    args = build_vllm_args(spec, decision)
    assert decision.nodes_per_replica is None
    assert not {"--nnodes", "--node-rank", "--pipeline-parallel-size", "--headless"} & set(args)


# --- the LeaderWorkerSet -------------------------------------------------------------------------


def example_sd() -> SpeculativeDeployment:
    body = example_body()
    body["metadata"]["uid"] = "u-405"
    return SpeculativeDeployment.from_body(body)


def test_a_revision_across_nodes_is_one_leaderworkerset_of_leader_and_workers() -> None:
    sd = example_sd()
    decision = sized(sd.spec)
    lws = build_revision_child(sd, "abc1234567", decision, CONFIG, replicas=1)
    assert (lws["apiVersion"], lws["kind"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    assert lws["metadata"]["name"] == "llama405b-chat-abc1234567"
    assert lws["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "interactive"
    assert lws["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high"
    assert lws["metadata"]["labels"]["specdeploy.dev/revision"] == "abc1234567"
    assert lws["metadata"]["ownerReferences"][0]["uid"] == "u-405"
    assert lws["metadata"]["annotations"] == {
        "leaderworkerset.sigs.k8s.io/exclusive-topology": "nvidia.com/gpu.clique",
        "specdeploy.dev/hash-schema": "3",
    }
    group = lws["spec"]["leaderWorkerTemplate"]
    assert lws["spec"]["replicas"] == 1
    assert group["size"] == 2
    assert group["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader, worker = group["leaderTemplate"], group["workerTemplate"]
    (leader_engine,) = leader["spec"]["containers"]
    (worker_engine,) = worker["spec"]["containers"]
    for engine in (leader_engine, worker_engine):
        assert engine["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert leader["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": H100}
    assert worker["spec"]["nodeSelector"] == leader["spec"]["nodeSelector"]
    # The leader serves the API and is scraped like a single pod; the workers neither.
    service = build_service(sd)
    selector = service["spec"]["selector"]
    assert selector.items() <= leader["metadata"]["labels"].items()
    assert not selector.items() <= worker["metadata"]["labels"].items()
    assert worker["metadata"]["labels"]["specdeploy.dev/worker-of"] == "llama405b-chat"
    assert leader["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert "annotations" not in worker["metadata"]
    assert "readinessProbe" in leader_engine
    # No probe of any kind: a worker has no HTTP server to answer one.
    assert not [key for key in worker_engine if key.endswith("Probe")]
    assert "ports" not in worker_engine
    assert worker_engine["args"][:2] == ["serve", "--"]
    assert worker_engine["args"][2:] == build_vllm_args(sd.spec, decision, "worker")


def test_only_the_leader_of_a_group_runs_the_probe_and_waits_for_its_verdict() -> None:
    body = example_body()
    body["metadata"]["uid"] = "u"
    body["spec"]["rollout"] = {"analysis": {"probe": {"configMapKeyRef": {"name": "p"}}}}
    sd = SpeculativeDeployment.from_body(body)
    decision = sized(sd.spec)
    group = build_revision_child(sd, "abc1234567", decision, CONFIG, replicas=1)["spec"]
    leader = group["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    worker = group["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    assert leader["readinessGates"] == [{"conditionType": "specdeploy.dev/probe-judged"}]
    assert "readinessGates" not in worker
    (leader_engine,), (worker_engine,) = leader["containers"], worker["containers"]
    assert leader_engine["readinessProbe"]["httpGet"]["path"] == "/specdeploy/ready"
    assert "--middleware" in leader_engine["args"]
    assert "--middleware" not in worker_engine["args"]
    probe_env = {"SPECDEPLOY_PROBE", "SPECDEPLOY_PROBE_PROMPTS"}
    assert probe_env <= {e["name"] for e in leader_engine["env"]}
    assert not probe_env & {e["name"] for e in worker_engine["env"]}


def test_a_one_node_revision_stays_a_deployment() -> None:
    body = example_body()
    body["metadata"]["uid"] = "u"
    body["spec"]["pair"]["target"]["model"] = "meta-llama/Llama-3.1-8B-Instruct"
    sd = SpeculativeDeployment.from_body(body)
    child = build_revision_child(sd, "abc", sized(sd.spec), CONFIG, replicas=1)
    assert child["kind"] == "Deployment"


# --- Kueue ---------------------------------------------------------------------------------------


def test_a_canary_group_waiting_for_quota_says_it_needs_a_whole_group() -> None:
    gated = {
        "metadata": {"name": "llama405b-chat-new-0", "labels": {LWS_NAME: "llama405b-chat-new"}},
        "spec": {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]},
    }
    serving = {
        "metadata": {"name": "llama405b-chat-old-0", "labels": {LWS_NAME: "llama405b-chat-old"}},
        "spec": {},
    }
    pending = {
        "metadata": {
            "ownerReferences": [{"kind": "LeaderWorkerSet", "name": "llama405b-chat-new"}]
        },
        "status": {
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "False",
                    # As Kueue v0.19.2 words it for a group (seen on the test bed).
                    "message": "couldn't assign flavors to pod set leader: flavor h200 doesn't "
                    "match node affinity, insufficient unused quota for nvidia.com/gpu in "
                    "flavor h100-80gb, 8 more needed; couldn't assign flavors to pod set "
                    "worker: flavor h200 doesn't match node affinity, insufficient unused quota "
                    "for nvidia.com/gpu in flavor h100-80gb, 16 more needed",
                }
            ]
        },
    }
    admitted = copy.deepcopy(pending)
    admitted["metadata"]["ownerReferences"][0]["name"] = "llama405b-chat-old"
    admitted["status"]["conditions"][0]["status"] = "True"
    update = judge_admission(
        "interactive",
        [serving, gated],
        [admitted, pending],
        {"spec": {"clusterQueue": "interactive"}},
        group_sets={"llama405b-chat-new", "llama405b-chat-old"},
        group_note="the canary new is a whole extra group of 2 pods x 8 nvidia.com/gpu (16) "
        "beside the stable revision's groups: Kueue admits a group whole or not at all",
    )
    assert (update.status, update.reason) == ("False", "WaitingForQuota")
    # The group lacks 16 (leader and worker), said once: not "8 ..., 16 ...".
    assert "lacks 16 nvidia.com/gpu (flavor h100-80gb);" in update.message
    assert "whole extra group of 2 pods x 8 nvidia.com/gpu (16)" in update.message


# --- the reconcile -------------------------------------------------------------------------------


def setup(body: dict[str, Any], lws_crd: bool = True) -> tuple[FakeKube, Reconciler, list[str]]:
    kube = FakeKube(kwok_gpu_nodes(), lws_crd=lws_crd)
    kube.objects[("SpeculativeDeployment", "serving", "llama405b-chat")] = body
    events: list[str] = []
    reconciler = Reconciler(
        kube,  # type: ignore[arg-type]
        OperatorConfig(),
        lambda _body, _type, reason, message: events.append(f"{reason}: {message}"),
    )
    return kube, reconciler, events


def reconciled_body(draft_revision: str = "main") -> dict[str, Any]:
    body = example_body()
    body["metadata"].update({"uid": "u-405", "generation": 1})
    body["spec"]["pair"]["draft"]["revision"] = draft_revision
    body["spec"].pop("modelSource")
    return body


def sd_status(kube: FakeKube) -> dict[str, Any]:
    status: dict[str, Any] = kube.objects[("SpeculativeDeployment", "serving", "llama405b-chat")][
        "status"
    ]
    return status


def test_the_reconcile_serves_a_pair_across_nodes_through_a_leaderworkerset() -> None:
    kube, reconciler, _ = setup(reconciled_body())
    reconciler.reconcile("serving", "llama405b-chat")
    assert kube.deployments() == {}
    [(name, groups)] = kube.leader_worker_sets().items()
    assert groups == 1
    record = kube.objects[("ControllerRevision", "serving", name)]
    assert record["data"]["kind"] == "LeaderWorkerSet"
    sizing = sd_status(kube)["sizing"]
    assert (sizing["nodesPerReplica"], sizing["count"], sizing["pipelineParallelSize"]) == (2, 8, 2)
    kube.make_ready()
    reconciler.reconcile("serving", "llama405b-chat")
    status = sd_status(kube)
    assert status["stableRevision"] == name.rsplit("-", 1)[1]
    assert status["phase"] == "Serving"
    assert status["readyReplicas"] == 1
    # Steady: nothing more is written.
    writes = kube.write_requests
    reconciler.reconcile("serving", "llama405b-chat")
    assert kube.write_requests == writes


def test_a_new_pair_across_nodes_is_a_canary_group_beside_the_stable_one() -> None:
    kube, reconciler, _ = setup(reconciled_body())
    reconciler.reconcile("serving", "llama405b-chat")
    kube.make_ready()
    reconciler.reconcile("serving", "llama405b-chat")
    [stable] = kube.leader_worker_sets()
    kube.objects[("SpeculativeDeployment", "serving", "llama405b-chat")]["spec"]["pair"]["draft"][
        "revision"
    ] = "next"
    reconciler.reconcile("serving", "llama405b-chat")
    sets = kube.leader_worker_sets()
    [canary] = set(sets) - {stable}
    assert sets == {stable: 1, canary: 1}
    assert sd_status(kube)["canaryRevision"] == canary.rsplit("-", 1)[1]


def test_without_the_leaderworkerset_kind_nothing_is_made_and_status_says_why() -> None:
    kube, reconciler, _ = setup(reconciled_body(), lws_crd=False)
    reconciler.reconcile("serving", "llama405b-chat")
    assert kube.leader_worker_sets() == {}
    assert kube.deployments() == {}
    sized_condition = next(c for c in sd_status(kube)["conditions"] if c["type"] == "Sized")
    assert (sized_condition["status"], sized_condition["reason"]) == ("False", "Unschedulable")
    assert (
        "LeaderWorkerSet kind (leaderworkerset.x-k8s.io/v1) is not served"
        in (sized_condition["message"])
    )


def test_pruned_revisions_across_nodes_delete_their_leaderworkerset() -> None:
    body = reconciled_body()
    body["spec"]["revisionHistoryLimit"] = 1
    body["spec"].pop("rollout")
    kube, reconciler, _ = setup(body)
    names = []
    for revision in ("a", "b", "c"):
        sd = kube.objects[("SpeculativeDeployment", "serving", "llama405b-chat")]
        sd["spec"]["pair"]["draft"]["revision"] = revision
        reconciler.reconcile("serving", "llama405b-chat")
        kube.make_ready()
        reconciler.reconcile("serving", "llama405b-chat")
        names.append(sd_status(kube)["stableRevision"])
    left = {n.rsplit("-", 1)[1] for n in kube.leader_worker_sets()}
    assert left == {names[1], names[2]}
    assert not any(
        k == ("ControllerRevision", "serving", f"llama405b-chat-{names[0]}") for k in kube.objects
    )


# --- canary analysis on groups ------------------------------------------------------------------

# Whole windows (tests/vllm_windows.figures): the judge wants the stable's step and token sums
# too, and would call a window without them Inconclusive.
GOOD = figures(0.8, 3.4, draft_tokens=5000)
BAD = figures(0.08, 1.2, draft_tokens=5000)


def judged_world(
    canary_measures: Measurement,
) -> tuple[FakeKube, Reconciler, list[str], str, str, list[datetime]]:
    """The example serving its first group, then a new draft as a canary group, judged every
    10 s by `canary_measures` (the stable group measures GOOD)."""
    body = reconciled_body()
    body["spec"]["rollout"] = {
        "canary": {"replicas": 1},
        "analysis": {
            "interval": "10s",
            "minDraftTokens": 100,
            "failureLimit": 2,
            "promoteAfter": 2,
        },
    }
    kube = FakeKube(kwok_gpu_nodes())
    kube.objects[("SpeculativeDeployment", "serving", "llama405b-chat")] = body
    events: list[str] = []
    now = [datetime(2026, 11, 26, 12, 0, tzinfo=UTC)]
    measured: dict[str, Measurement] = {}
    reconciler = Reconciler(
        kube,  # type: ignore[arg-type]
        OperatorConfig(),
        lambda _body, _type, reason, message: events.append(f"{reason}: {message}"),
        measure=lambda pods, _window, _stretch, _at: measured.get(pods.revision, Measurement()),
        clock=lambda: now[0],
    )

    def step(seconds: float = 0) -> None:
        now[0] += timedelta(seconds=seconds)
        reconciler.reconcile("serving", "llama405b-chat")
        kube.make_ready()
        reconciler.reconcile("serving", "llama405b-chat")

    step()
    stable = sd_status(kube)["stableRevision"]
    body["spec"]["pair"]["draft"]["revision"] = "next"
    body["metadata"]["generation"] += 1
    step()
    canary = sd_status(kube)["canaryRevision"]
    measured.update({stable: GOOD, canary: canary_measures})
    for _ in range(3):
        step(10)
    return kube, reconciler, events, stable, canary, now


def groups(kube: FakeKube) -> dict[str, int]:
    return {n.rsplit("-", 1)[1]: r for n, r in kube.leader_worker_sets().items()}


def test_a_canary_group_that_passes_is_promoted_and_the_stable_group_retired() -> None:
    kube, _, events, stable, canary, _ = judged_world(GOOD)
    assert sd_status(kube)["stableRevision"] == canary
    assert groups(kube) == {stable: 0, canary: 1}
    assert any(e.startswith("CanaryPromoted") for e in events), events


def test_a_canary_group_that_fails_is_rolled_back_while_the_stable_group_serves() -> None:
    kube, _, events, stable, canary, _ = judged_world(BAD)
    status = sd_status(kube)
    assert status["stableRevision"] == stable
    assert groups(kube) == {stable: 1, canary: 0}
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "RolledBack")
    assert any(e.startswith("RolledBack") for e in events), events


def test_ready_counts_groups_of_a_replica_across_nodes() -> None:
    kube, reconciler, _ = setup(reconciled_body())
    reconciler.reconcile("serving", "llama405b-chat")
    kube.make_ready()
    reconciler.reconcile("serving", "llama405b-chat")
    ready = next(c for c in sd_status(kube)["conditions"] if c["type"] == "Ready")
    revision = sd_status(kube)["stableRevision"]
    assert ready["message"] == f"1/1 groups of 2 pods of revision {revision} ready"


def test_a_group_pod_counts_as_admitted_by_its_leaderworkersets_workload_and_no_other() -> None:
    """Kueue admits a group through one Workload owned by the LeaderWorkerSet, none per pod: a
    running pod of a group whose LeaderWorkerSet has that Workload is admitted; one of a group
    with none ran outside Kueue's quota."""
    pod = {
        "metadata": {"name": "llama405b-chat-old-0", "labels": {LWS_NAME: "llama405b-chat-old"}},
        "spec": {},
    }
    workload = {
        "metadata": {
            "ownerReferences": [{"kind": "LeaderWorkerSet", "name": "llama405b-chat-old"}]
        },
        "status": {"admission": {"clusterQueue": "interactive"}},
    }
    queue = {"spec": {"clusterQueue": "interactive"}}
    groups = {"llama405b-chat-old"}
    update = judge_admission("interactive", [pod], [workload], queue, group_sets=groups)
    assert (update.status, update.reason) == ("True", "Admitted")
    update = judge_admission("interactive", [pod], [], queue, group_sets=groups)
    assert (update.status, update.reason) == ("False", "QuotaBypassed")
    assert "llama405b-chat-old-0" in update.message
