"""A canary through a Prometheus outage and a killed operator, on the simulator's 70B pair.

The stable serves the target alone; a good EAGLE-3 head runs as a canary (e2e/sim_bed.py).
Once its analysis has judged an interval, Prometheus hangs (SIGSTOP: every query times out):
the analysis holds, its intervals are Errors (not verdicts: nothing counts for or against the
canary), and nothing is promoted. The operator is SIGKILLed during the outage, mid-analysis;
the new process resumes from status, records the next intervals (Error), and once Prometheus
answers again promotes the canary, each interval counted once across the restart.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from sim_bed import INTERVAL_S, READY_S, Bed, sim_bed
from testbed import ClusterEnv, Kubectl, eventually
from testbed.conditions import condition
from testbed.faults import paused

pytestmark = [pytest.mark.e2e]

FAILURE_LIMIT = 2  # the default


@pytest.fixture(scope="module")
def bed(
    cluster: ClusterEnv, kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bed]:
    with sim_bed(cluster, kubectl, tmp_path_factory.mktemp("operator"), "e2e-outage") as found:
        yield found


def test_the_analysis_holds_while_prometheus_is_down_survives_a_killed_operator_then_promotes(
    bed: Bed,
) -> None:
    bed.apply(None, "1-target")
    stable = bed.serving("1-target")
    with bed.load():
        bed.apply("sim/eagle3-good", "2-good")
        canary = bed.canary_of("2-good")

        def judged() -> dict[str, Any] | None:
            analysis = bed.status().get("analysis") or {}
            ours = analysis.get("revision") == canary and analysis.get("stage") == "Live"
            return analysis if ours and analysis.get("lastInterval", -1) >= 0 else None

        eventually(judged, READY_S, "the canary's first live verdict")
        with paused(bed.cluster, "prometheus"):  # every query times out

            def holding() -> dict[str, Any] | None:
                sd = bed.sd()
                progressing = condition(sd, "Progressing")
                unavailable = "metrics unavailable" in progressing.get("message", "")
                held = progressing.get("reason") == "MetricsUnavailable" and unavailable
                return sd if held else None

            held = eventually(holding, 90, "the analysis to hold on missing metrics")
            failures = held["status"]["analysis"]["failures"]
            assert failures < FAILURE_LIMIT, held["status"]["analysis"]
            # SIGKILL mid-analysis, during the outage; a new process resumes from status and
            # proves itself by judging the next two intervals (verdicts only it can record).
            killed_at = bed.status()["analysis"]["lastInterval"]
            bed.operator.kill()
            bed.operator.start()

            def judged_twice_since_the_kill() -> list[dict[str, Any]] | None:
                later = [
                    v
                    for v in bed.verdicts(canary)
                    if v["interval"] > killed_at and v["result"] == "Error"
                ]
                return later if len(later) >= 2 else None

            eventually(
                judged_twice_since_the_kill,
                6 * INTERVAL_S + 60,
                f"two Error intervals after interval {killed_at} from the new process",
            )
            status = bed.status()
            assert status["stableRevision"] == stable, "nothing promoted while Prometheus is down"
            assert status["analysis"]["outcome"] == "Hold", status["analysis"]
            assert status["analysis"]["errorsInARow"] >= 2, status["analysis"]
            assert status["analysis"]["failures"] == failures, (
                "missing data is never a failure",
                status["analysis"],
                bed.verdicts(canary),
            )
        analysis, took = bed.outcome(canary)
    verdicts = bed.verdicts(canary)
    print(f"\noutage: outcome {analysis['outcome']} {took:.0f} s after Prometheus came back")
    assert analysis["outcome"] == "Promote", verdicts
    results = [v["result"] for v in verdicts]
    assert "Error" in results, verdicts
    assert results.count("Pass") >= 3, verdicts
    # Each interval counted once, across the restart too.
    intervals = [v["interval"] for v in verdicts if v["source"] == "Live"]
    assert all(a < b for a, b in itertools.pairwise(intervals)), intervals
