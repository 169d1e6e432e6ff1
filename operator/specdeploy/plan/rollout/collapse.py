"""The collapse guard as a pure function: first-position acceptance of the serving pair (the
share of its drafts whose first token was accepted, which does not fall with k) below a floor
for long enough triggers an action, once, and holds it until the spec names another pair or a
person asks for speculation back.

vLLM cannot switch speculation off at run time (TensorRT-LLM can, at engine level), so every
action goes through pods: DisableSpeculation rolls out the same target without a draft (a new
revision), RollbackToPrevious serves the last revision that served before this pair, AlertOnly
only says so (Degraded, a Warning Event).

It cannot flap: a window with too few draft tokens (or no data) changes nothing; acceptance must
stay below `floor` for all of `for` (any window at or above `floor + HYSTERESIS` starts the count
again; one between the two neither counts nor resets); and once fired, the action holds until the
spec names another pair, or the annotation `specdeploy.dev/resume-speculation` names the pair's
revision (a later resume of the same revision needs a new value, such as `<revision>-2`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from specdeploy.api.conditions import Reason
from specdeploy.api.models import CollapseGuardSpec, CollapseStatus
from specdeploy.api.times import RFC3339, parse_time
from specdeploy.plan.rollout.analysis import Measurement, duration_seconds
from specdeploy.plan.rollout.revisions import RolloutEvent

HYSTERESIS = 0.05
RESUME_ANNOTATION = "specdeploy.dev/resume-speculation"


@dataclass(frozen=True)
class GuardVerdict:
    """The guard's state to keep in status, whether its action applies, and its Events."""

    state: CollapseStatus | None
    fired: bool = False
    events: tuple[RolloutEvent, ...] = ()


def _asks_resume(value: str | None, pair_revision: str) -> bool:
    """The annotation names the revision, alone or with a suffix (`<revision>-2`) so that a
    later resume can be asked for again."""
    return value is not None and (value == pair_revision or value.startswith(f"{pair_revision}-"))


def watch_collapse(
    previous: CollapseStatus | None,
    *,
    guard: CollapseGuardSpec | None,
    pair_revision: str | None,
    serving: bool,
    measured: Measurement | None,
    min_draft_tokens: int,
    resume: str | None,
    now: datetime,
) -> GuardVerdict:
    """Advances the guard over the pair revision the spec names (with its draft).

    `serving` says whether that revision is the stable one now (the guard only judges a pair
    that serves); `measured` is what Prometheus says of it; `resume` is the value of the
    resume annotation.
    """
    if guard is None or pair_revision is None:
        return GuardVerdict(state=None)
    state = previous if previous is not None and previous.revision == pair_revision else None
    if state is not None and state.triggered:
        if _asks_resume(resume, pair_revision) and resume != state.resumed_with:
            return GuardVerdict(
                state=CollapseStatus(
                    revision=pair_revision, resumed_with=resume, message="resumed by annotation"
                ),
                events=(
                    RolloutEvent(
                        Reason.SPECULATION_ENABLED,
                        f"speculation resumed on revision {pair_revision} ({RESUME_ANNOTATION})",
                    ),
                ),
            )
        return GuardVerdict(state=state, fired=True)
    state = state or CollapseStatus(revision=pair_revision)
    usable = (
        serving
        and measured is not None
        and measured.error is None
        and measured.first_position_acceptance is not None
        and measured.draft_tokens >= min_draft_tokens
    )
    rate = measured.first_position_acceptance if measured is not None else None
    if not usable or rate is None:
        return GuardVerdict(state=state)
    stamp = now.strftime(RFC3339)
    if rate >= guard.floor + HYSTERESIS:
        return GuardVerdict(
            state=state.model_copy(
                update={"below_since": None, "message": f"first-position acceptance {rate:.2f}"}
            )
        )
    if rate >= guard.floor:
        return GuardVerdict(state=state)
    since = state.below_since or stamp
    lasted = (now - parse_time(since)).total_seconds()
    message = (
        f"first-position acceptance {rate:.2f} < floor {guard.floor:.2f} since {since} "
        f"({lasted:.0f}s of {guard.for_}) on revision {pair_revision}"
    )
    if lasted < duration_seconds(guard.for_):
        return GuardVerdict(
            state=state.model_copy(update={"below_since": since, "message": message})
        )
    fired = state.model_copy(
        update={
            "below_since": since,
            "triggered": True,
            "action": guard.action,
            "message": message,
        }
    )
    back = (
        f"speculation comes back when the spec names another pair or annotation "
        f"{RESUME_ANNOTATION}={pair_revision} is set"
    )
    return GuardVerdict(
        state=fired,
        fired=True,
        events=(
            RolloutEvent(
                Reason.ACCEPTANCE_COLLAPSED, f"{message}: {guard.action}; {back}", warning=True
            ),
        ),
    )
