"""Writes docs/crd-reference.md, the SpeculativeDeployment API reference, from the CRD schema.

The reference walks the same openAPIV3Schema that `make crds` writes (specdeploy.api.crd, itself
generated from the pydantic models), so field paths, types, defaults, descriptions, enums, bounds
and CEL rules are the ones the API server enforces. `make docs` writes it; `make lint` and
tests/test_crd_reference.py fail when the committed file is stale.

    python hack/crd_reference.py           # write docs/crd-reference.md
    python hack/crd_reference.py --check   # exit 1 when it is stale
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

from specdeploy.api.crd import CEL_RULES, PRINTER_COLUMNS, openapi_v3_schema  # noqa: E402
from specdeploy.api.models import API_VERSION, KIND, SHORT_NAMES  # noqa: E402

REFERENCE = ROOT / "docs" / "crd-reference.md"


@dataclass(frozen=True)
class FieldRow:
    """One field of the reference: where it is, what it holds, what the API server checks."""

    path: str
    type: str
    default: str
    description: str
    validation: tuple[str, ...]


def type_name(node: dict[str, Any]) -> str:
    """The field's type as a reader writes it: `[]string`, `map[string]string`, `int or string`."""
    if node.get("x-kubernetes-int-or-string"):
        return "int or string"
    kind = str(node.get("type", "object"))
    if kind == "array":
        return "[]" + type_name(node.get("items") or {})
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return "map[string]" + type_name(node["additionalProperties"])
    return f"{kind} ({node['format']})" if "format" in node else kind


def _bound(node: dict[str, Any], key: str, inclusive: str, exclusive: str) -> str | None:
    if key not in node:
        return None
    strict = node.get("exclusiveMinimum" if key == "minimum" else "exclusiveMaximum") is True
    return f"{exclusive if strict else inclusive} {node[key]}"


def checks(node: dict[str, Any], required: bool) -> list[str]:
    """The schema's own checks of one field, in words."""
    found = ["required"] if required else []
    if "enum" in node:
        found.append("one of " + ", ".join(f"`{v}`" for v in node["enum"]))
    for key, inclusive, exclusive in (("minimum", ">=", ">"), ("maximum", "<=", "<")):
        if (text := _bound(node, key, inclusive, exclusive)) is not None:
            found.append(text)
    for key, words in (
        ("minLength", "length >="),
        ("maxLength", "length <="),
        ("minItems", "items >="),
        ("maxItems", "items <="),
    ):
        if key in node:
            found.append(f"{words} {node[key]}")
    if "pattern" in node:
        found.append(f"pattern `{node['pattern']}`")
    if node.get("x-kubernetes-list-type") == "map":
        keys = ", ".join(f"`{k}`" for k in node["x-kubernetes-list-map-keys"])
        found.append(f"unique by {keys}")
    return found


def walk(
    node: dict[str, Any], path: str, required: bool = False
) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """Every field under `node` (itself first), lists as `path[]`, in schema order."""
    yield path, node, required
    needed = set(node.get("required") or [])
    for name, sub in (node.get("properties") or {}).items():
        yield from walk(sub, f"{path}.{name}" if path else name, name in needed)
    items = node.get("items")
    if isinstance(items, dict) and "properties" in items:
        for name, sub in items["properties"].items():
            yield from walk(sub, f"{path}[].{name}", name in set(items.get("required") or []))


def rows(root: str) -> list[FieldRow]:
    """The reference rows of `spec`, `status` or `metadata`, CEL rules on the field they name."""
    schema = openapi_v3_schema()
    rules: dict[str, list[str]] = {}
    for rule in CEL_RULES:
        where = rule.error_path.replace(".items", "[]")
        rules.setdefault(where, []).append(f"CEL: {rule.message}")
    found = []
    required_at_root = root in set(schema.get("required") or [])
    for path, node, required in walk(schema["properties"][root], root, required_at_root):
        default = node.get("default")
        found.append(
            FieldRow(
                path=path,
                type=type_name(node),
                default="" if default is None else f"`{_json(default)}`",
                description=str(node.get("description", "")),
                validation=(*checks(node, required), *rules.get(path, [])),
            )
        )
    return found


def _json(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _cell(text: str) -> str:
    return text.replace("\n", " ").replace("|", "\\|")


def table(found: list[FieldRow]) -> list[str]:
    lines = [
        "| Field | Type | Default | Description | Validation |",
        "|---|---|---|---|---|",
    ]
    for row in found:
        lines.append(
            f"| `{row.path}` | {_cell(row.type)} | {_cell(row.default)} | "
            f"{_cell(row.description)} | {_cell('; '.join(row.validation))} |"
        )
    return lines


def render_reference() -> str:
    """The whole of docs/crd-reference.md."""
    lines = [
        "<!-- Generated by `make docs` (hack/crd_reference.py) from"
        " operator/specdeploy/api/models.py and api/crd.py. Do not edit. -->",
        f"# {KIND} API reference ({API_VERSION})",
        "",
        f"Short name: `{', '.join(SHORT_NAMES)}`. Every field, its type, the default the API server"
        " stores, and what it checks at `kubectl apply`: the schema (enums, bounds, patterns) and"
        " the cross-field CEL rules, each listed on the field its error names. Lists read"
        " `field[].item`. `kubectl explain sd.spec.<field>` shows the same descriptions.",
        "",
        "## metadata",
        "",
        *table(rows("metadata")),
        "",
        "## spec",
        "",
        *table(rows("spec")),
        "",
        "## status",
        "",
        "Written by the operator only (the status subresource).",
        "",
        *table(rows("status")),
        "",
        "## Cross-field rules (CEL)",
        "",
        "The API server evaluates these on the object at *Where*; its error reads"
        " `<Field>: Invalid value: <message>`.",
        "",
        "| Field | Message | Where | Rule |",
        "|---|---|---|---|",
    ]
    for rule in CEL_RULES:
        lines.append(
            f"| `{rule.error_path.replace('.items', '[]')}` | {_cell(rule.message)} | "
            f"`{rule.path.replace('.items', '[]') or '.'}` | `{_cell(rule.rule)}` |"
        )
    lines += [
        "",
        "## kubectl get columns",
        "",
        "| Column | JSONPath | Shown |",
        "|---|---|---|",
    ]
    for column in PRINTER_COLUMNS:
        shown = "`-o wide`" if column.get("priority") else "always"
        lines.append(f"| {column['name']} | `{column['jsonPath']}` | {shown} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 when the file is stale")
    args = parser.parse_args(argv)
    text = render_reference()
    if args.check:
        current = REFERENCE.read_text(encoding="utf-8") if REFERENCE.exists() else ""
        if current != text:
            print(f"{REFERENCE.relative_to(ROOT)} is stale: run `make docs`", file=sys.stderr)
            return 1
        return 0
    REFERENCE.write_text(text, encoding="utf-8")
    print(REFERENCE.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
