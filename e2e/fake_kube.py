"""An in-memory stand-in for the operator's KubeAdapter, for fast tests of the reconcile.

It behaves like the real API server where the reconcile's correctness depends on it, and the
contract test (e2e/test_convergence_contract.py) runs the same scenarios through this fake and
through the test bed's real API server and compares what the reconcile saw and wrote:

- every write counts as one request, as the adapter counts them; server-side apply merges the
  applied fields into the live object (maps by key, lists of named things by their merge key,
  other lists and the atomic selector maps whole) and never removes another manager's fields;
- the API server's defaults are filled in on every write (Deployment strategy and history
  limit, container pull policy and termination message policy, port protocols, the Service's
  type and cluster IP), and resource quantities are stored as strings ("1", not 1), extended
  resources copied from limits to requests, so a reconcile that compares naively sees drift;
- status is merge-patched by RFC 7386 (a None removes a key, maps merge, lists are replaced);
- resourceVersion moves on every write, generation when the spec changes; create answers 409
  (False) when the name is taken; a ControllerRevision's data cannot change;
- a field the operator's apply set before and leaves out now is removed (server-side apply
  removes the fields a manager stops applying), unless another client's change set it since;
- pods are listed by namespace and label selector, Workloads by namespace; a LocalQueue exists
  only when its name is in `local_queues` (by default the test bed's `interactive` and `batch`,
  which `testbed.create_namespace_with_queues` makes in every namespace).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from specdeploy.plan.children.drift import ATOMIC_MAPS, list_merge_key

NODES_YAML = Path(__file__).resolve().parent / "manifests" / "nodes.yaml"

Key = tuple[str, str, str]  # kind, namespace, name
#: A field of an object: map keys, and for lists merged by key, the item's key values.
FieldPath = tuple[Any, ...]


def kwok_gpu_nodes() -> list[dict[str, Any]]:
    """The test bed's fake GPU nodes (e2e/manifests/nodes.yaml), as the API would list them."""
    return [d for d in yaml.safe_load_all(NODES_YAML.read_text()) if d and d["kind"] == "Node"]


class UnprocessableError(Exception):
    """What the API server answers with 422: the write is refused."""


def server_side_merge(live: Any, applied: Any, path: str = "") -> Any:
    """`applied` merged into `live` the way server-side apply merges a manager's fields."""
    if isinstance(applied, Mapping) and isinstance(live, Mapping):
        if path in ATOMIC_MAPS:
            return copy.deepcopy(dict(applied))
        merged = dict(live)
        for key, value in applied.items():
            sub = f"{path}.{key}" if path else key
            merged[key] = server_side_merge(live.get(key), value, sub)
        return merged
    if isinstance(applied, list) and isinstance(live, list) and applied:
        field = path.rsplit(".", 1)[-1]
        keys = list_merge_key(field, applied[0]) if isinstance(applied[0], Mapping) else None
        if keys is None:
            return copy.deepcopy(applied)

        def key_of(item: Mapping[str, Any]) -> tuple[Any, ...]:
            return tuple(item.get(k, "TCP" if k == "protocol" else None) for k in keys)

        by_key = {key_of(item): item for item in applied}
        merged_list = []
        for item in live:
            if key_of(item) in by_key:
                merged_list.append(server_side_merge(item, by_key.pop(key_of(item)), path))
            else:
                merged_list.append(item)
        merged_list.extend(copy.deepcopy(list(by_key.values())))
        return merged_list
    return copy.deepcopy(applied)


def field_paths(value: Any, path: FieldPath = (), dotted: str = "") -> set[FieldPath]:
    """Every field an applied manifest sets, as server-side apply tracks a manager's fields:
    each map key (atomic maps and lists whole), and each item of a list merged by key with the
    fields inside it."""
    found: set[FieldPath] = set()
    if isinstance(value, Mapping) and dotted not in ATOMIC_MAPS:
        for key, sub in value.items():
            sub_path, sub_dotted = (*path, key), f"{dotted}.{key}" if dotted else key
            found.add(sub_path)
            found |= field_paths(sub, sub_path, sub_dotted)
    elif isinstance(value, list) and value and isinstance(value[0], Mapping):
        keys = list_merge_key(dotted.rsplit(".", 1)[-1], value[0])
        if keys is not None:
            for item in value:
                item_path = (*path, _item_key(item, keys))
                found.add(item_path)
                found |= field_paths(item, item_path, dotted)
    return found


def _item_key(item: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[tuple[str, Any], ...]:
    return tuple((k, item.get(k, "TCP" if k == "protocol" else None)) for k in keys)


def remove_field(obj: Any, path: FieldPath) -> None:
    """Deletes one field (a map key, or a list item by its key) from `obj`, if it is there."""
    parent = obj
    for step in path[:-1]:
        parent = _child(parent, step)
        if parent is None:
            return
    last = path[-1]
    if isinstance(parent, dict):
        parent.pop(last, None)
    elif isinstance(parent, list) and isinstance(last, tuple):
        parent[:] = [i for i in parent if _item_key(i, tuple(k for k, _ in last)) != last]


def _child(obj: Any, step: Any) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(step)
    if isinstance(obj, list) and isinstance(step, tuple):
        keys = tuple(k for k, _ in step)
        return next((i for i in obj if _item_key(i, keys) == step), None)
    return None


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _default_container(container: dict[str, Any]) -> None:
    image = str(container.get("image", ""))
    container.setdefault(
        "imagePullPolicy", "Always" if image.endswith(":latest") else "IfNotPresent"
    )
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    for port in container.get("ports") or []:
        port.setdefault("protocol", "TCP")
    resources = container.setdefault("resources", {})
    for part in ("limits", "requests"):
        if part in resources:
            resources[part] = {k: str(v) for k, v in resources[part].items()}
    for name, value in (resources.get("limits") or {}).items():
        if name not in ("cpu", "memory", "ephemeral-storage"):
            resources.setdefault("requests", {}).setdefault(name, value)
    probe = container.get("readinessProbe")
    if probe:
        probe.setdefault("timeoutSeconds", 1)
        probe.setdefault("successThreshold", 1)
        probe.get("httpGet", {}).setdefault("scheme", "HTTP")


def apply_defaults(obj: dict[str, Any]) -> None:
    """Fills in what the API server defaults for the kinds the operator writes."""
    kind = obj["kind"]
    spec = obj.get("spec") or {}
    if kind == "Deployment":
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        spec.setdefault(
            "strategy",
            {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"},
            },
        )
        pod = spec.get("template", {}).setdefault("spec", {})
        pod.setdefault("restartPolicy", "Always")
        pod.setdefault("dnsPolicy", "ClusterFirst")
        pod.setdefault("schedulerName", "default-scheduler")
        pod.setdefault("terminationGracePeriodSeconds", 30)
        pod.setdefault("securityContext", {})
        for container in pod.get("containers") or []:
            _default_container(container)
    elif kind == "Service":
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        spec.setdefault("clusterIP", "10.96.0.10")
        for port in spec.get("ports") or []:
            port.setdefault("protocol", "TCP")


class FakeKube:
    """Objects by (kind, namespace, name); counts writes like the real adapter."""

    def __init__(
        self, nodes: list[dict[str, Any]], pod_monitor_crd: bool = True, lws_crd: bool = True
    ) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.nodes = nodes
        self.pod_monitor_crd = pod_monitor_crd
        self.lws_crd = lws_crd
        self.write_requests = 0
        self.pods: list[dict[str, Any]] = []
        self.workloads: list[dict[str, Any]] = []
        #: The LocalQueues that exist, by name, in every namespace.
        self.local_queues: set[str] = {"interactive", "batch"}
        #: The fields each object's last apply set, and those others' changes set since.
        self._applied: dict[Key, set[FieldPath]] = {}
        self._set_by_others: dict[Key, set[FieldPath]] = {}
        #: The Kueue WorkloadPriorityClasses that exist (all names, when None).
        self.priority_classes: set[str] | None = None
        #: MutatingWebhookConfigurations, and whether Kueue's Workload CRD exists.
        self.webhook_configurations: list[dict[str, Any]] = []
        self.kueue_installed = True
        self._versions = itertools.count(1)
        self._created = itertools.count(1)

    # --- reads ----------------------------------------------------------------------------------

    def get_speculative_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get(("SpeculativeDeployment", namespace, name)))

    def list_gpu_nodes(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.nodes)

    def list_objects(
        self, api_version: str, kind: str, namespace: str, selector: str
    ) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(o)
            for (k, ns, _), o in sorted(self.objects.items())
            if k == kind and ns == namespace and selected(o, selector)
        ]

    def list_deployments(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self.list_objects("apps/v1", "Deployment", namespace, selector)

    def list_leader_worker_sets(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self.list_objects(
            "leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", namespace, selector
        )

    def serves_leader_worker_sets(self) -> bool:
        return self.lws_crd

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(p)
            for p in self.pods
            if p["metadata"].get("namespace") == namespace and selected(p, selector)
        ]

    def list_workloads(self, namespace: str) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(w) for w in self.workloads if w["metadata"].get("namespace") == namespace
        ]

    def get_local_queue(self, namespace: str, name: str) -> dict[str, Any] | None:
        if name not in self.local_queues:
            return None
        return {"metadata": {"name": name, "namespace": namespace}, "spec": {"clusterQueue": name}}

    def get_workload_priority_class(self, name: str) -> dict[str, Any] | None:
        if self.priority_classes is not None and name not in self.priority_classes:
            return None
        return {"metadata": {"name": name}, "value": 100}

    def has_pod_monitor_crd(self) -> bool:
        return self.pod_monitor_crd

    def read_kueue_webhooks(self, workload_crd: str) -> tuple[list[dict[str, Any]], bool]:
        return copy.deepcopy(self.webhook_configurations), self.kueue_installed

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any:
        return copy.deepcopy(self.objects.get((kind, namespace, name)))

    def live_object(
        self, api_version: str, kind: str, namespace: str, name: str
    ) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get((kind, namespace, name)))

    # --- writes ---------------------------------------------------------------------------------

    def _store(self, key: Key, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        apply_defaults(obj)
        metadata = obj["metadata"]
        metadata["resourceVersion"] = str(next(self._versions))
        if old is None:
            metadata["creationTimestamp"] = f"2026-01-01T00:{next(self._created):05d}Z"
            metadata["generation"] = 1
            metadata["uid"] = f"uid-{key[0]}-{key[2]}"
        else:
            metadata["creationTimestamp"] = old["metadata"]["creationTimestamp"]
            metadata["uid"] = old["metadata"]["uid"]
            changed = old.get("spec") != obj.get("spec")
            metadata["generation"] = old["metadata"]["generation"] + (1 if changed else 0)
        self.objects[key] = obj

    def apply(self, manifest: Mapping[str, Any]) -> None:
        self.write_requests += 1
        body = copy.deepcopy(dict(manifest))
        key = (body["kind"], body["metadata"].get("namespace", ""), body["metadata"]["name"])
        old = self.objects.get(key)
        merged = server_side_merge(copy.deepcopy(old), body) if old else body
        # What this manager applied before and leaves out now goes, unless another client's
        # change set it since (then that client owns it too).
        applied = field_paths(body)
        dropped = self._applied.get(key, set()) - applied - self._set_by_others.get(key, set())
        for path in sorted(dropped, key=len):
            remove_field(merged, path)
        self._applied[key] = applied
        self._store(key, merged, old)

    def create(self, manifest: Mapping[str, Any]) -> bool:
        self.write_requests += 1
        body = copy.deepcopy(dict(manifest))
        key = (body["kind"], body["metadata"].get("namespace", ""), body["metadata"]["name"])
        if key in self.objects:
            return False
        self._store(key, body, None)
        return True

    def scale_deployment(self, namespace: str, name: str, replicas: int) -> None:
        self.edit("Deployment", namespace, name, {"spec": {"replicas": replicas}}, by_us=True)

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        self.write_requests += 1
        self.objects.pop((kind, namespace, name), None)
        self._applied.pop((kind, namespace, name), None)
        self._set_by_others.pop((kind, namespace, name), None)

    def set_pod_condition(
        self, namespace: str, name: str, condition_type: str, reason: str, message: str
    ) -> None:
        """A condition set True on a pod's status, others kept (a strategic merge by type)."""
        self.write_requests += 1
        for pod in self.pods:
            meta = pod["metadata"]
            if (meta.get("namespace"), meta.get("name")) != (namespace, name):
                continue
            conditions = [
                c
                for c in (pod.setdefault("status", {}).get("conditions") or [])
                if c.get("type") != condition_type
            ]
            conditions.append(
                {"type": condition_type, "status": "True", "reason": reason, "message": message}
            )
            pod["status"]["conditions"] = conditions

    def patch_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        self.write_requests += 1
        key = ("SpeculativeDeployment", namespace, name)
        sd = self.objects[key]
        sd["status"] = merge_patch(sd.get("status") or {}, dict(patch))
        sd["metadata"]["resourceVersion"] = str(next(self._versions))

    def remove_annotation(self, namespace: str, name: str, key: str, value: str) -> bool:
        self.write_requests += 1
        sd = self.objects.get(("SpeculativeDeployment", namespace, name))
        annotations = (sd or {}).get("metadata", {}).get("annotations") or {}
        if sd is None or annotations.get(key) != value:
            return False  # the API server answers 422: the test op failed
        del annotations[key]
        sd["metadata"]["resourceVersion"] = str(next(self._versions))
        return True

    # --- everyone else --------------------------------------------------------------------------

    def edit(
        self,
        kind: str,
        namespace: str,
        name: str,
        patch: Mapping[str, Any] | Callable[[dict[str, Any]], None],
        by_us: bool = False,
    ) -> None:
        """Another client's change: a merge patch, or a function that edits the object."""
        if by_us:
            self.write_requests += 1
        key = (kind, namespace, name)
        old = self.objects[key]
        if kind == "ControllerRevision" and not callable(patch) and "data" in patch:
            raise UnprocessableError("ControllerRevision data is immutable")
        new = copy.deepcopy(old)
        if callable(patch):
            patch(new)
        else:
            new = merge_patch(new, dict(patch))
        if not by_us:
            changed = {p for p in field_paths(new) if _child_at(new, p) != _child_at(old, p)}
            self._set_by_others.setdefault(key, set()).update(changed)
        self._store(key, new, old)

    def make_ready(self) -> None:
        """What the Deployment controller and the kubelets do: every pod ready."""
        for (kind, _, _), obj in self.objects.items():
            if kind in ("Deployment", "LeaderWorkerSet"):
                replicas = obj["spec"]["replicas"]
                obj["status"] = {
                    "replicas": replicas,
                    "readyReplicas": replicas,
                    "observedGeneration": obj["metadata"]["generation"],
                }

    def leader_worker_sets(self) -> dict[str, int]:
        """Revision LeaderWorkerSet name -> replicas (groups)."""
        return {
            o["metadata"]["name"]: o["spec"]["replicas"]
            for (kind, _, _), o in self.objects.items()
            if kind == "LeaderWorkerSet"
        }

    def deployments(self) -> dict[str, int]:
        """Revision Deployment name -> replicas."""
        return {
            o["metadata"]["name"]: o["spec"]["replicas"]
            for (kind, _, _), o in self.objects.items()
            if kind == "Deployment"
        }


def selected(obj: Mapping[str, Any], selector: str) -> bool:
    """Whether the object's labels match an equality-based label selector (`a=b,c!=d,e`)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.rstrip("=")) != value.lstrip("="):
                return False
        elif term not in labels:
            return False
    return True


def _child_at(obj: Any, path: FieldPath) -> Any:
    for step in path:
        obj = _child(obj, step)
        if obj is None:
            return None
    return obj
