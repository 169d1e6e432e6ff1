"""The generated CRD is current, structural, and carries its rules, columns and subresources."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specdeploy.api.crd import (
    CEL_RULES,
    CRD_FILE_NAME,
    build_crd,
    openapi_v3_schema,
    render_crd_yaml,
)

ROOT = Path(__file__).resolve().parents[1]


def _nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}{{}}")


def test_committed_crd_is_current() -> None:
    committed = (ROOT / "crds" / CRD_FILE_NAME).read_text(encoding="utf-8")
    assert committed == render_crd_yaml(), "crds/ is stale: run `make crds` and commit"


def test_schema_is_structural() -> None:
    for path, node in _nodes(openapi_v3_schema()):
        assert "$ref" not in node, path
        assert "$defs" not in node, path
        assert "title" not in node, path
        assert "uniqueItems" not in node, path
        if node.get("x-kubernetes-int-or-string"):
            assert node.get("anyOf", [{"type": "integer"}, {"type": "string"}]) == [
                {"type": "integer"},
                {"type": "string"},
            ], path
            continue
        assert "anyOf" not in node, path
        assert "oneOf" not in node, path
        assert "type" in node, f"{path} has no type"
        if "properties" in node:
            assert "additionalProperties" not in node, path
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert node.get(bound, True) is True, f"{path}.{bound} must be boolean"
        if node.get("type") in ("object", "array") or node.get("nullable"):
            assert "default" not in node or not isinstance(node["default"], dict | list), path


def test_status_has_no_defaults() -> None:
    status = openapi_v3_schema()["properties"]["status"]
    assert all("default" not in node for _, node in _nodes(status))


def test_conditions_are_a_map_keyed_by_type() -> None:
    conditions = openapi_v3_schema()["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]


def test_crd_names_subresources_and_columns() -> None:
    crd = build_crd()
    assert crd["metadata"]["name"] == "speculativedeployments.specdeploy.dev"
    assert crd["spec"]["names"]["shortNames"] == ["sd"]
    assert "specdeploy" in crd["spec"]["names"]["categories"]
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1"
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert version["subresources"]["status"] == {}
    columns = [c["name"] for c in version["additionalPrinterColumns"] if "priority" not in c]
    assert columns == ["Pair", "Revision", "Ready", "Acceptance", "Queue", "Phase", "Age"]


def test_every_cel_rule_is_in_the_schema_once() -> None:
    rules = [
        entry
        for _, node in _nodes(openapi_v3_schema())
        for entry in node.get("x-kubernetes-validations", [])
    ]
    assert len(rules) == len(CEL_RULES)
    for rule in CEL_RULES:
        assert "\n" not in rule.message
