"""Status as pure functions: conditions, phase, the status a reconcile writes, and its patch.

The launcher's verdict on the pair is one of the inputs: a refused desired revision makes Ready
and Progressing say so, is marked Failed in the revision history, and leaves the SD Degraded
while a stable revision serves (Failed when none does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specdeploy.api import labels
from specdeploy.api.conditions import ConditionType, Phase, Reason, RevisionPhase
from specdeploy.api.models import (
    AnalysisStatus,
    AutotuneStatus,
    ProbeFigures,
    RevisionDraft,
    RevisionStatus,
    RevisionTarget,
    RolloutProgress,
    SizingDecision,
    SpeculationStatus,
    SpeculativeDeployment,
    SpeculativeDeploymentStatus,
    Verdict,
)
from specdeploy.api.times import parse_time
from specdeploy.plan.rollout.analysis import Measurement, Outcome
from specdeploy.plan.rollout.collapse import GuardVerdict
from specdeploy.plan.rollout.lifecycle import CanaryJudgement, EndReason, Stage
from specdeploy.plan.rollout.revisions import RevisionDeployment, RolloutEvent, RolloutPlan
from specdeploy.plan.status.conditions import ConditionUpdate, set_conditions
from specdeploy.plan.status.crash_loop import CrashLoop
from specdeploy.plan.status.pair_check import PairVerdict
from specdeploy.plan.status.pod_failure import PodFailure
from specdeploy.plan.status.refusal import (
    RefusedWrite,
    refusal_condition,
    refusals_status,
    revision_refusal,
)


def status_patch(current: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that makes the keys of `desired` exactly so in `current`.

    Empty when nothing differs, so a steady reconcile writes nothing. Inside those keys,
    anything `current` holds that `desired` does not is removed (a None in the patch), so no
    stale field outlives the decision that wrote it; lists are replaced whole. Keys `desired`
    does not mention (other writers' fields) are left alone; a None value in `desired` removes
    its key.
    """
    return merge_patch(dict(current or {}), desired, prune=False)


def merge_patch(
    current: Mapping[str, Any], desired: Mapping[str, Any], prune: bool
) -> dict[str, Any]:
    """The RFC 7386 patch from `current` to `desired`; with `prune`, keys only `current` has
    are removed too."""
    patch: dict[str, Any] = {}
    for key, value in desired.items():
        before = current.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            inner = merge_patch(before, value, prune=True)
            if inner:
                patch[key] = inner
        elif before != value:
            patch[key] = value
    if prune:
        patch.update({key: None for key in current if key not in desired})
    return patch


@dataclass(frozen=True)
class ObservedRollout:
    """What a reconcile saw and decided, the inputs of the status it writes."""

    sizing: SizingDecision | None
    sizing_problem: str | None
    speculation: SpeculationStatus
    desired_revision: str | None
    plan: RolloutPlan
    revisions: Sequence[RevisionDeployment]
    admission: ConditionUpdate
    selector: str
    pair: PairVerdict
    canary: CanaryJudgement = field(default_factory=lambda: CanaryJudgement(state=None))
    measurements: Mapping[str, Measurement] = field(default_factory=dict)
    #: How often the serving figures (acceptance rate, mean acceptance length) are refreshed.
    figures_every_seconds: float = 60.0
    collapse: GuardVerdict = field(default_factory=lambda: GuardVerdict(state=None))
    autotune: AutotuneStatus | None = None
    #: An engine of the desired revision that keeps exiting (not the launcher's verdict).
    crash_loop: CrashLoop | None = None
    #: When the desired revision became the desired one (status.revisions[].since).
    since: str | None = None
    #: A new revision that is no canary past its progress deadline: why.
    overdue: str | None = None
    #: Every revision's probe figures, for status.revisions[].probe.
    probes: Mapping[str, ProbeFigures] = field(default_factory=dict)
    #: The revision a person's undo serves in place of the spec's, if any.
    undone: str | None = None
    #: A pod of the desired revision that cannot start (image, config, memory, scheduling).
    pod_failure: PodFailure | None = None
    #: Children not written (plan.status.refusal): Ready says so, the rest goes on.
    refused_writes: Sequence[RefusedWrite] = ()

    @property
    def held_by_kueue(self) -> bool:
        """Admitted is False because Kueue holds the pods back (not because it lets them by)."""
        return self.admission.status == "False" and self.admission.reason != Reason.QUOTA_BYPASSED

    def start_problem(self) -> tuple[str, str] | None:
        """(reason, detail) of why the desired revision's pods cannot start, if they show it:
        a pod failure first, then an engine that keeps exiting."""
        revision = self.desired_revision or ""
        if self.pod_failure is not None:
            return self.pod_failure.reason, self.pod_failure.describe(revision)
        if self.crash_loop is not None:
            return Reason.ENGINE_CRASH_LOOPING, self.crash_loop.describe(revision)
        return None

    @property
    def analysis(self) -> AnalysisStatus | None:
        """The analysis of the desired revision, if it has one."""
        state = self.canary.state
        return state if state is not None and state.revision == self.desired_revision else None

    @property
    def rolled_back(self) -> bool:
        """The desired revision was rolled back by its analysis, a person or its deadline."""
        analysis = self.analysis
        rolled = analysis is not None and analysis.outcome == Outcome.ROLLBACK
        return rolled or (self.overdue is not None and self.plan.stable_revision is not None)


@dataclass(frozen=True)
class Stop:
    """Why the rollout stopped the desired pair while another revision serves."""

    reason: str
    detail: str


#: The condition reason of each way an analysis ends in a rollback (status.analysis.reason).
STOP_REASONS = {
    EndReason.PROGRESS_DEADLINE: Reason.PROGRESS_DEADLINE_EXCEEDED,
    EndReason.INCONCLUSIVE_LIMIT: Reason.INCONCLUSIVE_LIMIT_REACHED,
    EndReason.ABORTED: Reason.ABORTED,
}


def _stopped(seen: ObservedRollout, recorded: Sequence[RevisionStatus]) -> Stop | None:
    """Why the desired pair was rolled back (its analysis, a person, a deadline), or None."""
    desired, stable = seen.desired_revision, seen.plan.stable_revision
    serving = f"; revision {stable} keeps serving" if stable and stable != desired else ""
    analysis = seen.analysis
    if analysis is not None and analysis.outcome == Outcome.ROLLBACK:
        reason = STOP_REASONS.get(analysis.reason or "", Reason.ROLLED_BACK)
        counted = reason == Reason.ROLLED_BACK and analysis.failures > 0
        failures = f", {analysis.failures} failed verdicts" if counted else ""
        return Stop(
            reason, f"revision {desired} rolled back: {analysis.message}{failures}{serving}"
        )
    if seen.overdue is not None and stable is not None:
        return Stop(
            Reason.PROGRESS_DEADLINE_EXCEEDED,
            f"revision {desired} rolled back: {seen.overdue}{serving}",
        )
    record = next((r for r in recorded if r.revision == desired), None)
    last = record.verdicts[-1] if record is not None and record.verdicts else None
    if (
        record is not None
        and record.phase == RevisionPhase.FAILED
        and last is not None
        and last.source == "Deadline"
        and stable is not None
    ):
        return Stop(
            Reason.PROGRESS_DEADLINE_EXCEEDED,
            f"revision {desired} rolled back: {last.message}{serving}",
        )
    return None


def _refused_desired(seen: ObservedRollout) -> bool:
    problem = seen.pair.desired_problem
    return problem is not None and problem.permanent and seen.desired_revision is not None


def _refusal_reason(seen: ObservedRollout) -> str:
    """PairIncompatible (exit 3) or ArgumentsRefused (exit 2)."""
    problem = seen.pair.desired_problem
    return problem.reason if problem is not None else Reason.PAIR_INCOMPATIBLE


def _refusal_detail(seen: ObservedRollout) -> str:
    stable = seen.plan.stable_revision
    serving = (
        f"; revision {stable} keeps serving" if stable and stable != seen.desired_revision else ""
    )
    return f"revision {seen.desired_revision} refused by the engine launcher{serving}"


def _stable_serves(sd: SpeculativeDeployment, seen: ObservedRollout) -> RevisionDeployment | None:
    """The stable revision when it is not the desired one and all spec.replicas of it are
    ready: it serves while the desired pair is stopped."""
    stable = seen.plan.stable_revision
    if stable is None or stable == seen.desired_revision:
        return None
    found = next((r for r in seen.revisions if r.revision == stable), None)
    replicas = sd.spec.replicas
    serves = found is not None and found.ready_replicas >= replicas and found.fully_ready
    return found if serves else None


def _ready_update(
    sd: SpeculativeDeployment, seen: ObservedRollout, stop: Stop | None
) -> ConditionUpdate:
    desired = next((r for r in seen.revisions if r.revision == seen.desired_revision), None)
    replicas = sd.spec.replicas
    nodes = (seen.sizing.nodes_per_replica if seen.sizing else None) or 1
    # A replica across nodes is a group of pods, ready when all of them are.
    unit = f"groups of {nodes} pods" if nodes > 1 else "pods"
    if seen.desired_revision is None:
        return ConditionUpdate(
            ConditionType.READY, "False", Reason.UNSCHEDULABLE, seen.sizing_problem or ""
        )
    if seen.plan.desired_ready and seen.plan.stable_revision == seen.desired_revision:
        if replicas == 0:
            return ConditionUpdate(
                ConditionType.READY, "True", Reason.SCALED_TO_ZERO, "spec.replicas is 0"
            )
        return ConditionUpdate(
            ConditionType.READY,
            "True",
            Reason.ALL_REPLICAS_READY,
            f"{replicas}/{replicas} {unit} of revision {seen.desired_revision} ready",
        )
    # Ready means serving: after a rollback (or a refusal) the stable revision serves every
    # replica; Degraded says what happened to the pair the spec names.
    serving = _stable_serves(sd, seen)
    if seen.undone is not None and serving is not None:
        return ConditionUpdate(
            ConditionType.READY,
            "True",
            Reason.ALL_REPLICAS_READY,
            f"{replicas}/{replicas} pods of revision {serving.revision} ready (undo); the "
            f"spec's revision {seen.desired_revision} waits for the next spec",
        )
    stopped = stop is not None or _refused_desired(seen)
    if stopped and serving is not None:
        why = stop.reason if stop is not None else _refusal_reason(seen)
        return ConditionUpdate(
            ConditionType.READY,
            "True",
            Reason.ALL_REPLICAS_READY,
            f"{replicas}/{replicas} pods of revision {serving.revision} ready; revision "
            f"{seen.desired_revision} stopped ({why}: see Degraded)",
        )
    if stop is not None:
        return ConditionUpdate(ConditionType.READY, "False", stop.reason, stop.detail)
    problem = seen.pair.desired_problem
    if problem is not None and _refused_desired(seen):
        return ConditionUpdate(
            ConditionType.READY,
            "False",
            problem.reason,
            f"{_refusal_detail(seen)}: {problem.message}",
        )
    if problem is not None:
        return ConditionUpdate(
            ConditionType.READY,
            "False",
            Reason.MODEL_NOT_FOUND,
            f"revision {seen.desired_revision}: {problem.message}",
        )
    ready = desired.ready_replicas if desired else 0
    if seen.held_by_kueue:
        return ConditionUpdate(
            ConditionType.READY, "False", Reason.WAITING_FOR_QUOTA, seen.admission.message
        )
    start = seen.start_problem()
    if start is not None:
        reason, detail = start
        return ConditionUpdate(
            ConditionType.READY, "False", reason, f"{ready}/{replicas} pods ready; {detail}"
        )
    if seen.plan.canary and seen.plan.stable_revision is not None:
        return ConditionUpdate(
            ConditionType.READY,
            "False",
            Reason.REPLICAS_NOT_READY,
            f"revision {seen.desired_revision} is a canary ({ready} of its pods ready) beside "
            f"revision {seen.plan.stable_revision}: Ready once it is promoted and serves "
            f"{replicas}/{replicas}",
        )
    return ConditionUpdate(
        ConditionType.READY,
        "False",
        Reason.REPLICAS_NOT_READY,
        f"{ready}/{replicas} {unit} of revision {seen.desired_revision} ready",
    )


def _canary_progress(seen: ObservedRollout, analysis: AnalysisStatus) -> ConditionUpdate:
    """Progressing while a canary is under way: which stage, its counts, the latest word."""
    canary, stable = seen.desired_revision, seen.plan.stable_revision
    head = f"canary {canary} beside revision {stable}: "
    if analysis.paused:
        return ConditionUpdate(
            ConditionType.PROGRESSING,
            "True",
            Reason.PAUSED,
            f"{head}paused by a person (annotation {labels.PAUSE}); no verdict is taken",
        )
    if analysis.stage == Stage.STARTING:
        return ConditionUpdate(
            ConditionType.PROGRESSING,
            "True",
            Reason.CANARY_STARTING,
            f"{head}waiting for its pods to be ready",
        )
    if analysis.stage == Stage.PROBE:
        return ConditionUpdate(
            ConditionType.PROGRESSING,
            "True",
            Reason.CANARY_PROBING,
            f"{head}its pods ran the probe and take no request until it is judged; "
            f"{analysis.message or 'waiting for the probe'}",
        )
    held = analysis.outcome == Outcome.HOLD
    return ConditionUpdate(
        ConditionType.PROGRESSING,
        "True",
        (
            Reason.METRICS_UNAVAILABLE
            if held and analysis.errors_in_a_row
            else Reason.ANALYSIS_INCONCLUSIVE
            if held
            else Reason.CANARY_ANALYSING
        ),
        f"{head}{analysis.passes_in_a_row} passes in a row, {analysis.failures} failures"
        + (f", {analysis.inconclusive_in_a_row} inconclusive in a row" if held else "")
        + (
            f", Prometheus unanswered {analysis.errors_in_a_row} intervals in a row (not "
            "verdicts: the analysis clock pauses)"
            if analysis.errors_in_a_row
            else ""
        )
        + f"; {'holding: ' if held else ''}"
        f"{analysis.message or 'first verdict after one interval'}",
    )


def _progressing_update(seen: ObservedRollout, stop: Stop | None) -> ConditionUpdate:
    if seen.desired_revision is None:
        return ConditionUpdate(
            ConditionType.PROGRESSING, "False", Reason.UNSCHEDULABLE, seen.sizing_problem or ""
        )
    if seen.plan.desired_ready and seen.plan.stable_revision == seen.desired_revision:
        return ConditionUpdate(
            ConditionType.PROGRESSING,
            "False",
            Reason.ROLLOUT_COMPLETE,
            f"revision {seen.desired_revision} serves",
        )
    if _refused_desired(seen):
        return ConditionUpdate(
            ConditionType.PROGRESSING, "False", _refusal_reason(seen), _refusal_detail(seen)
        )
    if seen.undone is not None:
        return ConditionUpdate(
            ConditionType.PROGRESSING,
            "False",
            Reason.UNDONE,
            f"revision {seen.undone} serves by a person's undo (annotation {labels.UNDO}) until "
            f"the spec changes; the spec's revision {seen.desired_revision} waits",
        )
    if stop is not None:
        return ConditionUpdate(ConditionType.PROGRESSING, "False", stop.reason, stop.detail)
    if seen.overdue is not None:
        # No stable revision to fall back to: the revision keeps trying, the deadline is said.
        return ConditionUpdate(
            ConditionType.PROGRESSING,
            "False",
            Reason.PROGRESS_DEADLINE_EXCEEDED,
            f"{seen.overdue}; no other revision serves, so it keeps its pods",
        )
    analysis = seen.analysis
    if seen.plan.canary and analysis is not None:
        return _canary_progress(seen, analysis)
    serving = seen.plan.stable_revision
    beside = f" alongside revision {serving}" if serving else ""
    problem = seen.start_problem()
    if problem is not None:
        # Still progressing (a pull, a Secret or a node may come): what holds it, by name.
        reason, detail = problem
        return ConditionUpdate(
            ConditionType.PROGRESSING,
            "True",
            reason,
            f"rolling out revision {seen.desired_revision}{beside}; {detail}",
        )
    return ConditionUpdate(
        ConditionType.PROGRESSING,
        "True",
        Reason.NEW_REVISION,
        f"rolling out revision {seen.desired_revision}{beside}",
    )


def _phase(ready: ConditionUpdate, seen: ObservedRollout, stop: Stop | None) -> str:
    if stop is not None:
        return Phase.ROLLED_BACK
    if _refused_desired(seen):
        stable = seen.plan.stable_revision
        return Phase.DEGRADED if stable and stable != seen.desired_revision else Phase.FAILED
    if ready.status == "True":
        return Phase.SERVING
    if seen.plan.canary and seen.analysis is not None:
        return Phase.CANARY
    if seen.desired_revision is None:
        return Phase.DEGRADED if seen.plan.stable_revision else Phase.FAILED
    if seen.held_by_kueue and not seen.plan.stable_revision:
        return Phase.PENDING
    return Phase.PROGRESSING


def _revision_history(
    seen: ObservedRollout,
    history_limit: int,
    recorded: Sequence[RevisionStatus],
    now: str,
    stop: Stop | None,
) -> list[RevisionStatus]:
    """One record per revision Deployment, oldest first; a revision the launcher refused or the
    rollout stopped is Failed; the verdict counted now is added to the canary's record; verdicts
    and a Failed phase written earlier are kept, and each revision's probe figures once read."""
    refused = seen.pair.refused | ({seen.desired_revision} if stop is not None else set())
    verdict = _verdict_record(seen, now)
    earlier = {r.revision: r for r in recorded}
    records: list[RevisionStatus] = []
    for revision in sorted(seen.revisions, key=lambda r: (r.created, r.name)):
        pair = revision.pair
        target = pair.get("target") or {}
        draft = pair.get("draft") or {}
        if revision.revision == seen.plan.stable_revision:
            phase = RevisionPhase.STABLE
        elif revision.revision == seen.desired_revision:
            phase = RevisionPhase.CANARY if seen.plan.canary else RevisionPhase.PENDING
        else:
            phase = RevisionPhase.SUPERSEDED
        before = earlier.get(revision.revision)
        if revision.revision in refused or (
            before is not None and before.phase == RevisionPhase.FAILED
        ):
            phase = RevisionPhase.FAILED
        desired = revision.revision == seen.desired_revision
        records.append(
            RevisionStatus(
                revision=revision.revision,
                pair_version=revision.pair_version or str(pair.get("version", "")),
                target=RevisionTarget(
                    model=str(target.get("model", "")), revision=target.get("revision")
                ),
                draft=RevisionDraft(
                    method=str(draft.get("method", "none")),
                    model=draft.get("model"),
                    revision=draft.get("revision"),
                    num_speculative_tokens=draft.get("numSpeculativeTokens"),
                ),
                phase=phase,
                created_at=revision.created or None,
                verdicts=kept_verdicts(
                    [
                        *(before.verdicts if before is not None else []),
                        *([verdict] if verdict and desired else []),
                    ]
                ),
                probe=seen.probes.get(revision.revision) or (before.probe if before else None),
                retried=before.retried if before else None,
            )
        )
    return records[-(history_limit + 1) :]


# Verdicts kept per revision in status.revisions: the probe's and the newest others.
VERDICTS_KEPT = 10


def kept_verdicts(verdicts: Sequence[Verdict]) -> list[Verdict]:
    """The verdicts status keeps of a revision, oldest first: its probe verdict, taken once on
    the prompts every revision ran and never repeated, and the newest of the others, at most
    VERDICTS_KEPT in all (a canary held on many inconclusive windows keeps what its probe
    found)."""
    first = next((i for i, v in enumerate(verdicts) if v.source == "Probe"), None)
    if first is None:
        return list(verdicts[-VERDICTS_KEPT:])
    others = [v for i, v in enumerate(verdicts) if i != first]
    return [verdicts[first], *others[1 - VERDICTS_KEPT :]]


def _verdict_record(seen: ObservedRollout, now: str) -> Verdict | None:
    """The verdict counted now, with the figures it was taken on (canary's and stable's)."""
    judgement = seen.canary
    judged = judgement.verdict
    if seen.overdue is not None and seen.plan.stable_revision is not None:
        return Verdict(time=now, source="Deadline", result="Fail", message=seen.overdue)
    if judged is None or seen.analysis is None:
        return None
    interval = -1 if judgement.source == "Probe" else seen.analysis.last_interval
    record = Verdict(
        time=now,
        interval=interval,
        source=judgement.source,
        result=judged.result.value,
        message=judged.message,
    )
    if judgement.source == "Probe":
        mine = seen.probes.get(seen.desired_revision or "")
        theirs = seen.probes.get(seen.plan.stable_revision or "")
        return record.model_copy(
            update={
                "acceptance_rate": mine.acceptance_rate if mine else None,
                "stable_acceptance_rate": theirs.acceptance_rate if theirs else None,
                "mean_acceptance_length": mine.mean_acceptance_length if mine else None,
                "draft_tokens": mine.draft_tokens if mine else None,
            }
        )
    measured, stable = judgement.measured, judgement.stable_measured
    if measured is None:
        return record
    return record.model_copy(
        update={
            "acceptance_rate": _rounded(measured.acceptance_rate),
            "stable_acceptance_rate": _rounded(stable.acceptance_rate) if stable else None,
            "mean_acceptance_length": _rounded(measured.tokens_per_step),
            "draft_tokens": int(measured.draft_tokens),
            "step_seconds": _rounded(measured.step_seconds, 5),
            "time_per_output_token_seconds": _rounded(judged.time_per_output_token, 5),
            "stable_time_per_output_token_seconds": _rounded(
                judged.stable_time_per_output_token, 5
            ),
            "time_to_first_token_seconds": _rounded(measured.time_to_first_token, 4),
            "stable_time_to_first_token_seconds": (
                _rounded(stable.time_to_first_token, 4) if stable else None
            ),
            "error_rate": _rounded(measured.error_rate, 4),
            "stable_error_rate": _rounded(stable.error_rate, 4) if stable else None,
            "batch_size": _rounded(measured.batch_size, 2),
            "stable_batch_size": _rounded(stable.batch_size, 2) if stable else None,
        }
    )


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _serving_figures(
    seen: ObservedRollout, current: SpeculativeDeploymentStatus, now: str
) -> tuple[float | None, float | None, str | None]:
    """(acceptance rate, mean acceptance length, when they last changed) of the stable revision,
    refreshed at most once per `figures_every_seconds`, and only when they changed, so steady
    traffic is not a status write on every reconcile. None at once when the stable revision
    serves the target alone: no acceptance is the truth, not the last pair's figure."""
    kept = (current.acceptance_rate, current.mean_acceptance_length, current.measured_at)
    stable = next((r for r in seen.revisions if r.revision == seen.plan.stable_revision), None)
    if stable is not None and (stable.pair.get("draft") or {}).get("method") == "none":
        return (None, None, current.measured_at if kept[:2] == (None, None) else now)
    measured = seen.measurements.get(seen.plan.stable_revision or "")
    if measured is None or measured.error is not None:
        return kept
    figures = (_rounded(measured.acceptance_rate), _rounded(measured.mean_acceptance_length))
    if figures == kept[:2]:
        return kept
    if current.measured_at is not None:
        age = _seconds_between(current.measured_at, now)
        if age < seen.figures_every_seconds:
            return kept
    return (*figures, now)


def _seconds_between(earlier: str, later: str) -> float:
    start = parse_time(earlier)
    end = parse_time(later)
    return (end - start).total_seconds()


def _degraded_update(seen: ObservedRollout, stop: Stop | None) -> ConditionUpdate:
    collapse = seen.collapse.state
    if seen.collapse.fired and collapse is not None:
        return ConditionUpdate(
            ConditionType.DEGRADED,
            "True",
            Reason.ACCEPTANCE_COLLAPSED,
            f"{collapse.message}; {collapse.action}",
        )
    if stop is not None:
        return ConditionUpdate(ConditionType.DEGRADED, "True", stop.reason, stop.detail)
    if _refused_desired(seen):
        return ConditionUpdate(
            ConditionType.DEGRADED, "True", _refusal_reason(seen), _refusal_detail(seen)
        )
    return ConditionUpdate(ConditionType.DEGRADED, "False", Reason.HEALTHY, "")


def build_status(sd: SpeculativeDeployment, seen: ObservedRollout, now: str) -> dict[str, Any]:
    """The status fields this reconcile owns, as the API stores them (camelCase JSON).

    Fields other parts of the operator own (acceptance rate, canary) are not included, so a
    merge patch of this never touches them.
    """
    current = sd.status or SpeculativeDeploymentStatus()
    generation = sd.metadata.generation
    if seen.sizing is not None:
        sized = ConditionUpdate(ConditionType.SIZED, "True", Reason.SIZED, seen.sizing.message)
    else:
        sized = ConditionUpdate(
            ConditionType.SIZED, "False", Reason.UNSCHEDULABLE, seen.sizing_problem or ""
        )
    stop = _stopped(seen, current.revisions)
    ready = _ready_update(sd, seen, stop)
    progressing = _progressing_update(seen, stop)
    phase = _phase(ready, seen, stop)
    refused = refusal_condition(seen.refused_writes)
    if refused is not None:
        ready = refused
        phase = Phase.DEGRADED if phase == Phase.SERVING else phase
        desired = revision_refusal(seen.refused_writes, sd.metadata.name, seen.desired_revision)
        if desired is not None:
            # The new revision cannot start: it does not progress until its child is written.
            progressing = ConditionUpdate(
                ConditionType.PROGRESSING, "False", desired.reason, desired.summary
            )
            stable = seen.plan.stable_revision
            phase = Phase.DEGRADED if stable and stable != seen.desired_revision else Phase.FAILED
    speculating = ConditionUpdate(
        ConditionType.SPECULATING,
        "True" if seen.speculation.state == "Enabled" else "False",
        seen.speculation.reason,
        seen.speculation.message,
    )
    conditions = set_conditions(
        current.conditions,
        [
            ready,
            progressing,
            _degraded_update(seen, stop),
            sized,
            seen.admission,
            speculating,
            seen.pair.condition,
        ],
        generation,
        now,
    )
    pods = sum(r.pods for r in seen.revisions)
    ready_pods = sum(r.ready_replicas for r in seen.revisions)
    acceptance, length, measured_at = _serving_figures(seen, current, now)
    status = SpeculativeDeploymentStatus(
        observed_generation=generation,
        phase=phase,
        conditions=conditions,
        stable_revision=seen.plan.stable_revision,
        canary_revision=(seen.desired_revision if seen.plan.canary and stop is None else None),
        analysis=seen.canary.state,
        progress=(
            RolloutProgress(revision=seen.desired_revision, since=seen.since)
            if seen.desired_revision is not None and seen.since is not None
            else None
        ),
        collapse=seen.collapse.state,
        autotune=seen.autotune,
        acceptance_rate=acceptance,
        mean_acceptance_length=length,
        measured_at=measured_at,
        revisions=_revision_history(
            seen, sd.spec.revision_history_limit, current.revisions, now, stop
        ),
        speculation=seen.speculation,
        sizing=seen.sizing,
        replicas=pods,
        ready_replicas=ready_pods,
        selector=seen.selector,
        refused_writes=refusals_status(
            seen.refused_writes, current.refused_writes, generation, now
        ),
    )
    dumped = status.model_dump(by_alias=True, exclude_none=False, mode="json")
    owned = (
        "observedGeneration",
        "phase",
        "conditions",
        "stableRevision",
        "canaryRevision",
        "analysis",
        "progress",
        "collapse",
        "autotune",
        "acceptanceRate",
        "meanAcceptanceLength",
        "measuredAt",
        "revisions",
        "speculation",
        "sizing",
        "replicas",
        "readyReplicas",
        "selector",
        "refusedWrites",
    )
    built = {key: _drop_none(dumped[key]) for key in owned}
    if not built["refusedWrites"] and not current.refused_writes:
        del built["refusedWrites"]  # never refused: no key at all
    return built


def _drop_none(value: Any) -> Any:
    """Removes None members inside objects, as the API server would not store them."""
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def condition_changes(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """Conditions in `after` whose status or reason differ from `before` (or that are new)."""
    old = {c.get("type"): (c.get("status"), c.get("reason")) for c in before}
    return [c for c in after if old.get(c.get("type")) != (c.get("status"), c.get("reason"))]


# Conditions whose changes are worth an Event; a False Sized or Admitted is a Warning.
CONDITIONS_WORTH_AN_EVENT = (
    ConditionType.READY,
    ConditionType.SIZED,
    ConditionType.ADMITTED,
    ConditionType.SPECULATING,
)
WARNING_WHEN_FALSE = (ConditionType.SIZED, ConditionType.ADMITTED)
#: Ready reasons that say why pods cannot start: news (a Warning) even while it was never True.
START_FAILURE_REASONS = frozenset(
    {
        Reason.IMAGE_PULL_FAILED,
        Reason.CREATE_CONTAINER_CONFIG_ERROR,
        Reason.OOM_KILLED,
        Reason.POD_UNSCHEDULABLE,
        Reason.ENGINE_CRASH_LOOPING,
    }
)


def condition_events(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]
) -> list[RolloutEvent]:
    """The Events a person wants from condition changes.

    Unknown is never news. Ready speaks when it becomes True or stops being True (while a new
    SD starts, "not ready yet" is expected; Sized and Admitted say why it cannot start), and
    as a Warning when it names why pods cannot start (an image, a Secret, memory, a node, a
    crash loop).

    A new SD's first status (`before` empty) posts only its Warnings. The rest is how every SD
    starts (sized, admitted or without a queue, speculating or not as its spec asks, Ready
    with the rollout's own `RolloutComplete`) and stays in the conditions: at 1,000 new SDs
    those four Events were more than half of the seven each posted, and the poster dropped
    thousands of them.
    """
    was = {c.get("type"): c.get("status") for c in before}
    events: list[RolloutEvent] = []
    for condition in condition_changes(before, after):
        type_, status = condition.get("type"), condition.get("status")
        if type_ not in CONDITIONS_WORTH_AN_EVENT or status == "Unknown":
            continue
        reason = str(condition.get("reason", ""))
        start_failure = type_ == ConditionType.READY and reason in START_FAILURE_REASONS
        if (
            type_ == ConditionType.READY
            and status != "True"
            and was.get(type_) != "True"
            and not start_failure
        ):
            continue
        warning = status == "False" and (type_ in WARNING_WHEN_FALSE or start_failure)
        if not before and not warning:
            continue
        events.append(
            RolloutEvent(
                reason=reason,
                message=f"{type_}={status}: {condition.get('message', '')}",
                warning=warning,
            )
        )
    return events
