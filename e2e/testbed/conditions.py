"""Reading an object's status conditions, as the e2e tests, the demo and the benchmarks check
them: read from the object as the API server answered it, never through the operator's code."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def condition(obj: Mapping[str, Any], type_: str) -> dict[str, Any]:
    """The condition of this type in the object's status ({} when absent)."""
    for found in (obj.get("status") or {}).get("conditions") or []:
        if found.get("type") == type_:
            return dict(found)
    return {}


def is_ready(obj: Mapping[str, Any]) -> bool:
    """Its Ready condition is True (a pod, an SD)."""
    return condition(obj, "Ready").get("status") == "True"


def is_serving(pod: Mapping[str, Any]) -> bool:
    """Ready and not being deleted: a pod being deleted is out of its Service's endpoints
    whatever its Ready condition still says."""
    return is_ready(pod) and not (pod.get("metadata") or {}).get("deletionTimestamp")
