"""Convergence on the real API server: drift set back, exact status, no idle writes.

- The contract test runs the convergence scenario (e2e/convergence_scenarios.py) through the
  test bed's API server, Deployment controller, Kueue and KWOK, and through the in-memory fake
  the unit tests use, and requires the same observations from both.
- The operator test makes the same out-of-band changes with kubectl while the operator runs
  with a 600 s timer, so only the children's own watch events can start the reconciles that
  set them back; then restarts it with a 2 s timer and counts the writes of twelve idle
  reconciles (none), while its log shows it reconciling the SDs all along.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import signal
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from convergence_scenarios import (
    CHANGES,
    CONFIG,
    EXTRA_ARG,
    NAME,
    OTHER_ENDPOINTS,
    OTHER_IMAGE,
    OTHER_PORT,
    OTHER_SELECTOR,
    PROBES,
    FakeBackend,
    drift_scenario,
    scenario_sd,
)
from engine_cluster import WRITE_LINE, OperatorProcess
from fake_kube import FakeKube, kwok_gpu_nodes
from specdeploy.adapters.kube import KubeAdapter
from testbed import ClusterEnv, Kubectl, eventually
from testbed.conditions import is_ready
from testbed.faults import compact_etcd, restart

pytestmark = pytest.mark.e2e

NAME_LABEL = "specdeploy.dev/name"
#: The stores' check period of the watch-gap test's operator (the default is 60 s).
STORE_CHECK_S = 5


def kubectl_change(
    kubectl: Kubectl, namespace: str, what: str, deployment: str, retired: str
) -> None:
    """Makes one of the scenario's CHANGES the way a person with edit rights would."""
    ns = ("-n", namespace)
    if what == "image":
        kubectl.run("set", "image", f"deployment/{deployment}", f"engine={OTHER_IMAGE}", *ns)
    elif what == "args":
        add: list[dict[str, Any]] = [
            {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": EXTRA_ARG}
        ]
        kubectl.run("patch", "deployment", deployment, "--type=json", "-p", json.dumps(add), *ns)
    elif what == "env":
        kubectl.run("set", "env", f"deployment/{deployment}", f"SPECDEPLOY_PORT={OTHER_PORT}", *ns)
    elif what == "retired-replicas":
        kubectl.run("scale", f"deployment/{retired}", "--replicas=1", *ns)
    elif what == "service-selector":
        patch: dict[str, Any] = {"spec": {"selector": OTHER_SELECTOR}}
        kubectl.run("patch", "service", NAME, "-p", json.dumps(patch), *ns)
    elif what == "pod-monitor":
        patch = {"spec": {"podMetricsEndpoints": OTHER_ENDPOINTS}}
        kubectl.run("patch", "podmonitor", NAME, "--type=merge", "-p", json.dumps(patch), *ns)
    else:
        raise ValueError(what)


def deployments_settled(kubectl: Kubectl, namespace: str, name: str) -> bool:
    """Every revision Deployment observed by its controller, with all its pods ready and no
    others left."""
    found = kubectl.get_json("deployments", "-n", namespace, "-l", f"{NAME_LABEL}={name}")
    for deployment in found["items"]:
        spec, status = deployment["spec"], deployment.get("status") or {}
        wanted = spec["replicas"]
        if (status.get("observedGeneration") or 0) < deployment["metadata"]["generation"]:
            return False
        counts = [status.get(k) or 0 for k in ("replicas", "readyReplicas", "updatedReplicas")]
        if counts != [wanted, wanted, wanted]:
            return False
    return True


@dataclass
class RealBackend:
    """The scenario's backend on the test bed: kubectl for people, the real adapter for us."""

    kube: KubeAdapter
    namespace: str
    kubectl: Kubectl

    def create_sd(self, body: Mapping[str, Any]) -> None:
        self.kubectl.apply([dict(body)])

    def patch_sd_spec(self, patch: Mapping[str, Any]) -> None:
        self.kubectl.run(
            "patch", "sd", NAME, "-n", self.namespace, "--type=merge", "-p",
            json.dumps({"spec": dict(patch)}),
        )  # fmt: skip

    def change(self, what: str, deployment: str, retired: str) -> None:
        kubectl_change(self.kubectl, self.namespace, what, deployment, retired)

    def settle(self) -> None:
        eventually(
            lambda: deployments_settled(self.kubectl, self.namespace, NAME),
            120,
            "the revision Deployments observed and ready",
        )


@pytest.mark.usefixtures("sd_crd", "pod_monitor_crd")
def test_the_scenario_sees_the_same_through_the_fake_and_the_real_api(
    kubectl: Kubectl, k8s_api: Any, namespace: str
) -> None:
    real = drift_scenario(RealBackend(KubeAdapter(k8s_api), namespace, kubectl))
    fake = drift_scenario(FakeBackend(FakeKube(kwok_gpu_nodes())))
    assert real == fake
    # And what both saw is the convergence the unit test demands of the fake.
    changes = [entry for entry in real if entry[0] in CHANGES and entry[1] is True]
    assert [entry[0] for entry in changes] == list(CHANGES)
    assert all(entry[-1] is True for entry in changes), changes
    assert all(len(entry[2]) == 1 for entry in changes), changes
    assert real[-2] == ("whole GPU", "nvidia.com/gpu", False)


# What the Event after each change names: the child and the field set back.
SAYS = {
    "image": "set back spec.template.spec.containers[engine].image",
    "args": "set back spec.template.spec.containers[engine].args",
    "env": "set back spec.template.spec.containers[engine].env[SPECDEPLOY_PORT].value",
    "retired-replicas": "set back spec.replicas",
    "service-selector": f"Service {NAME} was changed out of band; set back spec.selector",
    "pod-monitor": f"PodMonitor {NAME} was changed out of band; set back spec.podMetricsEndpoints",
}


def events_with_reason(kubectl: Kubectl, namespace: str, reason: str) -> list[str]:
    found = kubectl.get_json("events", "-n", namespace, "--field-selector", f"reason={reason}")
    return [e.get("message", "") for e in found["items"]]


@pytest.mark.usefixtures("sd_crd", "pod_monitor_crd")
def test_the_running_operator_sets_back_each_change_from_its_watch_and_then_idles(
    cluster: ClusterEnv, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    # A 600 s timer: nothing but watch events can start the reconciles below in time.
    config = {**CONFIG, "reconcileIntervalSeconds": 600}
    with scenario_operator(cluster, kubectl, namespace, config, tmp_path) as operator:
        run_operator_scenario(kubectl, namespace, operator)


def sd_status(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = kubectl.get_json("sd", name, "-n", namespace).get("status") or {}
    return status


def ready_on(kubectl: Kubectl, namespace: str, name: str, resource: str) -> str | None:
    """The serving revision once Ready with its pods on `resource`, else None."""
    status = sd_status(kubectl, namespace, name)
    ready = is_ready({"status": status})
    sizing = status.get("sizing") or {}
    settled = deployments_settled(kubectl, namespace, name)
    if ready and settled and sizing.get("resourceName") == resource:
        return str(status["stableRevision"])
    return None


def run_operator_scenario(kubectl: Kubectl, namespace: str, operator: OperatorProcess) -> None:
    mig = "nvidia.com/mig-3g.40gb"
    kubectl.apply([scenario_sd(namespace)])
    first = eventually(lambda: ready_on(kubectl, namespace, NAME, mig), 120, "Ready on a slice")
    patch = {"spec": {"pair": {"draft": {"revision": "eagle3-r2"}}}}
    kubectl.run("patch", "sd", NAME, "-n", namespace, "--type=merge", "-p", json.dumps(patch))
    serving = eventually(
        lambda: r if (r := ready_on(kubectl, namespace, NAME, mig)) != first else None,
        120,
        "the second revision serving",
    )
    deployment, retired = f"{NAME}-{serving}", f"{NAME}-{first}"

    def read(kind: str, name: str) -> Any:
        return kubectl.get_json(kind.lower(), name, "-n", namespace)

    def set_back(what: str) -> None:
        before = PROBES[what](read, deployment, retired)
        known = set(events_with_reason(kubectl, namespace, "DriftReverted"))
        kubectl_change(kubectl, namespace, what, deployment, retired)
        began = time.monotonic()
        eventually(
            lambda: PROBES[what](read, deployment, retired) == before,
            60,
            f"the {what} change set back",
        )
        took = time.monotonic() - began

        def new_message() -> str | None:
            messages = events_with_reason(kubectl, namespace, "DriftReverted")
            fresh = [m for m in messages if m not in known]
            return fresh[0] if fresh else None

        message = eventually(new_message, 30, f"a DriftReverted Event after the {what} change")
        print(f"{what}: set back in {took:.1f}s; Event: {message}")
        assert SAYS[what] in message, message
        eventually(
            lambda: deployments_settled(kubectl, namespace, NAME), 120, "the Deployments settled"
        )

    for what in CHANGES:
        set_back(what)

    # The sizing switch: from a MIG slice to a whole GPU, and no stale sizing key left.
    kubectl.run(
        "patch", "sd", NAME, "-n", namespace, "--type=merge", "-p",
        json.dumps({"spec": {"placement": {"gpu": {"mig": "Never"}}}}),
    )  # fmt: skip
    eventually(
        lambda: ready_on(kubectl, namespace, NAME, "nvidia.com/gpu"), 120, "Ready on a whole GPU"
    )
    sizing = sd_status(kubectl, namespace, NAME)["sizing"]
    assert "migProfile" not in sizing, sizing

    # Restarted with a 2 s timer: it reconciles the SD again and again, and writes nothing.
    operator.stop()
    restarted = dataclasses.replace(
        operator, config={**operator.config, "reconcileIntervalSeconds": 2}
    )
    offset = len(restarted.log_text())
    restarted.start()
    operator.process = restarted.process
    restarted.wait_for_reconciles(offset, namespace, NAME, count=2)
    # Idle: twelve more reconciles (about 24 s), each writing nothing.
    restarted.wait_for_reconciles(len(restarted.log_text()), namespace, NAME, count=12)
    writes = restarted.writes_since(offset)
    print(f"idle: 12 reconciles, writes since the restart: {writes}")
    assert writes == [], f"the restarted operator wrote: {writes}"


# The children an SD's reconcile makes, deleted one at a time while the operator runs: (kubectl
# resource, the child's name from the serving revision's Deployment name).
DELETED_CHILDREN = (
    ("deployment", lambda deployment: deployment),
    ("service", lambda _: NAME),
    ("podmonitor", lambda _: NAME),
)
API_PATHS = {"deployment": "deployments", "service": "services", "podmonitor": "podmonitors"}


@pytest.mark.usefixtures("sd_crd", "pod_monitor_crd")
def test_a_child_deleted_during_a_watch_gap_that_lists_nothing_is_made_again(
    cluster: ClusterEnv, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """The Service deleted while the operator is frozen, and its watches cannot resume: the API
    server restarts (ending them) before the deletion, and etcd's history is then compacted
    past them, so kopf gets 410 Gone and lists the Services again, finding none of ours. No
    handler sees that deletion. The stores' check (one LIST of the objects' metadata per kind,
    every `storeCheckSeconds`, 5 s here) finds the Service store holding what the server has
    not; the LIST it asks for removes the Service and reconciles its SD, which makes it again,
    with the operator's timer 10 minutes away."""
    config = {**CONFIG, "reconcileIntervalSeconds": 600, "storeCheckSeconds": STORE_CHECK_S}
    with scenario_operator(cluster, kubectl, namespace, config, tmp_path) as operator:
        assert operator.process is not None
        pid = operator.process.pid
        kubectl.apply([scenario_sd(namespace)])
        eventually(
            lambda: ready_on(kubectl, namespace, NAME, "nvidia.com/mig-3g.40gb"),
            120,
            "Ready on a slice",
        )
        before = kubectl.get_json("service", NAME, "-n", namespace)["metadata"]["uid"]
        offset = len(operator.log_text())
        os.kill(pid, signal.SIGSTOP)
        try:
            # The restart ends the watch connections first: the deletion is never sent on one
            # (a frozen process still receives what is sent, and reads it once thawed).
            restart(cluster, "kube-apiserver")
            kubectl.run("delete", "service", NAME, "-n", namespace, "--wait=true")
            revision = compact_etcd(cluster)
        finally:
            os.kill(pid, signal.SIGCONT)
        thawed = time.monotonic()
        print(f"Service deleted; etcd compacted at {revision}; API server restarted")
        eventually(
            functools.partial(made_again, kubectl, namespace, "service", NAME, before),
            STORE_CHECK_S + 30,
            "the Service made again",
        )
        print(f"Service made again {time.monotonic() - thawed:.1f}s after the thaw")
        log = operator.log_text()[offset:]
        assert "the services store holds objects the API server has not" in log, log[-4000:]
        assert "listing services afresh removed 1 deleted unseen" in log, log[-4000:]
        path = f"/namespaces/{namespace}/services/{NAME}"
        assert any(p.endswith(path) for _, p in WRITE_LINE.findall(log)), log[-4000:]


@contextlib.contextmanager
def scenario_operator(
    cluster: ClusterEnv,
    kubectl: Kubectl,
    namespace: str,
    config: Mapping[str, Any],
    workdir: Path,
) -> Iterator[OperatorProcess]:
    """An operator watching `namespace` with `config` for the block; then the namespace's SDs
    deleted, the operator stopped and its log printed."""
    operator = OperatorProcess(cluster.kubeconfig, config, workdir, (namespace,))
    operator.start()
    try:
        yield operator
    finally:
        kubectl.run(
            "delete", "sd", "--all", "-n", namespace, "--timeout=60s", check=False, timeout=70
        )
        operator.stop()
        print(f"--- operator log ({operator.log_path}) ---\n{operator.log_tail()}")


def made_again(
    kubectl: Kubectl, namespace: str, resource: str, name: str, before: str
) -> str | None:
    """The uid of `resource` `name` once it exists again under another uid than `before`."""
    found = kubectl.run("get", resource, name, "-n", namespace, "-o", "json", check=False)
    if found.returncode != 0:
        return None
    uid: str = json.loads(found.stdout)["metadata"]["uid"]
    return uid if uid != before else None


def first_reconcile(operator: OperatorProcess, offset: int, namespace: str) -> re.Match[str] | None:
    """The first `reconciled` line of the scenario's SD after character `offset` of the log."""
    pattern = rf"reconciled {namespace}/{NAME} \((\d+) API writes"
    return re.search(pattern, operator.log_text()[offset:])


@pytest.mark.usefixtures("sd_crd", "pod_monitor_crd")
def test_a_deleted_child_is_made_again_from_its_own_deletion_event(
    cluster: ClusterEnv, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """The serving revision's Deployment, the Service and the PodMonitor, each deleted by hand
    while the operator runs with a 600 s timer: the first reconcile after the deletion ends
    within 10 s of it (asked for by the deletion's own watch event) and is the one that makes
    the child again (a store that still held the deleted child would have let it pass the child
    by, writing nothing, until a timer round)."""
    config = {**CONFIG, "reconcileIntervalSeconds": 600}
    with scenario_operator(cluster, kubectl, namespace, config, tmp_path) as operator:
        kubectl.apply([scenario_sd(namespace)])
        revision = eventually(
            lambda: ready_on(kubectl, namespace, NAME, "nvidia.com/mig-3g.40gb"),
            120,
            "Ready on a slice",
        )
        deployment = f"{NAME}-{revision}"
        for resource, child_name in DELETED_CHILDREN:
            name = child_name(deployment)
            before = kubectl.get_json(resource, name, "-n", namespace)["metadata"]["uid"]
            offset = len(operator.log_text())
            began = time.monotonic()
            kubectl.run("delete", resource, name, "-n", namespace, "--wait=true")

            # Within seconds, from the deletion's event: the timer round is 10 minutes away.
            first = eventually(
                functools.partial(first_reconcile, operator, offset, namespace),
                10,
                "the first reconcile after the delete to end",
            )
            log = operator.log_text()[offset:]
            path = f"/namespaces/{namespace}/{API_PATHS[resource]}/{name}"
            written = [p for _, p in WRITE_LINE.findall(log[: first.start()])]
            assert any(p.endswith(path) for p in written), (
                f"the first reconcile after the delete did not make the {resource} again: "
                f"{first.group(0)}; writes before it: {written}"
            )
            eventually(
                functools.partial(made_again, kubectl, namespace, resource, name, before),
                10,
                f"the {resource} {name} made again",
            )
            took = time.monotonic() - began
            print(f"{resource} {name}: made again {took:.1f}s after its delete")
            eventually(
                lambda: ready_on(kubectl, namespace, NAME, "nvidia.com/mig-3g.40gb"),
                120,
                "Ready again",
            )
        # No new revision and no record made for any of it.
        assert sd_status(kubectl, namespace, NAME)["stableRevision"] == revision
        records = kubectl.get_json(
            "controllerrevisions", "-n", namespace, "-l", f"{NAME_LABEL}={NAME}"
        )["items"]
        assert [r["metadata"]["name"] for r in records] == [deployment]
