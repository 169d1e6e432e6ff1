"""The collapse guard on a GPU-shaped pair: a head whose acceptance drifts is switched off.

An SD serves the simulator's 70B target with `sim/eagle3-drifting`, whose acceptance falls to
a third of itself 60 s after the pod's simulator starts (the traffic moved where the head was
not trained). With a guard at the floor 0.5 for 10 s, the operator switches speculation off:
the target alone serves as a new revision, and the status says why (e2e/sim_bed.py). The
operator is SIGKILLed at seeded moments once the guard counts below its floor (not before:
a kill before the watch begins has nothing to lose), and every request the load sent to the
pair and to its fallback was answered. Then a person brings the pair back
(`kubectl specdeploy resume-speculation`): it comes back as a canary.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from engine_cluster import events_of
from fault_injection import DURING, OperatorKiller, fault_seed, kills_per_rollout, record_run
from sim_bed import INTERVAL_S, READY_S, Bed, sim_bed
from test_kubectl_plugin import Plugin
from testbed import ClusterEnv, Kubectl, eventually
from testbed.conditions import condition

pytestmark = [pytest.mark.e2e]

NAME = "drifting"
FOR_S = 10


@pytest.fixture(scope="module")
def bed(
    cluster: ClusterEnv, kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bed]:
    with sim_bed(cluster, kubectl, tmp_path_factory.mktemp("operator"), "e2e-collapse") as found:
        yield found


def test_a_drifting_head_is_switched_off_by_the_guard_through_kills_then_resumed(
    bed: Bed,
) -> None:
    body = bed.body("sim/eagle3-drifting", "1-drifting", name=NAME)
    body["spec"]["rollout"] = {
        "canary": {"replicas": 1},
        "analysis": {"interval": f"{INTERVAL_S}s", "window": "30s"},
        "collapseGuard": {"floor": 0.5, "for": f"{FOR_S}s", "action": "DisableSpeculation"},
    }
    bed.kubectl.apply([body])
    started = time.monotonic()
    pair = bed.serving("1-drifting", NAME)

    def below() -> dict[str, Any] | None:
        status = bed.status(NAME)
        return status if (status.get("collapse") or {}).get("belowSince") else None

    def fallback_serving() -> str | None:
        status = bed.status(NAME)
        stable = status.get("stableRevision")
        return (
            stable
            if stable and stable != pair and (status.get("collapse") or {}).get("triggered")
            else None
        )

    seed = fault_seed("collapse on the simulator")
    # The kills are drawn inside the guard's count below its floor (from the moment the test
    # sees it begin, up to 3 s before it can fire), so each one lands while the guard watches.
    killer = OperatorKiller(
        bed.operator, bed.kubectl, bed.namespace, NAME, seed, kills_per_rollout(),
        FOR_S - 3, "collapse",
    )  # fmt: skip
    with bed.load(NAME) as load:
        eventually(below, READY_S + 120, "acceptance below the guard's floor")
        with killer:
            fallback = eventually(fallback_serving, 180, "the target alone serving")
            killer.finish()
        took = time.monotonic() - started
        # The load goes on a while against the fallback alone.
        time.sleep(2 * INTERVAL_S)
    status = bed.status(NAME)
    print(f"\ncollapse: the fallback served {took:.0f} s after the SD was applied")
    print(f"collapse: {status['collapse']}\nkills: {killer.points()}")
    assert killer.landed()[DURING] >= 1, killer.points()
    speculation = status["speculation"]
    assert (speculation["state"], speculation["reason"]) == ("Disabled", "DisabledAfterCollapse")
    assert "< floor 0.5" in speculation["message"], speculation
    assert status["collapse"]["action"] == "DisableSpeculation"
    degraded = condition(bed.sd(NAME), "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "AcceptanceCollapsed")
    # The drift starts 60 s after the pod's simulator does: the guard cannot fire before.
    assert took > 60
    # One fallback revision: the guard did not fire again after a restart.
    fallbacks = [r for r in status["revisions"] if r["draft"]["method"] == "none"]
    assert [r["revision"] for r in fallbacks] == [fallback], status["revisions"]
    # Both served every request sent to them, through the kills and the switch.
    assert load.sent[pair] > 0
    assert load.sent[fallback] > 0
    assert not [e for e in load.errors if e.startswith((f"{pair}:", f"{fallback}:"))], load.errors
    reasons = [e.get("reason") for e in events_of(bed.kubectl, bed.namespace, NAME)]
    print(f"events: {reasons}")
    record_run("collapse-sim", seed, speculation["state"], killer=killer)

    plugin = Plugin(bed.kubectl, bed.namespace)
    assert plugin("resume-speculation", NAME) == (
        f"{NAME}: speculation of revision {pair} resumed: the pair comes back\n"
    )

    def resumed() -> dict[str, Any] | None:
        found = bed.status(NAME)
        back = found.get("canaryRevision") == pair
        return found if back and found["collapse"].get("resumedWith") == pair else None

    found = eventually(resumed, 120, "the pair back as a canary")
    assert found["speculation"]["state"] == "Enabled"
    assert "already asked" in plugin("resume-speculation", NAME), "idempotent"
