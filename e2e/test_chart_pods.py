"""The chart's operator as the chart's own pods on the test bed: two replicas of its unmodified
Deployment, run by the process kubelet from the operator image's entry point (the image map),
with the chart's ConfigMap at /etc/specdeploy, the projected ServiceAccount token at
/var/run/secrets/kubernetes.io/serviceaccount and KUBERNETES_SERVICE_HOST/PORT, so the operator
configures itself in-cluster as in a real cluster. Only the pods' annotations are set, so that
the process kubelet (not KWOK) runs them.

One release is walked through its life: install, two pods Running and one holding the Lease, an
SD served, the operator's metrics scraped by Prometheus through the chart's ServiceMonitor,
`helm test`, the leader's process killed (its container restarts in the same pod, as a new
candidate) and the standby taking over and finishing a rollout, `helm upgrade` with a changed
value rolling the operator's pods while the SD's pods stay, and `helm uninstall` leaving the SD
serving. With real engines, the leader's pod is deleted during a canary's analysis instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chart_harness import (
    CHART,
    ChartOperator,
    Helm,
    install,
    local_process_values,
    set_values,
)
from engine_cluster import (
    apply_crds,
    get_sd,
    kwok_operator_config,
    operator_config,
    prometheus_value,
    tiny_sd,
)
from engine_harness import engine_python, engine_python_path, tiny_models
from load import CompletionLoad
from sd_bodies import llama_8b
from testbed import ClusterEnv, Kubectl, create_namespace_with_queues, eventually
from testbed.conditions import condition
from testbed.prometheus_operator import served_monitor_crd

pytestmark = pytest.mark.e2e
__all__ = ["engine_python", "tiny_models"]  # session fixtures used here

NAME_LABEL = "specdeploy.dev/name"


HELM3_SCRIPT = Path(__file__).resolve().parent.parent / "hack" / "build-helm3.sh"


@pytest.fixture(scope="module")
def helm(cluster: ClusterEnv) -> Helm:
    return Helm(Path(cluster.bin_dir) / "helm", Path(cluster.kubeconfig))


@pytest.fixture(scope="module", params=["4", "3"], ids=["helm4", "helm3"])
def any_helm(request: pytest.FixtureRequest, cluster: ClusterEnv, helm: Helm) -> Helm:
    """Each Helm major users run: the test bed's Helm 4, and Helm 3 (hack/build-helm3.sh,
    built when missing)."""
    chosen = helm
    if request.param == "3":
        built = subprocess.run(
            ["bash", str(HELM3_SCRIPT)], capture_output=True, text=True, check=False, timeout=1800
        )
        if built.returncode != 0:
            raise RuntimeError(f"helm 3 could not be built: {built.stderr[-2000:]}")
        chosen = Helm(Path(built.stdout.strip().splitlines()[-1]), Path(cluster.kubeconfig))
    version = chosen.run("version", "--short").stdout.strip()
    assert version.startswith(f"v{request.param}."), version
    return chosen


@pytest.fixture
def release(helm: Helm, namespace: str) -> Iterator[str]:
    name = f"sd-{uuid.uuid4().hex[:6]}"
    try:
        yield name
    finally:
        helm.run("uninstall", name, "-n", namespace, "--wait", check=False)


def serving_revision(kubectl: Kubectl, namespace: str, name: str) -> str | None:
    sd = get_sd(kubectl, namespace, name)
    status = sd.get("status") or {}
    if condition(sd, "Ready").get("status") != "True" or status.get("phase") != "Serving":
        return None
    if condition(sd, "Ready").get("observedGeneration") != sd["metadata"]["generation"]:
        return None
    revision: str | None = status.get("stableRevision")
    return revision


def engine_pod_uids(kubectl: Kubectl, namespace: str, name: str) -> set[str]:
    pods = kubectl.get_json("pods", "-n", namespace, "-l", f"{NAME_LABEL}={name}")["items"]
    return {p["metadata"]["uid"] for p in pods if not p["metadata"].get("deletionTimestamp")}


def kill_pod(kubectl: Kubectl, namespace: str, name: str) -> None:
    """The pod deleted at once (grace 0, forced): its processes are killed without a grace
    period, and it never comes back under its name (its Deployment makes another pod)."""
    kubectl.run(
        "delete", "pod", name, "-n", namespace, "--grace-period=0", "--force", "--wait=false"
    )


def kill_process(operator: ChartOperator, name: str) -> int:
    """The operator container's process in pod `name` killed (SIGKILL, no release of the
    Lease), its pod kept: the process kubelet restarts the container in the same pod after its
    crash back-off. Returns the container's restart count before the kill."""
    (pod,) = [p for p in operator.pods() if p["metadata"]["name"] == name]
    (status,) = pod["status"]["containerStatuses"]
    os.kill(int(status["containerID"].removeprefix("process://")), signal.SIGKILL)
    return int(status.get("restartCount") or 0)


def restarted_and_ready(operator: ChartOperator, name: str, restarts_before: int) -> bool:
    """Whether pod `name`'s container was restarted since and is Ready again."""
    for pod in operator.pods():
        if pod["metadata"]["name"] == name:
            (status,) = pod["status"]["containerStatuses"]
            return bool(status.get("ready")) and status.get("restartCount", 0) > restarts_before
    return False


def took_over(operator: ChartOperator, *, killed: str, standby: str | None = None) -> str:
    """Waits for a new holder of the Lease once the leader `killed` (a pod) was killed, and
    returns its pod: `standby`, or with None any live pod of the release but the killed one.
    When none takes it, the error names every holder seen since, in order, and the pods."""
    holders: list[str | None] = []

    def new_holder() -> str | None:
        now = operator.leader()
        if not holders or holders[-1] != now:
            holders.append(now)
        if standby is not None:
            return now if now == standby else None
        live = {p["metadata"]["name"] for p in operator.pods()}
        return now if now != killed and now in live else None

    try:
        return eventually(new_holder, 90, f"{standby or 'another pod'} holding the Lease")
    except TimeoutError as error:
        pods = [p["metadata"]["name"] for p in operator.pods()]
        raise TimeoutError(
            f"{error}; the holders seen since {killed} was killed, in order: {holders}; the "
            f"release's pods: {pods}"
        ) from error


def describe(kubectl: Kubectl, operator: ChartOperator) -> str:
    """What to look at when the release does not come up: its pods and their logs."""
    namespace = operator.namespace
    pods = kubectl.run("get", "pods,lease", "-n", namespace, "-o", "wide", check=False).stdout
    return pods + operator.log_tail(3000)


@pytest.mark.usefixtures("sd_crd")
def test_the_charts_two_operator_pods_elect_a_leader_fail_over_and_survive_upgrade_and_uninstall(
    cluster: ClusterEnv, any_helm: Helm, kubectl: Kubectl, namespace: str, release: str
) -> None:
    helm = any_helm
    watched = f"{namespace}-sds"[:63]
    create_namespace_with_queues(kubectl, watched)
    config = {
        **kwok_operator_config(cluster.prometheus_url),
        "namespaces": [watched],
    }
    values = {
        "config": config,
        **local_process_values(),
        "serviceMonitor": {"enabled": True, "interval": "2s"},
        # Longer than the default 15 s, so that the leader's container, killed and restarted
        # in its pod after the crash back-off (10 s), is running again while the Lease it held
        # has not expired yet.
        "leaderElection": {"leaseDurationSeconds": 30, "renewDeadlineSeconds": 20},
    }
    operator = ChartOperator(cluster, release, namespace)
    with contextlib.ExitStack() as stack:
        stack.callback(kubectl.run, "delete", "namespace", watched, "--wait=false", check=False)
        stack.enter_context(served_monitor_crd(kubectl, "servicemonitors"))
        apply_crds(kubectl)
        install(helm, release, namespace, *set_values(values))
        try:
            first, second = eventually(
                lambda: operator.ready_pods(2),
                120,
                "two operator pods Running and Ready",
            )
            leader = eventually(operator.leader, 60, "a Lease holder")
        except (AssertionError, TimeoutError):
            print(describe(kubectl, operator))
            raise
        assert leader in (first, second)
        standby = second if leader == first else first

        # The leader serves an SD, with the chart's token and config only.
        kubectl.apply([llama_8b("chat", watched)])
        revision = eventually(
            lambda: serving_revision(kubectl, watched, "chat"), 120, "the SD Ready and Serving"
        )
        # Prometheus scrapes both pods through the chart's ServiceMonitor (job = the Service),
        # and the leader's reconciles among their series.
        fullname = f"{release}-specdeploy"
        scraped = (
            f'job="{fullname}",service="{fullname}",endpoint="metrics",namespace="{namespace}"'
        )
        eventually(
            lambda: prometheus_value(cluster.prometheus_url, f"count(up{{{scraped}}} == 1)") == 2,
            60,
            "both operator pods up in Prometheus through the ServiceMonitor",
        )
        eventually(
            lambda: (
                (
                    prometheus_value(
                        cluster.prometheus_url, f"sum(specdeploy_reconciles_total{{{scraped}}})"
                    )
                    or 0
                )
                > 0
            ),
            60,
            "the leader's reconciles scraped through the ServiceMonitor",
        )
        tested = helm.run("test", release, "-n", namespace, timeout=180)
        assert "Phase:          Succeeded" in tested.stdout, tested.stdout

        # The leader's process killed, its pod kept: no clean release of the Lease. Its
        # container restarts in the same pod before the Lease expires, as a new identity: a
        # candidate like any other, it finds its former self holding the Lease and stands by.
        # The standby, which saw the last renewal first, takes the Lease once it has not been
        # renewed for leaseDurationSeconds, and reconciles from then on.
        held_by = operator.holder()
        restarts = kill_process(operator, leader)
        eventually(
            lambda: restarted_and_ready(operator, leader, restarts),
            60,
            f"{leader}'s container restarted and Ready",
        )
        took_over(operator, killed=leader, standby=standby)
        where = f"Lease {namespace}/{operator.lease}"
        assert f"standing by: {where} is held by {held_by}" in operator.log_of(leader)
        kubectl.apply([llama_8b("chat", watched, draft_revision="eagle3-r2")])
        new_revision = eventually(
            lambda: (r := serving_revision(kubectl, watched, "chat")) != revision and r,
            120,
            "the new revision rolled out by the new leader",
        )
        assert operator.leader() == standby
        serving_pods = engine_pod_uids(kubectl, watched, "chat")
        assert serving_pods

        # helm upgrade with a changed value: new operator pods, the SD's pods untouched.
        before = {p["metadata"]["uid"] for p in operator.pods()}
        helm.run(
            "upgrade",
            release,
            str(CHART),
            "-n",
            namespace,
            *set_values({**values, "logReconciles": True}),
        )

        def rolled() -> list[str] | None:
            names = operator.ready_pods(2)
            uids = {p["metadata"]["uid"] for p in operator.pods()}
            return names if names and not (uids & before) else None

        eventually(rolled, 180, "two new operator pods Ready after the upgrade")
        assert engine_pod_uids(kubectl, watched, "chat") == serving_pods
        assert serving_revision(kubectl, watched, "chat") == new_revision

        # helm uninstall: the operator goes, the CRD (keep policy), the SD and its pods stay.
        helm.run("uninstall", release, "-n", namespace, "--wait")
        eventually(lambda: not operator.pods(), 60, "the operator pods gone")
        assert kubectl.run("get", "crd", "speculativedeployments.specdeploy.dev").returncode == 0
        assert serving_revision(kubectl, watched, "chat") == new_revision
        assert engine_pod_uids(kubectl, watched, "chat") == serving_pods


SD = "canary"
ENGINE_READY_S = 420
CANARY_ANALYSIS = {
    "interval": "10s",
    "window": "20s",
    "minDraftTokens": 60,
    "minAcceptanceRate": 0.5,
    "maxDropVsStable": 0.3,
    # Two engines share two cores here: latency is too noisy for a tight bound.
    "maxLatencyIncrease": 3.0,
    "failureLimit": 2,
    "promoteAfter": 2,
    "onInconclusive": "Hold",
}


def canary_sd(namespace: str, models: dict[str, str], version: str) -> dict[str, Any]:
    """The tiny pair with draft-small, rolled out as a canary of one pod judged every 10 s."""
    body = tiny_sd(SD, namespace, models, "draft-small", version)
    body["spec"]["rollout"] = {"canary": {"replicas": 1}, "analysis": dict(CANARY_ANALYSIS)}
    return body


@pytest.mark.engine
@pytest.mark.usefixtures("sd_crd")
def test_the_standby_operator_pod_finishes_a_canary_when_the_leader_is_killed_during_it(
    cluster: ClusterEnv, helm: Helm, namespace: str, release: str, tiny_models: dict[str, str]
) -> None:
    """Real engines: the chart's two pods serve the tiny pair; a new revision runs as a judged
    canary under load; once its analysis has begun, the leader's pod is killed (deleted at
    once), and another pod takes the Lease over and promotes the canary.

    The other pod is the standby or the pod the Deployment made in place of the killed one,
    whichever first sees the Lease unrenewed for its duration: each times that from when it
    saw the last renewal, and the standby, reading the Lease every retry period (2 s), can see
    it up to that much later than a replacement that starts just after it (a run here: the
    leader stopped at 17:48:00.4, the replacement read the Lease at 17:48:00.9 and took it
    16 s later, before the standby's next read). Either is a correct failover."""
    kubectl = cluster.kubectl()
    watched = f"{namespace}-sds"[:63]
    create_namespace_with_queues(kubectl, watched)
    config = {
        **operator_config(str(engine_python_path()), cluster.prometheus_url),
        "namespaces": [watched],
    }
    operator = ChartOperator(cluster, release, namespace)
    try:
        install(helm, release, namespace, *set_values({"config": config, **local_process_values()}))
        try:
            pods = eventually(lambda: operator.ready_pods(2), 120, "two operator pods Ready")
            leader = eventually(operator.leader, 60, "a Lease holder")
        except (AssertionError, TimeoutError):
            print(describe(kubectl, operator))
            raise
        standby = next(p for p in pods if p != leader)
        kubectl.apply([canary_sd(watched, tiny_models, "1-small")])
        stable = eventually(
            lambda: serving_revision(kubectl, watched, SD), ENGINE_READY_S, "the first pair Ready"
        )
        with CompletionLoad(kubectl, watched, SD, tiny_models["target"], cluster):
            kubectl.apply([canary_sd(watched, tiny_models, "2-small")])

            def canary_analysed() -> str | None:
                status = get_sd(kubectl, watched, SD).get("status") or {}
                canary = status.get("canaryRevision")
                analysis = status.get("analysis") or {}
                ours = canary not in (None, stable) and analysis.get("revision") == canary
                return str(canary) if ours else None

            canary = eventually(canary_analysed, ENGINE_READY_S, "the canary's analysis begun")
            kill_pod(kubectl, namespace, leader)
            successor = took_over(operator, killed=leader)
            print(f"\n{successor} took the Lease over ({standby} stood by before the kill)")
            promoted = eventually(
                lambda: (r := serving_revision(kubectl, watched, SD)) != stable and r,
                ENGINE_READY_S,
                "the canary promoted by the new leader",
            )
        assert promoted == canary
        assert operator.leader() == successor
        # The successor, not the killed leader, promoted it: its own writes include the old
        # stable's Deployment scaled down.
        scaled = f"api write: PATCH /apis/apps/v1/namespaces/{watched}/deployments/{SD}-{stable} "
        assert scaled in operator.log_of(successor)
        verdicts = get_sd(kubectl, watched, SD)["status"].get("revisions") or []
        print(f"revisions: {verdicts}")
    except (AssertionError, TimeoutError):
        print(describe(kubectl, operator))
        raise
    finally:
        # While the operator's pods run, so that the engines stop with their pods.
        kubectl.run("delete", "sd", "--all", "-n", watched, "--timeout=90s", check=False)
        kubectl.run("delete", "namespace", watched, "--wait=false", check=False)
