"""Whose object a child's name holds: the operator writes only objects it made for that SD.

Every child carries the SD's controller owner reference and the labels `specdeploy.dev/name`
and `app.kubernetes.io/managed-by: specdeploy` (plan.children.manifests). An object of a child's
name is this SD's to write when it has an owner reference with the SD's uid, or, with no owner
at all, both labels naming this SD (an orphan, such as `kubectl delete --cascade=orphan` leaves
behind, is adopted as a Deployment adopts its ReplicaSets). Anything else (a Service a person
made, an object another SD or controller owns, one left by an earlier SD of the same name until
the garbage collector removes it) is someone else's: the operator leaves it untouched and says
so (status.refusedWrites, reason NameTaken), never adopting an object by its name alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specdeploy.api import labels


def foreign_holder(live: Mapping[str, Any] | None, sd_name: str, uid: str | None) -> str | None:
    """Why the object `live` (as the API server holds it, under a child's name) is not the SD
    `sd_name`'s with `uid` to write, as a phrase ("owned by Deployment web"); None when it is
    the SD's own, an orphan of it, or absent."""
    if live is None:
        return None
    metadata = live.get("metadata") or {}
    refs = [r for r in metadata.get("ownerReferences") or [] if isinstance(r, Mapping)]
    if uid and any(r.get("uid") == uid for r in refs):
        return None
    if refs:
        owner = next((r for r in refs if r.get("controller")), refs[0])
        return f"owned by {owner.get('kind', '?')} {owner.get('name', '?')}"
    marks = metadata.get("labels") or {}
    if marks.get(labels.NAME) == sd_name and marks.get(labels.MANAGED_BY) == (
        labels.MANAGED_BY_VALUE
    ):
        return None
    return "not made by specdeploy for this SD"
