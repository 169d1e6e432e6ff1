"""The probe through the reconcile: readiness gates held and opened, the probe's verdict first."""

from __future__ import annotations

from typing import Any

from specdeploy.api import labels
from specdeploy.api.config import OperatorConfig
from specdeploy.handlers.reconcile import Reconciler
from specdeploy.plan.rollout.probe import ProbeResult
from specdeploy.plan.status.report import VERDICTS_KEPT
from test_canary import GOOD, NOTHING, World
from vllm_windows import figures

PROBE = {"configMapKeyRef": {"name": "prompts"}, "maxTokens": 32}


def probed(acceptance: float, prompt_set: str = "p1") -> ProbeResult:
    """A revision's probe as its pod reports it: 8 prompts of 32 tokens at k=3."""
    steps = 256 / (1 + 3 * acceptance)
    return ProbeResult(
        prompt_set=prompt_set,
        pods=1,
        complete_pods=1,
        prompts=8,
        requests=8,
        output_tokens=256 + 8,
        drafts=steps,
        draft_tokens=3 * steps,
        accepted_tokens=3 * acceptance * steps,
        decode_seconds=steps * 0.01,
        decode_steps=steps,
        first_token_seconds=0.16,
        first_tokens=8,
    )


class ProbedWorld(World):
    """The canary world with a probe in the spec: pods, their gates, and their probe figures."""

    def __init__(self) -> None:
        self.probes: dict[str, ProbeResult] = {}
        super().__init__()
        sd = self.kube.objects[("SpeculativeDeployment", "ns", "chat")]
        sd["spec"]["rollout"]["analysis"]["probe"] = PROBE

    def restart(self) -> Reconciler:
        self.reconciler = Reconciler(
            self.kube,  # type: ignore[arg-type]
            OperatorConfig(),
            lambda _b, type_, reason, message: self.events.append((type_, reason, message)),
            measure=lambda pods, _window, _stretch, _at: self.measured.get(pods.revision, NOTHING),
            measure_probe=lambda pods: self.probes.get(pods.revision),
            clock=lambda: self.now,
        )
        return self.reconciler

    def pod(self, revision: str) -> dict[str, Any]:
        """The revision's one pod (made on first ask), its containers ready: probe over."""
        name = f"chat-{revision}-0"
        for pod in self.kube.pods:
            if pod["metadata"]["name"] == name:
                return pod
        pod = {
            "metadata": {
                "name": name,
                "namespace": "ns",
                "labels": {labels.NAME: "chat", labels.REVISION: revision},
            },
            "status": {"conditions": [{"type": "ContainersReady", "status": "True"}]},
        }
        self.kube.pods.append(pod)
        return pod

    def gate_open(self, revision: str) -> bool:
        conditions = self.pod(revision)["status"]["conditions"]
        return any(c["type"] == labels.PROBE_GATE and c["status"] == "True" for c in conditions)

    def step(self, seconds: float = 0) -> None:
        """A reconcile, then the kubelets: a pod is ready once its gate is open."""
        self.now = self.now.__class__.fromtimestamp(self.now.timestamp() + seconds, self.now.tzinfo)
        self.reconciler.reconcile("ns", "chat")
        for (kind, _, name), obj in self.kube.objects.items():
            if kind != "Deployment":
                continue
            revision = name.removeprefix("chat-")
            replicas = obj["spec"]["replicas"]
            ready = replicas if replicas and self.gate_open(revision) else 0
            obj["status"] = {
                "replicas": replicas,
                "readyReplicas": ready,
                "observedGeneration": obj["metadata"]["generation"],
            }
        self.reconciler.reconcile("ns", "chat")


def started() -> tuple[ProbedWorld, str]:
    world = ProbedWorld()
    world.step()
    assert world.status.get("stableRevision") is None, "not ready before its gate opens"
    [stable] = world.replicas()
    world.pod(stable)
    world.probes[stable] = probed(0.8)
    world.step()
    assert world.gate_open(stable), "the first revision's pods are let in once probed"
    assert world.status["stableRevision"] == stable
    return world, stable


def live_after_a_passed_probe() -> tuple[ProbedWorld, str, str]:
    """A canary whose probe (0.78 against the stable's 0.8) passed: its gate open."""
    world, stable = started()
    _, canary = world.new_draft("r2")
    world.pod(canary)
    world.probes[canary] = probed(0.78)
    world.step()
    assert world.gate_open(canary)
    return world, stable, canary


def test_a_bad_draft_is_rolled_back_on_its_probe_and_never_takes_a_request() -> None:
    world, stable = started()
    _, canary = world.new_draft("r2")
    world.pod(canary)
    world.step()  # its probe is over; Prometheus has not read the figures yet
    assert not world.gate_open(canary)
    assert world.status["analysis"]["stage"] == "Probe"
    assert world.condition("Progressing")["reason"] == "CanaryProbing"

    world.probes[canary] = probed(0.02)
    world.step(5)
    assert not world.gate_open(canary), "no user request ever reached it"
    assert world.replicas() == {stable: 2, canary: 0}
    degraded = world.condition("Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "RolledBack")
    said = "probe: first-position acceptance 0.02 < 0.60 on the probe's 8 prompts"
    assert said in degraded["message"]
    [record] = [r for r in world.status["revisions"] if r["revision"] == canary]
    assert record["phase"] == "Failed"
    assert record["probe"]["acceptanceRate"] == 0.02
    assert [(v["source"], v["result"], v["interval"]) for v in record["verdicts"]] == [
        ("Probe", "Fail", -1)
    ]
    assert record["verdicts"][0]["stableAcceptanceRate"] == 0.8


def test_a_good_draft_passes_its_probe_its_gate_opens_and_live_traffic_promotes_it() -> None:
    world, stable, canary = live_after_a_passed_probe()
    assert world.status["analysis"]["stage"] == "Live"
    # Live: the canary's traffic has another prompt mix (0.6 accepted, not the stable's 0.8),
    # but the drop was judged on the probe's identical prompts; per token, each revision's
    # tokens a step come from the probe.
    world.measured = {stable: GOOD, canary: figures(0.62, 2.9, 0.010, draft_tokens=2412)}
    for _ in range(3):
        world.step(10)
    assert world.status["stableRevision"] == canary
    [record] = [r for r in world.status["revisions"] if r["revision"] == canary]
    assert [v["source"] for v in record["verdicts"]] == ["Probe", "Live", "Live"]
    assert "on the probe's tokens per step" in record["verdicts"][1]["message"]
    assert record["probe"]["promptSet"] == "p1"


def test_the_probe_verdict_stays_in_status_after_many_live_windows() -> None:
    world, stable, canary = live_after_a_passed_probe()
    # Windows too thin to judge, more than status keeps of a revision: the canary holds.
    world.measured = {stable: GOOD, canary: NOTHING}
    for _ in range(VERDICTS_KEPT + 3):
        world.step(10)
    [record] = [r for r in world.status["revisions"] if r["revision"] == canary]
    verdicts = record["verdicts"]
    assert len(verdicts) == VERDICTS_KEPT
    assert (verdicts[0]["source"], verdicts[0]["result"]) == ("Probe", "Pass")
    intervals = [v["interval"] for v in verdicts[1:]]
    assert intervals == sorted(intervals)
    assert len(set(intervals)) == VERDICTS_KEPT - 1
    assert {v["result"] for v in verdicts[1:]} == {"Inconclusive"}
    assert intervals[-1] == VERDICTS_KEPT + 2, "the newest window kept"
