"""The canary judge with real CPU engines, at the default criteria.

One SD of the tiny pair goes through a run of new pairs, each a canary beside the one serving
(process kubelet, real launcher and vLLM, the test bed's Prometheus). Every revision runs the
same probe (a ConfigMap of prompts) before it serves. Only the pacing differs from the
operator's defaults (a 10 s interval over a 60 s window, 90 s for the slow draft of test 3, so
a verdict takes seconds, not minutes); every criterion (minAcceptanceRate, maxDropVsStable,
maxTimePerOutputTokenIncrease, maxTimeToFirstTokenIncrease and its tolerance,
maxErrorRateIncrease, maxBatchSizeRatio, minDraftTokens, failureLimit, promoteAfter) is the
default. `PerPodLoad` keeps every ready
engine busy at one request at a time; two engines run at once, each on a CPU of its own.

1. target alone → draft-small k=1: a correct pair promoted beside the target alone;
2. → draft-small k=3: a pair with another k, faster per token, promoted; its first four live
   intervals are judged while the stable's queries fail, and it is never promoted until they
   answer again;
3. → draft-slow: accepted (100 %) but slow to run, rolled back on its time per output token;
4. → draft-bad: rolled back on its probe, before any user request reached it;
5. → draft-small k=3 again (another version), its pods sent another prompt mix than the
   stable's: not rolled back (the probe compared the two on identical prompts);
6. → draft-small k=3 without prefix caching, long repeated prompts: rolled back on its time to
   first token.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from engine_cluster import (
    OperatorProcess,
    apply_crds,
    get_sd,
    operator_config,
    prometheus_value,
    revision_pods,
    sd_status,
    tiny_pair,
    tiny_sd,
)
from engine_harness import engine_python, tiny_models
from load import PerPodLoad
from query_faults import QueryFaultProxy, query_fault_proxy
from specdeploy.engine.tiny_models import PROBE_PROMPTS
from test_kubectl_plugin import Plugin
from testbed import ClusterEnv, Kubectl, create_namespace_with_queues, eventually
from testbed.conditions import is_ready

pytestmark = [pytest.mark.e2e, pytest.mark.engine]

__all__ = ["engine_python", "tiny_models"]  # session fixtures used here

SD = "judge"
ENGINE_READY_S = 600
VERDICT_S = 600
#: Pacing only: one verdict every 10 s over the last 60 s (over the time since the analysis
#: started, while that is shorter). Every criterion is the default, minDraftTokens (2,000)
#: included: a verdict before the engines drafted that many is Inconclusive, and holds.
INTERVAL_S = 10
ANALYSIS = {"interval": f"{INTERVAL_S}s", "window": "60s"}
#: The slow draft's window (see test 3): long enough to hold the default minDraftTokens (2,000)
#: down to about 670 draft tokens a minute; on a faster machine the verdicts come as soon as the
#: window (cut at the canary's live start) holds 2,000, so it costs them no time there.
SLOW_WINDOW = "180s"
#: Long prompts, each sent again and again: a pair with prefix caching prefills them once.
LONG = [
    " ".join(f"the {adj} {noun} sees a {noun} at night" for adj, noun in pairs)
    for pairs in (
        [("quick", "fox"), ("old", "river"), ("green", "garden")] * 40,
        [("lazy", "dog"), ("young", "engine"), ("red", "train")] * 40,
    )
]


def judge_sd(
    namespace: str,
    models: dict[str, str],
    draft: str | None,
    version: str,
    *,
    tokens: int = 3,
    extra_args: Sequence[str] = (),
    window: str = ANALYSIS["window"],
) -> dict[str, Any]:
    body = tiny_sd(SD, namespace, models, draft, version)
    body["spec"]["pair"] = tiny_pair(models, draft, version, tokens)
    body["spec"]["engine"]["maxModelLen"] = 2048
    body["spec"]["engine"]["extraArgs"] = [*body["spec"]["engine"]["extraArgs"], *extra_args]
    body["spec"]["rollout"] = {
        "canary": {"replicas": 1},
        "analysis": {
            **ANALYSIS,
            "window": window,
            "probe": {"configMapKeyRef": {"name": "judge-probe"}},
        },
    }
    return body


class Bed:
    def __init__(
        self,
        cluster: ClusterEnv,
        kubectl: Kubectl,
        namespace: str,
        models: dict[str, str],
        proxy: QueryFaultProxy,
    ) -> None:
        self.cluster = cluster
        self.kubectl = kubectl
        self.namespace = namespace
        self.models = models
        self.proxy = proxy

    def status(self) -> dict[str, Any]:
        return sd_status(self.kubectl, self.namespace, SD)

    def sd(self) -> dict[str, Any]:
        return get_sd(self.kubectl, self.namespace, SD)

    def apply(
        self,
        draft: str | None,
        version: str,
        *,
        tokens: int = 3,
        extra: Sequence[str] = (),
        window: str = ANALYSIS["window"],
    ) -> None:
        body = judge_sd(
            self.namespace,
            self.models,
            draft,
            version,
            tokens=tokens,
            extra_args=extra,
            window=window,
        )
        self.kubectl.apply([body])

    def load(self, **options: Any) -> PerPodLoad:
        return PerPodLoad(
            self.kubectl, self.namespace, SD, self.models["target"], self.cluster, **options
        )

    def serving(self, other_than: str | None = None) -> str:
        def found() -> str | None:
            status = self.status()
            stable = status.get("stableRevision")
            ready = is_ready({"status": status})
            return stable if ready and stable and stable != other_than else None

        revision: str = eventually(found, ENGINE_READY_S, f"SD {SD} serving")
        return revision

    def canary_of(self, version: str) -> str:
        """The revision of pair version `version`, once the analysis under way is its own.

        status.analysis keeps the last analysis until a new one starts: just after an apply it
        still names the previous canary (rolled back, so not the stable either)."""

        def found() -> str | None:
            status = self.status()
            ours = {
                r["revision"] for r in status.get("revisions") or [] if r["pairVersion"] == version
            }
            revision = (status.get("analysis") or {}).get("revision")
            return revision if revision in ours else None

        revision: str = eventually(found, 120, f"the analysis of pair {version}")
        return revision

    def outcome(self, canary: str) -> dict[str, Any]:
        """status.analysis once the canary's analysis ended; fails with its verdicts if not."""

        def ended() -> dict[str, Any] | None:
            analysis = self.status().get("analysis") or {}
            done = analysis.get("revision") == canary and analysis.get("outcome") in (
                "Promote",
                "Rollback",
            )
            return analysis if done else None

        try:
            found: dict[str, Any] = eventually(ended, ENGINE_READY_S + VERDICT_S, "an outcome")
        except TimeoutError as error:
            raise AssertionError(self.verdicts(canary)) from error
        return found

    def verdicts(self, revision: str) -> list[dict[str, Any]]:
        for record in self.status().get("revisions") or []:
            if record["revision"] == revision:
                return list(record.get("verdicts") or [])
        return []

    def record(self, revision: str) -> dict[str, Any]:
        [found] = [r for r in self.status()["revisions"] if r["revision"] == revision]
        return dict(found)


@pytest.fixture(scope="module")
def bed(
    cluster: ClusterEnv,
    kubectl: Kubectl,
    engine_python: Path,
    tiny_models: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Bed]:
    namespace = f"e2e-judge-{uuid.uuid4().hex[:5]}"
    create_namespace_with_queues(kubectl, namespace)
    apply_crds(kubectl)
    kubectl.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "judge-probe", "namespace": namespace},
                "data": {"prompts": json.dumps(PROBE_PROMPTS)},
            }
        ]
    )
    with query_fault_proxy(cluster.prometheus_url) as proxy:
        config = operator_config(str(engine_python), proxy.url, interval=2)
        running = OperatorProcess(
            cluster.kubeconfig, config, tmp_path_factory.mktemp("operator"), (namespace,)
        )
        running.start()
        try:
            yield Bed(cluster, kubectl, namespace, tiny_models, proxy)
        finally:
            kubectl.run(
                "delete", "sd", "--all", "-n", namespace, "--timeout=90s", check=False, timeout=100
            )
            running.stop()
            kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)
            print(f"--- operator log ({running.log_path}) ---\n{running.log_tail()}")


def live(verdicts: list[dict[str, Any]], result: str | None = None) -> list[dict[str, Any]]:
    return [
        v for v in verdicts if v["source"] == "Live" and (result is None or v["result"] == result)
    ]


def stable_serving(bed: Bed, draft: str | None, version: str, tokens: int = 3) -> str:
    """The revision serving `draft` at `tokens` (applied afresh when another one serves)."""
    status = bed.status()
    for record in status.get("revisions") or []:
        same = record["pairVersion"] == version
        if same and record["revision"] == status.get("stableRevision"):
            return str(record["revision"])
    bed.apply(draft, version, tokens=tokens)
    return bed.serving()


def test_1_a_correct_pair_is_promoted_beside_the_target_alone(bed: Bed) -> None:
    bed.apply(None, "1-target")
    bed.serving()
    with bed.load():
        bed.apply("draft-small", "2-small-k1", tokens=1)
        canary = bed.canary_of("2-small-k1")
        analysis = bed.outcome(canary)
    verdicts = bed.verdicts(canary)
    print(f"\nverdicts: {json.dumps(verdicts, indent=1)}")
    assert analysis["outcome"] == "Promote", verdicts
    assert verdicts[0]["source"] == "Probe"
    passes = live(verdicts, "Pass")
    assert len(passes) >= 3
    # Faster per token than the target alone, though every step is longer.
    for verdict in passes:
        assert verdict["timePerOutputTokenSeconds"] < verdict["stableTimePerOutputTokenSeconds"]
        assert verdict["stepSeconds"] > verdict["stableTimePerOutputTokenSeconds"]
    assert bed.serving() == canary


def held_while_the_stables_queries_fail(bed: Bed, stable: str, canary: str) -> None:
    """Once the canary is live, the stable's queries fail for four intervals: the canary is
    never promoted meanwhile, its verdicts say the stable's figures could not be read, and the
    stable still serves. The queries answer again when this returns."""

    def canary_live() -> bool:
        # The previous canary's analysis, still in status until this one's starts, says Live
        # too: only this canary's own Live stage will do.
        analysis = bed.status().get("analysis") or {}
        return analysis.get("revision") == canary and analysis.get("stage") == "Live"

    eventually(canary_live, ENGINE_READY_S, "the canary live")
    bed.proxy.fail_revision(stable)
    try:
        # Four intervals with the stable's figures failing: never promoted.
        held = time.monotonic() + 4 * INTERVAL_S
        while time.monotonic() < held:
            analysis = bed.status()["analysis"]
            assert analysis["outcome"] != "Promote", analysis
            time.sleep(2)
        held_verdicts = [v for v in live(bed.verdicts(canary)) if v["result"] != "Pass"]
        assert any("the stable's figures could not be read" in v["message"] for v in held_verdicts)
        assert bed.status()["stableRevision"] == stable
        assert bed.proxy.failed > 0
    finally:
        bed.proxy.heal()


def test_2_a_pair_with_another_k_is_promoted_when_faster_per_token_not_while_the_stable_fails(
    bed: Bed,
) -> None:
    # Its canary also stands for a failed query of the stable: promoted only once the stable's
    # figures are read again (a pair that would pass every interval, so the hold is what stops
    # its promotion).
    stable = stable_serving(bed, "draft-small", "2-small-k1", tokens=1)
    with bed.load():
        bed.apply("draft-small", "3-small-k3", tokens=3)
        canary = bed.canary_of("3-small-k3")
        held_while_the_stables_queries_fail(bed, stable, canary)
        analysis = bed.outcome(canary)
    verdicts = bed.verdicts(canary)
    print(f"\nverdicts: {json.dumps(verdicts, indent=1)}")
    assert analysis["outcome"] == "Promote", verdicts
    # Its acceptance was compared on the draft position both propose, not on its rate (a longer
    # k's later positions are accepted less).
    [probed] = [v for v in verdicts if v["source"] == "Probe"]
    assert "over the first position (the canary drafts 3, the stable 1)" in probed["message"]
    ratios = [
        v["timePerOutputTokenSeconds"] / v["stableTimePerOutputTokenSeconds"]
        for v in live(verdicts, "Pass")
    ]
    assert ratios, verdicts
    assert sorted(ratios)[len(ratios) // 2] < 1.0, ratios  # faster per token, by the median


def test_3_an_accepted_but_slow_draft_is_rolled_back_on_its_time_per_output_token(
    bed: Bed,
) -> None:
    stable = stable_serving(bed, "draft-small", "3-small-k3")
    with bed.load():
        # The slow draft drafted 1,100 to 1,900 tokens a minute in CI runs (60 s windows held
        # 1,868 to 1,940 in one run, 90 s windows 1,653 to 1,893 in another: every verdict
        # Inconclusive, then the inconclusive limit), probably while the process kubelet could
        # pin it beside the stable (a draining pod kept its CPU until 50489dc); on a CPU of
        # its own, about 2,700. A 180 s window holds the default minDraftTokens (2,000) down to
        # about 670 a minute, the criteria unchanged.
        bed.apply("draft-slow", "4-slow", window=SLOW_WINDOW)
        canary = bed.canary_of("4-slow")
        analysis = bed.outcome(canary)
    verdicts = bed.verdicts(canary)
    print(f"\nverdicts: {json.dumps(verdicts, indent=1)}")
    assert analysis["outcome"] == "Rollback", verdicts
    assert analysis["reason"] == "Analysis"
    probe = verdicts[0]
    assert (probe["source"], probe["result"]) == ("Probe", "Pass"), "its drafts are accepted"
    assert probe["acceptanceRate"] >= 0.99
    failed = live(verdicts, "Fail")
    assert len(failed) == 2, verdicts
    for verdict in failed:
        assert "time per output token" in verdict["message"], verdict
        assert verdict["acceptanceRate"] >= 0.99
        ratio = verdict["timePerOutputTokenSeconds"] / verdict["stableTimePerOutputTokenSeconds"]
        assert ratio > 1.10, verdict
    assert bed.serving() == stable
    shown = Plugin(bed.kubectl, bed.namespace)("status", SD)
    print(f"$ kubectl specdeploy status {SD}\n{shown}")
    assert f"Canary:           {canary}" in shown or f"Canary:         {canary}" in shown
    assert "time per output token" in shown
    described = bed.kubectl.run("describe", "sd", SD, "-n", bed.namespace, check=False).stdout
    print(f"$ kubectl describe sd {SD}\n{described}")


def test_4_a_bad_draft_is_rolled_back_on_its_probe_before_any_user_request(bed: Bed) -> None:
    stable_serving(bed, "draft-small", "3-small-k3")
    with bed.load() as load:
        bed.apply("draft-bad", "5-bad")
        canary = bed.canary_of("5-bad")
        analysis = bed.outcome(canary)
    verdicts = bed.verdicts(canary)
    print(f"\nverdicts: {json.dumps(verdicts, indent=1)}; load {dict(load.sent)}")
    assert analysis["outcome"] == "Rollback"
    assert [(v["source"], v["result"]) for v in verdicts] == [("Probe", "Fail")]
    assert verdicts[0]["message"].startswith("probe: acceptance 0.0")
    # No user request reached it: the load sends only to Ready pods, and vLLM counted exactly
    # the probe's requests.
    assert load.sent[canary] == 0
    served = prometheus_value(
        bed.cluster.prometheus_url,
        f'sum(max_over_time(vllm:request_success_total{{namespace="{bed.namespace}",'
        f'specdeploy_dev_revision="{canary}"}}[30m]))',
    )
    assert served == len(PROBE_PROMPTS), served
    assert bed.record(canary)["probe"]["requests"] == len(PROBE_PROMPTS)
    for pod in revision_pods(bed.kubectl, bed.namespace, SD, canary):
        assert not is_ready(pod), pod["status"]
    shown = Plugin(bed.kubectl, bed.namespace)("status", SD)
    print(f"$ kubectl specdeploy status {SD}\n{shown}")
    assert "Probe (the same prompts on every revision):" in shown


#: Two prompt mixes draft-small predicts unequally well. Greedy, 48 tokens, k=3 on the tiny
#: pair, the share of draft tokens accepted is, per prompt: "The scheduler places the pod on"
#: 1.00, "Every small engine serves" 0.87, "The cat sat on the" 0.79, "A node sees" 0.67; so
#: 0.93 on the stable's mix and 0.72 on the canary's. (Halves of the same four prompts can
#: match: "The cat sat on the" with "In the morning the queue" gave 0.81 live, "A node sees"
#: with "The scheduler places the pod on" 0.82.)
MIX_STABLE = ["The scheduler places the pod on", "Every small engine serves"]
MIX_CANARY = ["A node sees", "The cat sat on the"]


def test_5_the_same_draft_on_another_prompt_mix_is_not_rolled_back(bed: Bed) -> None:
    stable = stable_serving(bed, "draft-small", "3-small-k3")

    def prompts_for(revision: str) -> list[str]:
        return MIX_STABLE if revision == stable else MIX_CANARY

    with bed.load(prompts_for=prompts_for):
        bed.apply("draft-small", "6-small-k3-again")
        canary = bed.canary_of("6-small-k3-again")
        analysis = bed.outcome(canary)
    verdicts = bed.verdicts(canary)
    print(f"\nverdicts: {json.dumps(verdicts, indent=1)}")
    assert analysis["outcome"] == "Promote", verdicts
    assert verdicts[0]["source"] == "Probe"
    assert verdicts[0]["acceptanceRate"] == verdicts[0]["stableAcceptanceRate"]
    # On the live mixes the canary's acceptance fell below the stable's by more than
    # maxDropVsStable (0.1): judged on them alone, the same draft would have been rolled back.
    drops = [v["stableAcceptanceRate"] - v["acceptanceRate"] for v in live(verdicts)]
    assert max(drops) > 0.1, drops


def test_6_a_slower_first_token_beyond_the_bound_is_rolled_back(bed: Bed) -> None:
    stable_serving(bed, "draft-small", "6-small-k3-again")
    with bed.load(prompts_for=lambda _revision: LONG):
        bed.apply("draft-small", "7-no-prefix-cache", extra=["--no-enable-prefix-caching"])
        canary = bed.canary_of("7-no-prefix-cache")
        analysis = bed.outcome(canary)
    verdicts = bed.verdicts(canary)
    print(f"\nverdicts: {json.dumps(verdicts, indent=1)}")
    assert analysis["outcome"] == "Rollback", verdicts
    failed = live(verdicts, "Fail")
    assert len(failed) == 2, verdicts
    for verdict in failed:
        assert "time to first token" in verdict["message"], verdict
        first, theirs = verdict["timeToFirstTokenSeconds"], verdict["stableTimeToFirstTokenSeconds"]
        assert first > 1.5 * theirs, verdict
        assert first - theirs > 0.05, verdict
