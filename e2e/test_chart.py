"""The Helm chart on the test bed: lint, server-side dry run, install, a CRD upgrade, uninstall,
and the operator running under the chart's ServiceAccount and RBAC.

The operator itself runs out of cluster (as in the other suites) but authenticates with a token
of the chart's ServiceAccount, against an API server that enforces RBAC, with the config the
chart rendered into its ConfigMap. The API server's audit log (docs/testbed.md) records every
request it makes; the RBAC test compares those requests with what the chart grants, both ways.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from chart_harness import (
    CHART,
    Helm,
    audited_requests,
    format_access,
    granted_access,
    install,
    service_account_operator,
    set_values,
)
from engine_cluster import OperatorProcess, apply_crds, get_sd
from sd_bodies import hub_sd, llama_8b, llama_405b_across_nodes
from testbed import (
    RESTRICTED_CONTAINER_SECURITY,
    RESTRICTED_POD_SECURITY,
    ClusterEnv,
    Kubectl,
    KubectlError,
    audit_log,
    create_namespace_with_queues,
    eventually,
)
from testbed.conditions import condition, is_ready

pytestmark = pytest.mark.e2e

CRD_NAME = "speculativedeployments.specdeploy.dev"
OLD_FINALIZER = "specdeploy.dev/finalizer"
NAME_LABEL = "specdeploy.dev/name"
PROBE_GATE = "specdeploy.dev/probe-judged"
REVISION_LABEL = "specdeploy.dev/revision"
# Nothing listens on the discard port: a model outside the catalog fails fast, offline.
LEGACY_REVISION = "legacy000"
OFFLINE_MODEL_CONFIG_URL = "http://127.0.0.1:9/{model}/{revision}/config.json"


@pytest.fixture(scope="module")
def helm(cluster: ClusterEnv) -> Helm:
    """The pinned helm bound to the test bed's admin kubeconfig."""
    return Helm(Path(cluster.bin_dir) / "helm", Path(cluster.kubeconfig))


@pytest.fixture
def release(helm: Helm, namespace: str) -> Iterator[str]:
    """A release name for this test; uninstalled afterwards (the CRD stays: keep policy)."""
    name = f"sd-{uuid.uuid4().hex[:6]}"
    try:
        yield name
    finally:
        helm.run("uninstall", name, "-n", namespace, "--wait", check=False)


def upgrade(helm: Helm, release: str, namespace: str, chart: Path) -> None:
    """`helm upgrade`, forcing server-side apply conflicts: fields of an adopted CRD are also
    owned by the field manager that applied it first (`kubectl apply --server-side`), and a
    change to them conflicts until helm takes them over (docs/chart.md)."""
    helm.run("upgrade", release, str(chart), "-n", namespace, "--force-conflicts")


def crd(kubectl: Kubectl) -> dict[str, Any]:
    found: dict[str, Any] = kubectl.get_json("crd", CRD_NAME)
    return found


def test_helm_lint_is_clean(helm: Helm) -> None:
    everything_on = {
        "config": {"namespaces": ["a", "b"]},
        "networkPolicy": {"enabled": True},
        "serviceMonitor": {"enabled": True},
    }
    for values in ({}, everything_on):
        out = helm.run("lint", "--strict", str(CHART), *set_values(values))
        text = out.stdout + out.stderr
        assert "1 chart(s) linted, 0 chart(s) failed" in text, text
        assert "[WARNING]" not in text
        assert "[ERROR]" not in text


def test_rendered_chart_passes_a_server_side_dry_run(
    helm: Helm, kubectl: Kubectl, namespace: str
) -> None:
    variants: list[dict[str, Any]] = [
        {},
        {
            "config": {"namespaces": [namespace]},
            "networkPolicy": {"enabled": True},
            "logReconciles": True,
        },
    ]
    for values in variants:
        rendered = helm.run("template", "dry", str(CHART), "-n", namespace, *set_values(values))
        out = kubectl.run("apply", "--dry-run=server", "-f", "-", stdin=rendered.stdout)
        assert "deployment.apps/dry-specdeploy created (server dry run)" in out.stdout, out.stdout
        assert "customresourcedefinition.apiextensions.k8s.io" in out.stdout


def with_printer_column(chart: Path, copy: Path) -> Path:
    """A copy of the chart whose CRD has one more printer column, `TargetRevision`."""
    shutil.copytree(chart, copy)
    (template,) = (copy / "templates").glob("crd-*.yaml")
    text = template.read_text()
    anchor = "    additionalPrinterColumns:\n"
    assert anchor in text
    column = (
        "    - name: TargetRevision\n"
        "      type: string\n"
        "      priority: 1\n"
        "      description: The target's revision (added by the chart upgrade test).\n"
        "      jsonPath: .spec.pair.target.revision\n"
    )
    template.write_text(text.replace(anchor, anchor + column, 1))
    return copy


def printer_columns(kubectl: Kubectl) -> list[str]:
    version = crd(kubectl)["spec"]["versions"][0]
    return [c["name"] for c in version.get("additionalPrinterColumns", [])]


def test_install_upgrade_with_a_changed_crd_and_uninstall_keeps_the_crd_and_sds(
    helm: Helm, kubectl: Kubectl, namespace: str, release: str, tmp_path: Path
) -> None:
    # As on a cluster that had the CRD from `kubectl apply --server-side -f crds/` (and as the
    # other suites leave it), whatever ran before.
    apply_crds(kubectl)
    install(helm, release, namespace)
    fullname = f"{release}-specdeploy"
    deployment = kubectl.get_json("deployment", fullname, "-n", namespace)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    installed = crd(kubectl)
    assert installed["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert installed["metadata"]["annotations"]["meta.helm.sh/release-name"] == release
    kubectl.run("get", "clusterrole", f"{fullname}-cluster", fullname)

    eventually(
        lambda: kubectl.run("get", "sd", "-n", namespace, check=False).returncode == 0,
        30,
        "the SpeculativeDeployment kind served",
    )
    kubectl.apply([llama_8b("kept", namespace)])

    assert "TargetRevision" not in printer_columns(kubectl)
    changed = with_printer_column(CHART, tmp_path / "specdeploy")
    upgrade(helm, release, namespace, changed)
    assert "TargetRevision" in printer_columns(kubectl), "the upgrade did not change the CRD"
    wide = kubectl.run("get", "sd", "kept", "-n", namespace, "-o", "wide").stdout
    assert "TARGETREVISION" in wide, wide

    # Back to the chart as committed: the CRD the other suites apply from crds/.
    upgrade(helm, release, namespace, CHART)
    assert "TargetRevision" not in printer_columns(kubectl)

    helm.run("uninstall", release, "-n", namespace, "--wait")
    assert kubectl.run("get", "deployment", fullname, "-n", namespace, check=False).returncode
    assert kubectl.run("get", "clusterrole", fullname, check=False).returncode
    assert crd(kubectl)["metadata"]["name"] == CRD_NAME, "the CRD went with the release"
    assert get_sd(kubectl, namespace, "kept")["spec"]["pair"]["version"] == "3.1"
    kubectl.run("delete", "sd", "kept", "-n", namespace, "--wait=false")


# --- the operator under the chart's ServiceAccount -------------------------------------------


def legacy_revision(namespace: str, sd: str, sd_uid: str) -> dict[str, Any]:
    """A revision Deployment without a ControllerRevision record, as operators before records
    made them (owned by its SD, as every child always was): the operator can only resize it,
    through the scale subresource."""
    labels = {NAME_LABEL: sd, REVISION_LABEL: LEGACY_REVISION}
    owner = {
        "apiVersion": "specdeploy.dev/v1alpha1",
        "kind": "SpeculativeDeployment",
        "name": sd,
        "uid": sd_uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": f"{sd}-{LEGACY_REVISION}",
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [owner],
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "securityContext": RESTRICTED_POD_SECURITY,
                    "containers": [
                        {
                            "name": "engine",
                            "image": "specdeploy/engine:old",
                            "securityContext": RESTRICTED_CONTAINER_SECURITY,
                        }
                    ],
                },
            },
        },
    }


def probe_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status) == 200
    except OSError:
        return False


def read_metrics(url: str) -> dict[str, float]:
    """The samples of a Prometheus text exposition, by name and labels."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def wait_serving(kubectl: Kubectl, namespace: str, name: str, operator: OperatorProcess) -> str:
    """Waits for Ready=True with the desired revision stable; returns that revision."""

    def serving() -> str | None:
        sd = get_sd(kubectl, namespace, name)
        status = sd.get("status") or {}
        ready = is_ready(sd)
        return status.get("stableRevision") if ready and status.get("phase") == "Serving" else None

    try:
        revision: str = eventually(serving, 120, f"{namespace}/{name} Ready and Serving")
    except AssertionError:
        print(operator.log_tail())
        raise
    return revision


@pytest.mark.usefixtures("pod_monitor_crd")
def test_operator_under_the_charts_service_account_reconciles_with_exactly_its_rbac(
    cluster: ClusterEnv, helm: Helm, namespace: str, release: str, tmp_path: Path
) -> None:
    kubectl = cluster.kubectl()
    watched = f"{namespace}-sds"[:63]
    create_namespace_with_queues(kubectl, watched)
    values = {
        "config": {
            "namespaces": [watched],
            "reconcileIntervalSeconds": 2,
            "batchQueues": ["batch"],
            "prometheusUrl": cluster.prometheus_url or "http://127.0.0.1:9090",
            "modelConfigUrl": OFFLINE_MODEL_CONFIG_URL,
        }
    }
    install(helm, release, namespace, *set_values(values))
    fullname = f"{release}-specdeploy"
    workdir = tmp_path / "operator"
    as_service_account = service_account_operator(cluster, namespace, fullname, workdir)
    chart_config, config = as_service_account.chart_config, as_service_account.config
    assert chart_config["namespaces"] == [watched]
    probe = urllib.parse.urlsplit(chart_config["livenessEndpoint"])
    assert (probe.hostname, probe.port, probe.path) == ("0.0.0.0", 8080, "/healthz")
    assert chart_config["metricsEndpoint"] == "http://0.0.0.0:8081/metrics"
    assert urllib.parse.urlsplit(config["livenessEndpoint"]).path == probe.path
    operator = OperatorProcess(str(as_service_account.kubeconfig), config, workdir, ())
    kubectl.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "hub-token", "namespace": watched},
                "data": {"token": base64.b64encode(b"hf_test").decode()},
            }
        ]
    )
    operator.start()
    # A scenario that fails for want of a permission is reported after the RBAC comparison,
    # which names the request refused.
    scenario_failure: Exception | None = None
    try:
        # What the pod's probes and the `helm test` pod ask.
        eventually(lambda: probe_answers(config["livenessEndpoint"]), 60, "the probe endpoint")
        run_through_every_call(kubectl, watched, operator)
        # What the optional ServiceMonitor scrapes.
        metrics = read_metrics(config["metricsEndpoint"])
        assert metrics.get('specdeploy_reconciles_total{result="ok"}', 0) > 0, metrics
        assert metrics.get("specdeploy_api_writes_total", 0) > 0, metrics
    except (AssertionError, TimeoutError, KubectlError) as failure:
        scenario_failure = failure
    finally:
        kubectl.run(
            "delete", "sd", "--all", "-n", watched, "--timeout=90s", check=False, timeout=100
        )
        operator.stop()
        kubectl.run("delete", "namespace", watched, "--wait=false", check=False)
        print(f"--- operator log ({operator.log_path}) ---\n{operator.log_tail()}")

    username = f"system:serviceaccount:{namespace}:{fullname}"
    audited = audited_requests(audit_log(cluster), username)
    assert not audited.forbidden, "requests refused (403):\n" + "\n".join(
        sorted(set(audited.forbidden))
    )
    # "API 403: Forbidden" (a handler), "failed: 403" (a child reconcile), APIForbiddenError
    # (kopf); not the milliseconds of a time stamp (",403").
    refusals = re.findall(r".*(?:Forbidden|(?<!,)\b403\b).*", operator.log_text())
    assert not refusals, "the operator was refused:\n" + "\n".join(refusals[:10])
    installed = helm.run("get", "manifest", release, "-n", namespace).stdout
    granted = granted_access(doc for doc in yaml.safe_load_all(installed) if doc)
    missing = audited.used - granted
    # `get` of a kind the operator lists and watches is the read its watch-fed store falls
    # back to before it is synced (docs/operator.md): granted, and seldom called.
    fallback = {
        (group, resource, "get")
        for group, resource, verb in audited.used
        if verb == "watch" and (group, resource, "list") in audited.used
    }
    # No request names it: the API server's OwnerReferencesPermissionEnforcement asks for it of
    # every child write (their owner references block the SD's deletion), and refuses the write
    # (403) without it.
    admission = {("specdeploy.dev", "speculativedeployments/finalizers", "update")}
    unused = granted - audited.used - fallback - admission
    assert not missing, "the operator called, the chart does not grant:\n" + format_access(missing)
    assert not unused, "the chart grants, the operator never called:\n" + format_access(unused)
    if scenario_failure is not None:
        raise scenario_failure


def run_through_every_call(kubectl: Kubectl, namespace: str, operator: OperatorProcess) -> None:
    """Drives the operator through each kind of request it can make: a pair served (its
    Deployment, record, Service, PodMonitor, status, Events), an old unrecorded revision
    resized, a revision pruned, a hub token read, and an SD deleted."""
    # With a probe: its pods wait behind the probe's readiness gate, which the operator opens
    # (a patch of each pod's status) once they ran it.
    probe = {"analysis": {"probe": {"configMapKeyRef": {"name": "chat-probe"}}}}
    kubectl.apply([llama_8b("chat", namespace, revisionHistoryLimit=1, rollout=probe)])
    first = wait_serving(kubectl, namespace, "chat", operator)
    for pod in kubectl.get_json("pods", "-n", namespace, "-l", f"{NAME_LABEL}=chat")["items"]:
        gate = [c for c in pod["status"]["conditions"] if c["type"] == PROBE_GATE]
        assert [c["status"] for c in gate] == ["True"], pod["status"]["conditions"]
    sd = get_sd(kubectl, namespace, "chat")
    assert condition(sd, "Ready")["observedGeneration"] == sd["metadata"]["generation"]
    kubectl.get_json("podmonitor", "chat", "-n", namespace)

    kubectl.apply([legacy_revision(namespace, "chat", sd["metadata"]["uid"])])
    eventually(
        lambda: (
            kubectl.get_json("deployment", f"chat-{LEGACY_REVISION}", "-n", namespace)["spec"][
                "replicas"
            ]
            == 0
        ),
        60,
        "the unrecorded revision scaled to zero",
    )

    kubectl.apply([llama_8b("chat", namespace, draft_revision="eagle3-r2", revisionHistoryLimit=1)])
    retired = {first, LEGACY_REVISION}

    def one_pruned() -> str | None:
        """The retired revision deleted beyond the history limit of 1, once the new one
        serves (which of the two depends on creation times, of one-second resolution)."""
        deployments = kubectl.get_json("deployments", "-n", namespace, "-l", f"{NAME_LABEL}=chat")
        left = {d["metadata"]["labels"][REVISION_LABEL] for d in deployments["items"]}
        sd = get_sd(kubectl, namespace, "chat")
        stable = (sd.get("status") or {}).get("stableRevision")
        if stable in retired or len(left) != 2 or len(retired - left) != 1:
            return None
        (gone,) = retired - left
        return gone

    pruned = eventually(one_pruned, 120, "the new revision serving and one retired one pruned")
    wait_serving(kubectl, namespace, "chat", operator)
    records = kubectl.get_json("controllerrevisions", "-n", namespace, "-l", f"{NAME_LABEL}=chat")
    assert f"chat-{pruned}" not in [r["metadata"]["name"] for r in records["items"]]

    run_through_a_pair_across_nodes(kubectl, namespace, operator)

    hub = hub_sd(namespace)
    # A Kueue priority class, so that the operator looks it up (it does not exist here).
    hub["spec"]["placement"]["priorityClass"] = "e2e-unlisted"
    # The finalizer an earlier version of the operator set: kopf takes it off (a patch of the
    # SD, the only one the operator sends).
    hub["metadata"]["finalizers"] = [OLD_FINALIZER]
    kubectl.apply([hub])
    eventually(
        lambda: condition(get_sd(kubectl, namespace, "hub"), "Sized").get("status") == "False",
        60,
        "the unlisted model's SD reconciled (no shape: not sized)",
    )
    eventually(
        lambda: not get_sd(kubectl, namespace, "hub")["metadata"].get("finalizers"),
        60,
        "an earlier version's finalizer taken off",
    )

    # No finalizer holds the SDs: they go at once, and the garbage collector deletes the
    # revision Deployments they own.
    kubectl.run("delete", "sd", "chat", "hub", "wide", "-n", namespace, "--wait=false")
    eventually(
        lambda: (
            not kubectl.get_json("deployments", "-n", namespace, "-l", f"{NAME_LABEL}=chat")[
                "items"
            ]
        ),
        # The garbage collector's pace, on a loaded machine.
        120,
        "the revision Deployments deleted with their SD",
    )
    events = kubectl.get_json("events", "-n", namespace)["items"]
    assert any(e.get("reason") == "RolloutComplete" for e in events), json.dumps(events)[:2000]


def run_through_a_pair_across_nodes(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    """A pair whose replicas span nodes: its revisions are LeaderWorkerSets, made, listed,
    watched and pruned as Deployments are. One group takes the test bed's whole H100 quota, so
    the later revisions never get ready: each is retired when the next one is asked for, and
    beyond the history limit of 1 the oldest of them is deleted."""
    kubectl.apply([llama_405b_across_nodes("wide", namespace)])
    serving = wait_serving(kubectl, namespace, "wide", operator)
    asked = []
    for version in ("v2", "v3", "v4"):
        kubectl.apply([llama_405b_across_nodes("wide", namespace, version=version)])

        def made(version: str = version) -> str | None:
            sets = kubectl.get_json("leaderworkersets", "-n", namespace, "-l", f"{NAME_LABEL}=wide")
            made = [
                s["metadata"]["labels"][REVISION_LABEL]
                for s in sets["items"]
                if s["metadata"]["labels"]["specdeploy.dev/pair-version"] == version
            ]
            return made[0] if made else None

        asked.append(eventually(made, 60, f"the LeaderWorkerSet of pair version {version}"))

    def pruned() -> bool:
        """One of the two retired revisions deleted beyond the history limit of 1 (which one
        depends on creation times, of one-second resolution)."""
        sets = kubectl.get_json("leaderworkersets", "-n", namespace, "-l", f"{NAME_LABEL}=wide")
        left = {s["metadata"]["labels"][REVISION_LABEL] for s in sets["items"]}
        return len(left) == 3 and {serving, asked[2]} <= left

    eventually(pruned, 60, "a retired revision never ready pruned beyond the history limit")


#: (verb, resource, namespace key, allowed): what the chart's ServiceAccount may and may not do.
#: Namespace keys: "watched" (a namespace the SDs live in), "release" (the chart's own), "other"
#: (a namespace nobody configured), "" (cluster scope).
CAN_I_MATRIX: tuple[tuple[str, str, str, bool], ...] = (
    # What the operator needs, in the SDs' namespace.
    ("get", "speculativedeployments.specdeploy.dev", "watched", True),
    ("patch", "speculativedeployments.specdeploy.dev/status", "watched", True),
    # OwnerReferencesPermissionEnforcement: children that block their SD's deletion.
    ("update", "speculativedeployments.specdeploy.dev/finalizers", "watched", True),
    ("patch", "deployments.apps", "watched", True),
    ("patch", "deployments.apps/scale", "watched", True),
    ("create", "controllerrevisions.apps", "watched", True),
    ("list", "pods", "watched", True),
    # The probe's readiness gate: a pod condition, not the pod itself.
    ("patch", "pods/status", "watched", True),
    ("patch", "pods", "watched", False),
    ("create", "events", "watched", True),
    ("get", "secrets", "watched", True),
    ("list", "nodes", "", True),
    ("list", "mutatingwebhookconfigurations.admissionregistration.k8s.io", "", True),
    # Secrets: one get in the SDs' namespaces, nothing more, nowhere else.
    ("list", "secrets", "watched", False),
    ("watch", "secrets", "watched", False),
    ("create", "secrets", "watched", False),
    ("get", "secrets", "release", False),
    ("get", "secrets", "other", False),
    ("get", "secrets", "kube-system", False),
    # Workloads outside the SDs' namespaces, and pods themselves.
    ("patch", "deployments.apps", "other", False),
    ("create", "pods", "watched", False),
    ("delete", "pods", "watched", False),
    ("create", "pods/exec", "watched", False),
    ("get", "configmaps", "kube-system", False),
    ("update", "speculativedeployments.specdeploy.dev", "watched", False),
    ("delete", "speculativedeployments.specdeploy.dev", "watched", False),
    # Widening its own access, or anyone's.
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", "", False),
    ("create", "rolebindings.rbac.authorization.k8s.io", "watched", False),
    ("escalate", "roles.rbac.authorization.k8s.io", "watched", False),
    ("bind", "clusterroles.rbac.authorization.k8s.io", "", False),
    ("impersonate", "serviceaccounts", "watched", False),
    ("create", "serviceaccounts/token", "release", False),
    ("update", "nodes", "", False),
    ("delete", "namespaces", "", False),
    ("patch", "customresourcedefinitions.apiextensions.k8s.io", "", False),
    ("create", "validatingadmissionpolicies.admissionregistration.k8s.io", "", False),
    ("get", "mutatingwebhookconfigurations.admissionregistration.k8s.io", "", False),
    ("patch", "mutatingwebhookconfigurations.admissionregistration.k8s.io", "", False),
)


def can_i(kubectl: Kubectl, user: str, verb: str, resource: str, namespace: str) -> bool:
    """`kubectl auth can-i`; `resource` may name a subresource (`pods/status`), which kubectl
    takes as `--subresource` (its `TYPE/NAME` form would name an object instead)."""
    scope = ["-n", namespace] if namespace else []
    kind, _, subresource = resource.partition("/")
    sub = [f"--subresource={subresource}"] if subresource else []
    done = kubectl.run("auth", "can-i", verb, kind, *sub, *scope, f"--as={user}", check=False)
    answer = done.stdout.strip()
    assert answer in ("yes", "no"), done.stdout + done.stderr
    return answer == "yes"


def test_the_charts_service_account_may_do_what_it_needs_and_nothing_else(
    helm: Helm, kubectl: Kubectl, namespace: str, release: str
) -> None:
    watched = f"{namespace}-sds"[:63]
    other = f"{namespace}-other"[:63]
    for extra in (watched, other):
        create_namespace_with_queues(kubectl, extra)
    try:
        install(helm, release, namespace, *set_values({"config": {"namespaces": [watched]}}))
        user = f"system:serviceaccount:{namespace}:{release}-specdeploy"
        places = {"watched": watched, "release": namespace, "other": other, "": ""}

        def upgrade_with_secret_namespaces(secret_namespaces: list[str]) -> None:
            """Every namespace watched, Secrets read in `secret_namespaces` (all when empty)."""
            values = {"config": {"namespaces": []}, "rbac": {"secretNamespaces": secret_namespaces}}
            helm.run("upgrade", release, str(CHART), "-n", namespace, *set_values(values))

        wrong = [
            f"{verb} {resource} in {places.get(where, where) or 'the cluster'}: "
            f"{'no' if allowed else 'yes'}, expected {'yes' if allowed else 'no'}"
            for verb, resource, where, allowed in CAN_I_MATRIX
            if can_i(kubectl, user, verb, resource, places.get(where, where)) != allowed
        ]
        assert not wrong, "\n".join(wrong)

        # Watching every namespace, rbac.secretNamespaces confines Secrets to those listed.
        upgrade_with_secret_namespaces([watched])
        assert can_i(kubectl, user, "patch", "deployments.apps", other)
        assert can_i(kubectl, user, "get", "secrets", watched)
        assert not can_i(kubectl, user, "get", "secrets", other)
        assert not can_i(kubectl, user, "get", "secrets", namespace)
        assert not can_i(kubectl, user, "list", "secrets", watched)

        # The defaults (every namespace watched, no rbac.secretNamespaces): one get of
        # Secrets in every namespace, kube-system included, and no list or watch anywhere:
        # exactly what docs/chart.md and the guarantees say the default grants.
        upgrade_with_secret_namespaces([])
        for where in (watched, other, namespace, "kube-system"):
            assert can_i(kubectl, user, "get", "secrets", where), where
            assert not can_i(kubectl, user, "list", "secrets", where), where
            assert not can_i(kubectl, user, "watch", "secrets", where), where
    finally:
        for extra in (watched, other):
            kubectl.run("delete", "namespace", extra, "--wait=false", check=False)
