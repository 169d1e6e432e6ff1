"""A child write the API server refuses for good: a condition that says so, and no retries until
the spec changes (plan.status.refusal, the refused-write path of handlers.reconcile and
adapters.kube)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

import test_reconcile
from fake_kube import FakeKube
from specdeploy.adapters.kube import WriteRefusedError, _refusals
from specdeploy.api.config import OperatorConfig
from specdeploy.handlers.reconcile import Reconciler
from test_reconcile import NODES, condition, sd_body, status

MESSAGE = (
    'Deployment.apps "chat-x" is forbidden: ValidatingAdmissionPolicy "no-v1" with binding '
    '"no-v1" denied request: pair version 1 is not allowed here'
)


class RefusingKube(FakeKube):
    """Refuses (422) every Deployment write while `refuse` is set, as an admission policy would."""

    def __init__(self) -> None:
        super().__init__(NODES)
        self.refuse = True
        self.refused = 0

    def apply(self, manifest: Mapping[str, Any]) -> None:
        if self.refuse and manifest["kind"] == "Deployment":
            self.write_requests += 1
            self.refused += 1
            raise WriteRefusedError(422, "Deployment", manifest["metadata"]["name"], MESSAGE)
        super().apply(manifest)


def setup() -> tuple[RefusingKube, Reconciler, list[tuple[str, str]]]:
    kube = RefusingKube()
    _, reconciler, events = test_reconcile.setup(sd_body(), kube)
    return kube, reconciler, events


def test_a_refused_child_sets_ready_false_and_is_not_retried_for_the_same_generation() -> None:
    kube, reconciler, events = setup()
    reconciler.reconcile("ns", "chat")  # no exception: nothing for kopf to retry
    assert kube.refused == 1
    ready = condition(kube, "Ready")
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == (
        "False",
        "ChildRejected",
        1,
    )
    assert "Deployment chat-" in ready["message"]
    assert "(422)" in ready["message"]
    assert "pair version 1 is not allowed here" in ready["message"]
    assert condition(kube, "Progressing")["reason"] == "ChildRejected"
    assert status(kube)["phase"] == "Failed"
    # No Event says the revision was created: it was not.
    assert [reason for reason, _ in events] == ["ChildRejected"]
    (refused,) = status(kube)["refusedWrites"]
    assert (refused["kind"], refused["reason"], refused["code"], refused["generation"]) == (
        "Deployment",
        "ChildRejected",
        422,
        1,
    )
    assert "pair version 1 is not allowed here" in refused["message"]

    writes = kube.write_requests
    for _ in range(5):
        reconciler.reconcile("ns", "chat")
    assert kube.write_requests == writes, "a refused child was written again, or its status"
    assert kube.refused == 1
    assert len(events) == 1


def test_a_spec_change_tries_again_and_clears_the_refusal() -> None:
    kube, reconciler, _ = setup()
    reconciler.reconcile("ns", "chat")
    assert condition(kube, "Ready")["reason"] == "ChildRejected"
    kube.refuse = False
    sd = kube.objects[("SpeculativeDeployment", "ns", "chat")]
    sd["spec"]["pair"]["version"] = "2"
    sd["metadata"]["generation"] = 2
    reconciler.reconcile("ns", "chat")
    assert kube.deployments(), "the new generation's Deployment was not written"
    ready = condition(kube, "Ready")
    assert ready["reason"] != "ChildRejected"
    assert ready["observedGeneration"] == 2


@pytest.mark.parametrize("code", [400, 422])
def test_the_adapter_turns_400_and_422_into_write_refused(code: int) -> None:
    body = json.dumps({"kind": "Status", "message": MESSAGE, "code": code})
    with pytest.raises(WriteRefusedError) as raised, _refusals("Deployment", "chat-x"):
        raise ApiException(status=code, reason="Unprocessable Entity")  # no body: reason used
    assert raised.value.message == "Unprocessable Entity"
    error = ApiException(status=code, reason="x")
    error.body = body
    with pytest.raises(WriteRefusedError) as raised, _refusals("Deployment", "chat-x"):
        raise error
    assert (raised.value.code, raised.value.kind, raised.value.message) == (
        code,
        "Deployment",
        MESSAGE,
    )


@pytest.mark.parametrize("code", [403, 409, 429, 500, 503])
def test_other_api_errors_stay_retriable(code: int) -> None:
    with pytest.raises(ApiException) as raised, _refusals("Deployment", "chat-x"):
        raise ApiException(status=code, reason="x")
    assert not isinstance(raised.value, WriteRefusedError)


class SecretlessKube(FakeKube):
    """Refuses every Secret read (403), as RBAC does outside rbac.secretNamespaces."""

    def __init__(self) -> None:
        super().__init__(NODES)
        self.secret_reads = 0

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any:
        if kind == "Secret":
            self.secret_reads += 1
            raise ApiException(status=403, reason="Forbidden")
        return super().get(api_version, kind, namespace, name)


def test_a_secret_the_operator_may_not_read_leaves_it_sizing_without_the_token() -> None:
    kube = SecretlessKube()
    body = sd_body()
    body["spec"]["pair"]["target"] = {"model": "example-org/unlisted-8b", "revision": "r"}
    body["spec"]["modelSource"] = {"hub": {"tokenSecretRef": {"name": "hub-token", "key": "t"}}}
    kube.objects[("SpeculativeDeployment", "ns", "chat")] = body
    config = OperatorConfig.model_validate({"modelConfigUrl": "http://127.0.0.1:9/{model}"})
    reconciler = Reconciler(kube, config, lambda *_: None)  # type: ignore[arg-type]
    reconciler.reconcile("ns", "chat")  # no ApiException: the reconcile goes on
    assert kube.secret_reads == 1
    assert condition(kube, "Sized")["status"] == "False"
