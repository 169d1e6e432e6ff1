"""A pair across nodes on the test bed: a LeaderWorkerSet group per replica, admitted whole by
Kueue, its pods on two 8-GPU H100 nodes of one NVLink clique; a canary group waiting for a
whole group of quota while the stable group serves; a worker lost and its group recreated, with
no new revision. And the leader's and workers' `vllm serve` arguments as the installed vLLM's
own parser reads them (real multi-node vLLM cannot run on this machine).

The operator runs with KWOK-run pods (no engine runs), as in test_operator.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine_cluster import OperatorProcess
from engine_harness import engine_python
from fake_kube import kwok_gpu_nodes
from specdeploy.api.config import OperatorConfig
from specdeploy.api.models import SizingDecision, SpeculativeDeployment
from specdeploy.plan.children.vllm_args import build_vllm_args
from specdeploy.plan.placement.gpu_catalog import read_gpu_inventories
from specdeploy.plan.placement.sizing import size_pair
from test_operator import (
    example_prerequisites,
    example_sd,
    items,
    sd_of,
    wait_ready,
)
from testbed import Kubectl, eventually
from testbed.conditions import condition

pytestmark = pytest.mark.e2e

__all__ = ["engine_python"]  # the fixture, used below

EXAMPLE = "llama-405b-multinode.yaml"
NAME = "llama405b-chat"
WORKER_OF = "specdeploy.dev/worker-of"
CLIQUE = "nvidia.com/gpu.clique"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"


def group_pods(kubectl: Kubectl, namespace: str, lws: str) -> list[dict[str, Any]]:
    """Every pod of a LeaderWorkerSet, leader first."""
    found: list[dict[str, Any]] = kubectl.get_json(
        "pods", "-n", namespace, "-l", f"{LWS_NAME}={lws}"
    )["items"]
    return sorted(found, key=lambda p: p["metadata"]["name"])


def leader_worker_sets(kubectl: Kubectl, namespace: str) -> list[dict[str, Any]]:
    return items(kubectl, "leaderworkersets", namespace, NAME)


def test_the_405b_example_serves_through_a_group_and_a_canary_waits_for_a_whole_group(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    body = example_sd(EXAMPLE, namespace)
    kubectl.apply([*example_prerequisites(body), body])
    wait_ready(kubectl, namespace, NAME, timeout=180)

    sd = sd_of(kubectl, namespace, NAME)
    stable = sd["status"]["stableRevision"]
    sizing = sd["status"]["sizing"]
    assert (sizing["nodesPerReplica"], sizing["count"], sizing["pipelineParallelSize"]) == (2, 8, 2)
    assert sizing["memory"]["perDeviceGiB"] == pytest.approx(63.4, abs=0.05)
    assert items(kubectl, "deployments", namespace, NAME) == []
    [lws] = leader_worker_sets(kubectl, namespace)
    assert lws["metadata"]["name"] == f"{NAME}-{stable}"
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert lws["status"]["readyReplicas"] == 1

    # One group: a leader and a worker, each on its own node of the clique, 8 GPUs each,
    # admitted together by one Kueue Workload.
    leader, worker = group_pods(kubectl, namespace, lws["metadata"]["name"])
    assert leader["metadata"]["labels"]["specdeploy.dev/name"] == NAME
    assert worker["metadata"]["labels"][WORKER_OF] == NAME
    assert "specdeploy.dev/name" not in worker["metadata"]["labels"]
    nodes = {p["spec"]["nodeName"] for p in (leader, worker)}
    assert nodes == {"kwok-h100-0", "kwok-h100-1"}
    for pod in (leader, worker):
        assert pod["status"]["phase"] == "Running"
        (engine,) = pod["spec"]["containers"]
        assert engine["resources"]["limits"]["nvidia.com/gpu"] == "8"
        env = {e["name"] for e in engine.get("env") or []}
        assert {"LWS_LEADER_ADDRESS", "LWS_WORKER_INDEX"} <= env
    assert worker["spec"]["nodeSelector"][CLIQUE]
    assert "--headless" in worker["spec"]["containers"][0]["args"]
    workloads = kubectl.get_json("workloads", "-n", namespace)["items"]
    [workload] = [
        w
        for w in workloads
        if w["metadata"]["ownerReferences"][0]["name"] == lws["metadata"]["name"]
    ]
    assert condition(workload, "Admitted")["status"] == "True"
    # The Service sends requests to the leader only: the workers serve no API.
    service = kubectl.get_json("service", NAME, "-n", namespace)
    assert service["spec"]["selector"].items() <= leader["metadata"]["labels"].items()
    assert not service["spec"]["selector"].items() <= worker["metadata"]["labels"].items()

    # A new pair: its canary is a whole second group, 16 more H100s than the cohort has.
    body["spec"]["pair"]["draft"]["revision"] = "next"
    kubectl.apply([body])

    def waiting() -> dict[str, Any] | None:
        # The condition says WaitingForQuota from the canary's first gated pod; what the group
        # lacks comes once Kueue has tried to reserve quota for its Workload.
        found = sd_of(kubectl, namespace, NAME)
        admitted = condition(found, "Admitted")
        told = admitted.get("reason") == "WaitingForQuota" and " lacks " in admitted["message"]
        return found if told else None

    sd = eventually(waiting, 90, "the canary group waiting for quota, with what it lacks")
    canary = sd["status"]["canaryRevision"]
    assert canary
    assert canary != stable
    message = condition(sd, "Admitted")["message"]
    # What the whole group lacks: the cohort's 16 H100s are the stable group's.
    assert "lacks 16 nvidia.com/gpu (flavor h100-80gb);" in message, message
    assert f"the canary {canary} is a whole extra group of 2 pods x 8 nvidia.com/gpu (16)" in (
        message
    )
    sets = {s["metadata"]["name"]: s for s in leader_worker_sets(kubectl, namespace)}
    assert set(sets) == {f"{NAME}-{stable}", f"{NAME}-{canary}"}
    assert sets[f"{NAME}-{canary}"]["spec"]["replicas"] == 1
    # The canary's leader is held by Kueue's gate; the stable group keeps serving.
    [canary_leader] = [
        p
        for p in items(kubectl, "pods", namespace, NAME)
        if p["metadata"]["name"].startswith(f"{NAME}-{canary}")
    ]
    gates = {g["name"] for g in canary_leader["spec"].get("schedulingGates") or []}
    assert "kueue.x-k8s.io/admission" in gates
    assert sd["status"]["stableRevision"] == stable
    assert sets[f"{NAME}-{stable}"]["status"]["readyReplicas"] == 1
    assert sets[f"{NAME}-{stable}"]["spec"]["replicas"] == 1


def test_a_lost_worker_recreates_its_group_and_makes_no_revision(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    body = example_sd(EXAMPLE, namespace)
    body["spec"].pop("rollout")
    kubectl.apply([*example_prerequisites(body), body])
    wait_ready(kubectl, namespace, NAME, timeout=180)
    before = sd_of(kubectl, namespace, NAME)
    [lws] = leader_worker_sets(kubectl, namespace)
    leader, worker = group_pods(kubectl, namespace, lws["metadata"]["name"])

    kubectl.run("delete", "pod", worker["metadata"]["name"], "-n", namespace, "--wait=false")

    def recreated() -> list[dict[str, Any]] | None:
        pods = group_pods(kubectl, namespace, lws["metadata"]["name"])
        fresh = [
            p
            for p in pods
            if p["metadata"]["uid"] not in (leader["metadata"]["uid"], worker["metadata"]["uid"])
            and p["status"].get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        ]
        return pods if len(fresh) == 2 and len(pods) == 2 else None

    # RecreateGroupOnPodRestart: the leader goes too, and the group comes back whole.
    eventually(recreated, 120, "the group recreated: a new leader and a new worker")
    wait_ready(kubectl, namespace, NAME, timeout=120)
    after = sd_of(kubectl, namespace, NAME)
    assert after["status"]["stableRevision"] == before["status"]["stableRevision"]
    assert [r["revision"] for r in after["status"]["revisions"]] == [
        r["revision"] for r in before["status"]["revisions"]
    ]
    assert [s["metadata"]["uid"] for s in leader_worker_sets(kubectl, namespace)] == [
        lws["metadata"]["uid"]
    ]
    events = kubectl.get_json(
        "events",
        "-n",
        namespace,
        "--field-selector",
        f"involvedObject.name={lws['metadata']['name']}",
    )["items"]
    assert any(e["reason"] == "RecreateGroup" for e in events), [e["reason"] for e in events]


# --- the launch, as vLLM reads it --------------------------------------------------------------

# Parses `vllm serve <args>` with the installed vLLM's own CLI parser (the `serve` subcommand and
# its checks), then builds the engine's parallel config from them, which checks the multi-node
# options (the multiprocessing backend, rank within the nodes).
PARSE = """
import json, sys
from vllm.config import ParallelConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser

parser = FlexibleArgumentParser(prog="vllm")
serve = ServeSubcommand()
serve.subparser_init(parser.add_subparsers(dest="subcommand"))
args = parser.parse_args(["serve", *json.loads(sys.argv[1])])
serve.validate(args)
args.model = args.model_tag
engine = EngineArgs.from_cli_args(args)
parallel = ParallelConfig(
    pipeline_parallel_size=engine.pipeline_parallel_size,
    tensor_parallel_size=engine.tensor_parallel_size,
    nnodes=engine.nnodes,
    node_rank=engine.node_rank,
    master_addr=engine.master_addr,
    master_port=engine.master_port,
    distributed_executor_backend=engine.distributed_executor_backend,
)
print(json.dumps({
    "model": engine.model,
    "headless": args.headless,
    "tensor": engine.tensor_parallel_size,
    "pipeline": engine.pipeline_parallel_size,
    "nnodes": engine.nnodes,
    "node_rank": engine.node_rank,
    "rank_within": parallel.node_rank_within_dp,
    "master": [engine.master_addr, engine.master_port],
    "backend": parallel.distributed_executor_backend,
    "world": parallel.world_size,
    "speculative": engine.speculative_config,
}))
"""

# What the kubelet puts in place of $(VAR) in a container's args: the pod's env as LWS sets it.
EXPANDED = {
    "$(SPECDEPLOY_HOST)": "0.0.0.0",
    "$(SPECDEPLOY_PORT)": "8000",
    "$(LWS_LEADER_ADDRESS)": "llama405b-chat-abc-0.llama405b-chat-abc.serving",
    "$(LWS_WORKER_INDEX)": "1",
}


def vllm_reads(python: Path, args: list[str]) -> dict[str, Any]:
    done = subprocess.run(
        [str(python), "-c", PARSE, json.dumps([EXPANDED.get(a, a) for a in args])],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_vllm_reads_the_leader_and_worker_launch_as_one_pipeline_over_two_nodes(
    engine_python: Path,
) -> None:
    examples = Path(__file__).resolve().parents[1] / "examples"
    body = yaml.safe_load((examples / EXAMPLE).read_text())
    spec = SpeculativeDeployment.from_body(body).spec
    sizing = size_pair(spec, read_gpu_inventories(kwok_gpu_nodes()), OperatorConfig())
    assert isinstance(sizing, SizingDecision)
    leader = vllm_reads(engine_python, build_vllm_args(spec, sizing, "leader"))
    worker = vllm_reads(engine_python, build_vllm_args(spec, sizing, "worker"))
    for read in (leader, worker):
        assert read["model"] == "meta-llama/Llama-3.1-405B-Instruct"
        assert (read["tensor"], read["pipeline"], read["world"]) == (8, 2, 16)
        assert (read["nnodes"], read["backend"]) == (2, "mp")
        assert read["master"] == [EXPANDED["$(LWS_LEADER_ADDRESS)"], 29501]
        assert read["speculative"]["draft_tensor_parallel_size"] == 8
        assert read["speculative"]["method"] == "draft_model"
    assert (leader["node_rank"], leader["rank_within"], leader["headless"]) == (0, 0, False)
    # Rank 1 of 2, headless: vLLM runs this node's engine ranks and joins the leader's group.
    assert (worker["node_rank"], worker["rank_within"], worker["headless"]) == (1, 1, True)
