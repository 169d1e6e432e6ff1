"""The canary judge on GPU-shaped figures: the simulator's 70B pair, at the default criteria.

One SD of the simulator's 70B target (20 ms steps on four H100s, docs/simulator.md) goes
through a run of new pairs, each a canary beside the one serving, every revision running the
same probe before it serves (e2e/sim_bed.py). Only the pacing differs from the defaults (a
verdict every 5 s over the last 30 s); every criterion is the default. `PerPodLoad` keeps each
ready engine at a running batch of 8.

1. target alone → the good EAGLE-3 head at k=3: promoted, faster per token though every step
   is longer, on figures a GPU gives (a 20 ms target step), and though its acceptance rate is
   under the 0.6 floor (the floor reads the first position, which does not fall with k);
2. → the same head again, while the stable's queries fail for four intervals: held, never
   promoted until they answer, then promoted;
3. → a head accepted 95 % but slow to run: rolled back on its time per output token;
4. → a bad head (5 % accepted): rolled back on its probe before any user request;
5. → the good head behind a cold first token (+400 ms): rolled back on time to first token;
6. → a head whose acceptance varies with the prompt, then the same head again with its pods
   sent another prompt mix than the stable's: not rolled back (the probe compared the two on
   identical prompts);
7. → the same head as the stable's, whose API answers 500 to a third of its requests once its
   probe has passed (as a chat template that raises would, before the engine): rolled back on
   the API server's 5xx share, which vLLM's finished requests never show.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator

import pytest

from engine_cluster import engine_url, prometheus_value, revision_pods
from sim_bed import INTERVAL_S, SD, Bed, live, report, sim_bed
from specdeploy.engine.tiny_models import PROBE_PROMPTS
from specdeploy.sim.engine import prompt_scale
from testbed import ClusterEnv, Kubectl
from testbed.conditions import is_ready

pytestmark = [pytest.mark.e2e]


@pytest.fixture(scope="module")
def bed(
    cluster: ClusterEnv, kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bed]:
    with sim_bed(cluster, kubectl, tmp_path_factory.mktemp("operator"), "e2e-judge-sim") as found:
        yield found


def test_1_a_good_head_is_promoted_beside_the_target_alone_on_gpu_shaped_steps(
    bed: Bed,
) -> None:
    bed.apply(None, "1-target")
    bed.serving("1-target")
    canary, analysis, verdicts, _ = bed.canary("sim/eagle3-good", "2-good")
    assert analysis["outcome"] == "Promote", verdicts
    assert verdicts[0]["source"] == "Probe"
    passes = live(verdicts, "Pass")
    assert len(passes) >= 3
    for verdict in passes:
        theirs = verdict["stableTimePerOutputTokenSeconds"]
        # A 70B target's step on four H100s (20 ms at batch 1, a little more at 8) ...
        assert 0.018 < theirs < 0.030, verdict
        # ... beaten per token by the head, though each of its steps is longer.
        assert verdict["timePerOutputTokenSeconds"] < theirs / 1.3, verdict
        assert verdict["stepSeconds"] > theirs, verdict
        # The rate a k=3 head reads, under minAcceptanceRate: not what the floor judges.
        assert verdict["acceptanceRate"] < 0.6, verdict
    assert bed.serving("2-good") == canary


def test_2_held_while_the_stables_queries_fail_then_promoted(bed: Bed) -> None:
    stable = bed.serving("2-good")
    with bed.load():
        bed.apply("sim/eagle3-good", "3-good-again")
        canary = bed.canary_of("3-good-again")
        bed.wait_live(canary)
        bed.proxy.fail_revision(stable)
        try:
            held = time.monotonic() + 4 * INTERVAL_S
            while time.monotonic() < held:
                assert bed.status()["analysis"]["outcome"] != "Promote"
                time.sleep(1)
            held_verdicts = [v for v in live(bed.verdicts(canary)) if v["result"] != "Pass"]
            assert any(
                "the stable's figures could not be read" in v["message"] for v in held_verdicts
            ), held_verdicts
            assert bed.status()["stableRevision"] == stable
            assert bed.proxy.failed > 0
        finally:
            bed.proxy.heal()
        analysis, took = bed.outcome(canary)
    report("held, then", bed.verdicts(canary), took)
    assert analysis["outcome"] == "Promote"


def test_3_an_accepted_but_slow_head_is_rolled_back_on_its_time_per_output_token(
    bed: Bed,
) -> None:
    stable = bed.serving("3-good-again")
    _, analysis, verdicts, _ = bed.canary("sim/eagle3-slow", "4-slow")
    assert (analysis["outcome"], analysis["reason"]) == ("Rollback", "Analysis"), verdicts
    assert (verdicts[0]["source"], verdicts[0]["result"]) == ("Probe", "Pass")
    failed = live(verdicts, "Fail")
    assert len(failed) == 2, verdicts
    for verdict in failed:
        assert "time per output token" in verdict["message"], verdict
        assert verdict["acceptanceRate"] >= 0.8, verdict
        ratio = verdict["timePerOutputTokenSeconds"] / verdict["stableTimePerOutputTokenSeconds"]
        assert ratio > 1.10, verdict
    assert bed.serving("3-good-again") == stable


def test_4_a_bad_head_is_rolled_back_on_its_probe_before_any_user_request(bed: Bed) -> None:
    bed.serving("3-good-again")
    canary, analysis, verdicts, load = bed.canary("sim/eagle3-bad", "5-bad")
    assert analysis["outcome"] == "Rollback"
    assert [(v["source"], v["result"]) for v in verdicts] == [("Probe", "Fail")]
    assert verdicts[0]["message"].startswith("probe: first-position acceptance 0.0"), verdicts
    assert load.sent[canary] == 0
    served = prometheus_value(
        bed.cluster.prometheus_url,
        f'sum(max_over_time(vllm:request_success_total{{namespace="{bed.namespace}",'
        f'specdeploy_dev_revision="{canary}"}}[30m]))',
    )
    assert served == len(PROBE_PROMPTS), served
    for pod in revision_pods(bed.kubectl, bed.namespace, SD, canary):
        assert not is_ready(pod), pod["status"]


def test_5_a_cold_first_token_is_rolled_back_on_time_to_first_token(bed: Bed) -> None:
    bed.serving("3-good-again")
    _, analysis, verdicts, _ = bed.canary("sim/eagle3-cold", "6-cold")
    assert analysis["outcome"] == "Rollback", verdicts
    failed = live(verdicts, "Fail")
    assert len(failed) == 2, verdicts
    for verdict in failed:
        assert "time to first token" in verdict["message"], verdict
        first, theirs = verdict["timeToFirstTokenSeconds"], verdict["stableTimeToFirstTokenSeconds"]
        assert first - theirs > 0.3, verdict


#: Prompts the varied head predicts best and worst (its acceptance scaled by the prompt's
#: factor, ±20 %): the stable's pods get the first two, the canary's the last two.
CANDIDATES = (
    "The cat sat on the",
    "The long queue moves",
    "A node sees",
    "Every small engine serves",
    "The old engine waits",
    "A quiet river runs",
)
BY_SCALE = sorted(CANDIDATES, key=lambda p: prompt_scale(p, 0.2), reverse=True)
MIX_STABLE, MIX_CANARY = BY_SCALE[:2], BY_SCALE[-2:]


def test_6_the_same_head_on_another_prompt_mix_is_not_rolled_back(bed: Bed) -> None:
    bed.serving("3-good-again")
    bed.canary("sim/eagle3-varied", "7-varied")
    stable = bed.serving("7-varied")

    def prompts_for(revision: str) -> list[str]:
        return list(MIX_STABLE if revision == stable else MIX_CANARY)

    _, analysis, verdicts, _ = bed.canary(
        "sim/eagle3-varied", "8-varied-again", prompts_for=prompts_for
    )
    assert analysis["outcome"] == "Promote", verdicts
    assert verdicts[0]["source"] == "Probe"
    assert verdicts[0]["acceptanceRate"] == verdicts[0]["stableAcceptanceRate"]
    # On the live mixes the canary's acceptance fell below the stable's by more than
    # maxDropVsStable (0.1): judged on them alone, the same head would have been rolled back.
    drops = [v["stableAcceptanceRate"] - v["acceptanceRate"] for v in live(verdicts)]
    assert max(drops) > 0.1, drops


def _put_faults(url: str, faults: dict[str, object]) -> None:
    request = urllib.request.Request(
        f"{url}/sim/faults",
        data=json.dumps(faults).encode(),
        headers={"Content-Type": "application/json"},
        method="PUT",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def test_7_5xx_before_the_engine_roll_the_canary_back_on_live_traffic(bed: Bed) -> None:
    stable = bed.serving("8-varied-again")
    with bed.load() as load:
        bed.apply("sim/eagle3-varied", "9-failing")
        canary = bed.canary_of("9-failing")
        bed.wait_live(canary, "the canary live, its probe passed")
        for pod in revision_pods(bed.kubectl, bed.namespace, SD, canary):
            _put_faults(engine_url(bed.cluster, pod), {"errorRates": {"500": 0.3}})
        analysis, took = bed.outcome(canary)
    verdicts = bed.verdicts(canary)
    report("9-failing (sim/eagle3-varied, 500s)", verdicts, took)
    assert analysis["outcome"] == "Rollback", verdicts
    assert verdicts[0]["source"] == "Probe"
    assert verdicts[0]["result"] == "Pass", verdicts[0]
    failed = live(verdicts, "Fail")
    assert failed, verdicts
    for verdict in failed:
        assert "HTTP 5xx" in verdict["message"], verdict
        # Refused before the engine: vLLM's finished requests hold no error.
        assert "errors 0.0% of" in verdict["message"] or "errors" not in verdict["message"]
    assert [e for e in load.errors if e.startswith(f"{canary}:")], "the load saw the 500s"
    assert bed.serving("8-varied-again") == stable
