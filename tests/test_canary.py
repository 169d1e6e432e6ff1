"""The canary through the reconcile: the in-memory API, a scripted clock and measurements."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from engine_cluster import MEASURED_LINE
from fake_kube import FakeKube
from specdeploy.api import labels
from specdeploy.api.config import OperatorConfig
from specdeploy.handlers.reconcile import Reconciler
from specdeploy.plan.rollout.analysis import Measurement
from test_reconcile import NODES, sd_body
from vllm_windows import figures

GOOD = figures(0.8, 3.2, draft_tokens=2412)
BAD = figures(0.08, 1.2, draft_tokens=2412)
NOTHING = Measurement(draft_tokens=0)
ANALYSIS = {"interval": "10s", "minDraftTokens": 100, "failureLimit": 2, "promoteAfter": 2}


class World:
    """One SD on the fake API, a clock the test moves and what Prometheus 'measures'."""

    def __init__(self) -> None:
        self.kube = FakeKube(NODES)
        body = sd_body("r1", replicas=2)
        body["spec"]["rollout"] = {"canary": {"replicas": 1}, "analysis": dict(ANALYSIS)}
        self.kube.objects[("SpeculativeDeployment", "ns", "chat")] = body
        self.now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
        self.measured: dict[str, Measurement] = {}
        self.events: list[tuple[str, str, str]] = []
        self.reconciler = self.restart()

    def restart(self) -> Reconciler:
        """A new operator process: nothing kept in memory."""
        self.reconciler = Reconciler(
            self.kube,  # type: ignore[arg-type]
            OperatorConfig(),
            lambda _b, type_, reason, message: self.events.append((type_, reason, message)),
            measure=lambda pods, _window, _stretch, _at: self.measured.get(pods.revision, NOTHING),
            clock=lambda: self.now,
        )
        return self.reconciler

    def step(self, seconds: float = 0) -> None:
        self.now += timedelta(seconds=seconds)
        self.reconciler.reconcile("ns", "chat")
        self.kube.make_ready()
        self.reconciler.reconcile("ns", "chat")

    @property
    def status(self) -> dict[str, Any]:
        found: dict[str, Any] = self.kube.objects[("SpeculativeDeployment", "ns", "chat")]["status"]
        return found

    def condition(self, type_: str) -> dict[str, Any]:
        return next(c for c in self.status["conditions"] if c["type"] == type_)

    def new_draft(self, revision: str) -> tuple[str, str]:
        """Changes the draft; returns (stable, canary) revision names."""
        stable = self.status["stableRevision"]
        sd = self.kube.objects[("SpeculativeDeployment", "ns", "chat")]
        sd["spec"]["pair"]["draft"]["revision"] = revision
        sd["metadata"]["generation"] += 1
        self.step()
        canary = self.status["canaryRevision"]
        return stable, canary

    def replicas(self) -> dict[str, int]:
        return {n.removeprefix("chat-"): r for n, r in self.kube.deployments().items()}


def started() -> World:
    world = World()
    world.step()
    assert world.status["phase"] == "Serving", "the first revision is promoted when ready"
    assert world.status.get("canaryRevision") is None
    return world


def test_a_canary_seen_ready_late_is_judged_from_when_its_pod_turned_ready() -> None:
    world = started()
    stable = world.status["stableRevision"]
    sd = world.kube.objects[("SpeculativeDeployment", "ns", "chat")]
    sd["spec"]["pair"]["draft"]["revision"] = "r2"
    sd["metadata"]["generation"] += 1
    world.reconciler.reconcile("ns", "chat")
    canary = world.status["canaryRevision"]
    assert world.status["analysis"]["stage"] == "Starting"
    # Its pod turns Ready 5 s later; the operator looks again only 30 s after that.
    world.kube.make_ready()
    ready_at = world.now + timedelta(seconds=5)
    world.kube.pods.append(
        {
            "metadata": {
                "name": f"chat-{canary}-0",
                "namespace": "ns",
                "labels": {labels.NAME: "chat", labels.REVISION: canary},
            },
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "lastTransitionTime": ready_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    }
                ]
            },
        }
    )
    world.now += timedelta(seconds=35)
    world.measured = {stable: GOOD, canary: GOOD}
    world.reconciler.reconcile("ns", "chat")
    analysis = world.status["analysis"]
    started_at = (ready_at + timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert (analysis["stage"], analysis["startedAt"]) == ("Live", started_at)
    # 29 s since: its first two intervals closed, the latest judged at once.
    assert (analysis["lastInterval"], analysis["passesInARow"]) == (1, 1)


def test_a_good_canary_runs_beside_the_stable_then_is_promoted() -> None:
    world = started()
    stable, canary = world.new_draft("r2")
    assert world.replicas() == {stable: 2, canary: 1}
    assert world.status["phase"] == "Canary"
    world.measured = {stable: GOOD, canary: GOOD}

    world.step(10)
    assert world.status["analysis"]["passesInARow"] == 1
    assert world.replicas() == {stable: 2, canary: 1}, "one pass is not enough"
    world.step(10)
    assert world.status["analysis"]["outcome"] == "Promote"
    world.step()
    assert world.status["stableRevision"] == canary
    assert world.replicas() == {stable: 0, canary: 2}
    assert world.condition("Ready")["status"] == "True"
    reasons = [reason for _, reason, _ in world.events]
    assert reasons.count("AnalysisPassed") == 2
    assert "CanaryPromoted" in reasons
    [record] = [r for r in world.status["revisions"] if r["revision"] == canary]
    assert [v["result"] for v in record["verdicts"]] == ["Pass", "Pass"]
    assert [v["interval"] for v in record["verdicts"]] == [0, 1]
    assert record["verdicts"][0]["draftTokens"] == 2412


def test_a_bad_canary_is_rolled_back_the_stable_keeps_serving_and_it_is_not_retried() -> None:
    world = started()
    stable, canary = world.new_draft("r2")
    world.measured = {stable: GOOD, canary: BAD}
    world.step(10)
    assert world.replicas() == {stable: 2, canary: 1}, "one failure of two"
    world.step(10)

    assert world.replicas() == {stable: 2, canary: 0}
    assert world.status["stableRevision"] == stable
    assert world.status["phase"] == "RolledBack"
    degraded = world.condition("Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "RolledBack")
    assert "first-position acceptance 0.08 < 0.60 over 2,412 draft tokens" in degraded["message"]
    assert "2 failed verdicts" in degraded["message"]
    # Ready means serving: the stable revision serves every replica (kubectl wait, HPA).
    ready = world.condition("Ready")
    assert (ready["status"], ready["reason"]) == ("True", "AllReplicasReady")
    assert ready["message"] == (
        f"2/2 pods of revision {stable} ready; revision {canary} stopped (RolledBack: see Degraded)"
    )
    # No launcher to wait for: the canary's pods are gone for good.
    world.step()
    pair = world.condition("PairCompatible")
    assert "waiting for the engine launcher" not in pair["message"]
    assert pair["message"].startswith(f"revision {canary} was rolled back")
    phases = {r["revision"]: r["phase"] for r in world.status["revisions"]}
    assert phases == {stable: "Stable", canary: "Failed"}
    warnings = [(reason, message) for type_, reason, message in world.events if type_ == "Warning"]
    assert [r for r, _ in warnings].count("AnalysisFailed") == 2
    assert any(r == "RolledBack" and "keeps serving" in m for r, m in warnings)

    # Steady: the failed pair stays at zero, nothing is written, even after a restart.
    writes = world.kube.write_requests
    world.restart()
    world.step(60)
    assert world.replicas() == {stable: 2, canary: 0}
    assert world.kube.write_requests == writes

    # A different pair in the spec moves on.
    _, third = world.new_draft("r3")
    assert third not in (stable, canary)
    assert world.replicas()[third] == 1


def test_missing_data_holds_and_never_promotes() -> None:
    world = started()
    stable, canary = world.new_draft("r2")
    world.measured = {stable: GOOD}
    for _ in range(5):
        world.step(10)
    assert world.replicas() == {stable: 2, canary: 1}
    assert world.status["analysis"]["outcome"] == "Hold"
    progressing = world.condition("Progressing")
    assert progressing["reason"] == "AnalysisInconclusive"
    assert "holding: 0 draft tokens in the window" in progressing["message"]

    world.measured = {stable: GOOD, canary: GOOD}
    world.step(10)
    world.step(10)
    assert world.status["stableRevision"] == canary


def test_prometheus_down_is_inconclusive_not_a_failure() -> None:
    world = started()
    stable, canary = world.new_draft("r2")
    world.measured = {canary: Measurement(error="connection refused"), stable: GOOD}
    for _ in range(4):
        world.step(10)
    assert world.status["analysis"]["failures"] == 0
    assert "metrics unavailable: connection refused" in world.condition("Progressing")["message"]
    assert world.replicas() == {stable: 2, canary: 1}


def test_a_restart_mid_canary_counts_no_interval_twice() -> None:
    world = started()
    stable, canary = world.new_draft("r2")
    world.measured = {stable: GOOD, canary: BAD}
    world.step(10)
    assert world.status["analysis"]["failures"] == 1
    for _ in range(3):
        world.restart()
        world.step(0)
    assert world.status["analysis"]["failures"] == 1
    assert world.replicas() == {stable: 2, canary: 1}


def test_a_spec_change_mid_canary_starts_a_new_canary() -> None:
    world = started()
    stable, canary = world.new_draft("r2")
    world.measured = {stable: GOOD, canary: BAD}
    world.step(10)
    _, other = world.new_draft("r3")
    assert other != canary
    assert world.replicas() == {stable: 2, canary: 0, other: 1}
    # The new canary's analysis starts afresh: the old one's failure does not count.
    assert world.status["analysis"]["revision"] == other
    assert world.status["analysis"]["failures"] == 0
    world.measured = {stable: GOOD, other: BAD}
    world.step(10)
    assert world.replicas() == {stable: 2, canary: 0, other: 1}, "one failure of two"


def test_the_operator_counts_verdicts_promotions_and_rollbacks_on_its_metrics() -> None:
    world = started()
    stable, canary = world.new_draft("r2")
    world.measured = {stable: GOOD, canary: BAD}
    world.step(10)
    world.step(10)
    registry = world.reconciler.metrics.registry
    assert registry.get_sample_value("specdeploy_analysis_verdicts_total", {"result": "Fail"}) == 2
    assert registry.get_sample_value("specdeploy_canary_rollbacks_total") == 1
    assert registry.get_sample_value("specdeploy_canary_promotions_total") == 0
    assert registry.get_sample_value(
        "specdeploy_acceptance_rate", {"namespace": "ns", "name": "chat"}
    ) == pytest.approx(0.8)
    assert (registry.get_sample_value("specdeploy_reconcile_duration_seconds_count") or 0) > 0


def test_a_canary_that_never_gets_ready_is_never_judged_and_the_stable_serves() -> None:
    world = started()
    stable = world.status["stableRevision"]
    sd = world.kube.objects[("SpeculativeDeployment", "ns", "chat")]
    sd["spec"]["pair"]["draft"]["revision"] = "r2"
    # Its pod never becomes ready (say, vLLM still loading): no verdict is taken.
    world.reconciler.reconcile("ns", "chat")
    canary = world.status["canaryRevision"]
    world.measured = {stable: GOOD}
    for _ in range(5):
        world.now += timedelta(seconds=10)
        world.reconciler.reconcile("ns", "chat")
    analysis = world.status["analysis"]
    assert (analysis["stage"], analysis["lastInterval"]) == ("Starting", -1)
    assert world.replicas() == {stable: 2, canary: 1}
    progressing = world.condition("Progressing")
    assert progressing["reason"] == "CanaryStarting"
    assert "waiting for its pods to be ready" in progressing["message"]
    assert world.status["stableRevision"] == stable


def test_canary_pods_short_of_quota_say_so() -> None:
    world = started()
    _, canary = world.new_draft("r2")
    gated = {
        "metadata": {
            "name": f"chat-{canary}-x",
            "namespace": "ns",
            "labels": {"specdeploy.dev/name": "chat", "specdeploy.dev/revision": canary},
        },
        "spec": {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]},
    }
    workload = {
        "metadata": {
            "namespace": "ns",
            "ownerReferences": [{"kind": "Pod", "name": f"chat-{canary}-x"}],
        },
        "status": {
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "False",
                    "message": "couldn't assign flavors to pod set main: insufficient unused "
                    "quota for nvidia.com/mig-3g.40gb in flavor h100-mig, 1 more needed",
                }
            ]
        },
    }
    world.kube.pods = [gated]
    world.kube.workloads = [workload]
    world.reconciler.reconcile("ns", "chat")
    admitted = world.condition("Admitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "WaitingForQuota")
    assert "lacks 1 nvidia.com/mig-3g.40gb (flavor h100-mig)" in admitted["message"]


def test_each_new_measurement_is_logged_once_in_the_line_the_demo_reads(
    caplog: pytest.LogCaptureFixture,
) -> None:
    world = started()
    caplog.set_level(logging.DEBUG, logger="specdeploy.reconcile")
    stable, canary = world.new_draft("r2")
    world.step(1)
    world.measured = {stable: GOOD, canary: GOOD}
    world.step(10)
    world.step(1)
    lines = [r for r in caplog.records if r.getMessage().startswith("measured ")]
    # Once per revision and change: the stable's unchanged NOTHING, and any figures that stay
    # the same over later reconciles, are not logged again.
    assert sorted(r.getMessage().split(" ")[3] for r in lines) == sorted([canary, canary, stable])
    nothing, good = (r for r in lines if f"revision {canary} " in r.getMessage())

    assert nothing.getMessage() == (
        f"measured ns/chat revision {canary} over 5m: acceptance n/a, 0 draft tokens, n/a "
        "tokens a step, mean step n/a, n/a per token, first token n/a, batch n/a, errors n/a"
    )
    assert "acceptance 0.80, 2,412 draft tokens, 3.20 tokens a step" in good.getMessage()
    # The operator's log format (handlers/run.py), as make demo's waits read it back.
    line = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s").format(nothing)
    found = MEASURED_LINE.match(line)
    assert found is not None
    assert (found[2], found[3]) == ("ns", "chat")
    assert found[4].startswith(f"revision {canary} over 5m: acceptance n/a")


def test_a_failed_stable_query_never_promotes_the_canary() -> None:
    world = started()
    stable, canary = world.new_draft("r2")
    world.measured = {stable: Measurement(error="query timed out"), canary: GOOD}
    for _ in range(5):
        world.step(10)
    assert world.status["stableRevision"] == stable
    assert world.replicas() == {stable: 2, canary: 1}
    assert world.status["analysis"]["outcome"] == "Hold"
    assert (
        "the stable's figures could not be read: query timed out"
        in (world.condition("Progressing")["message"])
    )
    # Its figures back: judged and promoted.
    world.measured = {stable: GOOD, canary: GOOD}
    world.step(10)
    world.step(10)
    world.step()
    assert world.status["stableRevision"] == canary


def test_each_verdict_records_the_canary_s_and_the_stable_s_figures_of_one_window() -> None:
    world = started()
    stable, canary = world.new_draft("r2")
    world.measured = {stable: figures(0.8, 3.2, 0.012), canary: figures(0.8, 3.2, 0.010)}
    world.step(10)
    [record] = [r for r in world.status["revisions"] if r["revision"] == canary]
    verdict = record["verdicts"][-1]
    assert verdict["source"] == "Live"
    assert verdict["timePerOutputTokenSeconds"] == pytest.approx(0.010 / 3.2, abs=1e-5)
    assert verdict["stableTimePerOutputTokenSeconds"] == pytest.approx(0.012 / 3.2, abs=1e-5)
    assert verdict["timeToFirstTokenSeconds"] == verdict["stableTimeToFirstTokenSeconds"] == 0.02
    assert (verdict["batchSize"], verdict["stableBatchSize"]) == (1.0, 1.0)
    assert (verdict["errorRate"], verdict["stableErrorRate"]) == (0.0, 0.0)


def test_a_canary_that_never_gets_ready_is_rolled_back_at_its_deadline() -> None:
    world = started()
    sd = world.kube.objects[("SpeculativeDeployment", "ns", "chat")]
    sd["spec"]["rollout"]["progressDeadlineSeconds"] = 300
    stable = world.status["stableRevision"]
    sd["spec"]["pair"]["draft"]["revision"] = "r2"
    world.reconciler.reconcile("ns", "chat")  # the canary's pod never gets ready
    canary = world.status["canaryRevision"]
    world.measured = {stable: GOOD}
    world.now += timedelta(seconds=299)
    world.reconciler.reconcile("ns", "chat")
    assert world.replicas() == {stable: 2, canary: 1}
    world.now += timedelta(seconds=2)
    world.reconciler.reconcile("ns", "chat")
    assert world.replicas() == {stable: 2, canary: 0}, "its pods are freed"
    degraded = world.condition("Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ProgressDeadlineExceeded")
    assert (
        "progress deadline of 300s exceeded after 301s: 0/1 canary pods ready"
        in (degraded["message"])
    )
    assert world.condition("Progressing")["reason"] == "ProgressDeadlineExceeded"
    assert world.status["phase"] == "RolledBack"
    # Not tried again while the spec names it, even after a restart.
    world.restart()
    world.step(600)
    assert world.replicas() == {stable: 2, canary: 0}


def test_a_plain_new_revision_that_never_gets_ready_is_stopped_at_its_deadline() -> None:
    world = World()
    sd = world.kube.objects[("SpeculativeDeployment", "ns", "chat")]
    sd["spec"]["rollout"] = {"progressDeadlineSeconds": 60}  # no canary: a plain new pair
    world.step()
    stable = world.status["stableRevision"]
    sd["spec"]["pair"]["draft"]["revision"] = "r2"
    world.reconciler.reconcile("ns", "chat")
    [new] = [r for r in world.replicas() if r != stable]
    assert world.replicas() == {stable: 2, new: 2}
    world.now += timedelta(seconds=61)
    world.reconciler.reconcile("ns", "chat")
    assert world.replicas() == {stable: 2, new: 0}
    assert world.condition("Degraded")["reason"] == "ProgressDeadlineExceeded"
    assert world.condition("Ready")["status"] == "True"
    [record] = [r for r in world.status["revisions"] if r["revision"] == new]
    assert record["phase"] == "Failed"
    assert record["verdicts"][-1]["source"] == "Deadline"
    world.now += timedelta(seconds=60)
    world.reconciler.reconcile("ns", "chat")
    assert world.replicas() == {stable: 2, new: 0}
    assert world.condition("Degraded")["reason"] == "ProgressDeadlineExceeded"


def test_a_canary_whose_engine_restarts_mid_analysis_is_rolled_back() -> None:
    world = started()
    stable, canary = world.new_draft("r2")
    world.measured = {stable: GOOD, canary: GOOD}
    engine = {"name": "engine", "restartCount": 0}
    world.kube.pods.append(
        {
            "metadata": {
                "name": f"chat-{canary}-0",
                "namespace": "ns",
                "labels": {labels.NAME: "chat", labels.REVISION: canary},
            },
            "status": {"containerStatuses": [engine]},
        }
    )
    world.step(10)
    assert world.status["analysis"]["restartsAtLive"] == 0
    assert world.replicas() == {stable: 2, canary: 1}
    # Every window passes, but its engine crashed once: the requests it held are lost.
    engine["restartCount"] = 1
    world.step(1)
    assert world.replicas() == {stable: 2, canary: 0}
    degraded = world.condition("Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "RolledBack")
    assert "the canary's engine restarted 1 time during its analysis" in degraded["message"]


def test_the_acceptance_column_shows_the_payoff_of_a_pair_rolled_out_without_analysis() -> None:
    # A new user's first SD: a pair, no canary, no analysis, no guard. What it pays is still
    # measured and shown (status.acceptanceRate, the ACCEPTANCE column).
    world = World()
    sd = world.kube.objects[("SpeculativeDeployment", "ns", "chat")]
    sd["spec"].pop("rollout")
    world.step()
    stable = world.status["stableRevision"]
    world.measured = {stable: GOOD}
    world.step(60)
    assert world.status["acceptanceRate"] == pytest.approx(0.8)
    assert world.status["meanAcceptanceLength"] == pytest.approx(3.2)


def test_the_acceptance_column_is_empty_while_the_target_serves_alone() -> None:
    world = started()
    stable = world.status["stableRevision"]
    world.measured = {stable: GOOD}
    world.step(60)
    assert world.status["acceptanceRate"] == pytest.approx(0.8)
    sd = world.kube.objects[("SpeculativeDeployment", "ns", "chat")]
    sd["spec"]["placement"]["speculation"] = "Disabled"
    sd["spec"].pop("rollout")
    world.step()
    world.step()
    assert world.status["stableRevision"] != stable
    assert "acceptanceRate" not in world.status
    assert "meanAcceptanceLength" not in world.status
