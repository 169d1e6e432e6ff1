"""The Helm chart: generated files current, values and schema in step with the operator config,
and what `helm template` renders (tests marked `helm` run the pinned helm; `make chart-lint`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from chart_harness import CHART, Helm, HelmError, granted_access, set_values
from render_chart import document_values, expected_files, render_readme
from specdeploy.api.config import OperatorConfig
from testbed.cluster import tools_dir

VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
SCHEMA: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
#: Config keys the chart writes itself rather than taking from values.config.
CHART_SET_CONFIG = {"livenessEndpoint", "metricsEndpoint", "leaderElection"}


# --- without helm -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(expected_files()), ids=lambda p: p.name)
def test_generated_chart_file_is_current(path: Path) -> None:
    assert path.exists(), f"{path} is missing: run `make crds chart-docs` and commit"
    assert path.read_text(encoding="utf-8") == expected_files()[path], (
        f"{path.relative_to(CHART)} is stale: run `make crds chart-docs` and commit"
    )


def test_values_config_holds_every_operator_config_key() -> None:
    keys = {field.alias or name for name, field in OperatorConfig.model_fields.items()}
    assert set(VALUES["config"]) == keys - CHART_SET_CONFIG
    assert set(SCHEMA["properties"]["config"]["properties"]) == keys - CHART_SET_CONFIG
    defaults = OperatorConfig().model_dump(by_alias=True, exclude=CHART_SET_CONFIG)
    from_values = OperatorConfig.from_mapping(VALUES["config"])
    assert from_values.model_dump(by_alias=True, exclude=CHART_SET_CONFIG) == defaults, (
        "values.yaml's config differs from the operator's defaults"
    )


def test_values_yaml_is_valid_under_its_schema() -> None:
    jsonschema.validate(VALUES, SCHEMA)


def _object_levels(schema: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The path of each object level of the schema that declares its properties ("[]" stands
    for an item of a list)."""
    if "properties" in schema:
        yield path
        for name, sub in schema["properties"].items():
            yield from _object_levels(sub, (*path, name))
    if isinstance(schema.get("items"), dict):
        yield from _object_levels(schema["items"], (*path, "[]"))


LEVELS = list(_object_levels(SCHEMA))


def _node(path: tuple[str, ...]) -> dict[str, Any]:
    node: dict[str, Any] = SCHEMA
    for part in path:
        node = node["items"] if part == "[]" else node["properties"][part]
    return node


@pytest.mark.parametrize("path", LEVELS, ids=lambda p: ".".join(p) or "root")
def test_every_schema_level_refuses_unknown_keys(path: tuple[str, ...]) -> None:
    assert _node(path).get("additionalProperties") is False


def test_every_value_is_documented() -> None:
    documented = {doc.key for doc in document_values((CHART / "values.yaml").read_text())}

    def leaves(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
        for key, value in values.items():
            full = f"{prefix}{key}"
            if full in documented:
                continue
            assert isinstance(value, dict), f"{full} has no `# --` comment"
            assert value, f"{full} has no `# --` comment"
            yield from leaves(value, f"{full}.")

    assert not list(leaves(VALUES))


# --- helm template ------------------------------------------------------------------------------

helm_test = pytest.mark.helm


@pytest.fixture(scope="module")
def helm() -> Helm:
    """The pinned helm of the test bed's tools (`make tools`), without a cluster."""
    return Helm(tools_dir(build=False) / "helm")


def _by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = _by_kind(objects, kind)
    return found


def _misspelt_values(path: tuple[str, ...]) -> Any:
    """Values with the key `misspelt` at one level (a list level gets one otherwise valid item)."""
    level: Any = {"misspelt": True}
    for depth in range(len(path), 0, -1):
        part = path[depth - 1]
        if part == "[]":
            required = _node(path[:depth]).get("required", [])
            sample = {"name": "x", "product": "X", "memoryGiB": 1}
            level = [{**{k: sample[k] for k in required}, **level}]
        else:
            level = {part: level}
    return level


@helm_test
def test_helm_lint_strict(helm: Helm) -> None:
    out = helm.run("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in out.stdout


@helm_test
@pytest.mark.parametrize("path", LEVELS, ids=lambda p: ".".join(p) or "root")
def test_helm_refuses_a_misspelt_key_at_every_level(
    helm: Helm, path: tuple[str, ...], tmp_path: Path
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(_misspelt_values(path)))
    with pytest.raises(HelmError) as refused:
        helm.template("-f", str(values))
    assert "additional properties 'misspelt' not allowed" in refused.value.stderr


@helm_test
def test_operator_pod_is_locked_down_and_probed(helm: Helm) -> None:
    objects = helm.template("-n", "ops")
    deployment = _one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}
    assert container["image"] == "specdeploy/operator:0.1.0"
    assert container["args"] == ["operator", "run", "--config", "/etc/specdeploy/config.yaml"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "probes"}
    assert container["ports"] == [
        {"name": "probes", "containerPort": 8080, "protocol": "TCP"},
        {"name": "metrics", "containerPort": 8081, "protocol": "TCP"},
    ]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts == {"/etc/specdeploy": "config", "/tmp": "tmp"}
    # Two replicas, one reconciling: the Lease decides which (leader election is on).
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert container["env"] == [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    ]


@helm_test
def test_config_map_is_the_operator_config_with_the_probe_and_metrics_endpoints(helm: Helm) -> None:
    values = {"config": {"batchQueues": ["batch"]}, "probes": {"port": 9000}}
    objects = helm.template(*set_values({**values, "metrics": {"port": 9001}}))
    text = _one(objects, "ConfigMap")["data"]["config.yaml"]
    config = OperatorConfig.from_mapping(yaml.safe_load(text))
    assert config.batch_queues == ["batch"]
    assert config.liveness_endpoint == "http://0.0.0.0:9000/healthz"
    assert config.metrics_endpoint == "http://0.0.0.0:9001/metrics"
    pod = _one(objects, "Deployment")["spec"]["template"]
    assert pod["spec"]["containers"][0]["ports"][0]["containerPort"] == 9000
    assert pod["metadata"]["annotations"]["checksum/config"]


@helm_test
def test_config_map_holds_the_lease_of_the_release_namespace(helm: Helm) -> None:
    values = {"leaderElection": {"leaseName": "ops-lease"}}
    objects = helm.template("-n", "ops", *set_values(values))
    config = OperatorConfig.from_mapping(
        yaml.safe_load(_one(objects, "ConfigMap")["data"]["config.yaml"])
    )
    assert config.leader_election.enabled
    assert (config.leader_election.namespace, config.leader_election.lease_name) == (
        "ops",
        "ops-lease",
    )
    assert config.leader_election.lease_duration_seconds == 15


@helm_test
def test_several_replicas_without_leader_election_are_refused(helm: Helm) -> None:
    with pytest.raises(HelmError, match="leaderElection"):
        helm.template(*set_values({"leaderElection": {"enabled": False}}))
    objects = helm.template(*set_values({"leaderElection": {"enabled": False}, "replicas": 1}))
    deployment = _one(objects, "Deployment")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert not _by_kind(objects, "Role")


@helm_test
def test_crds_are_kept_on_uninstall_unless_turned_off(helm: Helm) -> None:
    (crd,) = _by_kind(helm.template(), "CustomResourceDefinition")
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert (
        crd["spec"]
        == yaml.safe_load(
            (CHART.parents[1] / "crds" / "specdeploy.dev_speculativedeployments.yaml").read_text()
        )["spec"]
    )
    (unkept,) = _by_kind(
        helm.template(*set_values({"crds": {"keep": False}})), "CustomResourceDefinition"
    )
    assert "annotations" not in unkept["metadata"]
    without = helm.template(*set_values({"crds": {"enabled": False}}))
    assert not _by_kind(without, "CustomResourceDefinition")


@helm_test
def test_rbac_for_all_namespaces_is_cluster_wide_without_namespace_access(helm: Helm) -> None:
    objects = helm.template("-n", "ops")
    # The only Role is the Lease's, in the release's namespace.
    (leader,) = _by_kind(objects, "Role")
    assert leader["metadata"]["namespace"] == "ops"
    assert granted_access([leader]) == {
        ("coordination.k8s.io", "leases", verb) for verb in ("get", "create", "update")
    }
    assert {r["metadata"]["name"] for r in _by_kind(objects, "ClusterRole")} == {
        "specdeploy",
        "specdeploy-cluster",
    }
    granted = granted_access(objects)
    assert ("", "namespaces", "list") not in granted
    assert ("specdeploy.dev", "speculativedeployments/status", "patch") in granted
    # OwnerReferencesPermissionEnforcement: children whose owner reference blocks deletion.
    assert ("specdeploy.dev", "speculativedeployments/finalizers", "update") in granted
    for binding in _by_kind(objects, "ClusterRoleBinding"):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "specdeploy", "namespace": "ops"}
        ]


@helm_test
def test_rbac_for_listed_namespaces_is_a_role_in_each(helm: Helm) -> None:
    objects = helm.template("-n", "ops", *set_values({"config": {"namespaces": ["a", "b"]}}))
    roles = [r for r in _by_kind(objects, "Role") if r["metadata"]["name"] == "specdeploy"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["a", "b"]
    assert sorted(b["metadata"]["namespace"] for b in _by_kind(objects, "RoleBinding")) == [
        "a",
        "b",
        "ops",  # the Lease's
    ]
    (cluster_role,) = _by_kind(objects, "ClusterRole")
    cluster_wide = granted_access([cluster_role])
    assert {resource for _, resource, _ in cluster_wide} == {
        "nodes",
        "customresourcedefinitions",
        "mutatingwebhookconfigurations",
        "namespaces",
        "workloadpriorityclasses",
    }
    all_namespaces = {r["metadata"]["name"]: r for r in _by_kind(helm.template(), "ClusterRole")}
    for role in roles:
        assert granted_access([role]) == granted_access([all_namespaces["specdeploy"]])


@helm_test
def test_optional_objects_are_off_by_default(helm: Helm) -> None:
    kinds = {o["kind"] for o in helm.template()}
    assert "NetworkPolicy" not in kinds
    assert "ServiceMonitor" not in kinds
    policy = _one(helm.template(*set_values({"networkPolicy": {"enabled": True}})), "NetworkPolicy")
    assert policy["spec"]["ingress"][0] == {
        "ports": [{"port": 8080, "protocol": "TCP"}, {"port": 8081, "protocol": "TCP"}]
    }
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]


@helm_test
def test_service_monitor_scrapes_the_metrics_port_of_the_operator_service(helm: Helm) -> None:
    objects = helm.template(
        "-n", "ops", *set_values({"serviceMonitor": {"enabled": True, "labels": {"team": "a"}}})
    )
    monitor = _one(objects, "ServiceMonitor")
    service = _one(objects, "Service")
    assert monitor["metadata"]["labels"]["team"] == "a"
    assert "release" not in monitor["metadata"]["labels"]
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s"}
    ]
    selected = monitor["spec"]["selector"]["matchLabels"]
    assert selected.items() <= service["metadata"]["labels"].items()
    metrics_port = {"name": "metrics", "port": 8081, "targetPort": "metrics", "protocol": "TCP"}
    assert metrics_port in service["spec"]["ports"]


@helm_test
def test_pod_monitor_labels_reach_the_operator_config_and_the_service_monitor(helm: Helm) -> None:
    values = {
        "config": {"podMonitorLabels": {"release": "kube-prometheus-stack"}},
        "serviceMonitor": {"enabled": True, "labels": {"team": "a"}},
    }
    objects = helm.template("-n", "ops", *set_values(values))
    config = OperatorConfig.from_mapping(
        yaml.safe_load(_one(objects, "ConfigMap")["data"]["config.yaml"])
    )
    assert config.pod_monitor_labels == {"release": "kube-prometheus-stack"}
    labels = _one(objects, "ServiceMonitor")["metadata"]["labels"]
    assert (labels["release"], labels["team"]) == ("kube-prometheus-stack", "a")


@helm_test
def test_helm_test_pod_asks_the_probe_endpoint_through_the_service(helm: Helm) -> None:
    objects = helm.template("-n", "ops")
    (test_pod,) = _by_kind(objects, "Pod")
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    service = _one(objects, "Service")
    url = test_pod["spec"]["containers"][0]["command"][-1]
    assert url == f"http://{service['metadata']['name']}.ops.svc:8080/healthz"
    assert service["spec"]["ports"][0]["targetPort"] == "probes"


def test_helm_error_names_the_command() -> None:
    error = HelmError(["template", "x"], 1, "", "boom")
    assert "helm template x exited 1: boom" in str(error)


def _resolved(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """A pydantic schema node with its $ref, anyOf-with-null and allOf wrappers taken off."""
    while True:
        if "$ref" in schema:
            schema = defs[schema["$ref"].rsplit("/", 1)[-1]]
        elif "anyOf" in schema:
            options = [s for s in schema["anyOf"] if s.get("type") != "null"]
            if len(options) != 1:
                return schema
            schema = options[0]
        elif "allOf" in schema and len(schema["allOf"]) == 1:
            schema = schema["allOf"][0]
        else:
            return schema


def _key_differences(
    model: dict[str, Any], chart: dict[str, Any], defs: dict[str, Any], path: str
) -> list[str]:
    """Where the chart's schema and the operator config's model hold other keys, at any depth."""
    model = _resolved(model, defs)
    found: list[str] = []
    if "properties" in model and "properties" in chart:
        mine, theirs = set(model["properties"]), set(chart["properties"])
        found += [
            f"{path}.{k}: in the operator config, not in values.schema.json"
            for k in sorted(mine - theirs)
        ]
        found += [
            f"{path}.{k}: in values.schema.json, not in the operator config"
            for k in sorted(theirs - mine)
        ]
        for key in sorted(mine & theirs):
            found += _key_differences(
                model["properties"][key], chart["properties"][key], defs, f"{path}.{key}"
            )
    elif "items" in model and "items" in chart:
        found += _key_differences(model["items"], chart["items"], defs, f"{path}[]")
    return found


def test_values_schema_holds_the_operator_configs_keys_at_every_depth() -> None:
    model = OperatorConfig.model_json_schema(by_alias=True)
    defs = model.get("$defs", {})
    config = {
        **model,
        "properties": {k: v for k, v in model["properties"].items() if k not in CHART_SET_CONFIG},
    }
    assert _key_differences(config, SCHEMA["properties"]["config"], defs, "config") == []


def test_the_chart_readme_says_the_replica_count_values_yaml_sets() -> None:
    chart = (CHART / "Chart.yaml").read_text()
    assert "(one replica," in render_readme(chart, "replicas: 1\n")
    assert "(3 replicas, one leader at a time," in render_readme(chart, "replicas: 3\n")
    shipped = (CHART / "README.md").read_text()
    assert f"({VALUES['replicas']} replicas, one leader at a time," in " ".join(shipped.split())
