"""The operator with the real CPU engine on the test bed: shared by the e2e suite and `make demo`.

A SpeculativeDeployment of the tiny models (absolute local paths, shapes from their own
config.json) is sized onto the smallest MIG slice of a KWOK node; the operator, in local-process
mode, gives its pods the engine venv's python as command, so the test bed's process kubelet runs
the real launcher and vLLM on this machine's CPU. Nothing here starts an engine by itself: the
engines are the pods the operator creates.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes.client import CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from engine_harness import ACCEPTED_TOKENS, DRAFT_TOKENS, FAST_ENGINE_ARGS, OPERATOR_SRC, http_json
from specdeploy import GROUP, VERSION
from specdeploy.api.models import PLURAL
from testbed import ClusterEnv, Kubectl, create_namespace_with_queues, eventually
from testbed.conditions import is_ready
from testbed.kubectl import api_client
from testbed.process_kubelet import read_local_ports

REPO = Path(__file__).resolve().parent.parent
NAME_LABEL = "specdeploy.dev/name"
REVISION_LABEL = "specdeploy.dev/revision"
#: vLLM settings for a small, quick CPU engine, as the SD carries them (engine.extraArgs / env).
EXTRA_ARGS = [a for a in FAST_ENGINE_ARGS if a not in ("--max-model-len", "512")]
ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # vLLM's CPU build binds its OpenMP threads to core 0 by default ('auto' on a 2-core machine):
    # two engines (a canary beside its stable) would then share one core and starve each other.
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    # The engine venv does not install specdeploy: the launcher comes from the source tree.
    "PYTHONPATH": str(OPERATOR_SRC),
}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def model_shape(model_dir: str) -> dict[str, Any]:
    """The CRD's ModelShape of a local model, from its config.json and the size of its weights."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    weights = sum(p.stat().st_size for p in Path(model_dir).glob("*.safetensors"))
    return {
        "parametersBillion": round(weights / DTYPE_BYTES.get(dtype, 4) / 1e9, 6),
        "layers": config["num_hidden_layers"],
        "hiddenSize": config["hidden_size"],
        "attentionHeads": config["num_attention_heads"],
        "kvHeads": config.get("num_key_value_heads", config["num_attention_heads"]),
        "vocabSize": config["vocab_size"],
        "dtype": dtype,
    }


def draft_method(draft: str) -> str:
    """The speculation method of a tiny draft by its factory name."""
    return "eagle3" if draft.startswith("eagle3") else "draft_model"


def tiny_pair(
    models: Mapping[str, str], draft: str | None, version: str, tokens: int = 3
) -> dict[str, Any]:
    """spec.pair for the tiny target with the named tiny draft (None: no speculation)."""
    target = {"model": models["target"], "shape": model_shape(models["target"])}
    if draft is None:
        return {"version": version, "target": target, "draft": {"method": "none"}}
    spec_draft: dict[str, Any] = {
        "method": draft_method(draft),
        "model": models[draft],
        "numSpeculativeTokens": tokens,
    }
    if spec_draft["method"] == "draft_model":
        spec_draft["shape"] = model_shape(models[draft])
    return {"version": version, "target": target, "draft": spec_draft}


def tiny_sd(
    name: str, namespace: str, models: Mapping[str, str], draft: str | None, version: str
) -> dict[str, Any]:
    """A SpeculativeDeployment of the tiny pair: one replica on the smallest MIG slice."""
    return {
        "apiVersion": "specdeploy.dev/v1alpha1",
        "kind": "SpeculativeDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "pair": tiny_pair(models, draft, version),
            "engine": {
                "maxModelLen": 512,
                "maxNumSeqs": 16,
                "extraArgs": EXTRA_ARGS,
                "env": [{"name": k, "value": v} for k, v in ENGINE_ENV.items()],
            },
            "placement": {
                "queue": "interactive",
                "speculation": "Auto",
                "gpu": {"mig": "Auto"},
            },
        },
    }


# How the operator logs each non-GET request it sends (adapters/kube.py).
WRITE_LINE = re.compile(r"api write: (\S+) (\S+)")


def operator_config(engine_python: str, prometheus_url: str, interval: float = 2) -> dict[str, Any]:
    """The operator config for local-process engines: the engine venv runs the launcher."""
    return {
        "localProcess": True,
        "engineCommand": [engine_python, "-m", "specdeploy.engine"],
        "engineImage": "specdeploy/engine-cpu:local",
        "reconcileIntervalSeconds": interval,
        "batchQueues": ["batch"],
        "prometheusUrl": prometheus_url,
    }


def kwok_operator_config(prometheus_url: str) -> dict[str, Any]:
    """The operator config for KWOK-run pods (no engine runs), with a 2 s reconcile timer."""
    return {
        "reconcileIntervalSeconds": 2,
        "batchQueues": ["batch"],
        "engineImage": "specdeploy/engine:e2e",
        "localProcess": False,
        "prometheusUrl": prometheus_url or "http://127.0.0.1:9090",
    }


@dataclass
class OperatorProcess:
    """`specdeploy operator run` as a child process watching some namespaces, logging to a file."""

    kubeconfig: str
    config: Mapping[str, Any]
    workdir: Path
    namespaces: tuple[str, ...]
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def log_path(self) -> Path:
        return self.workdir / "operator.log"

    def start(self) -> None:
        """Starts it (again, after `stop`); each start is marked in the log."""
        self.starts += 1
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / "operator.yaml"
        config_path.write_text(yaml.safe_dump(dict(self.config)))
        env = {
            **os.environ,
            "KUBECONFIG": self.kubeconfig,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join([str(OPERATOR_SRC), os.environ.get("PYTHONPATH", "")]),
        }
        command = [sys.executable, "-m", "specdeploy.cli", "operator", "run"]
        command += ["--config", str(config_path), "--log-reconciles"]
        for namespace in self.namespaces:
            command += ["--namespace", namespace]
        with self.log_path.open("ab") as log:
            log.write(f"\n=== start {self.starts} ===\n".encode())
            log.flush()
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        """SIGKILL: the process dies mid-whatever, as a node failure or OOM kill would end it."""
        if self.process is None:
            return
        self.process.kill()
        self.process.wait()
        self.process = None

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """SIGSTOP for the block, then SIGCONT: the process sees and writes nothing meanwhile,
        as one stalled (a busy node, a long pause) would, then goes on where it was."""
        assert self.process is not None, "the operator is not running"
        self.process.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def log_text(self) -> str:
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def log_tail(self, chars: int = 20000) -> str:
        return self.log_text()[-chars:]

    def writes_since(self, offset: int) -> list[tuple[str, str]]:
        """The (verb, object) of each `api write:` line logged after character `offset`."""
        return WRITE_LINE.findall(self.log_text()[offset:])

    def reconciles_since(self, offset: int, namespace: str, name: str) -> int:
        """How many reconciles of one SD finished after character `offset` of the log."""
        return self.log_text()[offset:].count(f"reconciled {namespace}/{name} ")

    def wait_for_reconciles(self, offset: int, namespace: str, name: str, count: int = 1) -> None:
        """Waits until `count` reconciles of the SD finished after `offset`: the operator is
        alive and has looked at the SD (a dead operator also writes nothing)."""
        eventually(
            lambda: self.reconciles_since(offset, namespace, name) >= count,
            120,
            f"{count} reconciles of {namespace}/{name} in the operator log",
        )


def stop_after_deleting_sds(
    running: OperatorProcess, kubectl: Kubectl, namespace: str, timeout: int = 60
) -> None:
    """Deletes the namespace's SDs while the operator runs (started again if stopped), so their
    engines stop with their pods; then stops it and prints its log."""
    if running.process is None:
        running.start()
    kubectl.run(
        "delete",
        "sd",
        "--all",
        "-n",
        namespace,
        f"--timeout={timeout}s",
        check=False,
        timeout=timeout + 10,
    )
    running.stop()
    print(f"--- operator log ({running.log_path}) ---\n{running.log_tail()}")


@contextlib.contextmanager
def operator_in_namespace(
    kubectl: Kubectl,
    kubeconfig: str,
    namespace: str,
    config: Mapping[str, Any],
    workdir: Path,
) -> Iterator[OperatorProcess]:
    """A fresh namespace (with its LocalQueues) and the operator watching it; on the way out
    its SDs are deleted while the operator runs, so their engines stop, then
    the operator and the namespace go and the operator's log is printed."""
    create_namespace_with_queues(kubectl, namespace)
    apply_crds(kubectl)
    running = OperatorProcess(kubeconfig, config, workdir, (namespace,))
    running.start()
    try:
        yield running
    finally:
        stop_after_deleting_sds(running, kubectl, namespace, timeout=90)
        kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)


@contextlib.contextmanager
def operator_running(
    running: OperatorProcess, kubectl: Kubectl, namespace: str
) -> Iterator[OperatorProcess]:
    """The operator started for a block; then the namespace's SDs deleted while it still runs,
    the operator stopped and its log printed (shown when a test fails)."""
    running.start()
    try:
        yield running
    finally:
        stop_after_deleting_sds(running, kubectl, namespace)


def apply_crds(kubectl: Kubectl) -> None:
    """The SpeculativeDeployment CRD from crds/, once served."""
    for path in sorted((REPO / "crds").glob("*.yaml")):
        kubectl.apply(path.read_text())
    eventually(
        lambda: (
            "speculativedeployments"
            in kubectl.run("api-resources", "--api-group=specdeploy.dev", check=False).stdout
        ),
        60,
        "the SpeculativeDeployment kind in discovery",
    )


# --- reading the SD and its pods -----------------------------------------------------------------


#: The reads below poll (every half second in `eventually`, every second in the load): through
#: the Python client they cost about 3 ms of CPU each, where a `kubectl get` process costs about
#: 100 ms, on the CPUs the engines under test are pinned to.
READ_TIMEOUT_S = 30


def get_sd(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    """The SD as the API server holds it (ApiException when it cannot be read)."""
    found = CustomObjectsApi(api_client(kubectl.kubeconfig)).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, _request_timeout=READ_TIMEOUT_S
    )
    return cast("dict[str, Any]", found)


def sd_status(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    """The SD's status ({} before the SD exists or while it cannot be read)."""
    try:
        sd = get_sd(kubectl, namespace, name)
    except (ApiException, HTTPError, OSError):
        return {}
    found: dict[str, Any] = sd.get("status") or {}
    return found


def revision_pods(
    kubectl: Kubectl, namespace: str, name: str, revision: str | None = None
) -> list[dict[str, Any]]:
    selector = f"{NAME_LABEL}={name}"
    if revision:
        selector += f",{REVISION_LABEL}={revision}"
    # Unparsed: the client's models for every pod cost more CPU than the JSON.
    answer: Any = CoreV1Api(api_client(kubectl.kubeconfig)).list_namespaced_pod(
        namespace,
        label_selector=selector,
        _preload_content=False,
        _request_timeout=READ_TIMEOUT_S,
    )
    items: list[dict[str, Any]] = json.loads(answer.data)["items"]
    return items


def get_pod(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any] | None:
    """The pod as the API server holds it, None when there is none of that name."""
    try:
        answer: Any = CoreV1Api(api_client(kubectl.kubeconfig)).read_namespaced_pod(
            name, namespace, _preload_content=False, _request_timeout=READ_TIMEOUT_S
        )
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    found: dict[str, Any] = json.loads(answer.data)
    return found


def ready_pod(kubectl: Kubectl, namespace: str, name: str, revision: str) -> dict[str, Any] | None:
    for pod in revision_pods(kubectl, namespace, name, revision):
        if is_ready(pod):
            return pod
    return None


def events_of(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    """Events whose involved object is this SpeculativeDeployment."""
    items: list[dict[str, Any]] = kubectl.get_json(
        "events",
        "-n",
        namespace,
        "--field-selector",
        f"involvedObject.name={name},involvedObject.kind=SpeculativeDeployment",
    )["items"]
    return items


def engine_url(cluster: ClusterEnv, pod: Mapping[str, Any]) -> str:
    """The engine's local address: the local port the process kubelet gave its container
    (whether or not Prometheus scrapes it)."""
    run_dir = Path(cluster.run_dir) / "process-kubelet"
    ports = eventually(
        lambda: read_local_ports(run_dir, dict(pod)),
        30,
        f"the local ports of pod {pod['metadata']['name']} in {run_dir}",
    )
    return f"http://127.0.0.1:{ports[pod['spec']['containers'][0]['name']]}"


def complete(url: str, model: str, prompt: str, max_tokens: int = 32) -> dict[str, Any]:
    """A greedy completion with token ids."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    answer: dict[str, Any] = http_json(url + "/v1/completions", body)
    return answer


def prometheus_value(prometheus_url: str, query: str) -> float | None:
    """The sum of an instant query's samples; None when Prometheus has none."""
    url = f"{prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    result = http_json(url)["data"]["result"]
    if not result:
        return None
    return sum(float(sample["value"][1]) for sample in result)


def spec_decode_queries(
    namespace: str, pod: str, revision: str, job: str | None = None
) -> dict[str, str]:
    """PromQL for the pod's draft and accepted token counters, by the labels the bed gives
    (and by scrape job: `kubernetes-pods` for scrape annotations, `<namespace>/<name>` for a
    PodMonitor)."""
    labels = f'namespace="{namespace}",pod="{pod}",specdeploy_dev_revision="{revision}"'
    if job is not None:
        labels += f',job="{job}"'
    return {
        "draft": f"sum({DRAFT_TOKENS}{{{labels}}})",
        "accepted": f"sum({ACCEPTED_TOKENS}{{{labels}}})",
    }


# --- why the operator wrote what it wrote -------------------------------------------------------

# How the operator logs each new measurement of a revision (handlers/reconcile.py, at debug
# level: `operator run --log-reconciles`, which OperatorProcess passes).
MEASURED_LINE = re.compile(r"^(\S+ \S+) DEBUG specdeploy\.reconcile: measured (\S+)/(\S+) (.*)$")


def what_the_operator_measured(
    kubectl: Kubectl, prometheus_url: str, operator_log: str, namespace: str, name: str
) -> str:
    """What a wait on an SD's status can print when it runs out: the status fields the
    operator wrote (figures, analysis, latest verdicts, conditions), the last measurement it
    logged of each revision, and the draft-token series Prometheus holds for the namespace
    (when each pod was first scraped, and at what value)."""
    lines = [f"what the operator measured of {namespace}/{name}:"]
    status = sd_status(kubectl, namespace, name)
    figures = ["phase", "stableRevision", "canaryRevision", "acceptanceRate"]
    figures += ["meanAcceptanceLength", "measuredAt"]
    lines.append("  status: " + ", ".join(f"{key}={status.get(key)}" for key in figures))
    if status.get("analysis"):
        lines.append(f"  status.analysis: {json.dumps(status['analysis'], sort_keys=True)}")
    for record in status.get("revisions") or []:
        verdicts = record.get("verdicts") or []
        if verdicts:
            latest = json.dumps(verdicts[-1], sort_keys=True)
            lines.append(
                f"  revision {record['revision']}, latest of {len(verdicts)} verdicts: {latest}"
            )
    for found in status.get("conditions") or []:
        lines.append(
            f"  {found.get('type')}={found.get('status')} {found.get('reason')}: "
            f"{found.get('message', '')}"
        )
    last: dict[str, str] = {}
    for line in operator_log.splitlines():
        matched = MEASURED_LINE.match(line)
        if matched and (matched[2], matched[3]) == (namespace, name):
            revision = matched[4].split(" ")[1]
            last[revision] = f"{matched[1]} {matched[4]}"
    if last:
        lines += [f"  operator log, last measured: {text}" for text in last.values()]
    else:
        lines.append("  operator log: no measurement logged (is spec.rollout set?)")
    lines += [f"  {line}" for line in _scraped_draft_tokens(prometheus_url, namespace)]
    return "\n".join(lines)


def _scraped_draft_tokens(prometheus_url: str, namespace: str) -> list[str]:
    """Each pod's draft-token series in Prometheus over the last 10 minutes: its first and last
    samples (a series born at a value above 0 served requests before its first scrape)."""
    query = f"{DRAFT_TOKENS}{{namespace={json.dumps(namespace)}}}[10m]"
    url = f"{prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        found = http_json(url, timeout=10)["data"]["result"]
    except (OSError, ValueError, KeyError) as error:
        return [f"Prometheus: {query} failed: {error}"]
    if not found:
        return [f"Prometheus: no {DRAFT_TOKENS} series in {namespace} in the last 10 minutes"]
    lines = []
    for series in found:
        labels, values = series["metric"], series["values"]
        (first_at, first), (last_at, last) = values[0], values[-1]
        revision = labels.get("specdeploy_dev_revision")
        lines.append(
            f"Prometheus: pod {labels.get('pod')} (revision {revision})"
            f" draft tokens first scraped at {_clock(first_at)} = {float(first):.0f}, "
            f"last at {_clock(last_at)} = {float(last):.0f}"
        )
    return lines


def _clock(unix_seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(float(unix_seconds))) + "Z"
