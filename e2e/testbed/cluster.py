"""The local cluster: start, check and stop every component of the test bed.

Layout of the run folder (``.run/cluster/`` under the repository root unless
``SPECDEPLOY_CLUSTER_DIR`` names another):

- ``env.json``: what clients need (see :class:`ClusterEnv`), written as components come up;
- ``kubeconfig``: the admin kubeconfig (``O=system:masters`` client certificate);
- ``<component>.log`` / ``<component>.pid``: one pair per process;
- ``pki/``, ``etcd-data/``, ``kueue/``, ``kwok/``, ``prometheus/``, ``prometheus-sd/`` (the
  Prometheus file service discovery folder) and ``process-kubelet/``.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import fcntl
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from testbed import conditions, ports, processes
from testbed.images import ImageEntry, image_entry_from_dockerfile, write_image_map
from testbed.kubectl import Kubectl, KubectlError
from testbed.pki import CertPair, ClusterPki, create_cluster_pki, write_kubeconfig

REPO_ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = REPO_ROOT / "e2e" / "manifests"
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-testbed-tools.sh"
LWS_BUILD_SCRIPT = REPO_ROOT / "hack" / "build-lws.sh"
PROCESS_KUBELET = REPO_ROOT / "e2e" / "testbed" / "process_kubelet.py"
OPERATOR_DOCKERFILE = "images/operator/Dockerfile"

LOCAL_PROCESS_ANNOTATION = "specdeploy.dev/local-process"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
QUEUE_NAMES = ("interactive", "batch")
SYSTEM_NAMESPACES = ("kube-system", "kueue-system", "lws-system")
KUEUE_INTEGRATIONS = (
    "batch/job",
    "pod",
    "deployment",
    "statefulset",
    "leaderworkerset.x-k8s.io/leaderworkerset",
)
# Webhooks of Kueue's that are registered: its own API plus the integrations above.
_WEBHOOK_API_GROUPS = {"kueue.x-k8s.io", "", "apps", "batch", "leaderworkerset.x-k8s.io"}
# LeaderWorkerSet's webhooks for pods: only for the pods of an LWS (its kustomize patch).
_LWS_POD_SELECTOR = {
    "matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]
}
# The order `down` stops things in: clients of the API server first, etcd last.
STOP_ORDER = (
    "process-kubelet",
    "prometheus",
    "kueue",
    "lws",
    "kwok",
    "kube-scheduler",
    "kube-controller-manager",
    "kube-apiserver",
    "etcd",
)
KUEUE_METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")


def run_dir() -> Path:
    """The run folder of the local cluster."""
    return Path(os.environ.get("SPECDEPLOY_CLUSTER_DIR", REPO_ROOT / ".run" / "cluster")).resolve()


@dataclass
class ClusterEnv:
    """The contents of ``env.json``: how to reach a running test-bed cluster."""

    kubeconfig: str
    api_server: str
    prometheus_url: str
    prometheus_sd_dir: str
    bin_dir: str
    manifests_dir: str
    run_dir: str
    versions: dict[str, str]
    components: dict[str, dict[str, Any]] = field(default_factory=dict)
    # True once every component is up and the cluster objects are in place.
    complete: bool = False

    def write(self, folder: Path) -> None:
        """Write env.json atomically."""
        tmp = folder / "env.json.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(folder / "env.json")

    @classmethod
    def read(cls, folder: Path) -> ClusterEnv | None:
        """The env.json in ``folder``, or None when there is none."""
        try:
            data = json.loads((folder / "env.json").read_text())
        except (OSError, ValueError):
            return None
        data.setdefault("complete", True)  # env.json from before the flag existed
        return cls(**data)

    def kubectl(self) -> Kubectl:
        """kubectl for this cluster."""
        return Kubectl(Path(self.bin_dir) / "kubectl", Path(self.kubeconfig))


# --- tools -----------------------------------------------------------------------------------


def tools_dir(build: bool = True) -> Path:
    """The folder with the pinned binaries; builds them first (a no-op when cached) if asked."""
    return _built_folder(BUILD_SCRIPT, "the test-bed tools are", build)


def lws_dir(build: bool = True) -> Path:
    """The folder with the pinned LeaderWorkerSet controller and its YAML (hack/build-lws.sh);
    builds it first (a no-op when cached) if asked."""
    return _built_folder(LWS_BUILD_SCRIPT, "LeaderWorkerSet is", build)


def _built_folder(script: Path, what: str, build: bool) -> Path:
    cmd = ["bash", str(script)]
    if not build:
        cmd.append("--print-dir")
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    folder = Path(out.strip().splitlines()[-1])
    if not (folder / ".complete").exists():
        raise RuntimeError(
            f"{what} not built in {folder}: run `make tools` (bash {script.relative_to(REPO_ROOT)})"
        )
    return folder


def prometheus_binary() -> Path:
    """The Debian package's Prometheus binary."""
    found = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(found).exists():
        raise RuntimeError("prometheus is not installed: run `make system-deps`")
    return Path(found)


# --- probes ------------------------------------------------------------------------------------


def _http_get(
    url: str,
    ca: Path | None = None,
    client: CertPair | None = None,
    verify: bool = True,
    timeout: float = 2.0,
) -> tuple[int, bytes]:
    context: ssl.SSLContext | None = None
    if url.startswith("https://"):
        if verify:
            context = ssl.create_default_context(cafile=str(ca) if ca else None)
        else:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if client is not None:
            context.load_cert_chain(str(client.cert), str(client.key))
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as err:
        return int(err.code), err.read()


def _ok(url: str, **kwargs: Any) -> Callable[[], bool]:
    return lambda: _http_get(url, **kwargs)[0] == 200


# --- the cluster -----------------------------------------------------------------------------

# Every request made with a ServiceAccount's credentials, at Metadata level (who, verb,
# resource, response code), into `audit.log` of the run folder: the chart's e2e test compares
# what the operator really calls under its ServiceAccount with the RBAC the chart grants. The
# components all use the admin kubeconfig, so the log holds little else.
AUDIT_POLICY_FILE = "audit-policy.yaml"
AUDIT_LOG_FILE = "audit.log"
AUDIT_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}


def audit_log(env: ClusterEnv) -> Path:
    """The API server's audit log of ServiceAccount requests (JSON lines)."""
    return Path(env.run_dir) / AUDIT_LOG_FILE


@dataclass
class _Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    scheduler: int
    kwok: int
    kueue_webhook: int
    kueue_metrics: int
    kueue_health: int
    prometheus: int
    lws_webhook: int
    lws_health: int

    @classmethod
    def pick(cls) -> _Ports:
        return cls(*ports.free_ports(11))


class Cluster:
    """Brings the local cluster up in ``folder`` and records what it started."""

    def __init__(
        self,
        folder: Path,
        bin_dir: Path,
        log: Callable[[str], None],
        die_with_parent: bool = False,
        lws: Path | None = None,
    ) -> None:
        self.folder = folder
        self.lws = lws or lws_dir(build=False)
        self.die_with_parent = die_with_parent
        self.bin = bin_dir
        self.say = log
        self.ports = _Ports.pick()
        self.pki: ClusterPki
        self.kubeconfig = folder / "kubeconfig"
        self.manifests = bin_dir / "manifests"
        versions = json.loads((bin_dir / "versions.json").read_text())
        versions["lws"] = (self.lws / "version").read_text().strip()
        self.env = ClusterEnv(
            kubeconfig=str(self.kubeconfig),
            api_server=f"https://127.0.0.1:{self.ports.apiserver}",
            prometheus_url=f"http://127.0.0.1:{self.ports.prometheus}",
            prometheus_sd_dir=str(folder / "prometheus-sd"),
            bin_dir=str(bin_dir),
            manifests_dir=str(self.manifests),
            run_dir=str(folder),
            versions={str(k): str(v) for k, v in versions.items()},
        )
        self.kubectl = Kubectl(bin_dir / "kubectl", self.kubeconfig)

    # Each step starts one component and returns once it answers.

    def _start(
        self,
        name: str,
        argv: list[str],
        ready: Callable[[], bool],
        *,
        timeout: float = 120.0,
        port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> processes.Running:
        began = time.monotonic()
        # An orphaned API server waits for etcd forever on SIGTERM: kill outright, except the
        # process kubelet, which needs SIGTERM to stop the processes it runs.
        death = signal.SIGTERM if name == "process-kubelet" else signal.SIGKILL
        running = processes.start(
            name,
            argv,
            self.folder,
            env=env,
            parent_death_signal=death if self.die_with_parent else None,
        )
        self.env.components[name] = {
            "pid": running.pid,
            "exe": running.exe,
            "log": str(running.log),
            "port": port,
        }
        self.env.write(self.folder)
        processes.wait_until_ready(running, ready, timeout)
        self.say(f"  {name:<24} up in {time.monotonic() - began:5.1f}s (pid {running.pid})")
        return running

    def up(self) -> ClusterEnv:
        """Start every component; on failure the caller stops what was started."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.pki = create_cluster_pki(self.folder / "pki")
        write_kubeconfig(
            self.kubeconfig, self.env.api_server, self.pki.ca.cert, self.pki.admin, "admin"
        )
        (self.folder / "prometheus-sd").mkdir(exist_ok=True)
        self.env.write(self.folder)
        self._etcd()
        self._apiserver()
        self._controller_manager()
        self._scheduler()
        self._install_crds()
        self._kwok()
        self._lws()
        self._kueue()
        self._prometheus()
        self._process_kubelet()
        self.env.complete = True
        self.env.write(self.folder)
        return self.env

    def _etcd(self) -> None:
        p = self.ports
        peer = f"http://127.0.0.1:{p.etcd_peer}"
        client = f"http://127.0.0.1:{p.etcd_client}"
        argv = [
            str(self.bin / "etcd"),
            "--name=testbed",
            f"--data-dir={self.folder / 'etcd-data'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=testbed={peer}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]

        def healthy() -> bool:
            status, body = _http_get(f"{client}/health")
            return status == 200 and json.loads(body).get("health") == "true"

        self._start("etcd", argv, healthy, port=p.etcd_client)

    def _apiserver(self) -> None:
        p, pki = self.ports, self.pki
        (self.folder / AUDIT_POLICY_FILE).write_text(yaml.safe_dump(AUDIT_POLICY))
        argv = [
            str(self.bin / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{p.etcd_client}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={p.apiserver}",
            f"--cert-dir={self.folder / 'pki' / 'apiserver-generated'}",
            f"--tls-cert-file={pki.apiserver.cert}",
            f"--tls-private-key-file={pki.apiserver.key}",
            f"--client-ca-file={pki.ca.cert}",
            # Only so that the extension-apiserver-authentication ConfigMap is complete (the
            # scheduler logs errors otherwise); no certificate with this name is ever issued.
            f"--requestheader-client-ca-file={pki.ca.cert}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--authorization-mode=Node,RBAC",
            # As OpenShift does: an owner reference that blocks its owner's deletion needs
            # update on the owner's finalizers (the chart grants it on SDs).
            "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
            "--endpoint-reconciler-type=none",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            "--allow-privileged=true",
            "--profiling=false",
            f"--audit-policy-file={self.folder / AUDIT_POLICY_FILE}",
            f"--audit-log-path={self.folder / AUDIT_LOG_FILE}",
            "--audit-log-format=json",
            "--audit-log-maxsize=200",
            "--audit-log-maxbackup=1",
            "--v=1",
        ]
        ready = _ok(f"{self.env.api_server}/readyz", ca=pki.ca.cert, client=pki.admin)
        self._start("kube-apiserver", argv, ready, timeout=180, port=p.apiserver)

    def _controller_manager(self) -> None:
        argv = [
            str(self.bin / "kube-controller-manager"),
            f"--kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            f"--root-ca-file={self.pki.ca.cert}",
            f"--service-account-private-key-file={self.pki.sa_key}",
            "--secure-port=0",
            "--v=1",
        ]

        # The service-account controller creating `default` shows the controllers are running
        # (pods cannot be created in a namespace before it exists).
        def ready() -> bool:
            return self.kubectl.run("get", "serviceaccount", "default", check=False).returncode == 0

        self._start("kube-controller-manager", argv, ready, timeout=120)

    def _scheduler(self) -> None:
        port = self.ports.scheduler
        argv = [
            str(self.bin / "kube-scheduler"),
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.folder / 'pki' / 'scheduler-generated'}",
            "--v=1",
        ]
        ready = _ok(f"https://127.0.0.1:{port}/healthz", verify=False)
        self._start("kube-scheduler", argv, ready, port=port)

    def _install_crds(self) -> None:
        """Kueue's CRDs (conversion webhooks by URL) and Argo CD's, server-side applied."""
        began = time.monotonic()
        crds: list[dict[str, Any]] = []
        for path in sorted((self.manifests / "kueue" / "crd" / "bases").glob("*.yaml")):
            crds.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
        converted = self._kueue_conversion_crds()
        url = f"https://127.0.0.1:{self.ports.kueue_webhook}/convert"
        for crd in crds:
            if crd["metadata"]["name"] in converted:
                crd["spec"]["conversion"] = {
                    "strategy": "Webhook",
                    "webhook": {
                        "clientConfig": {"url": url, "caBundle": self._ca_bundle()},
                        "conversionReviewVersions": ["v1"],
                    },
                }
        crds.extend(argocd_crds(self.manifests))
        crds.extend(lws_crds(self.lws))
        self.kubectl.apply(crds)
        self.kubectl.apply(
            [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
                for name in ("kueue-system", "lws-system")
            ]
        )
        wait_for_condition(self.kubectl, "customresourcedefinitions", "Established")
        self.say(f"  {'CRDs (Kueue, LWS, Argo)':<24} in {time.monotonic() - began:5.1f}s")

    def _kueue_conversion_crds(self) -> set[str]:
        """CRD names Kueue's own kustomization gives a conversion webhook."""
        crd_dir = self.manifests / "kueue" / "crd"
        kustomization = yaml.safe_load((crd_dir / "kustomization.yaml").read_text())
        names = set()
        for patch in kustomization.get("patches") or []:
            doc = yaml.safe_load((crd_dir / patch["path"]).read_text())
            if doc.get("spec", {}).get("conversion", {}).get("strategy") == "Webhook":
                names.add(doc["metadata"]["name"])
        return names

    def _ca_bundle(self) -> str:
        return base64.b64encode(self.pki.ca.cert.read_bytes()).decode()

    def _kwok(self) -> None:
        folder = self.folder / "kwok"
        folder.mkdir(exist_ok=True)
        stages = kwok_stages(self.manifests / "kwok" / "stage")
        stage_file = folder / "stages.yaml"
        stage_file.write_text(yaml.safe_dump_all(stages, sort_keys=False))
        port = self.ports.kwok
        argv = [
            str(self.bin / "kwok"),
            f"--kubeconfig={self.kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
            f"--server-address=127.0.0.1:{port}",
            "--node-lease-duration-seconds=40",
            f"--config={stage_file}",
        ]
        self._start(
            "kwok",
            argv,
            _ok(f"http://127.0.0.1:{port}/healthz"),
            port=port,
            env={"HOME": str(folder)},
        )
        began = time.monotonic()
        self.kubectl.run("apply", "-f", str(MANIFESTS / "nodes.yaml"))
        wait_for_condition(self.kubectl, "nodes", "Ready")
        self.say(f"  {'KWOK GPU nodes':<24} Ready in {time.monotonic() - began:5.1f}s")

    def _lws(self) -> None:
        """The LeaderWorkerSet controller out of cluster, as Kueue: its webhooks by URL."""
        folder = self.folder / "lws"
        certs = folder / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.pki.webhook.cert, certs / "tls.crt")
        shutil.copy(self.pki.webhook.key, certs / "tls.key")
        p = self.ports
        config = {
            "apiVersion": "config.lws.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{p.lws_health}"},
            # "0" turns controller-runtime's metrics server off (nothing scrapes it here).
            "metrics": {"bindAddress": "0"},
            "webhook": {"host": "127.0.0.1", "port": p.lws_webhook, "certDir": str(certs)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "clientConnection": {"qps": 100, "burst": 200},
        }
        self._start_controller("lws", self.lws / "lws", config, p.lws_health, p.lws_webhook)
        # Webhooks fail closed, so they are registered only once the controller answers.
        self.kubectl.apply(self._lws_webhooks())

    def _start_controller(
        self, name: str, binary: Path, config: dict[str, Any], health: int, webhook: int
    ) -> None:
        """A controller-runtime controller out of cluster: its config file in its folder, the
        admin kubeconfig, ready once its health port answers `/readyz`."""
        config_file = self.folder / name / "config.yaml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        argv = [
            str(binary),
            f"--config={config_file}",
            f"--kubeconfig={self.kubeconfig}",
            "--zap-log-level=info",
        ]
        self._start(
            name,
            argv,
            _ok(f"http://127.0.0.1:{health}/readyz"),
            timeout=120,
            port=webhook,
            env={"KUBECONFIG": str(self.kubeconfig)},
        )

    def _lws_webhooks(self) -> list[dict[str, Any]]:
        """LeaderWorkerSet's webhook configurations by URL with our CA, its pod webhooks only
        for LWS pods (as its kustomization patches them)."""
        docs = yaml.safe_load_all((self.lws / "manifests" / "webhook.yaml").read_text())
        base = f"https://127.0.0.1:{self.ports.lws_webhook}"
        out = []
        for original in docs:
            if not original:
                continue
            doc = copy.deepcopy(original)
            doc["metadata"]["name"] = "lws-" + doc["metadata"]["name"]
            for hook in doc.get("webhooks", []):
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": base + path, "caBundle": self._ca_bundle()}
                groups = {g for rule in hook.get("rules", []) for g in rule.get("apiGroups", [])}
                if groups == {""}:
                    hook["objectSelector"] = copy.deepcopy(_LWS_POD_SELECTOR)
            out.append(doc)
        return out

    def _kueue(self) -> None:
        folder = self.folder / "kueue"
        certs = folder / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.pki.webhook.cert, certs / "tls.crt")
        shutil.copy(self.pki.webhook.key, certs / "tls.key")
        _ensure_kueue_metrics_certs(self.pki.webhook)
        p = self.ports
        config = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": "kueue-system",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{p.kueue_health}"},
            "metrics": {"bindAddress": f"127.0.0.1:{p.kueue_metrics}"},
            "webhook": {"host": "127.0.0.1", "port": p.kueue_webhook, "certDir": str(certs)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "manageJobsWithoutQueueName": False,
            "managedJobsNamespaceSelector": _not_system_namespaces(),
            "integrations": {"frameworks": list(KUEUE_INTEGRATIONS)},
            # The visibility API server would need its own serving certificates and an
            # APIService; nothing here uses it.
            "featureGates": {"VisibilityOnDemand": False},
            "clientConnection": {"qps": 100, "burst": 200},
        }
        self._start_controller("kueue", self.bin / "kueue", config, p.kueue_health, p.kueue_webhook)
        began = time.monotonic()
        # Webhooks fail closed, so they are registered only once Kueue answers.
        self.kubectl.apply(self._kueue_webhooks())
        self._apply_with_retry((MANIFESTS / "kueue.yaml").read_text())
        self._apply_with_retry(yaml.safe_dump_all(local_queue_objects("default")))
        wait_for_condition(self.kubectl, "clusterqueues.kueue.x-k8s.io", "Active")
        self.say(f"  {'Kueue queues':<24} Active in {time.monotonic() - began:5.1f}s")

    def _apply_with_retry(self, text: str, attempts: int = 20) -> None:
        # Right after registration the API server may not yet reach the webhook.
        for attempt in range(attempts):
            try:
                self.kubectl.apply(text)
                return
            except KubectlError:
                if attempt == attempts - 1:
                    raise
                time.sleep(0.5)

    def _kueue_webhooks(self) -> list[dict[str, Any]]:
        """Kueue's webhook configurations, pointed at 127.0.0.1 with our CA."""
        docs = yaml.safe_load_all((self.manifests / "kueue" / "webhook.yaml").read_text())
        base = f"https://127.0.0.1:{self.ports.kueue_webhook}"
        out = []
        for original in docs:
            if not original:
                continue
            doc = copy.deepcopy(original)
            doc["metadata"]["name"] = "kueue-" + doc["metadata"]["name"]
            hooks = []
            for hook in doc.get("webhooks", []):
                groups = {g for rule in hook.get("rules", []) for g in rule.get("apiGroups", [])}
                if not groups <= _WEBHOOK_API_GROUPS:
                    continue
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": base + path, "caBundle": self._ca_bundle()}
                if "kueue.x-k8s.io" not in groups:
                    hook["namespaceSelector"] = _not_system_namespaces()
                hooks.append(hook)
            doc["webhooks"] = hooks
            out.append(doc)
        return out

    def _prometheus(self) -> None:
        folder = self.folder / "prometheus"
        folder.mkdir(exist_ok=True)
        port = self.ports.prometheus
        config = {
            "global": {
                "scrape_interval": "2s",
                "scrape_timeout": "2s",
                "evaluation_interval": "2s",
            },
            "scrape_configs": [
                {
                    "job_name": "pods",
                    "file_sd_configs": [
                        {
                            "files": [
                                str(self.folder / "prometheus-sd" / "*.json"),
                                str(self.folder / "prometheus-sd" / "*.yaml"),
                            ],
                            "refresh_interval": "2s",
                        }
                    ],
                },
                {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]},
            ],
        }
        config_file = folder / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        argv = [
            str(prometheus_binary()),
            f"--config.file={config_file}",
            f"--storage.tsdb.path={folder / 'data'}",
            "--storage.tsdb.retention.time=1d",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
        ]
        self._start(
            "prometheus", argv, _ok(f"{self.env.prometheus_url}/-/ready"), port=port, timeout=120
        )

    def _process_kubelet(self) -> None:
        if not PROCESS_KUBELET.exists():
            self.say(f"  WARNING: {PROCESS_KUBELET.relative_to(REPO_ROOT)} is missing; not started")
            return
        folder = self.folder / "process-kubelet"
        folder.mkdir(exist_ok=True)
        image_map = folder / "images.json"
        write_image_map(image_map, testbed_images(folder))
        argv = [
            sys.executable,
            "-m",
            "testbed.process_kubelet",
            f"--kubeconfig={self.kubeconfig}",
            f"--run-dir={folder}",
            f"--sd-dir={self.folder / 'prometheus-sd'}",
            f"--image-map={image_map}",
            f"--reach-host-port={self.ports.prometheus}",
        ]
        pythonpath = os.pathsep.join(
            [str(REPO_ROOT / "e2e"), str(REPO_ROOT / "operator"), os.environ.get("PYTHONPATH", "")]
        )
        deadline = time.monotonic() + 3.0
        # It has no port of its own to probe: alive for a few seconds counts as up.
        self._start(
            "process-kubelet",
            argv,
            lambda: time.monotonic() > deadline,
            timeout=30,
            env={
                "PYTHONPATH": pythonpath.rstrip(os.pathsep),
                "PATH": f"{self.bin}:{os.environ.get('PATH', '')}",
            },
        )


def chart_app_version() -> str:
    """The chart's appVersion: the operator image tag its Deployment names by default."""
    chart = yaml.safe_load((REPO_ROOT / "charts" / "specdeploy" / "Chart.yaml").read_text())
    return str(chart["appVersion"])


def testbed_images(folder: Path) -> dict[str, ImageEntry]:
    """The images the process kubelet runs without a command:

    - the operator image the chart names (`specdeploy/operator:<appVersion>`): its Dockerfile's
      ENTRYPOINT and CMD, the entry point being this virtualenv's `specdeploy` (the project's
      own, installed editable);
    - `busybox:1.37`, the chart's `helm test` pod: Debian's busybox, its applets on PATH, but
      for `wget`, which is GNU wget: Debian's busybox 1.35 `wget -T` (the test's timeout)
      dies of SIGSEGV on these machines.

    Both get a network namespace of their own (testbed.pod_network).
    """
    venv_bin = Path(sys.executable).parent
    operator = image_entry_from_dockerfile(
        (REPO_ROOT / OPERATOR_DOCKERFILE).read_text(),
        {"specdeploy": str(venv_bin / "specdeploy")},
        source=OPERATOR_DOCKERFILE,
        own_network=True,
    )
    # The project and its virtualenv are the operator image's files.
    operator = replace(operator, files=tuple(dict.fromkeys((str(REPO_ROOT), sys.prefix))))
    images = {f"specdeploy/operator:{chart_app_version()}": operator}
    busybox = shutil.which("busybox")
    if busybox is not None:
        applets = folder / "images" / "busybox" / "bin"
        applets.mkdir(parents=True, exist_ok=True)
        listed = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True)
        gnu_wget = shutil.which("wget")
        for applet in listed.stdout.split():
            link = applets / applet
            if not link.is_symlink():
                link.symlink_to(gnu_wget if applet == "wget" and gnu_wget else busybox)
        images["busybox:1.37"] = ImageEntry(
            cmd=("sh",),
            env={"PATH": str(applets)},
            source="Debian's busybox",
            own_network=True,
            files=(str(applets),),
        )
    return images


def wait_for_condition(
    kubectl: Kubectl, resource: str, condition: str, timeout: float = 180
) -> None:
    """Wait until every object of a cluster-scoped ``resource`` has ``condition`` True.

    (``kubectl wait --all`` fails outright on an object that has no conditions yet.)
    """
    deadline = time.monotonic() + timeout
    while True:
        items = kubectl.get_json(resource)["items"]
        waiting = [
            item["metadata"]["name"]
            for item in items
            if conditions.condition(item, condition).get("status") != "True"
        ]
        if items and not waiting:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{resource} not {condition} after {timeout:.0f}s: {waiting}")
        time.sleep(0.25)


def _not_system_namespaces() -> dict[str, Any]:
    return {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": list(SYSTEM_NAMESPACES),
            }
        ]
    }


def _ensure_kueue_metrics_certs(pair: CertPair) -> None:
    """Kueue without internal cert management insists on /etc/kueue/metrics/certs/tls.{crt,key}.

    The path is compiled in; any valid pair will do, so an existing one is left alone.
    """
    crt, key = KUEUE_METRICS_CERT_DIR / "tls.crt", KUEUE_METRICS_CERT_DIR / "tls.key"
    if crt.exists() and key.exists():
        return
    try:
        KUEUE_METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)
        shutil.copy(pair.cert, crt)
        shutil.copy(pair.key, key)
    except OSError as err:
        raise RuntimeError(
            f"Kueue needs a certificate pair in {KUEUE_METRICS_CERT_DIR} (a path compiled into it) "
            f"and it cannot be written ({err}). Create it once with: sudo mkdir -p "
            f"{KUEUE_METRICS_CERT_DIR} && sudo chown $USER {KUEUE_METRICS_CERT_DIR}"
        ) from err


# KWOK's pod-ready stage marks every readiness gate True with the containers; a kubelet never
# does (a gate is a controller's to open), so the stage leaves them to their controller.
_KWOK_OPENS_READINESS_GATES = re.compile(
    r"\{\{ range \.spec\.readinessGates \}\}.*?\{\{ end \}\}\n?", re.DOTALL
)


def kwok_stages(stage_dir: Path) -> list[dict[str, Any]]:
    """KWOK's upstream node and pod stages; pod stages skip pods the process kubelet runs, and
    leave a pod's readiness gates to the controller that owns them."""
    files = [
        stage_dir / "node" / "fast" / "node-initialize.yaml",
        stage_dir / "node" / "heartbeat-with-lease" / "node-heartbeat-with-lease.yaml",
        stage_dir / "pod" / "fast" / "pod-ready.yaml",
        stage_dir / "pod" / "fast" / "pod-complete.yaml",
        stage_dir / "pod" / "fast" / "pod-delete.yaml",
    ]
    stages: list[dict[str, Any]] = []
    for path in files:
        for stage in yaml.safe_load_all(path.read_text()):
            if not stage:
                continue
            if stage["spec"]["resourceRef"]["kind"] == "Pod":
                selector = stage["spec"].setdefault("selector", {})
                selector.setdefault("matchExpressions", []).append(
                    {
                        "key": f'.metadata.annotations["{LOCAL_PROCESS_ANNOTATION}"]',
                        "operator": "NotIn",
                        "values": ["true"],
                    }
                )
                template = stage["spec"].get("next", {}).get("statusTemplate")
                if template:
                    template = _KWOK_OPENS_READINESS_GATES.sub("", template)
                    assert "readinessGates" not in template, f"{path}: {template}"
                    stage["spec"]["next"]["statusTemplate"] = template
            stages.append(stage)
    return stages


def lws_crds(lws: Path) -> list[dict[str, Any]]:
    """LeaderWorkerSet's CRDs (and the DisaggregatedSet one its controller also watches), served
    without a conversion webhook: each has a single version. Their schemas embed whole pod
    templates (1.3-1.5 MB of YAML each, most of it descriptions): the descriptions, which only
    `kubectl explain` shows, are left out, so the API server stores and establishes a fifth of
    it; what the schemas validate is the same."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crds: list[dict[str, Any]] = []
    for path in sorted((lws / "manifests" / "crd").glob("*.yaml")):
        crds.extend(
            _without_descriptions(d) for d in yaml.load_all(path.read_text(), Loader=loader) if d
        )
    return crds


def _without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        # A property named "description" is a schema (a mapping), not a description's text.
        return {
            k: _without_descriptions(v)
            for k, v in node.items()
            if not (k == "description" and isinstance(v, str))
        }
    if isinstance(node, list):
        return [_without_descriptions(item) for item in node]
    return node


def argocd_crds(manifests_dir: Path) -> list[dict[str, Any]]:
    """Argo CD's Application, ApplicationSet and AppProject CRDs (from the build cache)."""
    crds: list[dict[str, Any]] = []
    for path in sorted((manifests_dir / "argocd").glob("*.yaml")):
        crds.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return crds


def seed(kubectl: Kubectl, manifests_dir: Path, log: Callable[[str], None] = print) -> None:
    """Put the test bed's objects into another cluster that already runs Kueue and KWOK.

    Argo CD CRDs, the fake GPU nodes, the ResourceFlavors and ClusterQueues, and the LocalQueues
    of `default`. For kind and other clusters; the local test bed does this itself in `up`.
    """
    kubectl.apply(argocd_crds(manifests_dir))
    log("  Argo CD CRDs applied")
    kubectl.run("apply", "-f", str(MANIFESTS / "nodes.yaml"))
    wait_for_condition(kubectl, "nodes", "Ready", timeout=120)
    log("  fake GPU nodes Ready")
    kubectl.apply((MANIFESTS / "kueue.yaml").read_text())
    kubectl.apply(local_queue_objects("default"))
    wait_for_condition(kubectl, "clusterqueues.kueue.x-k8s.io", "Active", timeout=120)
    log("  Kueue ResourceFlavors, ClusterQueues and LocalQueues in default are in place")


def local_queue_objects(namespace: str) -> list[dict[str, Any]]:
    """The LocalQueues `interactive` and `batch` of ``namespace``, each on its ClusterQueue."""
    return [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": name},
        }
        for name in QUEUE_NAMES
    ]


#: Pod Security "restricted", enforced on every namespace the e2e tests create: the operator's
#: and the engine's pods must pass it (docs/testbed.md).
POD_SECURITY_LABELS = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
#: What a test's own pods carry to pass "restricted".
RESTRICTED_POD_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "seccompProfile": {"type": "RuntimeDefault"},
}
RESTRICTED_CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


def create_namespace_with_queues(kubectl: Kubectl, namespace: str) -> None:
    """Create ``namespace`` (Pod Security "restricted" enforced) with both LocalQueues; returns
    once pods can be created in it.

    The default ServiceAccount, which admission requires of every pod, is applied with the
    namespace rather than awaited from the controller-manager: on two busy cores its
    ServiceAccount controller once took over a minute behind a queue of namespace deletions."""
    kubectl.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": namespace, "labels": dict(POD_SECURITY_LABELS)},
            },
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "default", "namespace": namespace},
            },
            *local_queue_objects(namespace),
        ]
    )


@contextlib.contextmanager
def queued_namespace(kubectl: Kubectl, namespace: str) -> Iterator[str]:
    """`namespace` made by create_namespace_with_queues for the block, deleted after it (not
    waited for)."""
    create_namespace_with_queues(kubectl, namespace)
    try:
        yield namespace
    finally:
        kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)


# --- the commands ----------------------------------------------------------------------------


def health(env: ClusterEnv) -> list[str]:
    """What is wrong with a recorded cluster: dead components, API server not ready."""
    problems = [] if env.complete else ["its start did not finish"]
    if env.run_dir and not (Path(env.run_dir) / AUDIT_POLICY_FILE).exists():
        problems.append("it was started without the audit log (by an older test bed)")
    for name, info in env.components.items():
        if not processes.is_alive(int(info["pid"]), str(info["exe"])):
            problems.append(f"{name} (pid {info['pid']}) is not running; log: {info['log']}")
    ca = Path(env.run_dir) / "pki" / "ca.crt"
    admin = CertPair(
        Path(env.run_dir) / "pki" / "admin.crt", Path(env.run_dir) / "pki" / "admin.key"
    )
    try:
        status, body = _http_get(f"{env.api_server}/readyz", ca=ca, client=admin)
        if status != 200:
            problems.append(f"kube-apiserver /readyz answered {status}: {body[:200]!r}")
    except OSError as err:
        problems.append(f"kube-apiserver {env.api_server} unreachable: {err}")
    return problems


@contextlib.contextmanager
def _exclusive(folder: Path) -> Iterator[None]:
    """One `up` or `down` at a time per run folder (a second `up` waits, then reuses)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with (folder.parent / f".{folder.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def up(
    log: Callable[[str], None] = print,
    folder: Path | None = None,
    die_with_parent: bool = False,
) -> tuple[ClusterEnv, bool]:
    """Start the cluster, or reuse a healthy running one. Returns (env, whether it started it).

    ``die_with_parent``: components started now stop when the calling process dies.
    """
    folder = folder or run_dir()
    with _exclusive(folder):
        return _up(log, folder, die_with_parent)


def _up(log: Callable[[str], None], folder: Path, die_with_parent: bool) -> tuple[ClusterEnv, bool]:
    existing = ClusterEnv.read(folder)
    if existing is not None:
        if not health(existing):
            log(f"reusing the running cluster in {folder}")
            return existing, False
        log("a previous cluster is recorded but not healthy; stopping what is left of it")
        _down(log, folder)
    began = time.monotonic()
    bin_dir = tools_dir(build=True)
    lws = lws_dir(build=True)
    prometheus_binary()
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    log(f"starting the local cluster in {folder}")
    cluster = Cluster(folder, bin_dir, log, die_with_parent=die_with_parent, lws=lws)
    try:
        env = cluster.up()
    except BaseException:
        log("start failed; stopping what was started (logs are kept)")
        _down(log, folder)
        raise
    log(f"cluster up in {time.monotonic() - began:.1f}s")
    return env, True


def down(log: Callable[[str], None] = print, folder: Path | None = None) -> None:
    """Stop exactly the processes recorded in the run folder's pid files."""
    folder = folder or run_dir()
    with _exclusive(folder):
        _down(log, folder)


def _down(log: Callable[[str], None], folder: Path) -> None:
    env = ClusterEnv.read(folder)
    recorded = env.components if env else {}
    pid_files = {p.stem: p for p in folder.glob("*.pid")} if folder.exists() else {}
    names = [n for n in STOP_ORDER if n in pid_files or n in recorded]
    names += sorted((set(pid_files) | set(recorded)) - set(names))
    for name in names:
        info = recorded.get(name, {})
        try:
            pid = int(info.get("pid") or pid_files[name].read_text().strip())
        except (KeyError, ValueError, OSError):
            continue
        exe = info.get("exe")
        if processes.stop(pid, exe, timeout=20 if name == "process-kubelet" else 15):
            log(f"  stopped {name} (pid {pid})")
        pid_files.get(name, folder / f"{name}.pid").unlink(missing_ok=True)
    (folder / "env.json").unlink(missing_ok=True)
