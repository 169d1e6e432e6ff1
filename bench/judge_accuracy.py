"""How often the canary judge decides right, and how many intervals it takes (`make bench-judge`).

A set of canaries whose right outcome is known by construction, each judged beside a stable
pair on the real CPU engine at the operator's default criteria (pacing: a verdict every 20 s
over the last 60 s, the pacing the judge's real-engine e2e module had):

- good: draft-small k=3 (a second engine of the same pair) beside draft-small k=3: promote;
- bad: draft-bad k=3 (about 0 % accepted) beside draft-small k=3: roll back;
- accepted-but-slow: draft-slow k=3 (100 % accepted, three times the target's cost a pass)
  beside draft-small k=3: roll back;
- same draft, another prompt mix: draft-small k=3 fed other prompts than the stable beside
  draft-small k=3: promote;
- faster-longer: draft-small k=6 beside draft-small k=1 (more tokens a step outweigh the
  longer steps: 0.65 times k=1's time per output token in a first run): promote, though its
  acceptance rate is lower (0.72 against 0.91 on the probe: a longer k's later positions are
  accepted less, so the judge compares the positions both draft);
- slower-shorter: draft-small k=1 beside draft-small k=6: roll back.

Both engines of a pair run at once, each on a CPU of its own, each fed by one client sending
greedy completions back to back, and each ran the probe (engine/probe.py, the same prompts)
when it started. Every interval the bench reads both engines' vLLM counters, forms the window's
`Measurement` of each exactly as the operator's queries do (sums and counts, cut at the run's
start), and asks the operator's own pure judge (`plan.rollout.probe.judge_probe`,
`plan.rollout.analysis.judge_interval`, `advance`) until it promotes or rolls back. Each canary
is judged `--runs` times in a row on the same engines, each run from a fresh analysis. Prometheus
and the reconcile are not in the loop (the e2e suite covers them); the engines and the judge are
the real ones.

Figures: accuracy (verdicts right / total, a Wilson 95 % interval, target ≥ 0.9) with the probe
and, as context, judged on live traffic alone; per canary, the intervals each run took to decide
and the per-token ratios its live verdicts saw (median, bootstrap interval).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench import confidence, record
from specdeploy.adapters.prometheus import ACCEPTED_PER_POSITION
from specdeploy.api.config import AnalysisSettings
from specdeploy.api.contract import (
    PROBE_ENV,
    PROBE_GAUGES,
    PROBE_METRIC_PREFIX,
    PROBE_MIDDLEWARE,
    PROBE_PROMPTS_ENV,
    PROBE_READY_PATH,
)
from specdeploy.api.models import ProbeFigures
from specdeploy.engine.tiny_models import PROBE_PROMPTS
from specdeploy.plan.rollout.analysis import (
    AnalysisState,
    Measurement,
    Outcome,
    Result,
    acceptance_by_position,
    advance,
    judge_interval,
)
from specdeploy.plan.rollout.probe import ProbeResult, judge_probe, probe_record, probe_tokens

#: Pacing (the criteria are the operator's defaults).
INTERVAL_S = 20.0
WINDOW_S = 60.0
#: A run that has not decided after this many intervals counts as undecided (wrong).
MAX_INTERVALS = 12
ACCURACY_TARGET = 0.9
#: Judged runs per canary by default: 6 x 6 canaries = 36 verdicts, the fewest (35) whose Wilson
#: 95 % interval clears 0.9 when all are right (18 of 18 gives 0.82 to 1.0, inconclusive).
RUNS = 6

PROMPTS = ("The cat sat on the", "In the morning the queue", "A node sees", "Every small engine")
#: Two mixes whose acceptance really differs on the tiny pair (per prompt, greedy, k=3: "The
#: scheduler places the pod on" 1.00, "Every small engine serves" 0.87, "The cat sat on the" 0.79,
#: "A node sees" 0.67), as the judge's real-engine prompt-mix test used: the same draft sits
#: about 0.2 lower on the canary's mix. ("The cat sat on the" with "In the morning the queue"
#: against "A node sees" with "The scheduler places the pod on" gave 0.81 and 0.82: no test.)
MIX_STABLE = ("The scheduler places the pod on", "Every small engine serves")
MIX_CANARY = ("A node sees", "The cat sat on the")


@dataclass(frozen=True)
class Engine:
    """One engine configuration: a draft of the tiny target at a length (None: no draft)."""

    draft: str | None
    tokens: int = 3

    @property
    def name(self) -> str:
        return f"{self.draft or 'target'}-k{self.tokens}"


@dataclass(frozen=True)
class Canary:
    name: str
    stable: Engine
    canary: Engine
    promote: bool
    stable_prompts: Sequence[str] = PROMPTS
    canary_prompts: Sequence[str] = PROMPTS


SMALL = Engine("draft-small", 3)
CANARIES = (
    Canary("good", SMALL, Engine("draft-small", 3), promote=True),
    Canary("bad", SMALL, Engine("draft-bad", 3), promote=False),
    Canary("accepted-but-slow", SMALL, Engine("draft-slow", 3), promote=False),
    Canary(
        "same draft, another prompt mix",
        SMALL,
        Engine("draft-small", 3),
        promote=True,
        stable_prompts=MIX_STABLE,
        canary_prompts=MIX_CANARY,
    ),
    Canary("faster-longer", Engine("draft-small", 1), Engine("draft-small", 6), promote=True),
    Canary("slower-shorter", Engine("draft-small", 6), Engine("draft-small", 1), promote=False),
)


# --- counters into measurements (pure) ----------------------------------------------------------


@dataclass(frozen=True)
class Counters:
    """One engine's vLLM counters at one moment, summed over their labels."""

    totals: Mapping[str, float]
    failed: float = 0.0
    #: vllm:spec_decode_num_accepted_tokens_per_pos_total by position.
    accepted_per_position: Mapping[int, float] = field(default_factory=dict)

    def get(self, name: str) -> float:
        return self.totals.get(name, 0.0)


COUNTED = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:inter_token_latency_seconds_sum",
    "vllm:inter_token_latency_seconds_count",
    "vllm:generation_tokens_total",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:iteration_tokens_total_count",
    "vllm:request_success_total",
)


def read_counters(metrics_text: str) -> Counters:
    totals: dict[str, float] = dict.fromkeys(COUNTED, 0.0)
    failed = 0.0
    per_position: dict[int, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
            if sample.name == ACCEPTED_PER_POSITION and "position" in sample.labels:
                position = int(sample.labels["position"])
                per_position[position] = per_position.get(position, 0.0) + sample.value
            if sample.name == "vllm:request_success_total" and sample.labels.get(
                "finished_reason"
            ) in ("error", "abort"):
                failed += sample.value
    return Counters(totals, failed, per_position)


def measurement_between(before: Counters, after: Counters) -> Measurement:
    """The window's figures of one engine, as the operator's queries form them."""

    def grown(name: str) -> float:
        return max(0.0, after.get(name) - before.get(name))

    drafts, draft_tokens = (
        grown("vllm:spec_decode_num_drafts_total"),
        grown("vllm:spec_decode_num_draft_tokens_total"),
    )
    accepted = grown("vllm:spec_decode_num_accepted_tokens_total")
    grown_per_position = [
        max(0.0, after.accepted_per_position.get(i, 0.0) - before.accepted_per_position.get(i, 0.0))
        for i in range(max(after.accepted_per_position, default=-1) + 1)
    ]
    return Measurement(
        acceptance_rate=accepted / draft_tokens if draft_tokens else None,
        mean_acceptance_length=1 + accepted / drafts if drafts else None,
        draft_tokens=draft_tokens,
        acceptance_per_position=acceptance_by_position(grown_per_position, drafts),
        step_seconds_sum=grown("vllm:inter_token_latency_seconds_sum"),
        steps=grown("vllm:inter_token_latency_seconds_count"),
        output_tokens=grown("vllm:generation_tokens_total"),
        first_token_seconds_sum=grown("vllm:time_to_first_token_seconds_sum"),
        first_tokens=grown("vllm:time_to_first_token_seconds_count"),
        engine_steps=grown("vllm:iteration_tokens_total_count"),
        finished=grown("vllm:request_success_total"),
        failed=max(0.0, after.failed - before.failed),
    )


def probe_from_metrics(metrics_text: str) -> ProbeResult | None:
    """An engine's probe gauges as the operator reads them (one pod)."""
    values: dict[str, float] = {}
    per_position: dict[int, float] = {}
    prompt_set = ""
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if not sample.name.startswith(PROBE_METRIC_PREFIX):
                continue
            prompt_set = sample.labels.get("prompt_set", prompt_set)
            suffix = sample.name.removeprefix(PROBE_METRIC_PREFIX)
            if "position" in sample.labels:
                per_position[int(sample.labels["position"])] = sample.value
            elif suffix in PROBE_GAUGES:
                values[suffix] = sample.value
    if not values:
        return None
    return ProbeResult(
        prompt_set=prompt_set,
        pods=1,
        complete_pods=int(values.get("complete", 0)),
        prompts=int(values.get("prompts", 0)),
        requests=values.get("requests", 0.0),
        errors=values.get("errors", 0.0),
        output_tokens=values.get("output_tokens", 0.0),
        drafts=values.get("drafts", 0.0),
        draft_tokens=values.get("draft_tokens", 0.0),
        accepted_tokens=values.get("accepted_tokens", 0.0),
        accepted_per_position=tuple(per_position[p] for p in sorted(per_position)),
        decode_seconds=values.get("decode_seconds", 0.0),
        decode_steps=values.get("decode_steps", 0.0),
        first_token_seconds=values.get("first_token_seconds", 0.0),
        first_tokens=values.get("first_tokens", 0.0),
    )


@dataclass
class Decision:
    """One run of the judge over a canary: what it decided and when."""

    outcome: str
    intervals: int
    verdicts: list[str] = field(default_factory=list)
    per_token_ratios: list[float] = field(default_factory=list)


def judge_run(
    windows: Callable[[int], tuple[Measurement, Measurement]],
    *,
    canary_probe: ProbeFigures | None,
    stable_probe: ProbeFigures | None,
    canary_has_draft: bool,
    stable_has_draft: bool,
    settings: AnalysisSettings,
    use_probe: bool = True,
    max_intervals: int = MAX_INTERVALS,
) -> Decision:
    """The operator's judge over one canary: its probe first (with `use_probe`), then one
    verdict per interval on `windows(i)` ((canary, stable) measurements) until it decides."""
    decision = Decision(outcome="Undecided", intervals=0)
    tokens = None
    if use_probe and canary_probe is not None:
        verdict = judge_probe(
            canary_probe,
            stable_probe,
            canary_has_draft=canary_has_draft,
            stable_has_draft=stable_has_draft,
            criteria=settings,
        )
        decision.verdicts.append(f"probe {verdict.result}: {verdict.message}")
        if verdict.result == Result.FAIL:
            decision.outcome = str(Outcome.ROLLBACK)
            return decision
        tokens = probe_tokens(canary_probe, stable_probe)
    state = AnalysisState()
    for number in range(max_intervals):
        canary, stable = windows(number)
        verdict = judge_interval(
            canary,
            stable,
            stable_has_draft,
            settings,
            canary_has_draft=canary_has_draft,
            probe=tokens,
        )
        decision.intervals = number + 1
        decision.verdicts.append(f"{verdict.result}: {verdict.message}")
        mine, theirs = verdict.time_per_output_token, verdict.stable_time_per_output_token
        if mine and theirs:
            decision.per_token_ratios.append(mine / theirs)
        state, outcome = advance(state, number, verdict, settings)
        if outcome in (Outcome.PROMOTE, Outcome.ROLLBACK):
            decision.outcome = str(outcome)
            return decision
    return decision


def wilson(right: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score 95 % interval of a proportion."""
    if total == 0:
        return 0.0, 1.0
    p = right / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    spread = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return max(0.0, centre - spread), min(1.0, centre + spread)


def accuracy_figure(
    name: str, right: Sequence[bool], *, load: float | None, context: str
) -> confidence.Figure:
    total, good = len(right), sum(right)
    low, high = wilson(good, total)
    share = good / total if total else 0.0
    verdict = confidence.verdict_of_interval(
        low, high, ACCURACY_TARGET, confidence.Direction.AT_LEAST
    )
    reason = (
        f"{good} of {total} right, Wilson 95 % interval {low:.2f} to {high:.2f}, target ≥ "
        f"{ACCURACY_TARGET}"
    )
    # A count, not a timing: rated whatever the load (its own two busy engines and their clients
    # keep a 2-core machine above the timing bound), with the load recorded beside it.
    if verdict is confidence.Verdict.INCONCLUSIVE:
        reason += ": the interval straddles the target"
    return confidence.Figure(
        name=name,
        rounds=tuple(1.0 if r else 0.0 for r in right),
        target=ACCURACY_TARGET,
        direction=confidence.Direction.AT_LEAST,
        median=share,
        low=low,
        high=high,
        verdict=verdict,
        reason=reason,
        load=load,
        context=context,
    )


# --- the engines (I/O) ----------------------------------------------------------------------------


class Running:
    """A pair of engines, each fed back to back by a client of its own, read every interval."""

    def __init__(
        self, harness: Any, python: Path, models: Mapping[str, str], log_dir: Path
    ) -> None:
        self.harness = harness
        self.python = python
        self.models = models
        self.log_dir = log_dir
        self.servers: dict[str, Any] = {}

    def start(self, engine: Engine, key: str) -> Any:
        h = self.harness
        port = h.free_port()
        speculative = (
            None
            if engine.draft is None
            else {
                "method": "draft_model",
                "model": self.models[engine.draft],
                "num_speculative_tokens": engine.tokens,
            }
        )
        args = h.vllm_args(self.models["target"], port, speculative=speculative)
        args += ["--middleware", PROBE_MIDDLEWARE]
        env = {
            PROBE_ENV: json.dumps({"maxTokens": 48, "temperature": 0, "timeoutSeconds": 600}),
            PROBE_PROMPTS_ENV: json.dumps(list(PROBE_PROMPTS)),
            "SPECDEPLOY_PORT": str(port),
        }
        server = h.start_engine(self.python, key, args, self.log_dir, env=env, port=port)
        self.servers[key] = server
        return server

    def ready(self, server: Any, timeout: float = 900) -> ProbeFigures:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                raise RuntimeError(f"engine {server.name} exited:\n{server.tail()}")
            try:
                self.harness.http_text(server.url + PROBE_READY_PATH, timeout=5)
                found = probe_from_metrics(self.harness.http_text(server.url + "/metrics"))
                if found is not None:
                    return probe_record(found, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            except Exception:  # not ready yet
                pass
            time.sleep(1)
        raise TimeoutError(f"engine {server.name} not ready:\n{server.tail()}")

    def counters(self, server: Any) -> Counters:
        return read_counters(self.harness.http_text(server.url + "/metrics"))

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.servers.clear()


class Windows:
    """One judged run's windows: both engines' counters read every interval from the run's
    start; each verdict's window is the last WINDOW_S of them, cut at that start."""

    def __init__(
        self,
        running: Running,
        canary: Any,
        stable: Any,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.running, self.canary, self.stable = running, canary, stable
        self.sleep = sleep
        self.snapshots: list[tuple[Counters, Counters]] = [self._read()]

    def _read(self) -> tuple[Counters, Counters]:
        return self.running.counters(self.canary), self.running.counters(self.stable)

    def _window(self, index: int) -> tuple[Measurement, Measurement]:
        first = max(0, index - int(WINDOW_S // INTERVAL_S))
        then, now = self.snapshots[first], self.snapshots[index]
        return measurement_between(then[0], now[0]), measurement_between(then[1], now[1])

    def live(self, _number: int) -> tuple[Measurement, Measurement]:
        """Waits one interval, reads both engines and gives the window that closes."""
        self.sleep(INTERVAL_S)
        self.snapshots.append(self._read())
        return self._window(len(self.snapshots) - 1)

    def replay(self, number: int) -> tuple[Measurement, Measurement]:
        """The window of interval `number` as it was read; read live (an interval on each) where
        the judge with the probe decided before it, so that live traffic alone is judged until it
        decides too (a bad draft's probe decides with no live window at all)."""
        while len(self.snapshots) <= number + 1:
            self.live(len(self.snapshots) - 1)
        return self._window(number + 1)


def feed(server: Any, prompts: Sequence[str], stop: threading.Event) -> threading.Thread:
    def run() -> None:
        turn = 0
        while not stop.is_set():
            try:
                server.complete(prompts[turn % len(prompts)], max_tokens=48)
            except Exception:  # the engine stopping
                stop.wait(0.5)
            turn += 1

    thread = threading.Thread(target=run, name=f"feed {server.name}", daemon=True)
    thread.start()
    return thread


def judge_canary_runs(
    running: Running, canary: Canary, runs: int, settings: AnalysisSettings
) -> dict[str, Any]:
    """Starts the pair, feeds it, and has the judge decide `runs` times (with the probe and on
    live traffic alone, over the same windows)."""
    stable_server = running.start(canary.stable, f"stable-{canary.stable.name}")
    canary_server = running.start(canary.canary, f"canary-{canary.canary.name}")
    stable_probe = running.ready(stable_server)
    canary_probe = running.ready(canary_server)
    stop = threading.Event()
    feeds = [
        feed(stable_server, canary.stable_prompts, stop),
        feed(canary_server, canary.canary_prompts, stop),
    ]
    results: list[dict[str, Any]] = []
    try:
        time.sleep(5)  # both clients warm
        for run in range(runs):
            windows = Windows(running, canary_server, stable_server)
            with_probe = judge_run(
                windows.live,
                canary_probe=canary_probe,
                stable_probe=stable_probe,
                canary_has_draft=canary.canary.draft is not None,
                stable_has_draft=canary.stable.draft is not None,
                settings=settings,
            )
            # The same windows, judged on live traffic alone (no probe).
            live_only = judge_run(
                windows.replay,
                canary_probe=None,
                stable_probe=None,
                canary_has_draft=canary.canary.draft is not None,
                stable_has_draft=canary.stable.draft is not None,
                settings=settings,
                use_probe=False,
            )
            right = with_probe.outcome == (
                str(Outcome.PROMOTE) if canary.promote else str(Outcome.ROLLBACK)
            )
            print(
                f"  {canary.name} run {run + 1}: {with_probe.outcome} after "
                f"{with_probe.intervals} intervals ({'right' if right else 'WRONG'}); "
                f"live only: {live_only.outcome}",
                flush=True,
            )
            results.append(
                {
                    "outcome": with_probe.outcome,
                    "intervals": with_probe.intervals,
                    "right": right,
                    "verdicts": with_probe.verdicts,
                    "per_token_ratios": with_probe.per_token_ratios,
                    "live_only_outcome": live_only.outcome,
                    "live_only_intervals": live_only.intervals,
                }
            )
    finally:
        stop.set()
        for thread in feeds:
            thread.join(timeout=60)
        running.stop()
    return {
        "canary": canary.name,
        "stable_engine": canary.stable.name,
        "canary_engine": canary.canary.name,
        "right_outcome": "Promote" if canary.promote else "Rollback",
        "probe": {
            "canary": canary_probe.model_dump(by_alias=True, exclude_none=True),
            "stable": stable_probe.model_dump(by_alias=True, exclude_none=True),
        },
        "runs": results,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.judge_accuracy", description=__doc__)
    parser.add_argument(
        "--runs",
        type=int,
        default=RUNS,
        help=f"judged runs per canary ({RUNS}: {RUNS * len(CANARIES)} verdicts, the fewest whose "
        "Wilson interval can clear the 0.9 target when every one is right)",
    )
    parser.add_argument(
        "--only", action="append", default=None, help="canary names to run (default: all)"
    )
    args = parser.parse_args(argv)
    import engine_harness as harness  # noqa: PLC0415 (the e2e harness, on PYTHONPATH)

    python = harness.engine_python_path()
    models = harness.build_tiny_models(python)
    settings = AnalysisSettings(interval=f"{INTERVAL_S:.0f}s", window=f"{WINDOW_S:.0f}s")
    log_dir = Path(record.RESULTS).parent / ".judge-engines"
    running = Running(harness, python, models, log_dir)
    chosen = [c for c in CANARIES if args.only is None or c.name in args.only]
    canaries: list[dict[str, Any]] = []
    with record.LoadWatch("judge") as load:
        for canary in chosen:
            print(f"{canary.name}: {canary.canary.name} beside {canary.stable.name}", flush=True)
            canaries.append(judge_canary_runs(running, canary, args.runs, settings))
    right = [run["right"] for c in canaries for run in c["runs"]]
    live_right = [
        run["live_only_outcome"] == c["right_outcome"] for c in canaries for run in c["runs"]
    ]
    figures = [
        accuracy_figure(
            "judge accuracy, with the probe",
            right,
            load=load.peak,
            context="verdicts right / total over the canary set, default criteria",
        ),
        accuracy_figure(
            "judge accuracy, live traffic alone",
            live_right,
            load=load.peak,
            context="the same windows judged without the probe",
        ),
    ]
    for c in canaries:
        ratios = [r for run in c["runs"] for r in run["per_token_ratios"]]
        if len(ratios) >= 2:
            figures.append(
                confidence.judge(
                    f"{c['canary']}: time per output token / the stable's",
                    ratios,
                    1.10,
                    confidence.Direction.AT_MOST,
                    load=load.peak,
                    load_bound=record.load_bound(),
                    context=(
                        f"right outcome {c['right_outcome']}; intervals to decide "
                        f"{[run['intervals'] for run in c['runs']]}"
                    ),
                )
            )
    for figure in figures:
        print(f"{figure.name}: {figure.verdict} ({figure.reason})")
    record.write_result(
        "judge",
        {
            "what": "canary judge accuracy on the CPU engine, default criteria",
            "pacing": {"interval_s": INTERVAL_S, "window_s": WINDOW_S},
            "figures": [f.to_json() for f in figures],
            "load": {"judge": load.summary()},
            "canaries": canaries,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
