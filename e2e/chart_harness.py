"""The Helm chart on the test bed: helm bound to a kubeconfig, the RBAC the chart grants, and
the requests the API server's audit log saw a ServiceAccount make.

An access is one (API group, resource, verb), the resource with its subresource as RBAC writes
it (`speculativedeployments/status`); the core group is "".
"""

from __future__ import annotations

import json
import subprocess
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testbed import ClusterEnv, Kubectl
from testbed.conditions import is_ready
from testbed.ports import free_ports

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "specdeploy"
RBAC_KINDS = ("ClusterRole", "Role")

Access = tuple[str, str, str]


class HelmError(RuntimeError):
    """helm exited non-zero; carries its output."""

    def __init__(self, args: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        super().__init__(f"helm {' '.join(args)} exited {returncode}: {stderr.strip() or stdout}")


@dataclass(frozen=True)
class Helm:
    """The pinned helm, with the test bed's kubeconfig (none for offline commands)."""

    binary: Path
    kubeconfig: Path | None = None

    def run(
        self, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """Runs helm; raises HelmError on a non-zero exit when `check`."""
        argv = [str(self.binary), *args]
        if self.kubeconfig is not None:
            argv += ["--kubeconfig", str(self.kubeconfig)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise HelmError(args, proc.returncode, proc.stdout, proc.stderr)
        return proc

    def template(self, *args: str, chart: Path = CHART) -> list[dict[str, Any]]:
        """`helm template` of the chart, as objects (empty documents dropped)."""
        text = self.run("template", "specdeploy", str(chart), *args).stdout
        return [doc for doc in yaml.safe_load_all(text) if doc]


def set_values(values: Mapping[str, Any]) -> list[str]:
    """`--set-json` flags for top-level values."""
    flags: list[str] = []
    for key, value in values.items():
        flags += ["--set-json", f"{key}={json.dumps(value)}"]
    return flags


def granted_access(objects: Iterable[Mapping[str, Any]]) -> set[Access]:
    """Every (group, resource, verb) the rendered ClusterRoles and Roles grant."""
    granted: set[Access] = set()
    for obj in objects:
        if obj.get("kind") not in RBAC_KINDS:
            continue
        for rule in obj.get("rules") or []:
            assert "*" not in rule.get("verbs", []), f"{obj['metadata']['name']}: wildcard verb"
            assert "*" not in rule.get("resources", []), f"{obj['metadata']['name']}: wildcard"
            for group in rule.get("apiGroups", []):
                for resource in rule.get("resources", []):
                    for verb in rule["verbs"]:
                        granted.add((group, resource, verb))
    return granted


@dataclass(frozen=True)
class AuditedRequests:
    """What one user asked of the API server, by access, and the requests it was refused."""

    used: set[Access]
    forbidden: list[str]


def audited_requests(audit_log: Path, username: str) -> AuditedRequests:
    """The resource requests `username` made, from the API server's JSON audit log (discovery
    and other non-resource URLs, which every authenticated user may read, are left out)."""
    used: set[Access] = set()
    forbidden: list[str] = []
    for line in audit_log.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if (event.get("user") or {}).get("username") != username:
            continue
        code = (event.get("responseStatus") or {}).get("code")
        ref = event.get("objectRef")
        if code == 403:
            forbidden.append(f"{event.get('verb')} {event.get('requestURI', '').split('?')[0]}")
        if not ref:
            continue
        resource = ref.get("resource", "")
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        group = ref.get("apiGroup", "")
        used.add((group, resource, event["verb"]))
        if event["verb"] == "patch" and code == 201:
            # A server-side apply that created its object: the API server authorizes it as a
            # create too (without `create` the patch is refused with 403).
            used.add((group, resource, "create"))
    return AuditedRequests(used, forbidden)


def format_access(accesses: Iterable[Access]) -> str:
    """One `verb group/resource` per line, sorted."""
    return "\n".join(f"  {v} {g or 'core'}/{r}" for g, r, v in sorted(accesses)) or "  (none)"


def service_account_kubeconfig(path: Path, api_server: str, ca_file: Path, token: str) -> Path:
    """A kubeconfig that authenticates with a ServiceAccount token only."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "testbed",
                "cluster": {"server": api_server, "certificate-authority": str(ca_file)},
            }
        ],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "testbed", "user": "operator"}}],
        "current-context": "operator",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


# --- the operator out of cluster, as the chart's ServiceAccount ------------------------------


def install(helm: Helm, release: str, namespace: str, *args: str, chart: Path = CHART) -> None:
    """`helm install`; `--take-ownership` adopts a CRD applied earlier by `kubectl apply`
    (the other suites do), as a cluster moving from crds/ to the chart would."""
    helm.run("install", release, str(chart), "-n", namespace, "--take-ownership", *args)


def operator_config_from_chart(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    """The config the chart rendered into its ConfigMap, as the operator pod would read it."""
    configmap = kubectl.get_json("configmap", name, "-n", namespace)
    config: dict[str, Any] = yaml.safe_load(configmap["data"]["config.yaml"])
    return config


@dataclass(frozen=True)
class ServiceAccountOperator:
    """How to run the operator of an installed release out of cluster, as the release's pod
    would: with its ServiceAccount's token for only credential and its ConfigMap for config."""

    kubeconfig: Path
    #: The config as the chart rendered it into its ConfigMap.
    chart_config: dict[str, Any]
    #: What to run with: the same, its probe and metrics on free loopback ports.
    config: dict[str, Any]


def service_account_operator(
    cluster: ClusterEnv,
    release_namespace: str,
    fullname: str,
    workdir: Path,
    token_duration: str = "2h",
) -> ServiceAccountOperator:
    """The credentials and config of the operator of the release whose objects are named
    `fullname`. The chart's probe and metrics endpoints listen on all addresses at fixed
    ports; out of cluster on a shared machine they move to free loopback ports, with the
    chart's paths."""
    kubectl = cluster.kubectl()
    token = kubectl.run(
        "create", "token", fullname, "-n", release_namespace, f"--duration={token_duration}"
    ).stdout.strip()
    workdir.mkdir(parents=True, exist_ok=True)
    kubeconfig = service_account_kubeconfig(
        workdir / "operator.kubeconfig",
        cluster.api_server,
        Path(cluster.run_dir) / "pki" / "ca.crt",
        token,
    )
    chart_config = operator_config_from_chart(kubectl, release_namespace, fullname)
    config = dict(chart_config)
    probe_port, metrics_port = free_ports(2)
    probe_path = urllib.parse.urlsplit(str(chart_config.get("livenessEndpoint", ""))).path
    config["livenessEndpoint"] = f"http://127.0.0.1:{probe_port}{probe_path or '/healthz'}"
    config["metricsEndpoint"] = f"http://127.0.0.1:{metrics_port}/metrics"
    return ServiceAccountOperator(kubeconfig, chart_config, config)


# --- the operator as the chart's own pods on the test bed -----------------------------------

#: What the chart's pods carry on the test bed so that its process kubelet, not KWOK, runs them.
LOCAL_PROCESS = {"specdeploy.dev/local-process": "true"}


def local_process_values() -> dict[str, Any]:
    """Chart values that put the operator's pods and `helm test`'s pod on the process kubelet
    (nothing else of the chart changes)."""
    return {"podAnnotations": LOCAL_PROCESS, "test": {"podAnnotations": LOCAL_PROCESS}}


@dataclass(frozen=True)
class ChartOperator:
    """The operator pods of an installed release, as the test bed's process kubelet runs them."""

    cluster: ClusterEnv
    release: str
    namespace: str
    lease: str = "specdeploy-operator"

    def pods(self) -> list[dict[str, Any]]:
        """The release's operator pods that are not being deleted."""
        selector = f"app.kubernetes.io/instance={self.release},app.kubernetes.io/component=operator"
        found = self.cluster.kubectl().get_json("pods", "-n", self.namespace, "-l", selector)
        return [p for p in found["items"] if not p["metadata"].get("deletionTimestamp")]

    def ready_pods(self, count: int) -> list[str] | None:
        """The names of exactly `count` operator pods, all Ready; None otherwise."""
        pods = self.pods()
        ready = sorted(p["metadata"]["name"] for p in pods if is_ready(p))
        return ready if len(ready) == count == len(pods) else None

    def holder(self) -> str | None:
        """The identity holding the release's Lease (`<pod>_<uuid>`, one per operator process),
        None when nobody holds it."""
        done = self.cluster.kubectl().run(
            "get", "lease", self.lease, "-n", self.namespace, "-o", "json", check=False
        )
        if done.returncode != 0:
            return None
        holder: str | None = (json.loads(done.stdout).get("spec") or {}).get("holderIdentity")
        return holder

    def leader(self) -> str | None:
        """The pod of the Lease's holder, None when nobody holds it."""
        holder = self.holder()
        # Pod names have no "_": what comes before it is the pod's name.
        return holder.split("_", 1)[0] if holder else None

    def log_paths(self) -> list[Path]:
        """The operator containers' logs in the process kubelet's pod folders."""
        folder = Path(self.cluster.run_dir) / "process-kubelet" / "pods"
        return sorted(folder.glob(f"{self.namespace}_{self.release}-*/operator.log"))

    def log_of(self, pod: str) -> str:
        """Pod `pod`'s operator log: every run of its container, one after the other."""
        folder = Path(self.cluster.run_dir) / "process-kubelet" / "pods"
        (path,) = folder.glob(f"{self.namespace}_{pod}_*/operator.log")  # <ns>_<pod>_<uid>
        return path.read_text(errors="replace")

    def log_text(self) -> str:
        """Every operator pod's log, one after the other (the leader's holds the reconciles)."""
        return "\n".join(path.read_text(errors="replace") for path in self.log_paths())

    def log_tail(self, chars: int = 4000) -> str:
        """The last `chars` of every operator pod's log, each under its pod folder's name."""
        return "\n".join(
            f"--- {path.parent.name}/{path.name}\n{path.read_text(errors='replace')[-chars:]}"
            for path in self.log_paths()
        )
