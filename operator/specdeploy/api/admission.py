"""A local stand-in for the API server's validation of a SpeculativeDeployment (render, tests).

It applies the CRD's defaults, checks the OpenAPI schema with jsonschema (plus the list-map key
uniqueness the API server adds), and evaluates the CEL rules with cel-python, formatting errors
as the API server (v1.36) does (`<path>: Invalid value: <message>`). Kubernetes' own CEL
library functions the rules use (isSorted) are provided here. The real API server remains the
judge: the test bed runs the same fixtures against it.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
from collections.abc import Iterator
from typing import Any

import celpy
import celpy.adapter
import jsonschema

from specdeploy.api.crd import openapi_v3_schema


def _json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """OpenAPI v3.0 (Kubernetes flavour) to JSON Schema, for jsonschema."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: _json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _json_schema(value)
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            if value is True:
                out[key] = node["minimum" if key == "exclusiveMinimum" else "maximum"]
        elif key.startswith("x-kubernetes-") or key == "nullable":
            continue
        else:
            out[key] = value
    if out.get("exclusiveMinimum") is not None and "minimum" in out:
        del out["minimum"]
    if out.get("exclusiveMaximum") is not None and "maximum" in out:
        del out["maximum"]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """The object with the schema's defaults filled in, as the API server stores it."""
    if isinstance(value, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(sub, value[name])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(schema["items"], item) for item in value]
    return value


def _path(parts: Any) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text.lstrip(".")


def _walk(
    schema: dict[str, Any], value: Any, path: str = ""
) -> Iterator[tuple[str, dict[str, Any], Any]]:
    if value is None:
        return
    yield path, schema, value
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                yield from _walk(sub, value[name], f"{path}.{name}".lstrip("."))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            yield from _walk(schema["items"], item, f"{path}[{index}]")


def schema_errors(schema: dict[str, Any], value: Any) -> list[str]:
    """Schema violations as `<path>: <jsonschema message>`, plus duplicate list-map keys."""
    if schema is crd_schema():
        validator = _crd_validator()
    else:
        validator = jsonschema.Draft7Validator(_json_schema(schema))
    errors = []
    for error in validator.iter_errors(value):
        path = _path(error.absolute_path)
        if error.validator == "required":
            # Name the missing field, as the API server does ("spec.pair: Required value").
            missing = error.message.split("'")[1]
            errors.append(f"{path}.{missing}: Required value".lstrip("."))
        else:
            errors.append(f"{path}: {error.message}")
    for path, node, item in _walk(schema, value):
        if node.get("x-kubernetes-list-type") == "map" and isinstance(item, list):
            keys = node["x-kubernetes-list-map-keys"]
            seen: set[tuple[Any, ...]] = set()
            for index, element in enumerate(item):
                key = tuple(element.get(k) for k in keys)
                if key in seen:
                    errors.append(f"{path}[{index}]: Duplicate value: {element}")
                seen.add(key)
    return errors


def _is_sorted(values: Any) -> celpy.celtypes.BoolType:
    items = list(values)
    return celpy.celtypes.BoolType(all(a <= b for a, b in itertools.pairwise(items)))


# Built on import: it raises the interpreter's recursion limit, which Hypothesis warns about
# when it happens inside a property test.
_CEL = celpy.Environment()


@functools.cache
def _cel_program(rule: str) -> celpy.Runner:
    # Parsing a rule costs far more than evaluating it; property tests evaluate thousands.
    return _CEL.program(_CEL.compile(rule), functions={"isSorted": _is_sorted})


# Results by (rule, value as canonical JSON): property tests judge thousands of values that
# differ from each other in one field, so most objects in them were judged before.
_RESULTS: dict[tuple[str, str], bool] = {}
_MAX_RESULTS = 100_000


def broken_rules(node: dict[str, Any], item: Any) -> Iterator[dict[str, Any]]:
    """The `x-kubernetes-validations` entries of `node` itself that `item` breaks, lazily."""
    rules = node.get("x-kubernetes-validations", [])
    if not rules:
        return
    canonical = json.dumps(item, sort_keys=True)
    for rule in rules:
        key = (rule["rule"], canonical)
        if key not in _RESULTS:
            if len(_RESULTS) >= _MAX_RESULTS:
                _RESULTS.clear()
            activation = {"self": celpy.adapter.json_to_cel(item)}
            result = _cel_program(rule["rule"]).evaluate(activation)
            _RESULTS[key] = not isinstance(result, Exception) and bool(result)
        if not _RESULTS[key]:
            yield rule


def cel_errors(schema: dict[str, Any], value: Any) -> list[str]:
    """CEL rule failures, formatted as the API server formats them."""
    errors: list[str] = []
    for path, node, item in _walk(schema, value):
        for rule in broken_rules(node, item):
            where = (path + rule.get("fieldPath", "")).lstrip(".")
            errors.append(f"{where}: Invalid value: {rule['message']}")
    return errors


@functools.cache
def crd_schema() -> dict[str, Any]:
    """The CRD's openAPIV3Schema, built once per test session; callers must not modify it."""
    return openapi_v3_schema()


@functools.cache
def _crd_validator() -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(_json_schema(crd_schema()))


def admission_errors(body: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(schema errors, CEL errors) for a SpeculativeDeployment body, after defaulting."""
    schema = crd_schema()
    stored = apply_defaults(schema, copy.deepcopy(body))
    return schema_errors(schema, stored), cel_errors(schema, stored)
