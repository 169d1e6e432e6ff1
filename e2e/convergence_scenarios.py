"""Convergence scenarios for the reconcile, runnable against the in-memory fake or a real API.

One scenario, two backends: the unit tests run it through `FakeKube` in milliseconds, and the
contract test runs it through the test bed's real API server (with its Deployment controller,
Kueue and KWOK) and checks that both give the same observations. So the fake cannot drift from
the real API in anything the reconcile relies on without a test saying so.

The scenario: an SD goes Ready; its draft changes, so one revision is retired at zero; each
child is then changed out of band in one way (image, args, env, the retired revision's replicas,
the Service selector, the PodMonitor) and the next reconcile must set exactly that child back,
with a DriftReverted Event, and then write nothing; finally the SD moves from a MIG slice to a
whole GPU and no stale sizing key may stay in status.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from fake_kube import merge_patch
from sd_bodies import H100, llama_8b
from specdeploy.api.config import OperatorConfig
from specdeploy.handlers.reconcile import Reconciler

NAME = "drift"
ENGINE_IMAGE = "specdeploy/engine:e2e"
CONFIG: dict[str, Any] = {
    "reconcileIntervalSeconds": 2,
    "batchQueues": ["batch"],
    "engineImage": ENGINE_IMAGE,
    "localProcess": False,
}

# The out-of-band changes, by name; each backend knows how a person would make them.
CHANGES = (
    "image",
    "args",
    "env",
    "retired-replicas",
    "service-selector",
    "pod-monitor",
)


def scenario_sd(namespace: str) -> dict[str, Any]:
    """Llama 3.1 8B with its EAGLE-3 head on an H100, on a MIG slice while `mig` is Auto."""
    body = llama_8b(NAME, namespace)
    body["spec"]["placement"]["gpu"] = {"product": H100, "mig": "Auto"}
    return body


class Backend(Protocol):
    """What the scenario needs from a cluster, real or fake."""

    kube: Any
    namespace: str

    def create_sd(self, body: Mapping[str, Any]) -> None:
        """Creates the SD as a user would."""

    def patch_sd_spec(self, patch: Mapping[str, Any]) -> None:
        """Merge-patches the SD's spec as a user would."""

    def change(self, what: str, deployment: str, retired: str) -> None:
        """Makes one of CHANGES out of band."""

    def settle(self) -> None:
        """Lets the cluster's own controllers catch up (Deployments observed, pods ready)."""


@dataclass
class Recorder:
    """Wraps the reconciler's kube adapter to record each write as (verb, kind, name)."""

    inner: Any
    writes: list[tuple[str, str, str]] = field(default_factory=list)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    def apply(self, manifest: Mapping[str, Any]) -> None:
        self.writes.append(("apply", manifest["kind"], manifest["metadata"]["name"]))
        self.inner.apply(manifest)

    def create(self, manifest: Mapping[str, Any]) -> bool:
        self.writes.append(("create", manifest["kind"], manifest["metadata"]["name"]))
        created: bool = self.inner.create(manifest)
        return created

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        self.writes.append(("delete", kind, name))
        self.inner.delete(api_version, kind, namespace, name)

    def scale_deployment(self, namespace: str, name: str, replicas: int) -> None:
        self.writes.append(("scale", "Deployment", name))
        self.inner.scale_deployment(namespace, name, replicas)

    def patch_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        self.writes.append(("patch-status", "SpeculativeDeployment", name))
        self.inner.patch_status(namespace, name, patch)

    def remove_annotation(self, namespace: str, name: str, key: str, value: str) -> bool:
        self.writes.append(("remove-annotation", "SpeculativeDeployment", name))
        return bool(self.inner.remove_annotation(namespace, name, key, value))


@dataclass
class Run:
    """A reconciler bound to a backend, recording writes and Events."""

    backend: Backend
    recorder: Recorder = field(init=False)
    reconciler: Reconciler = field(init=False)
    events: list[tuple[str, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.recorder = Recorder(self.backend.kube)
        self.reconciler = Reconciler(
            self.recorder,  # type: ignore[arg-type]
            OperatorConfig.from_mapping(CONFIG),
            lambda _body, type_, reason, message: self.events.append((type_, reason, message)),
        )

    def reconcile(self) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
        """One reconcile: (the writes it sent, the Events it posted)."""
        writes, events = len(self.recorder.writes), len(self.events)
        self.reconciler.reconcile(self.backend.namespace, NAME)
        return self.recorder.writes[writes:], self.events[events:]

    def converge(self, rounds: int = 40) -> int:
        """Lets the cluster settle, then reconciles, until one reconcile writes nothing; returns
        how many rounds it took. A reconcile right after a write may see the world before the
        cluster's controllers moved it (a Deployment not yet observed), write nothing, and the
        next one find something to write: quiet counts only on a settled world."""
        for round_ in range(1, rounds + 1):
            self.backend.settle()
            writes, _ = self.reconcile()
            if not writes:
                return round_
        raise AssertionError(f"no quiet reconcile after {rounds} rounds: {self.recorder.writes}")

    def sd(self) -> dict[str, Any]:
        found = self.backend.kube.get_speculative_deployment(self.backend.namespace, NAME)
        assert found is not None
        return copy.deepcopy(found)

    def deployment(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.backend.kube.get(
            "apps/v1", "Deployment", self.backend.namespace, name
        )
        return found


def _engine(deployment: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    found: Mapping[str, Any] = next(c for c in containers if c["name"] == "engine")
    return found


# Reads one child by kind and name: (kind, name) -> the object.
Reader = Callable[[str, str], Any]
API_VERSIONS = {
    "Deployment": "apps/v1",
    "Service": "v1",
    "PodMonitor": "monitoring.coreos.com/v1",
}

# What a child looks like in the fields each change touches, to see it was set back:
# (read, serving deployment, retired deployment) -> value.
Probe = Callable[[Reader, str, str], Any]
PROBES: dict[str, Probe] = {
    "image": lambda read, d, _: _engine(read("Deployment", d))["image"],
    "args": lambda read, d, _: list(_engine(read("Deployment", d))["args"]),
    "env": lambda read, d, _: {
        e["name"]: e.get("value") for e in _engine(read("Deployment", d))["env"]
    },
    "retired-replicas": lambda read, _, r: read("Deployment", r)["spec"]["replicas"],
    "service-selector": lambda read, _d, _r: read("Service", NAME)["spec"]["selector"],
    "pod-monitor": lambda read, _d, _r: read("PodMonitor", NAME)["spec"]["podMetricsEndpoints"],
}


def drift_scenario(backend: Backend) -> list[tuple[Any, ...]]:
    """Runs the scenario; returns its observations, which must not depend on the backend."""
    run = Run(backend)
    seen: list[tuple[Any, ...]] = []
    backend.create_sd(scenario_sd(backend.namespace))
    run.converge()
    first = run.sd()["status"]["stableRevision"]
    backend.patch_sd_spec({"pair": {"draft": {"revision": "eagle3-r2"}}})
    run.converge()
    sd = run.sd()
    serving = sd["status"]["stableRevision"]
    conditions = {c["type"]: c["status"] for c in sd["status"]["conditions"]}
    seen.append(("rolled", serving != first, conditions["Ready"]))
    deployment, retired = f"{NAME}-{serving}", f"{NAME}-{first}"
    seen.append(
        (
            "replicas",
            run.deployment(deployment)["spec"]["replicas"],
            run.deployment(retired)["spec"]["replicas"],
        )
    )

    def read(kind: str, name: str) -> Any:
        return backend.kube.get(API_VERSIONS[kind], kind, backend.namespace, name)

    for what in CHANGES:
        probe = PROBES[what]
        before = probe(read, deployment, retired)
        backend.change(what, deployment, retired)
        changed = probe(read, deployment, retired) != before
        writes, events = run.reconcile()
        child_writes = sorted(w for w in writes if w[0] != "patch-status")
        reverted = [(t, r) for t, r, m in events if r == "DriftReverted"]
        seen.append(
            (what, changed, child_writes, reverted, probe(read, deployment, retired) == before)
        )
        run.converge()
        writes, _ = run.reconcile()
        seen.append((what, "then quiet", writes))

    backend.patch_sd_spec({"placement": {"gpu": {"mig": "Never"}}})
    run.converge()
    sd = run.sd()
    sizing = sd["status"]["sizing"]
    seen.append(("whole GPU", sizing["resourceName"], "migProfile" in sizing))
    writes, _ = run.reconcile()
    seen.append(("whole GPU", "then quiet", writes))
    return seen


def _set_engine(field_name: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(deployment: dict[str, Any]) -> None:
        containers = deployment["spec"]["template"]["spec"]["containers"]
        engine = next(c for c in containers if c["name"] == "engine")
        engine[field_name] = value(engine[field_name]) if callable(value) else value

    return edit


def _set_env(name: str, value: str) -> Callable[[dict[str, Any]], None]:
    def edit(env: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"name": name, "value": value} if e["name"] == name else e for e in env]

    return _set_engine("env", edit)


# The same changes as the real backend makes them with kubectl (e2e/test_convergence.py).
OTHER_IMAGE = "other/image:latest"
EXTRA_ARG = "--max-num-seqs=999"
OTHER_PORT = "9999"
OTHER_SELECTOR = {"app": "other"}
OTHER_ENDPOINTS = [{"port": "other", "path": "/other"}]


@dataclass
class FakeBackend:
    """The scenario's backend on the in-memory fake."""

    kube: Any
    namespace: str = "ns"

    def create_sd(self, body: Mapping[str, Any]) -> None:
        sd = copy.deepcopy(dict(body))
        sd["metadata"].update(uid="sd-uid", generation=1)
        self.kube.objects[("SpeculativeDeployment", self.namespace, NAME)] = sd

    def patch_sd_spec(self, patch: Mapping[str, Any]) -> None:
        sd = self.kube.objects[("SpeculativeDeployment", self.namespace, NAME)]
        sd["spec"] = merge_patch(sd["spec"], dict(patch))
        sd["metadata"]["generation"] += 1

    def change(self, what: str, deployment: str, retired: str) -> None:
        ns = self.namespace
        if what == "image":
            self.kube.edit("Deployment", ns, deployment, _set_engine("image", OTHER_IMAGE))
        elif what == "args":
            add = _set_engine("args", lambda args: [*args, EXTRA_ARG])
            self.kube.edit("Deployment", ns, deployment, add)
        elif what == "env":
            self.kube.edit("Deployment", ns, deployment, _set_env("SPECDEPLOY_PORT", OTHER_PORT))
        elif what == "retired-replicas":
            self.kube.edit("Deployment", ns, retired, {"spec": {"replicas": 1}})
        elif what == "service-selector":
            self.kube.edit("Service", ns, NAME, {"spec": {"selector": OTHER_SELECTOR}})
        elif what == "pod-monitor":
            patch = {"spec": {"podMetricsEndpoints": OTHER_ENDPOINTS}}
            self.kube.edit("PodMonitor", ns, NAME, patch)
        else:
            raise ValueError(what)

    def settle(self) -> None:
        self.kube.make_ready()
