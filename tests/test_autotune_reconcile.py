"""The autotuner through the reconcile: the in-memory API, a scripted clock and measurements."""

from __future__ import annotations

import dataclasses
from typing import Any

from specdeploy.adapters.prometheus import RevisionPods
from specdeploy.handlers.reconcile import Reconciler
from specdeploy.plan.rollout.autotune import AutotuneMeasurement
from test_canary import GOOD, World
from vllm_windows import figures

# The stable serves k=3 (sd_body); 1000 drafts accepted 0.9, 0.8, 0.7 at positions 0-2, a 13 ms
# step: with draftCostRatio 0.1 and maxTokens 5 the model predicts k=5, +10.7 % (see
# test_autotune_model).
WELL_PREDICTED = AutotuneMeasurement(
    drafts=1000, draft_tokens=3000, accepted_per_position=(900, 800, 700), step_seconds=0.013
)


class TunedWorld(World):
    def __init__(self, mode: str) -> None:
        self.tuning_measured: dict[str, AutotuneMeasurement] = {}
        self.autotune_reads: list[str] = []
        super().__init__()
        draft = self.sd["spec"]["pair"]["draft"]
        draft["autotune"] = {"mode": mode, "maxTokens": 5, "draftCostRatio": 0.1}

    @property
    def sd(self) -> dict[str, Any]:
        found: dict[str, Any] = self.kube.objects[("SpeculativeDeployment", "ns", "chat")]
        return found

    def restart(self) -> Reconciler:
        reconciler = super().restart()
        reconciler.measure_autotune = self._measure_autotune
        return reconciler

    def _measure_autotune(self, pods: RevisionPods, _window: str) -> AutotuneMeasurement:
        self.autotune_reads.append(pods.revision)
        return self.tuning_measured.get(pods.revision, AutotuneMeasurement())

    def reasons(self) -> list[str]:
        return [reason for _, reason, _ in self.events]


def serving_well_predicted(mode: str) -> tuple[TunedWorld, str]:
    """The first revision serving (k=3), measured as WELL_PREDICTED; one interval on."""
    world = TunedWorld(mode)
    world.step()
    stable = world.status["stableRevision"]
    world.measured = {stable: GOOD}
    world.tuning_measured = {stable: WELL_PREDICTED}
    world.step(10)
    return world, stable


def speculative_config(world: World, revision: str) -> str:
    """The --speculative-config the revision's pods are started with."""
    deployment = world.kube.objects[("Deployment", "ns", f"chat-{revision}")]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    args: list[str] = container["args"]
    return args[args.index("--speculative-config") + 1].replace(" ", "")


def test_recommend_writes_status_autotune_and_changes_nothing_else() -> None:
    world, stable = serving_well_predicted("Recommend")
    world.step(10)

    tuned = world.status["autotune"]
    assert tuned["recommendation"]["numSpeculativeTokens"] == 5
    assert tuned["recommendation"]["changed"] is True
    assert tuned["inputs"]["revision"] == stable
    assert tuned["inputs"]["acceptancePerPosition"] == [0.9, 0.8, 0.7]
    assert world.replicas() == {stable: 2}, "Recommend starts no revision"
    assert world.status["stableRevision"] == stable
    assert "TunedRevisionRolledOut" not in world.reasons()
    # At most once per analysis interval (10s here): four reconciles in 20 s, two reads.
    assert world.autotune_reads == [stable, stable]


def test_turning_recommend_on_is_no_new_revision() -> None:
    world = World()
    world.step()
    stable = world.status["stableRevision"]
    sd = world.kube.objects[("SpeculativeDeployment", "ns", "chat")]
    sd["spec"]["pair"]["draft"]["autotune"] = {"mode": "Recommend"}
    sd["metadata"]["generation"] += 1
    world.step(10)
    assert world.replicas() == {stable: 2}
    assert world.status["stableRevision"] == stable


def test_apply_rolls_a_tuned_revision_through_the_canary_and_promotes_it() -> None:
    world, stable = serving_well_predicted("Apply")

    canary = world.status["canaryRevision"]
    assert canary is not None
    assert canary != stable
    assert world.status["autotune"]["trialRevision"] == canary
    assert world.status["autotune"]["appliedTokens"] == 5
    assert world.replicas() == {stable: 2, canary: 1}
    assert '"num_speculative_tokens":5' in speculative_config(world, canary)
    assert '"num_speculative_tokens":3' in speculative_config(world, stable)
    assert "TunedRevisionRolledOut" in world.reasons()

    # k=5 accepts a smaller share of its drafts (0.68 against 0.80, more than maxDropVsStable
    # 0.10 lower) and its steps are 15 % longer, both of which would fail an ordinary canary;
    # but 4.4 tokens a 23 ms step is 191 tokens/s against 3.4 a 20 ms step, 170: it passes.
    world.measured = {
        stable: figures(0.80, 3.4, 0.020, draft_tokens=6000),
        canary: figures(0.68, 4.4, 0.023, draft_tokens=6000),
    }
    world.step(10)
    world.step(10)
    world.step(10)
    assert "tuned revision: 191.3 tokens/s" in world.status["analysis"]["message"]
    assert world.status["stableRevision"] == canary
    assert world.replicas() == {stable: 0, canary: 2}
    assert world.reasons().count("TunedRevisionPromoted") == 1
    assert world.status["autotune"].get("trialRevision") is None
    # The tuned k serves on; the recommendation now measured at k=5 is to keep it.
    world.tuning_measured = {
        canary: AutotuneMeasurement(
            drafts=1000,
            draft_tokens=5000,
            accepted_per_position=(900, 800, 700, 551, 391),
            step_seconds=0.015,
        )
    }
    world.step(10)
    assert world.status["autotune"]["recommendation"]["numSpeculativeTokens"] == 5
    assert world.status["autotune"]["recommendation"]["changed"] is False
    assert world.reasons().count("TunedRevisionRolledOut") == 1


def test_a_tuned_revision_the_canary_rejects_is_rolled_back_and_not_retried() -> None:
    world, stable = serving_well_predicted("Apply")
    canary = world.status["canaryRevision"]
    # The longer k is slower in fact: 3.2 tokens a 50 ms step is 64 tokens/s against the
    # stable's 3.1 a 20 ms step, 155.
    slow = figures(0.8, 3.2, 0.05, draft_tokens=2412)
    world.measured = {
        stable: figures(0.8, 3.1, 0.02, draft_tokens=2412),
        canary: slow,
    }
    world.tuning_measured[canary] = AutotuneMeasurement(
        drafts=500,
        draft_tokens=2500,
        accepted_per_position=(450, 400, 350, 300, 200),
        step_seconds=0.05,
    )
    for _ in range(4):
        world.step(10)
    assert "TunedRevisionRejected" in world.reasons()
    assert world.status["autotune"]["rejectedTokens"] == [5]
    # The trial's step time was read beside the stable's and is kept for the cost fit.
    assert canary in world.autotune_reads
    costs = world.status["autotune"]["inputs"]["stepCosts"]
    assert {"numSpeculativeTokens": 5, "stepSeconds": 0.05} in [
        {k: c[k] for k in ("numSpeculativeTokens", "stepSeconds")} for c in costs
    ]
    assert world.status["stableRevision"] == stable
    assert world.replicas().get(canary, 0) == 0
    assert world.replicas()[stable] == 2
    # An hour on, the same recommendation is not rolled out again.
    world.now = world.now.replace(hour=world.now.hour + 1)
    for _ in range(3):
        world.step(10)
    assert world.reasons().count("TunedRevisionRolledOut") == 1
    assert world.status["autotune"]["recommendation"]["numSpeculativeTokens"] == 5
    assert world.replicas()[stable] == 2


def test_a_recommended_schedule_is_rolled_out_as_a_revision_and_promoted_with_it() -> None:
    """Recommend measures two batch sizes, Apply then rolls the schedule out (the model's case in
    test_autotune_model: b 1: k=5, 2-4: k=4, 5-16: k=3) and the promoted revision serves it."""
    world = TunedWorld("Recommend")
    draft = world.sd["spec"]["pair"]["draft"]
    draft["autotune"]["schedule"] = "Auto"
    world.sd["spec"]["engine"] = {"maxModelLen": 4096, "maxNumSeqs": 16}  # fits a MIG slice
    world.step()
    stable = world.status["stableRevision"]
    world.measured = {stable: GOOD}
    world.tuning_measured = {
        stable: dataclasses.replace(WELL_PREDICTED, step_seconds=0.015, mean_batch_size=1.0)
    }
    world.step(10)
    world.tuning_measured = {
        stable: dataclasses.replace(WELL_PREDICTED, step_seconds=0.029, mean_batch_size=8.0)
    }
    world.step(10)
    recommendation = world.status["autotune"]["recommendation"]
    assert [(s["maxBatchSize"], s["tokens"]) for s in recommendation["schedule"]] == [
        (1, 5),
        (4, 4),
        (16, 3),
    ]
    assert world.replicas() == {stable: 2}, "Recommend starts no revision"

    draft["autotune"]["mode"] = "Apply"
    world.sd["metadata"]["generation"] += 1
    world.step(10)
    canary = world.status["canaryRevision"]
    assert canary not in (None, stable)
    assert world.status["autotune"]["trialRevision"] == canary
    config = speculative_config(world, canary)
    assert '"num_speculative_tokens":5' in config
    assert '"num_speculative_tokens_per_batch_size":[[1,1,5],[2,4,4],[5,16,3]]' in config
    assert "per_batch_size" not in speculative_config(world, stable)
    assert world.reasons().count("TunedRevisionRolledOut") == 1

    # Judged by throughput, as any tuned revision: 4.0 tokens a 20 ms step against 3.4.
    world.measured = {
        stable: figures(0.8, 3.4, 0.020, draft_tokens=2412),
        canary: figures(0.8, 4.0, 0.020, draft_tokens=2412),
    }
    for _ in range(3):
        world.step(10)
    assert world.status["stableRevision"] == canary
    assert world.replicas() == {stable: 0, canary: 2}
    assert world.reasons().count("TunedRevisionPromoted") == 1
    assert world.status["autotune"]["appliedSchedule"] == recommendation["schedule"]
    # Measured again at both batch sizes, the served schedule is no new trial.
    world.tuning_measured = {
        canary: dataclasses.replace(WELL_PREDICTED, step_seconds=0.029, mean_batch_size=8.0)
    }
    world.step(10)
    assert world.reasons().count("TunedRevisionRolledOut") == 1
    assert world.status.get("canaryRevision") is None
