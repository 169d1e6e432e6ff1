"""Hypothesis strategies derived from a structural (CRD-style) OpenAPI schema, and single edits.

A value is drawn node by node from the schema the API server enforces: types, enums, patterns,
bounds, required and optional properties, list sizes and list-map keys. An object's own CEL
rules (`x-kubernetes-validations`) filter that object as it is drawn, after the schema's
defaults are applied as the API server applies them, so almost every value drawn is one the
API server would store; the caller still judges the whole value (specdeploy.api.admission) and
drops the rare one that is refused.

Sizes are small on purpose: a tiny alphabet, short strings and lists and narrow number ranges
make equal and nearly equal values common, which is where hashing mistakes hide.

`edit_sites` lists every place a single edit can go in a value (replace a property, map entry or
list item, remove an optional one, add a new one), with the schema of that place;
`single_edits` draws neighbours of a value that each differ from it at exactly one of those.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from hypothesis import strategies as st

from specdeploy.api.admission import apply_defaults, broken_rules

# Letters, a digit, path and version punctuation, and one non-ASCII letter.
ALPHABET = "ab1./-é"
MAX_TEXT = 4
MAX_ITEMS = 3
INT_SPAN = 8
FLOAT_SPAN = 100.0
# Draws of one object (or string) before its CEL rules (or length) are given up on.
RULE_ATTEMPTS = 25
# Draws of an edit at one field before that field is skipped (every draw left it as it was).
EDIT_ATTEMPTS = 4

Path = tuple[str | int, ...]


def value_strategy(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values valid for `schema`, its own and its descendants' CEL rules included."""
    # One strategy per schema node, kept with the node so that its id is never reused.
    key = id(schema)
    if key not in _STRATEGIES:
        strategy = _bare_strategy(schema)
        if schema.get("x-kubernetes-validations"):
            strategy = _satisfying(strategy, schema)
        _STRATEGIES[key] = (schema, strategy)
    return _STRATEGIES[key][1]


_STRATEGIES: dict[int, tuple[dict[str, Any], st.SearchStrategy[Any]]] = {}


@st.composite
def _satisfying(draw: st.DrawFn, strategy: st.SearchStrategy[Any], schema: dict[str, Any]) -> Any:
    # Drawing the whole object again until every rule holds would mostly throw work away (a
    # draft breaks one of its six rules more often than not). A failed rule that names its
    # field (fieldPath) gets that field drawn again, present or absent; one that names none
    # gets the whole object drawn again.
    value = draw(strategy)
    for _ in range(RULE_ATTEMPTS):
        stored = apply_defaults(schema, copy.deepcopy(value))
        broken = next(broken_rules(schema, stored), None)
        if broken is None:
            break
        field = tuple(part for part in broken.get("fieldPath", "").split(".") if part)
        value = _redraw(draw, strategy, schema, value, field)
    # Still broken after every attempt: the caller's admission check refuses it (rejecting
    # here would make Hypothesis print this strategy, schema and all).
    return value


def _redraw(
    draw: st.DrawFn,
    strategy: st.SearchStrategy[Any],
    schema: dict[str, Any],
    value: Any,
    field: tuple[str, ...],
) -> Any:
    parent_schema, parent = schema, value
    for part in field[:-1]:
        parent_schema = parent_schema.get("properties", {}).get(part, {})
        parent = parent.get(part) if isinstance(parent, dict) else None
    sub = parent_schema.get("properties", {}).get(field[-1]) if field else None
    if sub is None or not isinstance(parent, dict):
        return draw(strategy)
    value = copy.deepcopy(value)
    target = _at(value, field[:-1])
    if field[-1] not in parent_schema.get("required", []) and draw(st.booleans()):
        target.pop(field[-1], None)
    else:
        target[field[-1]] = draw(value_strategy(sub))
    return value


def _bare_strategy(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    strategy = _typed_strategy(schema)
    default = schema.get("default")
    if default is not None and not isinstance(default, dict | list):
        # The default is the one value a user is most likely to write out explicitly. Second,
        # because Hypothesis favours the first alternative.
        strategy = st.one_of(strategy, st.just(default))
    return strategy


def _typed_strategy(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if schema.get("x-kubernetes-int-or-string"):
        return st.one_of(_integers(schema), _strings(schema))
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        return _objects(schema)
    if kind == "array":
        return _arrays(schema)
    if kind == "string":
        return _strings(schema)
    if kind == "integer":
        return _integers(schema)
    if kind == "number":
        return _numbers(schema)
    if kind == "boolean":
        return st.booleans()
    raise ValueError(f"no strategy for schema node {sorted(schema)}")


def _objects(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    properties: dict[str, Any] = schema.get("properties", {})
    if properties:
        required = set(schema.get("required", []))
        return st.fixed_dictionaries(
            {name: value_strategy(sub) for name, sub in properties.items() if name in required},
            optional={
                name: value_strategy(sub)
                for name, sub in properties.items()
                if name not in required
            },
        )
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        return st.dictionaries(_map_keys(), value_strategy(extra), max_size=MAX_ITEMS)
    return st.just({})


def _map_keys() -> st.SearchStrategy[str]:
    return st.text(ALPHABET, min_size=1, max_size=MAX_TEXT)


def _arrays(schema: dict[str, Any]) -> st.SearchStrategy[list[Any]]:
    keys: list[str] = schema.get("x-kubernetes-list-map-keys", [])
    low = schema.get("minItems", 0)
    return st.lists(
        value_strategy(schema["items"]),
        min_size=low,
        max_size=max(low, min(schema.get("maxItems", MAX_ITEMS), MAX_ITEMS)),
        unique_by=(lambda item: tuple(item.get(k) for k in keys)) if keys else None,
    )


def _strings(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    low = schema.get("minLength", 0)
    high = schema.get("maxLength")
    pattern = schema.get("pattern")
    if pattern is None:
        return st.text(ALPHABET, min_size=low, max_size=max(low, min(high or MAX_TEXT, MAX_TEXT)))
    return _retried(
        st.from_regex(pattern, fullmatch=True),
        lambda text: low <= len(text) <= (high if high is not None else len(text)),
    )


@st.composite
def _retried(draw: st.DrawFn, strategy: st.SearchStrategy[str], keep: Callable[[str], bool]) -> str:
    # A regex strategy knows nothing of minLength: `(...)?` patterns often give "". A filter
    # would give up after three tries and throw the whole example away.
    text = draw(strategy)
    for _ in range(RULE_ATTEMPTS):
        if keep(text):
            break
        text = draw(strategy)
    return text


def _integers(schema: dict[str, Any]) -> st.SearchStrategy[int]:
    low = schema.get("minimum")
    high = schema.get("maximum")
    if low is not None and schema.get("exclusiveMinimum") is True:
        low += 1
    if high is not None and schema.get("exclusiveMaximum") is True:
        high -= 1
    if low is None:
        low = -2 if high is None else high - INT_SPAN
    high = low + INT_SPAN if high is None else min(high, low + INT_SPAN)
    return st.integers(int(low), int(high))


def _numbers(schema: dict[str, Any]) -> st.SearchStrategy[float]:
    low = float(schema.get("minimum", 0.0))
    high = float(schema.get("maximum", low + FLOAT_SPAN))
    return st.floats(
        low,
        high,
        exclude_min=schema.get("exclusiveMinimum") is True,
        exclude_max=schema.get("exclusiveMaximum") is True,
        allow_nan=False,
        allow_infinity=False,
    )


@dataclass(frozen=True)
class EditSite:
    """One place a single edit can go: `path` (the property, map key or list index edited)."""

    path: Path
    # The schema path edited, list items as [] and map entries as {}: spec.engine.env[].name.
    field: str
    schema: dict[str, Any] = dataclasses.field(repr=False)
    # replace: set the property or item at `path` (present or not); remove: drop it;
    # add: a new map entry under a drawn key, or a new list item, in the container at `path`.
    action: Literal["replace", "remove", "add"]

    def describe(self) -> str:
        """`replace spec.pair.draft.model`, `remove spec.engine.env[0]`, ..."""
        text = ""
        for part in self.path:
            text += f"[{part}]" if isinstance(part, int) else f".{part}"
        return f"{self.action} {text.lstrip('.')}"


def edit_sites(
    schema: dict[str, Any], value: Any, path: Path = (), field: str = ""
) -> list[EditSite]:
    """Every single edit of `value` that stays within `schema`'s shape (rules may still fail)."""
    sites: list[EditSite] = []
    if isinstance(value, dict) and "properties" in schema:
        required = set(schema.get("required", []))
        for name, sub in schema["properties"].items():
            here, named = (*path, name), f"{field}.{name}".lstrip(".")
            sites.append(EditSite(here, named, sub, "replace"))
            if name in value:
                if name not in required:
                    sites.append(EditSite(here, named, sub, "remove"))
                sites += edit_sites(sub, value[name], here, named)
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        extra, named = schema["additionalProperties"], f"{field}{{}}"
        for key in value:
            sites.append(EditSite((*path, key), named, extra, "replace"))
            sites.append(EditSite((*path, key), named, extra, "remove"))
            sites += edit_sites(extra, value[key], (*path, key), named)
        sites.append(EditSite(path, named, schema, "add"))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        items, named = schema["items"], f"{field}[]"
        for index, item in enumerate(value):
            sites.append(EditSite((*path, index), named, items, "replace"))
            if len(value) > schema.get("minItems", 0):
                sites.append(EditSite((*path, index), named, items, "remove"))
            sites += edit_sites(items, item, (*path, index), named)
        if len(value) < schema.get("maxItems", MAX_ITEMS + 1):
            sites.append(EditSite(path, named, schema, "add"))
    return sites


class Edit:
    """A value one edit away from another: the site, what was put there, the whole new value.

    A plain class, not a dataclass: Hypothesis prints dataclasses field by field, and a
    failing example would print every edited copy in full.
    """

    def __init__(self, site: EditSite, new: Any, value: Any) -> None:
        self.site = site
        # What the edit put at the site (None for a removal); a new map entry is {key: value}.
        self.new = new
        self.value = value

    def __repr__(self) -> str:
        put = "" if self.site.action == "remove" else f" = {self.new!r}"
        return f"<{self.site.describe()}{put}>"


@st.composite
def single_edits(draw: st.DrawFn, schema: dict[str, Any], value: Any, count: int) -> list[Edit]:
    """Up to `count` edited copies of `value`, each one edit away from it, at distinct fields.

    Fields are picked, not sites, so a field with a long list under it is no likelier than
    any other. The fields are an order keyed by `value` itself, not drawn: Hypothesis makes
    most examples by mutating earlier ones, and drawn picks kept landing on the first fields
    in the list (the simplest choices), while the values drawn are as varied as one could want.
    """
    by_field: dict[str, list[EditSite]] = {}
    for site in edit_sites(schema, value):
        by_field.setdefault(site.field, []).append(site)
    digest = hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()
    fields = sorted(by_field, key=lambda field: hashlib.sha256((digest + field).encode()).digest())
    edits = []
    for field in fields[:count]:
        # A few tries at an edit that changes something: setting a field to the value it
        # already has proves nothing.
        for _ in range(EDIT_ATTEMPTS):
            edit = draw(_edited(value, draw(st.sampled_from(by_field[field]))))
            if edit.value != value:
                edits.append(edit)
                break
    return edits


@st.composite
def _edited(draw: st.DrawFn, value: Any, site: EditSite) -> Edit:
    result = copy.deepcopy(value)
    if site.action == "add":
        container = _at(result, site.path)
        if isinstance(container, list):
            new = draw(value_strategy(site.schema["items"]))
            container.append(new)
        else:
            key = draw(_map_keys())
            container[key] = draw(value_strategy(site.schema["additionalProperties"]))
            new = {key: container[key]}
        return Edit(site, new, result)
    *parents, last = site.path
    container = _at(result, tuple(parents))
    if site.action == "remove":
        del container[last]
        return Edit(site, None, result)
    container[last] = draw(value_strategy(site.schema))
    return Edit(site, container[last], result)


def _at(value: Any, path: Path) -> Any:
    for part in path:
        value = value[part]
    return value
