"""What `kubectl specdeploy status` and `history` print, from the SD alone (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from specdeploy.api.models import (
    Condition,
    RevisionStatus,
    SpeculativeDeployment,
    SpeculativeDeploymentStatus,
    Verdict,
)
from specdeploy.api.times import parse_time


def _unanswered(errors: int) -> str:
    """The analysis' pause while Prometheus does not answer, when it does not."""
    return f", Prometheus unanswered {errors} intervals in a row (held)" if errors else ""


def _age(stamp: str | None, now: datetime) -> str:
    try:
        then = parse_time(stamp or "")
    except ValueError:
        return "-"
    seconds = int((now - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]
    return [
        indent + "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]


def _pair(status: SpeculativeDeploymentStatus, revision: str | None) -> RevisionStatus | None:
    return next((r for r in status.revisions if r.revision == revision), None)


def _draft(record: RevisionStatus) -> str:
    draft = record.draft
    if draft.method == "none":
        return "none (target alone)"
    model = (draft.model or "").rstrip("/").split("/")[-1]
    k = f" k={draft.num_speculative_tokens}" if draft.num_speculative_tokens else ""
    return f"{draft.method} {model}{k}".strip()


def _pair_of(a: float | None, b: float | None, scale: float = 1.0, digits: int = 2) -> str:
    if a is None and b is None:
        return "-"

    def one(value: float | None) -> str:
        return "-" if value is None else f"{value * scale:.{digits}f}"

    return f"{one(a)} vs {one(b)}"


def _condition(conditions: Sequence[Condition], type_: str) -> str:
    found = next((c for c in conditions if c.type == type_), None)
    if found is None:
        return "-"
    message = f"  {found.message}" if found.message else ""
    return f"{found.status:<5}  {found.reason}{message}"


def _verdict_rows(verdicts: Sequence[Verdict]) -> list[list[str]]:
    rows = []
    for v in verdicts:
        rows.append(
            [
                v.time[11:19] if len(v.time) >= 19 else v.time,
                v.source,
                v.result,
                _pair_of(v.acceptance_rate, v.stable_acceptance_rate),
                _pair_of(
                    v.time_per_output_token_seconds,
                    v.stable_time_per_output_token_seconds,
                    1000,
                    1,
                ),
                _pair_of(
                    v.time_to_first_token_seconds, v.stable_time_to_first_token_seconds, 1000, 0
                ),
                _pair_of(v.error_rate, v.stable_error_rate, 100, 1),
                _pair_of(v.batch_size, v.stable_batch_size),
            ]
        )
    return rows


def render_status(body: Mapping[str, object], now: datetime | None = None) -> str:
    """The SD as a person reads a rollout: who serves, the canary's stage and verdicts with the
    figures they compared (the canary's vs the stable's), the probe, the guard, the history."""
    now = now or datetime.now(UTC)
    sd = SpeculativeDeployment.from_body(dict(body))
    status = sd.status or SpeculativeDeploymentStatus()
    pair = sd.spec.pair
    lines = [
        f"Name:           {sd.metadata.name} (namespace {sd.metadata.namespace})",
        f"Pair:           {pair.version}: target {pair.target.model}, draft {pair.draft.method}"
        + (f" {pair.draft.model}" if pair.draft.model else "")
        + (f" k={pair.draft.num_speculative_tokens}" if pair.draft.num_speculative_tokens else ""),
        f"Phase:          {status.phase or '-'}",
    ]
    for type_ in ("Ready", "Progressing", "Degraded", "PairCompatible", "Admitted"):
        lines.append(f"{type_ + ':':<16}{_condition(status.conditions, type_)}")
    stable = _pair(status, status.stable_revision)
    acceptance = (
        f"  acceptance {status.acceptance_rate:.2f} (mean length "
        f"{status.mean_acceptance_length or 0:.2f})"
        if status.acceptance_rate is not None
        else ""
    )
    if stable is not None:
        lines.append(f"Stable:         {stable.revision}  {_draft(stable)}{acceptance}")
    analysis = status.analysis
    if analysis is not None:
        canary = _pair(status, analysis.revision)
        paused = ", paused by a person" if analysis.paused else ""
        ended = f", ended: {analysis.outcome} ({analysis.reason})" if analysis.reason else ""
        lines.append(
            f"Canary:         {analysis.revision}  {_draft(canary) if canary else ''}  stage "
            f"{analysis.stage}{paused}; {analysis.passes_in_a_row} passes in a row, "
            f"{analysis.failures} failures, {analysis.inconclusive_in_a_row} inconclusive in a "
            f"row{_unanswered(analysis.errors_in_a_row)}{ended}"
        )
        if analysis.message:
            lines.append(f"                {analysis.message}")
    probes = [r for r in status.revisions if r.probe is not None]
    if probes:
        lines += ["", "Probe (the same prompts on every revision):"]
        rows = []
        for record in probes:
            figures = record.probe
            assert figures is not None
            rows.append(
                [
                    record.revision,
                    figures.prompt_set,
                    str(figures.pods),
                    "-" if figures.acceptance_rate is None else f"{figures.acceptance_rate:.2f}",
                    "-" if figures.tokens_per_step is None else f"{figures.tokens_per_step:.2f}",
                    "-"
                    if figures.time_per_output_token_seconds is None
                    else f"{figures.time_per_output_token_seconds * 1000:.1f}",
                    "-"
                    if figures.time_to_first_token_seconds is None
                    else f"{figures.time_to_first_token_seconds * 1000:.0f}",
                    f"{figures.errors}/{figures.requests}",
                    "yes" if figures.complete else "no",
                ]
            )
        lines += _table(
            [
                "REVISION",
                "PROMPT SET",
                "PODS",
                "ACCEPTANCE",
                "TOKENS/STEP",
                "MS/TOKEN",
                "TTFT MS",
                "ERRORS",
                "COMPLETE",
            ],
            rows,
        )
    if analysis is not None:
        judged = _pair(status, analysis.revision)
        if judged is not None and judged.verdicts:
            lines += [
                "",
                f"Verdicts of canary {analysis.revision} (canary vs stable, newest last):",
            ]
            lines += _table(
                [
                    "TIME",
                    "SOURCE",
                    "RESULT",
                    "ACCEPTANCE",
                    "MS/TOKEN",
                    "TTFT MS",
                    "ERRORS %",
                    "BATCH",
                ],
                _verdict_rows(judged.verdicts),
            )
            lines.append(f"  latest: {judged.verdicts[-1].message}")
    collapse = status.collapse
    if collapse is not None:
        state = "fired" if collapse.triggered else "watching"
        below = f", below the floor since {collapse.below_since}" if collapse.below_since else ""
        lines += ["", f"Collapse guard: {state} revision {collapse.revision}{below}"]
        if collapse.message:
            lines.append(f"  {collapse.message}")
    lines += ["", "Revisions (oldest first):"]
    lines += _table(
        ["REVISION", "VERSION", "DRAFT", "PHASE", "AGE"],
        [
            [r.revision, r.pair_version, _draft(r), r.phase, _age(r.created_at, now)]
            for r in status.revisions
        ],
    )
    return "\n".join(lines) + "\n"


def render_history(
    body: Mapping[str, object], records: Mapping[str, int], now: datetime | None = None
) -> str:
    """Every revision kept, with its record number (`undo --to-revision N`) and last verdict."""
    now = now or datetime.now(UTC)
    sd = SpeculativeDeployment.from_body(dict(body))
    status = sd.status or SpeculativeDeploymentStatus()
    rows = []
    for r in status.revisions:
        last = r.verdicts[-1] if r.verdicts else None
        rows.append(
            [
                str(records.get(r.revision, "-")),
                r.revision,
                r.pair_version,
                _draft(r),
                r.phase + (" (serving)" if r.revision == status.stable_revision else ""),
                _age(r.created_at, now),
                f"{last.result} ({last.source}): {last.message}" if last else "-",
            ]
        )
    return (
        "\n".join(
            _table(
                ["#", "REVISION", "VERSION", "DRAFT", "PHASE", "AGE", "LAST VERDICT"],
                rows,
                indent="",
            )
        )
        + "\n"
    )
