"""Speculation is on by default, off on batch queues under Auto, and off when asked or collapsed."""

from __future__ import annotations

import pytest

from specdeploy.api.config import OperatorConfig
from specdeploy.api.models import SpeculativeDeploymentSpec as Spec
from specdeploy.plan.rollout.speculation import decide_speculation, served_spec

CONFIG = OperatorConfig(batchQueues=["batch"])


def _spec(queue: str | None, policy: str, method: str = "eagle3") -> Spec:
    draft = {"method": method, "numSpeculativeTokens": 3}
    if method == "eagle3":
        draft["model"] = "org/head"
    return Spec.model_validate(
        {
            "pair": {"version": "1", "target": {"model": "org/target"}, "draft": draft},
            "placement": {"queue": queue, "speculation": policy},
        }
    )


@pytest.mark.parametrize(
    ("queue", "policy", "state", "reason"),
    [
        ("interactive", "Auto", "Enabled", "SpeculationEnabled"),
        (None, "Auto", "Enabled", "SpeculationEnabled"),
        ("batch", "Auto", "Disabled", "BatchQueue"),
        ("batch", "Enabled", "Enabled", "SpeculationEnabled"),
        ("interactive", "Disabled", "Disabled", "DisabledBySpec"),
    ],
)
def test_policy_and_queue_decide(queue: str | None, policy: str, state: str, reason: str) -> None:
    decision = decide_speculation(_spec(queue, policy), CONFIG)
    assert (decision.state, decision.reason) == (state, reason)


def test_collapse_turns_speculation_off_even_when_on() -> None:
    decision = decide_speculation(_spec("interactive", "Enabled"), CONFIG, collapsed=True)
    assert (decision.state, decision.reason) == ("Disabled", "DisabledAfterCollapse")


def test_no_draft_is_off() -> None:
    decision = decide_speculation(_spec(None, "Auto", method="none"), CONFIG)
    assert (decision.state, decision.reason) == ("Disabled", "NoDraft")


def test_served_spec_drops_the_draft_only_when_off() -> None:
    spec = _spec("batch", "Auto")
    assert served_spec(spec, decide_speculation(spec, OperatorConfig())) == spec
    served = served_spec(spec, decide_speculation(spec, CONFIG))
    assert served.pair.draft.method == "none"
    assert served.pair.draft.model is None
    assert served.pair.target == spec.pair.target
    assert spec.pair.draft.method == "eagle3"
