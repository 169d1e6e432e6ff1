"""What the operator benchmarks share: the test bed, the operator as a child process, timing by
watch, the API server's audit log and the operator's own metrics.

Needs `operator/` and `e2e/` on PYTHONPATH (the Makefile sets it).
"""

from __future__ import annotations

import copy
import json
import re
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, watch
from prometheus_client.parser import text_string_to_metric_families

from bench.record import REPO
from chart_harness import service_account_kubeconfig
from engine_cluster import OperatorProcess, apply_crds
from specdeploy.api import labels
from testbed import ClusterEnv, Kubectl, audit_log, create_namespace_with_queues, up
from testbed.conditions import is_ready
from testbed.kubectl import api_client
from testbed.ports import free_port

GROUP, VERSION, PLURAL = "specdeploy.dev", "v1alpha1", "speculativedeployments"
NODES = REPO / "e2e" / "manifests" / "nodes.yaml"
MIG_TEMPLATE = "kwok-h100-mig-0"
MIG_SLICE = "nvidia.com/mig-3g.40gb"
SLICES_PER_NODE = 16
BENCH_NODE_LABEL = "specdeploy.dev/bench-node"


def median(values: Iterable[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of nothing")
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def log(message: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {message}", file=sys.stderr, flush=True)


# --- the cluster -----------------------------------------------------------------------------


class Bed:
    """The running test bed (started when none runs) and clients for it."""

    def __init__(self) -> None:
        self.env: ClusterEnv = up()[0]
        self.kubectl: Kubectl = self.env.kubectl()
        self.api = api_client(Path(self.env.kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        apply_crds(self.kubectl)

    def namespace(self, name: str) -> str:
        """A fresh namespace with the test bed's LocalQueues."""
        self.kubectl.run("delete", "namespace", name, "--wait=true", check=False, timeout=300)
        create_namespace_with_queues(self.kubectl, name)
        return name

    def operator(
        self,
        workdir: Path,
        namespaces: tuple[str, ...],
        config: Mapping[str, Any],
        kubeconfig: str | None = None,
    ) -> tuple[OperatorProcess, str]:
        """An operator child process serving its metrics on a free port; (process, metrics URL)."""
        port = free_port()
        full = {
            "prometheusUrl": self.env.prometheus_url,
            "metricsEndpoint": f"http://127.0.0.1:{port}/metrics",
            **config,
        }
        running = OperatorProcess(kubeconfig or self.env.kubeconfig, full, workdir, namespaces)
        return running, f"http://127.0.0.1:{port}/metrics"

    def ensure_mig_slices(self, slices: int) -> int:
        """Adds KWOK nodes (copies of the MIG node, 16 3g.40gb slices each) until the bench
        nodes together offer `slices`; returns how many bench nodes there are."""
        [template] = [
            d
            for d in yaml.safe_load_all(NODES.read_text())
            if d and d["metadata"]["name"] == MIG_TEMPLATE
        ]
        wanted = -(-slices // SLICES_PER_NODE)
        nodes = []
        for index in range(wanted):
            node = copy.deepcopy(template)
            name = f"bench-mig-{index}"
            node["metadata"]["name"] = name
            node["metadata"]["labels"]["kubernetes.io/hostname"] = name
            node["metadata"]["labels"][BENCH_NODE_LABEL] = "true"
            node["metadata"]["labels"]["nvidia.com/mig-3g.40gb.count"] = str(SLICES_PER_NODE)
            for part in ("capacity", "allocatable"):
                node["status"][part][MIG_SLICE] = str(SLICES_PER_NODE)
            nodes.append(node)
        if nodes:
            self.kubectl.apply(nodes)
        return wanted

    def remove_bench_nodes(self) -> None:
        """Deletes the nodes `ensure_mig_slices` added (the e2e suite expects the bed's own)."""
        self.kubectl.run("delete", "nodes", "-l", BENCH_NODE_LABEL, "--wait=false", check=False)

    def list_sds(self, namespace: str) -> list[dict[str, Any]]:
        found: Any = self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        items: list[dict[str, Any]] = found["items"]
        return items

    def get_sd(self, namespace: str, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.custom.get_namespaced_custom_object(  # type: ignore[assignment]
            GROUP, VERSION, namespace, PLURAL, name
        )
        return found

    def create_deployment(self, body: Mapping[str, Any]) -> None:
        """Creates a Deployment from a plain manifest (the client sends a dict as it is)."""
        manifest: Any = dict(body)
        self.apps.create_namespaced_deployment(body["metadata"]["namespace"], manifest)

    def delete_sds(self, namespace: str, timeout: float = 300) -> None:
        """Deletes every SD of the namespace (an operator must be running to release them)."""
        self.kubectl.run(
            "delete", "sd", "--all", "-n", namespace, f"--timeout={int(timeout)}s",
            check=False, timeout=timeout + 30,
        )  # fmt: skip

    def drop_namespace(self, namespace: str) -> None:
        """Deletes the namespace, taking finalizers off SDs no operator released."""
        for sd in self.list_sds(namespace):
            if sd["metadata"].get("finalizers"):
                self.custom.patch_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, sd["metadata"]["name"],
                    {"metadata": {"finalizers": None}},
                )  # fmt: skip
        self.kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)

    def service_account_kubeconfig(
        self, path: Path, name: str = "specdeploy-bench"
    ) -> tuple[Path, str]:
        """A kubeconfig with a cluster-admin ServiceAccount's token, so that the API server's
        audit log (which records ServiceAccount requests) counts every request of the operator;
        returns (path, username)."""
        namespace = "specdeploy-bench-system"
        self.kubectl.apply(
            [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {"name": name, "namespace": namespace},
                },
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": name},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": "cluster-admin",
                    },
                    "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
                },
            ]
        )
        token = self.kubectl.run(
            "create", "token", name, "-n", namespace, "--duration=6h"
        ).stdout.strip()
        ca = Path(self.env.run_dir) / "pki" / "ca.crt"
        service_account_kubeconfig(path, self.env.api_server, ca, token)
        return path, f"system:serviceaccount:{namespace}:{name}"


def raw_copy(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    """The operator's Deployment as a plain one: same pod template, labels the operator does not
    own or watch (no managed-by label, its own name label)."""

    def relabel(found: dict[str, str]) -> dict[str, str]:
        return {
            k: (name if k == labels.NAME else v) for k, v in found.items() if k != labels.MANAGED_BY
        }

    spec = copy.deepcopy(deployment["spec"])
    spec["selector"]["matchLabels"] = relabel(spec["selector"]["matchLabels"])
    spec["template"]["metadata"]["labels"] = relabel(spec["template"]["metadata"]["labels"])
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": deployment["metadata"]["namespace"]},
        "spec": spec,
    }


# --- timing by watch -------------------------------------------------------------------------


def time_until(
    list_call: Callable[..., Any],
    predicate: Callable[[Any], bool],
    start: Callable[[], object],
    timeout: float,
    **list_args: Any,
) -> float:
    """Seconds from `start()` to the first watch event whose object satisfies `predicate`.

    The watch resumes from a list taken before `start`, so no event is missed; the time is taken
    when the event arrives here, as a client waiting on `kubectl wait` would see it. Every
    event's object is its JSON as parsed (a dict), whatever the kind: the client's typed models
    would cost a built-in kind's watch far more CPU per event than a custom resource's, on
    the same CPUs as what is timed, and delay the last event by its own decoding. The watch is
    told so by its return type (`object`), not by `deserialize=False`, with which the client
    meets an ERROR event (a resourceVersion too old, 410) with a KeyError of its own; here it
    raises the client's ApiException with the server's code and message, and nothing is timed."""
    listed = list_call(**list_args)
    version = (
        listed["metadata"]["resourceVersion"]
        if isinstance(listed, dict)
        else listed.metadata.resource_version
    )
    began = time.monotonic()
    start()
    stream = watch.Watch(return_type="object")  # type: ignore[no-untyped-call]
    deadline = began + timeout
    while time.monotonic() < deadline:
        remaining = max(1, int(deadline - time.monotonic()))
        for event in stream.stream(  # type: ignore[no-untyped-call]
            list_call,
            resource_version=version,
            timeout_seconds=remaining,
            **list_args,
        ):
            obj = event["object"]
            version = obj["metadata"]["resourceVersion"]
            if predicate(obj):
                stream.stop()  # type: ignore[no-untyped-call]
                return time.monotonic() - began
    raise TimeoutError(f"nothing satisfied the predicate within {timeout:.0f}s")


def deployment_ready(obj: Mapping[str, Any]) -> bool:
    """A Deployment's JSON: its controller has seen its spec and counts every replica updated
    and ready (as `kubectl rollout status` waits for)."""
    status = obj.get("status") or {}
    wanted = (obj.get("spec") or {}).get("replicas") or 0
    generation = (obj.get("metadata") or {}).get("generation") or 0
    return bool(
        (status.get("observedGeneration") or 0) >= generation
        and (status.get("readyReplicas") or 0) >= wanted
        and (status.get("updatedReplicas") or 0) >= wanted
    )


def time_sd_ready(bed: Bed, body: Mapping[str, Any], timeout: float) -> float:
    """Seconds from creating the SD `body` to its Ready condition."""
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    return time_until(
        bed.custom.list_namespaced_custom_object,
        lambda obj: obj["metadata"]["name"] == name and is_ready(obj),
        lambda: bed.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, dict(body)
        ),
        timeout,
        group=GROUP,
        version=VERSION,
        namespace=namespace,
        plural=PLURAL,
    )


def time_deployment_ready(bed: Bed, body: Mapping[str, Any], timeout: float) -> float:
    """Seconds from creating the Deployment `body` to all its replicas ready."""
    name = body["metadata"]["name"]
    return time_until(
        bed.apps.list_namespaced_deployment,
        lambda obj: obj["metadata"]["name"] == name and deployment_ready(obj),
        lambda: bed.create_deployment(body),
        timeout,
        namespace=body["metadata"]["namespace"],
    )


# --- the operator process --------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    """Resident set size of a process in MiB (from /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        text: str = response.read().decode()
        return text


BUCKET = re.compile(r'^specdeploy_reconcile_duration_seconds_bucket\{le="([^"]+)"\} (\S+)$', re.M)


def counter_total(metrics_text: str, name: str) -> float | None:
    """The value of the sample `name` (a counter's `..._total`) in a metrics page; None when
    the page has none."""
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return None


def reconcile_buckets(metrics_text: str) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of the reconcile duration histogram."""
    return [(float(le), float(count)) for le, count in BUCKET.findall(metrics_text)]


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """As Prometheus' histogram_quantile: linear within the bucket holding the q-th rank."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            share = (rank - lower_count) / (count - lower_count) if count > lower_count else 0
            return lower_bound + (bound - lower_bound) * share
        lower_bound, lower_count = bound, count
    return lower_bound


def bucket_delta(
    after: list[tuple[float, float]], before: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    earlier = dict(before)
    return [(bound, count - earlier.get(bound, 0.0)) for bound, count in after]


RECONCILED = re.compile(r"reconciled (\S+)/(\S+) ")


def reconciled_names(log_text: str) -> set[str]:
    return {name for _, name in RECONCILED.findall(log_text)}


# --- the audit log ---------------------------------------------------------------------------

READ_VERBS = frozenset({"get", "list", "watch"})


def audited(env: ClusterEnv, username: str, since: datetime, until: datetime) -> dict[str, Any]:
    """Requests `username` sent between two moments (by the API server's receipt time), reads
    and writes apart, with a count by verb and resource."""
    path = audit_log(env)
    files = [*sorted(path.parent.glob(path.stem + "-*" + path.suffix)), path]
    quoted = json.dumps(username)
    by_kind: dict[str, int] = {}
    reads = writes = 0
    for file in files:
        with file.open(errors="replace") as lines:
            for line in lines:
                if quoted not in line or '"ResponseComplete"' not in line:
                    continue
                event = json.loads(line)
                if event.get("stage") != "ResponseComplete":
                    continue
                received = datetime.fromisoformat(
                    event["requestReceivedTimestamp"].replace("Z", "+00:00")
                )
                if not since <= received < until:
                    continue
                verb = event.get("verb", "")
                ref = event.get("objectRef") or {}
                key = f"{verb} {ref.get('resource', event.get('requestURI', '?').split('?')[0])}"
                by_kind[key] = by_kind.get(key, 0) + 1
                if verb in READ_VERBS:
                    reads += 1
                else:
                    writes += 1
    return {"reads": reads, "writes": writes, "by_request": dict(sorted(by_kind.items()))}


def poll_until(probe: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
    """Polls `probe` every `interval` seconds until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
