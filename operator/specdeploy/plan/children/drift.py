"""Whether a live child still holds what the operator set on it, as pure functions.

The operator owns the fields of its manifests, not whole objects: the API server adds defaults
(`imagePullPolicy`, `strategy`, …), other controllers add annotations, and other field managers
may add list entries that server-side apply would never remove. So a live object *holds* a
desired manifest when every field the manifest sets has the same value there; anything else is
ignored. Lists follow their Kubernetes merge strategy: lists of named things (containers, env,
ports, volumes) are matched by key, others (args, command, tolerations) must match whole; and a
few maps that Kubernetes treats as atomic (selectors) must match exactly, since an extra key
there changes what they select.

Each applied manifest carries the hash of itself in an annotation. When a live object's
annotation names the manifest the operator wants *now* but its fields differ, somebody else
changed them: that is drift, and the apply that follows reverts it (and says so in an Event).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from specdeploy.api.conditions import Reason
from specdeploy.plan.rollout.revisions import RolloutEvent

APPLIED_HASH_ANNOTATION = "specdeploy.dev/applied-hash"

# The merge key of each list of objects that Kubernetes merges by key (patchMergeKey / listMapKeys).
LIST_MAP_KEYS: Mapping[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "env": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "ownerReferences": ("uid",),
    "imagePullSecrets": ("name",),
    "schedulingGates": ("name",),
}
# Lists merged by key whose key depends on the object: container ports by port and protocol
# (the API server defaults protocol to TCP), Service ports likewise.
PORT_KEYS = ("containerPort", "port")

# Paths (dotted, list indices left out) of maps compared whole: Kubernetes marks selectors
# atomic, so server-side apply replaces them, and an extra key would change what they select.
ATOMIC_MAPS = frozenset(
    {"spec.selector", "spec.selector.matchLabels", "spec.template.spec.nodeSelector"}
)

# Resource quantities the API server stores in canonical form ("1" for 1, "1Gi" stays "1Gi",
# "1000m" becomes "1").
_SUFFIXES = {
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}


def manifest_hash(manifest: Mapping[str, Any]) -> str:
    """A stable hash of a desired manifest (the applied-hash annotation leaves itself out)."""
    canonical = json.dumps(
        _without_hash_annotation(manifest), sort_keys=True, separators=(",", ":"), default=str
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _without_hash_annotation(manifest: Mapping[str, Any]) -> Mapping[str, Any]:
    annotations = (manifest.get("metadata") or {}).get("annotations") or {}
    if APPLIED_HASH_ANNOTATION not in annotations:
        return manifest
    kept = {k: v for k, v in annotations.items() if k != APPLIED_HASH_ANNOTATION}
    metadata = {**manifest["metadata"], "annotations": kept}
    if not kept:
        del metadata["annotations"]
    return {**manifest, "metadata": metadata}


def with_applied_hash(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `manifest` whose metadata carries the annotation with its own hash."""
    body: dict[str, Any] = json.loads(json.dumps(manifest))
    digest = manifest_hash(body)
    body["metadata"].setdefault("annotations", {})[APPLIED_HASH_ANNOTATION] = digest
    return body


def parse_quantity(value: Any) -> Decimal | None:
    """A Kubernetes resource quantity as a number, or None when it is not one."""
    text = str(value).strip()
    if not text:
        return None
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if text.endswith(suffix):
            number, scale = text[: -len(suffix)], _SUFFIXES[suffix]
            break
    else:
        number, scale = text, Decimal(1)
    try:
        return Decimal(number) * scale
    except InvalidOperation:
        return None


def _scalars_equal(desired: Any, live: Any, in_resources: bool) -> bool:
    if desired == live:
        return True
    if isinstance(desired, bool) or isinstance(live, bool):
        return False
    if in_resources:
        a, b = parse_quantity(desired), parse_quantity(live)
        return a is not None and a == b
    return False


def _is_empty(value: Any) -> bool:
    return value is None or value in ({}, [])


def list_merge_key(field: str, item: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The merge key of a list of objects named `field` (by its first item), or None when
    Kubernetes treats that list as atomic."""
    if field in LIST_MAP_KEYS:
        return LIST_MAP_KEYS[field]
    if field == "ports":
        port = next((k for k in PORT_KEYS if k in item), None)
        return (port, "protocol") if port else None
    return None


def _key_of(item: Mapping[str, Any], keys: Sequence[str]) -> tuple[Any, ...]:
    # Protocol is defaulted to TCP by the API server when left out.
    return tuple(item.get(k, "TCP" if k == "protocol" else None) for k in keys)


def _label(item: Mapping[str, Any], keys: Sequence[str]) -> str:
    return ",".join(str(item.get(k, "TCP" if k == "protocol" else "")) for k in keys)


def differences(desired: Any, live: Any, path: str = "") -> list[str]:
    """The paths of fields set in `desired` that `live` does not hold (empty: it holds them all).

    Paths read like `spec.template.spec.containers[engine].image`.
    """
    found: list[str] = []
    _collect(desired, live, path, path, found)
    return found


def _collect(desired: Any, live: Any, path: str, schema_path: str, found: list[str]) -> None:
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            if not (_is_empty(desired) and live is None):
                found.append(path or ".")
            return
        if schema_path in ATOMIC_MAPS and set(live) != set(desired):
            found.append(path)
            return
        for key, value in desired.items():
            sub = f"{path}.{key}" if path else key
            sub_schema = f"{schema_path}.{key}" if schema_path else key
            if key not in live:
                if not _is_empty(value):
                    found.append(sub)
                continue
            _collect(value, live[key], sub, sub_schema, found)
        return
    if isinstance(desired, list):
        _collect_list(desired, live, path, schema_path, found)
        return
    in_resources = ".resources." in f".{schema_path}"
    if not _scalars_equal(desired, live, in_resources):
        found.append(path)


def _collect_list(
    desired: list[Any], live: Any, path: str, schema_path: str, found: list[str]
) -> None:
    if not isinstance(live, list):
        if not (desired == [] and live is None):
            found.append(path)
        return
    field = schema_path.rsplit(".", 1)[-1]
    keys = (
        list_merge_key(field, desired[0]) if desired and isinstance(desired[0], Mapping) else None
    )
    if keys is None:
        # Atomic list: same length, each item holds the desired one.
        if len(desired) != len(live):
            found.append(path)
            return
        for index, (want, have) in enumerate(zip(desired, live, strict=True)):
            _collect(want, have, f"{path}[{index}]", schema_path, found)
        return
    by_key = {_key_of(item, keys): item for item in live if isinstance(item, Mapping)}
    for want in desired:
        sub = f"{path}[{_label(want, keys)}]"
        have = by_key.get(_key_of(want, keys))
        if have is None:
            found.append(sub)
        else:
            _collect(want, have, sub, schema_path, found)


@dataclass(frozen=True)
class ApplyDecision:
    """Whether a child needs a write, and the out-of-band changes that write reverts."""

    write: bool
    reverted: tuple[str, ...] = ()


def decide_apply(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> ApplyDecision:
    """Compares a desired manifest (with its applied-hash annotation) with the live object.

    No write when the live object holds every desired field. A write otherwise; when the live
    object says it was last applied from this very manifest, the differing fields were changed
    by someone else and are listed as reverted.
    """
    if live is None:
        return ApplyDecision(write=True)
    changed = differences(desired, live)
    if not changed:
        return ApplyDecision(write=False)
    wanted = ((desired.get("metadata") or {}).get("annotations") or {}).get(APPLIED_HASH_ANNOTATION)
    applied = ((live.get("metadata") or {}).get("annotations") or {}).get(APPLIED_HASH_ANNOTATION)
    if wanted is not None and wanted == applied:
        return ApplyDecision(write=True, reverted=tuple(changed))
    return ApplyDecision(write=True)


def drift_event(kind: str, name: str, reverted: Sequence[str]) -> RolloutEvent:
    """The Warning Event saying which fields of a child were changed out of band and set back."""
    shown = ", ".join(reverted[:8]) + (
        f" and {len(reverted) - 8} more" if len(reverted) > 8 else ""
    )
    return RolloutEvent(
        Reason.DRIFT_REVERTED, f"{kind} {name} was changed out of band; set back {shown}", True
    )
