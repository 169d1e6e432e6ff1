"""A new SD's first status: written with its first Ready pods, or with the first bad news, or
once the SD is FIRST_STATUS_GRACE old, whichever comes first.

While a new SD's pods come up, each watch event of its Deployment and pods reconciles it, and
every reconcile would write a status that says only "not ready yet". On a busy API server that
write is the longest step of the reconcile, and the reconcile the pods' turn to Ready asks for
waits behind it. So while the SD has never had a status, is younger than the grace, and its
status would say nothing but "replicas not ready" (no Warning, no other reason on Ready), the
status is left for a later reconcile: the one the pods' readiness starts writes it whole, or the
one this decision's `wake_at` asks for when the grace ends. Nothing is lost meanwhile: the status
is recomputed from the world by every reconcile, and the condition Events it tells are told with
it; the Events of child writes are posted at once.

The age is read from `metadata.creationTimestamp` (whole seconds, so the grace lasts between 1
and 2 s from the create). A stamp later than the operator's clock (clocks apart) writes at once,
so a clock behind the API server's cannot hold status back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from specdeploy.api.conditions import ConditionType, Reason
from specdeploy.api.times import parse_time
from specdeploy.plan.rollout.revisions import RolloutEvent

#: How long a new SD's first status may wait for its first Ready pods.
FIRST_STATUS_GRACE = timedelta(seconds=2)


def first_status_due(
    body: Mapping[str, Any],
    status: Mapping[str, Any],
    events: Sequence[RolloutEvent],
    now: datetime,
) -> datetime | None:
    """When the first status of the SD `body` is due, if it may wait until then; None when
    `status` is to be written now (the SD has had a status, is older than the grace, its
    creation time is unknown or ahead of `now`, or `status` or `events` say more than "replicas
    not ready")."""
    if body.get("status"):
        return None
    stamp = (body.get("metadata") or {}).get("creationTimestamp")
    try:
        created = parse_time(stamp) if isinstance(stamp, str) else None
    except ValueError:
        created = None
    if created is None:
        return None
    due = created + FIRST_STATUS_GRACE
    if not created <= now < due:
        return None
    if any(event.warning for event in events):
        return None
    ready = next(
        (c for c in status.get("conditions") or [] if c.get("type") == ConditionType.READY), None
    )
    if ready is None or ready.get("status") != "False":
        return None
    if ready.get("reason") != Reason.REPLICAS_NOT_READY:
        return None
    return due
