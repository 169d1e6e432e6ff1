"""Bad input and least privilege on the test bed: a child write refused by the API server, and the
hub token kept out of everything but its Secret.

- A CR the API server accepts whose child it then refuses (here a ValidatingAdmissionPolicy on
  the test bed refuses Deployments of one pair version: admission cannot know a cluster's own
  policies) ends in Ready False / ChildRejected with the API server's message, and the operator
  sends no further write for that generation; a new generation is tried again.
- The hub token a spec names reaches the engine only as a Secret reference: after a run that
  made the operator read it (and send it to the model-config endpoint, a local server here),
  its value is in no pod spec, Deployment, revision record, SD status, Event or operator log.
"""

from __future__ import annotations

import base64
import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from engine_cluster import OperatorProcess
from sd_bodies import hub_sd, llama_8b
from testbed import ClusterEnv, Kubectl, eventually
from testbed.conditions import condition

pytestmark = pytest.mark.e2e

NAME_LABEL = "specdeploy.dev/name"
REFUSED_VERSION = "refused-by-policy"
POLICY_MESSAGE = "pair version refused-by-policy may not run in this namespace"


def operator_config(cluster: ClusterEnv, **extra: Any) -> dict[str, Any]:
    return {
        "reconcileIntervalSeconds": 2,
        "batchQueues": ["batch"],
        "engineImage": "specdeploy/engine:e2e",
        "localProcess": False,
        "prometheusUrl": cluster.prometheus_url or "http://127.0.0.1:9090",
        **extra,
    }


# --- a child write refused by the API server ---------------------------------------------------


def admission_policy(name: str, namespace: str) -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy refusing Deployments labelled with REFUSED_VERSION, bound to
    one namespace (reason Invalid: the API server answers 422)."""
    rule = (
        "!has(object.metadata.labels)"
        " || !('specdeploy.dev/pair-version' in object.metadata.labels)"
        f" || object.metadata.labels['specdeploy.dev/pair-version'] != '{REFUSED_VERSION}'"
    )
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["apps"],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": ["deployments"],
                        }
                    ]
                },
                "validations": [
                    {"expression": rule, "message": POLICY_MESSAGE, "reason": "Invalid"}
                ],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        },
    ]


@pytest.fixture
def refusing_policy(kubectl: Kubectl, namespace: str) -> Iterator[str]:
    name = f"refuse-{uuid.uuid4().hex[:6]}"
    kubectl.apply(admission_policy(name, namespace))
    # The policy takes effect once the API server's informer has it: probe with a dry run.
    probe = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "probe",
            "namespace": namespace,
            "labels": {"specdeploy.dev/pair-version": REFUSED_VERSION},
        },
        "spec": {
            "selector": {"matchLabels": {"app": "probe"}},
            "template": {
                "metadata": {"labels": {"app": "probe"}},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            },
        },
    }

    def refused() -> bool:
        done = kubectl.run(
            "create", "--dry-run=server", "-f", "-", stdin=json.dumps(probe), check=False
        )
        return done.returncode != 0 and POLICY_MESSAGE in done.stderr

    eventually(refused, 30, "the admission policy in force")
    try:
        yield name
    finally:
        kubectl.run("delete", "validatingadmissionpolicybinding", name, check=False)
        kubectl.run("delete", "validatingadmissionpolicy", name, check=False)


@pytest.mark.usefixtures("sd_crd", "refusing_policy")
def test_a_child_the_api_server_refuses_is_a_condition_and_is_not_retried(
    cluster: ClusterEnv, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    operator = OperatorProcess(cluster.kubeconfig, operator_config(cluster), tmp_path, (namespace,))
    operator.start()
    try:
        # A Service of the SD's name that someone else made: never taken over.
        victim = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "chat", "namespace": namespace},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        }
        kubectl.apply([victim])
        body = llama_8b("chat", namespace)
        body["spec"]["pair"]["version"] = REFUSED_VERSION
        kubectl.apply([body])  # the CR itself is valid: the API server stores it

        def rejected() -> dict[str, Any] | None:
            sd: dict[str, Any] = kubectl.get_json("sd", "chat", "-n", namespace)
            return sd if condition(sd, "Ready").get("reason") == "ChildRejected" else None

        sd = eventually(rejected, 90, "Ready False with reason ChildRejected")
        ready = condition(sd, "Ready")
        assert ready["status"] == "False"
        assert ready["observedGeneration"] == sd["metadata"]["generation"]
        assert "Deployment chat-" in ready["message"]
        assert "(422)" in ready["message"]
        assert POLICY_MESSAGE in ready["message"]
        assert sd["status"]["phase"] == "Failed"
        refused = {(r["kind"], r["reason"]) for r in sd["status"]["refusedWrites"]}
        assert refused == {("Deployment", "ChildRejected"), ("Service", "NameTaken")}, refused
        assert "Service chat is not this SD's" in ready["message"]
        events = kubectl.get_json("events", "-n", namespace)["items"]
        assert {"ChildRejected", "NameTaken"} <= {e.get("reason") for e in events}, events
        # The rest went on (sized, its record made); the Service is as its owner made it.
        assert condition(sd, "Sized").get("status") == "True", sd["status"]
        service = kubectl.get_json("service", "chat", "-n", namespace)
        assert service["spec"]["selector"] == {"app": "web"}
        assert not service["metadata"].get("ownerReferences"), service["metadata"]

        # Several reconciles of this generation later (seen in the log: each timer round finds
        # the refusals and sends nothing): no write at all.
        offset = len(operator.log_text())
        skipped = f"reconciled {namespace}/chat ("
        eventually(
            lambda: operator.log_text()[offset:].count(skipped) >= 5,
            120,
            f"five reconciles that found the refusals ({skipped!r} in the operator log)",
        )
        writes = operator.writes_since(offset)
        assert writes == [], writes
        assert not kubectl.get_json("deployments", "-n", namespace, "-l", f"{NAME_LABEL}=chat")[
            "items"
        ]

        # A new generation (another pair version) is tried again, and goes through.
        body["spec"]["pair"]["version"] = "3.2"
        kubectl.apply([body])

        def deployed() -> bool:
            found = kubectl.get_json("deployments", "-n", namespace, "-l", f"{NAME_LABEL}=chat")
            ready = condition(kubectl.get_json("sd", "chat", "-n", namespace), "Ready")
            return bool(found["items"]) and ready.get("reason") != "ChildRejected"

        eventually(deployed, 90, "the next generation's Deployment written")
        assert kubectl.get_json("service", "chat", "-n", namespace)["spec"]["selector"] == {
            "app": "web"
        }

        # Its owner deletes the Service: the SD makes its own.
        kubectl.run("delete", "service", "chat", "-n", namespace)

        def own_service() -> bool:
            found = kubectl.run(
                "get", "service", "chat", "-n", namespace, "-o", "json", check=False
            )
            if found.returncode != 0:
                return False
            selector = json.loads(found.stdout)["spec"].get("selector")
            sd = kubectl.get_json("sd", "chat", "-n", namespace)
            return selector == {NAME_LABEL: "chat"} and not sd["status"].get("refusedWrites")

        eventually(own_service, 120, "the SD's own Service once the other one is gone")
    finally:
        kubectl.run(
            "delete", "sd", "--all", "-n", namespace, "--timeout=60s", check=False, timeout=70
        )
        operator.stop()
        print(f"--- operator log ({operator.log_path}) ---\n{operator.log_tail()}")


# --- the hub token -----------------------------------------------------------------------------


def _config_endpoint(tokens: list[str]) -> type[BaseHTTPRequestHandler]:
    """A model-config endpoint that knows no model; it records the bearer tokens it is sent."""

    class Endpoint(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            tokens.append(self.headers.get("Authorization", ""))
            self.send_response(404)
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    return Endpoint


@pytest.fixture
def config_endpoint() -> Iterator[tuple[str, list[str]]]:
    tokens: list[str] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _config_endpoint(tokens))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        yield f"http://127.0.0.1:{port}/{{model}}/{{revision}}/config.json", tokens
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.usefixtures("sd_crd")
def test_the_hub_token_is_only_a_secret_reference(
    cluster: ClusterEnv,
    kubectl: Kubectl,
    namespace: str,
    tmp_path: Path,
    config_endpoint: tuple[str, list[str]],
) -> None:
    url, seen_tokens = config_endpoint
    token = f"hf_{uuid.uuid4().hex}"
    config = operator_config(cluster, modelConfigUrl=url)
    operator = OperatorProcess(cluster.kubeconfig, config, tmp_path, (namespace,))
    kubectl.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "hub-token", "namespace": namespace},
                "data": {"token": base64.b64encode(token.encode()).decode()},
            }
        ]
    )
    source = {"hub": {"tokenSecretRef": {"name": "hub-token", "key": "token"}}}
    listed = llama_8b("listed", namespace, modelSource=source)
    unlisted = hub_sd(namespace, "unlisted")
    operator.start()
    try:
        kubectl.apply([listed, unlisted])
        eventually(
            lambda: kubectl.get_json("pods", "-n", namespace, "-l", f"{NAME_LABEL}=listed")[
                "items"
            ],
            90,
            "the listed pair's pods",
        )
        # The operator read the Secret and used the token (sizing the unlisted model).
        eventually(lambda: f"Bearer {token}" in seen_tokens, 60, "the token sent for config.json")
        eventually(
            lambda: (
                condition(kubectl.get_json("sd", "unlisted", "-n", namespace), "Sized").get(
                    "status"
                )
                == "False"
            ),
            60,
            "the unlisted pair reconciled",
        )

        pods = kubectl.get_json("pods", "-n", namespace)["items"]
        env = [e for p in pods for c in p["spec"]["containers"] for e in c.get("env", [])]
        hub = [e for e in env if e["name"] == "HF_TOKEN"]
        assert hub, "no HF_TOKEN in the engine pods"
        assert all(
            e.get("valueFrom") == {"secretKeyRef": {"name": "hub-token", "key": "token"}}
            and "value" not in e
            for e in hub
        ), hub

        places = {
            kind: kubectl.run("get", kind, "-n", namespace, "-o", "json").stdout
            for kind in (
                "pods",
                "deployments",
                "replicasets",
                "controllerrevisions",
                "speculativedeployments",
                "events",
                "services",
                "configmaps",
            )
        }
        places["operator log"] = operator.log_text()
        encoded = base64.b64encode(token.encode()).decode()
        leaks = [where for where, text in places.items() if token in text or encoded in text]
        assert leaks == [], f"the hub token appears in: {leaks}"
    finally:
        kubectl.run(
            "delete", "sd", "--all", "-n", namespace, "--timeout=60s", check=False, timeout=70
        )
        operator.stop()
        print(f"--- operator log ({operator.log_path}) ---\n{operator.log_tail()}")
