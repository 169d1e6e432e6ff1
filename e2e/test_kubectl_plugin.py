"""`kubectl specdeploy`, found by the test bed's kubectl as a plugin, on KWOK pods, and the
rollout's deadlines.

KWOK pods give Prometheus nothing, so a canary's every verdict is Inconclusive and it holds:
each verb moves it (promote, abort, pause and resume, undo), `status` and `history` show it, and
a verb that does not apply refuses in one line. A canary that can never be ready (its pods
ask for more memory than its queue has) is rolled back at its progress deadline, and a held one
at its inconclusive limit, both freeing their pods; `retry` starts the held one again.
`resume-speculation` needs a collapse guard that fired, on real engines:
e2e/test_canary_engine.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_cluster import OperatorProcess, kwok_operator_config, operator_running
from sd_bodies import llama_8b
from testbed import ClusterEnv, Kubectl, eventually
from testbed.conditions import condition, is_ready

pytestmark = pytest.mark.e2e

SD = "chat"
#: The analysis interval of the SDs here (their verdicts are Inconclusive: no engine runs).
INTERVAL_S = 2


def with_canary(body: dict[str, Any], **analysis: Any) -> dict[str, Any]:
    body["spec"]["rollout"] = {
        "canary": {"replicas": 1},
        "analysis": {"interval": f"{INTERVAL_S}s", "window": "10s", **analysis},
    }
    return body


class Plugin:
    """`kubectl specdeploy ...` as a person runs it: kubectl finds `kubectl-specdeploy` on PATH."""

    def __init__(self, kubectl: Kubectl, namespace: str) -> None:
        self.kubectl = kubectl
        self.namespace = namespace
        bin_dir = Path(sys.executable).parent
        assert (bin_dir / "kubectl-specdeploy").exists(), "the package's console script"
        self.env = {
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "KUBECONFIG": str(kubectl.kubeconfig),
        }

    def __call__(self, *args: str, expect: int = 0) -> str:
        done = subprocess.run(
            [str(self.kubectl.binary), "specdeploy", "-n", self.namespace, *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
            check=False,
        )
        assert done.returncode == expect, (args, done.returncode, done.stdout, done.stderr)
        return done.stdout if expect == 0 else done.stderr


@pytest.fixture
def kwok_operator(
    cluster: ClusterEnv, kubectl: Kubectl, namespace: str, tmp_path: Path, sd_crd: None
) -> Iterator[OperatorProcess]:
    config = {**kwok_operator_config(cluster.prometheus_url), "progressDeadlineSeconds": 1800}
    running = OperatorProcess(cluster.kubeconfig, config, tmp_path, (namespace,))
    with operator_running(running, kubectl, namespace):
        yield running


def status(kubectl: Kubectl, namespace: str) -> dict[str, Any]:
    found: dict[str, Any] = kubectl.get_json("sd", SD, "-n", namespace).get("status") or {}
    return found


def canary_holding(kubectl: Kubectl, namespace: str, stable: str) -> str:
    def holding() -> str | None:
        found = status(kubectl, namespace)
        analysis = found.get("analysis") or {}
        canary = found.get("canaryRevision")
        ours = canary not in (None, stable) and analysis.get("revision") == canary
        return canary if ours and analysis.get("outcome") == "Hold" else None

    canary: str = eventually(holding, 90, "a canary holding on no data")
    return canary


def serving(kubectl: Kubectl, namespace: str, other_than: str | None = None) -> str:
    def found() -> str | None:
        sd = kubectl.get_json("sd", SD, "-n", namespace)
        stable = (sd.get("status") or {}).get("stableRevision")
        ready = is_ready(sd)
        return stable if ready and stable and stable != other_than else None

    revision: str = eventually(found, 90, "the SD serving")
    return revision


def test_every_verb_acts_through_the_sd_and_refuses_when_it_does_not_apply(
    kubectl: Kubectl, namespace: str, kwok_operator: OperatorProcess
) -> None:
    plugin = Plugin(kubectl, namespace)
    kubectl.apply([with_canary(llama_8b(SD, namespace, draft_revision="r1"))])
    first = serving(kubectl, namespace)
    refused = plugin("promote", SD, expect=1)
    assert refused == (
        "kubectl specdeploy promote: nothing to promote: no canary is under way; revision "
        f"{first} serves\n"
    )

    # promote: a canary holding on no data is promoted by a person.
    kubectl.apply([with_canary(llama_8b(SD, namespace, draft_revision="r2"))])
    second = canary_holding(kubectl, namespace, first)
    out = plugin("status", SD)
    print(f"\n$ kubectl specdeploy status {SD}\n{out}")
    assert f"Canary:         {second}" in out
    assert "Inconclusive" in out
    assert plugin("promote", SD) == f"{SD}: canary {second} promoted\n"
    assert serving(kubectl, namespace, other_than=first) == second
    # Honoured, then removed by the operator: it cannot promote a later turn of the revision.
    eventually(
        lambda: (
            "specdeploy.dev/promote"
            not in kubectl.get_json("sd", SD, "-n", namespace)["metadata"].get("annotations", {})
        ),
        30,
        "the spent promote request removed",
    )

    # pause, resume: no verdict is taken while paused.
    kubectl.apply([with_canary(llama_8b(SD, namespace, draft_revision="r3"))])
    third = canary_holding(kubectl, namespace, second)
    assert plugin("pause", SD) == f"{SD}: canary {third} paused: no verdict is taken\n"
    assert plugin("pause", SD).startswith(f"{SD}: already asked:"), "idempotent"

    def paused() -> dict[str, Any] | None:
        analysis = status(kubectl, namespace).get("analysis") or {}
        return analysis if analysis.get("paused") else None

    before = eventually(paused, 30, "the canary paused")
    sd = kubectl.get_json("sd", SD, "-n", namespace)
    assert condition(sd, "Progressing")["reason"] == "Paused"
    # Held for four intervals: at every poll the count and the last interval judged are the
    # ones the pause found (an operator that went on judging moves both within an interval).
    held_until = time.monotonic() + 4 * INTERVAL_S
    polls = 0
    while time.monotonic() < held_until:
        analysis = status(kubectl, namespace)["analysis"]
        assert analysis["inconclusiveInARow"] == before["inconclusiveInARow"], analysis
        assert analysis.get("lastInterval") == before.get("lastInterval"), analysis
        polls += 1
        time.sleep(0.5)
    assert polls >= 4
    assert plugin("resume", SD) == f"{SD}: canary {third} resumed: judged again\n"
    eventually(
        lambda: (
            status(kubectl, namespace)["analysis"]["inconclusiveInARow"]
            > before["inconclusiveInARow"]
        ),
        30,
        "verdicts again after resume",
    )
    assert plugin("resume", SD, expect=1).endswith("nothing to resume: no canary is paused\n")

    # abort: rolled back now, the stable keeps serving; not again.
    assert plugin("abort", SD) == (
        f"{SD}: canary {third} rolled back; revision {second} keeps serving\n"
    )

    def aborted() -> dict[str, Any] | None:
        sd = kubectl.get_json("sd", SD, "-n", namespace)
        degraded = condition(sd, "Degraded")
        return sd if degraded.get("reason") == "Aborted" else None

    sd = eventually(aborted, 30, "the canary aborted")
    assert condition(sd, "Ready")["status"] == "True"
    assert sd["status"]["stableRevision"] == second
    plugin("abort", SD, expect=1)
    deployments = kubectl.get_json("deployments", "-n", namespace)["items"]
    replicas = {
        d["metadata"]["labels"]["specdeploy.dev/revision"]: d["spec"]["replicas"]
        for d in deployments
    }
    assert replicas[third] == 0

    # history, undo: the first revision serves again until the spec changes.
    history = plugin("history", SD)
    print(f"$ kubectl specdeploy history {SD}\n{history}")
    numbers = {line.split()[1]: line.split()[0] for line in history.splitlines()[1:]}
    assert set(numbers) == {first, second, third}
    plugin("undo", SD, "--to-revision", "99", expect=1)
    refused = plugin("undo", SD, "--to-revision", numbers[third], expect=1)
    assert "was rolled back: undo serves only a revision that served" in refused
    assert plugin("undo", SD, "--to-revision", numbers[first]).startswith(
        f"{SD}: revision {first} serves until the spec changes"
    )
    assert serving(kubectl, namespace, other_than=second) == first
    sd = kubectl.get_json("sd", SD, "-n", namespace)
    assert condition(sd, "Progressing")["reason"] == "Undone"
    out = plugin("status", SD, "--watch", "--interval", "1", "--timeout", "2")
    assert out.count("--- ") >= 2, "refreshed"
    plugin("resume-speculation", SD, expect=1)


def test_a_canary_that_can_never_be_ready_is_rolled_back_at_its_deadline(
    kubectl: Kubectl, namespace: str, kwok_operator: OperatorProcess
) -> None:
    body = with_canary(llama_8b(SD, namespace, draft_revision="r1"))
    body["spec"]["rollout"]["progressDeadlineSeconds"] = 30
    kubectl.apply([body])
    stable = serving(kubectl, namespace)
    # More memory than the queue will ever admit: its pod stays gated by Kueue.
    body = with_canary(llama_8b(SD, namespace, draft_revision="r2"))
    body["spec"]["rollout"]["progressDeadlineSeconds"] = 30
    body["spec"]["engine"]["resources"] = {"memory": "100Ti"}
    kubectl.apply([body])

    def rolled_back() -> dict[str, Any] | None:
        sd = kubectl.get_json("sd", SD, "-n", namespace)
        degraded = condition(sd, "Degraded")
        return sd if degraded.get("reason") == "ProgressDeadlineExceeded" else None

    sd = eventually(rolled_back, 120, "the canary rolled back at its deadline")
    analysis = sd["status"]["analysis"]
    print(f"\n{json.dumps(analysis, indent=1)}")
    assert analysis["reason"] == "ProgressDeadlineExceeded"
    assert "progress deadline of 30s exceeded" in analysis["message"]
    assert "0/1 canary pods ready" in analysis["message"]
    assert condition(sd, "Ready")["status"] == "True"
    canary = analysis["revision"]
    eventually(
        lambda: (
            not [
                p
                for p in kubectl.get_json(
                    "pods", "-n", namespace, "-l", f"specdeploy.dev/revision={canary}"
                )["items"]
            ]
        ),
        60,
        "the canary's pod gone: its quota freed",
    )
    assert sd["status"]["stableRevision"] == stable


def test_a_hold_with_no_traffic_is_rolled_back_at_its_inconclusive_limit(
    kubectl: Kubectl, namespace: str, kwok_operator: OperatorProcess
) -> None:
    kubectl.apply([with_canary(llama_8b(SD, namespace, draft_revision="r1"), inconclusiveLimit=3)])
    stable = serving(kubectl, namespace)
    kubectl.apply([with_canary(llama_8b(SD, namespace, draft_revision="r2"), inconclusiveLimit=3)])

    def rolled_back() -> dict[str, Any] | None:
        sd = kubectl.get_json("sd", SD, "-n", namespace)
        degraded = condition(sd, "Degraded")
        return sd if degraded.get("reason") == "InconclusiveLimitReached" else None

    sd = eventually(rolled_back, 120, "the held canary rolled back at its limit")
    analysis = sd["status"]["analysis"]
    assert analysis["inconclusiveInARow"] == 3
    assert analysis["message"].startswith(
        "3 inconclusive verdicts in a row (inconclusiveLimit 3): rolled back to free the "
        "canary's pods"
    )
    assert sd["status"]["stableRevision"] == stable
    canary = analysis["revision"]
    eventually(
        lambda: (
            not kubectl.get_json(
                "pods", "-n", namespace, "-l", f"specdeploy.dev/revision={canary}"
            )["items"]
        ),
        60,
        "the canary's pod gone",
    )

    # Nothing measured it failing: `retry` starts it again as a new canary, once per value.
    plugin = Plugin(kubectl, namespace)
    assert plugin("retry", SD) == f"{SD}: revision {canary} tried again as a new canary\n"
    started = analysis["startedAt"]

    def again() -> dict[str, Any] | None:
        found = status(kubectl, namespace)
        analysis = found.get("analysis") or {}
        records = [r for r in found.get("revisions", []) if r["revision"] == canary]
        fresh = analysis.get("revision") == canary and analysis.get("outcome") == "Hold"
        return found if fresh and records and records[0].get("retried") == canary else None

    retried = eventually(again, 60, "the retried canary holding again")
    assert retried["canaryRevision"] == canary
    assert retried["stableRevision"] == stable
    [record] = [r for r in retried["revisions"] if r["revision"] == canary]
    assert record["phase"] == "Canary"
    assert retried["analysis"]["inconclusiveInARow"] < 3
    sd = eventually(rolled_back, 120, "the retried canary rolled back at its limit again")
    assert sd["status"]["analysis"]["startedAt"] != started, "a new analysis"
    time.sleep(2 * INTERVAL_S)
    found = status(kubectl, namespace)
    assert found["analysis"]["outcome"] == "Rollback", "the honoured value is not honoured twice"
    [record] = [r for r in found["revisions"] if r["revision"] == canary]
    assert record["phase"] == "Failed"
    assert plugin("retry", SD) == f"{SD}: revision {canary} tried again as a new canary\n"
    annotations = kubectl.get_json("sd", SD, "-n", namespace)["metadata"]["annotations"]
    assert annotations["specdeploy.dev/retry"] == f"{canary}-2"
