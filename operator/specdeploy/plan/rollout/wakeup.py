"""When an SD next has something to decide that no watch event announces.

A canary's verdict falls due when an analysis interval closes, and a collapse guard fires when
acceptance has stayed below its floor for `for`. Waiting for the periodic round would add up to
one round (`reconcileIntervalSeconds`, 30 s by default) to each verdict; instead every reconcile
computes the next such moment and the operator reconciles the SD again then (handlers.run).
Pure: the answer depends on the status the reconcile wrote and the settings alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from specdeploy.api.models import AnalysisStatus, CollapseStatus
from specdeploy.api.times import parse_time
from specdeploy.plan.rollout.analysis import Outcome, duration_seconds

#: Past the computed moment: the interval has surely closed (status times are whole seconds).
MARGIN = timedelta(milliseconds=50)


def next_verdict_at(analysis: AnalysisStatus | None, interval: str) -> datetime | None:
    """When the next interval of a running canary analysis closes (None: no analysis running).

    Interval n (from 0) closes `(n + 1) x interval` after the start (analysis.interval_number),
    so the next one to judge, `last_interval + 1`, closes at `(last_interval + 2) x interval`.
    """
    if analysis is None or analysis.outcome in (Outcome.PROMOTE, Outcome.ROLLBACK):
        return None
    if analysis.stage != "Live" or analysis.paused:
        return None
    started = parse_time(analysis.started_at)
    seconds = duration_seconds(interval) * (analysis.last_interval + 2)
    return started + timedelta(seconds=seconds) + MARGIN


def next_collapse_at(collapse: CollapseStatus | None, for_: str | None) -> datetime | None:
    """When a guard whose pair is below its floor fires if nothing changes (None: not pending)."""
    if collapse is None or for_ is None or collapse.triggered or collapse.below_since is None:
        return None
    return parse_time(collapse.below_since) + timedelta(seconds=duration_seconds(for_)) + MARGIN


def next_wake(
    analysis: AnalysisStatus | None,
    interval: str,
    collapse: CollapseStatus | None,
    collapse_for: str | None,
    now: datetime,
    *,
    also: Iterable[datetime | None] = (),
) -> datetime | None:
    """The earliest moment after `now` the SD has a verdict due, or None; `also` adds other
    moments (a progress deadline, the probe's figures awaited).

    A moment already past is dropped (the verdict could not be taken now, e.g. no usable data):
    the periodic round retries it, rather than a wake-up that would fire again at once.
    """
    moments = (next_verdict_at(analysis, interval), next_collapse_at(collapse, collapse_for))
    due = [at for at in (*moments, *also) if at is not None and at > now]
    return min(due) if due else None
