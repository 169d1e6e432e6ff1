"""`kubectl specdeploy`: each verb's annotation, its refusals, its effect through the reconcile,
and what `status` and `history` print."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from specdeploy.api import labels
from specdeploy.api.models import SpeculativeDeployment
from specdeploy.plan.rollout.collapse import RESUME_ANNOTATION
from specdeploy.plugin import verbs
from specdeploy.plugin.cli import build_parser
from specdeploy.plugin.render import render_history, render_status
from test_canary import BAD, GOOD, World, started


def sd(world: World) -> SpeculativeDeployment:
    return SpeculativeDeployment.from_body(
        world.kube.objects[("SpeculativeDeployment", "ns", "chat")]
    )


def ask(world: World, request: verbs.Request) -> None:
    """What the plugin sends: a merge patch of the SD's annotations."""
    body = world.kube.objects[("SpeculativeDeployment", "ns", "chat")]
    annotations = body["metadata"].setdefault("annotations", {})
    for key in request.removes:
        annotations.pop(key, None)
    if request.value is None:
        annotations.pop(request.annotation, None)
    else:
        annotations[request.annotation] = request.value


def test_verbs_without_a_canary_refuse_in_one_line() -> None:
    world = started()
    stable = world.status["stableRevision"]
    for verb in (verbs.promote, verbs.abort, verbs.pause):
        with pytest.raises(verbs.NotApplicableError) as refused:
            verb(sd(world))
        assert str(refused.value).endswith(f"no canary is under way; revision {stable} serves")
        assert "\n" not in str(refused.value)
    with pytest.raises(verbs.NotApplicableError, match="no canary is paused"):
        verbs.resume(sd(world))
    with pytest.raises(verbs.NotApplicableError, match="the collapse guard has not fired"):
        verbs.resume_speculation(sd(world))
    with pytest.raises(verbs.NotApplicableError, match="no earlier revision that served"):
        verbs.undo(sd(world), {})


def test_abort_rolls_the_canary_back_and_asking_again_changes_nothing() -> None:
    world = started()
    stable, canary = world.new_draft("r2")
    world.measured = {stable: GOOD, canary: GOOD}
    request = verbs.abort(sd(world))
    assert (request.annotation, request.value) == (labels.ABORT, canary)
    ask(world, request)
    world.step()
    assert world.replicas() == {stable: 2, canary: 0}
    degraded = world.condition("Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "Aborted")
    assert "aborted by a person (kubectl specdeploy abort)" in degraded["message"]
    assert world.condition("Ready")["status"] == "True"
    # Idempotent: the canary is gone, a second abort does not apply; the first one stands.
    with pytest.raises(verbs.NotApplicableError):
        verbs.abort(sd(world))
    world.restart()
    world.step(60)
    assert world.replicas() == {stable: 2, canary: 0}


def test_promote_now_and_pause_then_resume() -> None:
    world = started()
    stable, canary = world.new_draft("r2")
    world.measured = {stable: GOOD, canary: BAD}
    pause = verbs.pause(sd(world))
    ask(world, pause)
    for _ in range(4):
        world.step(10)
    assert world.status["analysis"]["paused"] is True
    assert world.status["analysis"]["failures"] == 0, "no verdict while paused"
    assert world.condition("Progressing")["reason"] == "Paused"
    assert verbs.pause(sd(world)).already
    ask(world, verbs.resume(sd(world)))
    world.step(10)
    assert world.status["analysis"]["failures"] == 1

    promote = verbs.promote(sd(world))
    assert (promote.annotation, promote.value) == (labels.PROMOTE, canary)
    ask(world, promote)
    world.step()
    world.step()
    assert world.status["stableRevision"] == canary
    assert world.replicas() == {stable: 0, canary: 2}
    [record] = [r for r in world.status["revisions"] if r["revision"] == canary]
    assert record["verdicts"][-1]["source"] == "Person"


@pytest.mark.parametrize("verb", ["promote", "abort", "pause"])
def test_a_request_never_outlives_its_canary(verb: str) -> None:
    # Revision hashes are deterministic: the spec that comes back is the same revision. A
    # request made for its earlier turn is removed once that turn's analysis ended, so the
    # revision is judged afresh, not promoted, rolled back or held by it.
    world = started()
    stable, canary = world.new_draft("r2")
    world.measured = {stable: GOOD, canary: GOOD}
    request = getattr(verbs, verb)(sd(world))
    ask(world, request)
    world.step(10)
    if verb == "pause":
        assert world.status["analysis"]["paused"] is True
        assert sd(world).metadata.annotations[labels.PAUSE] == canary, "in force while it holds"
        ask(world, verbs.promote(sd(world)))
    world.step()
    world.step()
    assert world.status["analysis"]["outcome"] in ("Promote", "Rollback")
    spent = {labels.PROMOTE, labels.ABORT, labels.PAUSE} & set(sd(world).metadata.annotations)
    assert not spent, "the operator removed the requests of the ended analysis"
    if verb == "abort":
        return  # a rolled-back revision that comes back stays so until `retry`
    # Away (the judge promotes r3 on its own: no request of a person) and back: the same
    # revision is a canary again, and its analysis runs.
    _, away = world.new_draft("r3")
    world.measured = {**world.measured, away: GOOD}
    for _ in range(30):
        world.step(10)
        if world.status["stableRevision"] == away:
            break
    back = world.status["stableRevision"]
    assert back == away
    _, again = world.new_draft("r2")
    assert again == canary
    world.step(10)
    analysis = world.status["analysis"]
    assert (analysis["revision"], analysis["outcome"]) == (canary, "Continue")
    assert analysis.get("paused") is not True
    assert world.status["stableRevision"] == back


def test_undo_serves_an_earlier_revision_until_the_spec_changes() -> None:
    world = started()
    first, second = world.new_draft("r2")
    world.measured = {first: GOOD, second: GOOD}
    world.step(10)
    world.step(10)
    world.step()
    assert world.status["stableRevision"] == second
    records = {1: first, 2: second}
    with pytest.raises(verbs.NotApplicableError, match="record 7 does not exist"):
        verbs.undo(sd(world), records, to_record=7)
    request = verbs.undo(sd(world), records, to_record=1)
    generation = sd(world).metadata.generation
    assert (request.annotation, request.value) == (labels.UNDO, f"{first}@{generation}")
    assert verbs.undo(sd(world), records) == request, "the default: the one before"
    ask(world, request)
    world.step()
    world.step()
    assert world.status["stableRevision"] == first
    assert world.replicas() == {first: 2, second: 0}
    progressing = world.condition("Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "Undone")
    assert world.condition("Ready")["status"] == "True"
    assert world.condition("Degraded")["status"] == "False"
    # The spec moves on: the undo no longer holds, the new pair rolls out as a canary.
    _, third = world.new_draft("r3")
    assert world.status["canaryRevision"] == third
    assert world.replicas()[third] == 1


def test_retry_starts_an_aborted_canary_afresh_once_per_value() -> None:
    world = started()
    stable, canary = world.new_draft("r2")
    world.measured = {stable: GOOD, canary: GOOD}
    world.step(10)
    ask(world, verbs.abort(sd(world)))
    world.step()
    assert world.replicas() == {stable: 2, canary: 0}
    # The abort was honoured: the operator removed it (a spent request).
    assert labels.ABORT not in sd(world).metadata.annotations
    request = verbs.retry(sd(world))
    assert (request.annotation, request.value, request.removes) == (labels.RETRY, canary, ())
    assert verbs.annotation_patch(request) == {"metadata": {"annotations": {labels.RETRY: canary}}}
    ask(world, request)
    world.step()
    # A new canary: its pod back, its analysis from the start, its earlier verdicts kept.
    assert world.status["canaryRevision"] == canary
    assert world.replicas() == {stable: 2, canary: 1}
    analysis = world.status["analysis"]
    assert analysis["revision"] == canary
    assert analysis["outcome"] == "Continue"
    assert analysis["failures"] == 0
    assert analysis["passesInARow"] == 0
    [record] = [r for r in world.status["revisions"] if r["revision"] == canary]
    assert (record["phase"], record["retried"]) == ("Canary", canary)
    assert [v["source"] for v in record["verdicts"]][-1] == "Person"
    assert world.condition("Degraded")["status"] == "False"
    assert verbs.retry(sd(world)).already
    # Aborted again: the honoured value does not start it a third time, a new one would.
    ask(world, verbs.abort(sd(world)))
    world.step()
    world.restart()
    world.step(60)
    world.step(60)
    assert world.replicas() == {stable: 2, canary: 0}
    [record] = [r for r in world.status["revisions"] if r["revision"] == canary]
    assert [v["source"] for v in record["verdicts"]].count("Person") == 2, "not retried again"
    assert verbs.retry(sd(world)).value == f"{canary}-2"


def test_retry_refuses_a_canary_its_live_verdicts_failed_and_one_that_serves() -> None:
    world = started()
    with pytest.raises(verbs.NotApplicableError, match="was not rolled back"):
        verbs.retry(sd(world))
    stable, canary = world.new_draft("r2")
    world.measured = {stable: GOOD, canary: BAD}
    for _ in range(3):
        world.step(10)
    assert world.replicas() == {stable: 2, canary: 0}
    with pytest.raises(verbs.NotApplicableError, match="rolled back on a failed live verdict"):
        verbs.retry(sd(world))
    # Asked by hand all the same: the operator honours no retry of a pair its verdicts failed.
    ask(world, verbs.Request(labels.RETRY, canary, "by hand"))
    world.step()
    world.step(10)
    assert world.replicas() == {stable: 2, canary: 0}
    assert world.condition("Degraded")["reason"] == "RolledBack"


def test_resume_speculation_names_the_collapsed_revision_and_a_new_value_each_time() -> None:
    world = started()
    body = world.kube.objects[("SpeculativeDeployment", "ns", "chat")]
    body["status"]["collapse"] = {"revision": "abc", "triggered": True, "action": "X"}
    assert verbs.resume_speculation(sd(world)).value == "abc"
    body["metadata"].setdefault("annotations", {})[RESUME_ANNOTATION] = "abc"
    body["status"]["collapse"]["resumedWith"] = "abc"
    assert verbs.resume_speculation(sd(world)).value == "abc-2", "fired again"
    body["status"]["collapse"]["triggered"] = False  # resumed: asking again changes nothing
    assert verbs.resume_speculation(sd(world)).already


def test_status_prints_the_canary_s_verdicts_beside_the_stable_s_figures() -> None:
    world = started()
    stable, canary = world.new_draft("r2")
    world.measured = {stable: GOOD, canary: BAD}
    world.step(10)
    body: dict[str, Any] = world.kube.objects[("SpeculativeDeployment", "ns", "chat")]
    text = render_status(body, now=datetime(2026, 11, 23, 12, 1, tzinfo=UTC))
    assert f"Stable:         {stable}" in text
    assert f"Canary:         {canary}" in text
    assert "stage Live; 0 passes in a row, 1 failures, 0 inconclusive in a row" in text
    assert "TIME      SOURCE  RESULT  ACCEPTANCE    MS/TOKEN    TTFT MS   ERRORS %" in text
    assert "12:00:10  Live    Fail    0.08 vs 0.80  8.3 vs 3.1  20 vs 20  0.0 vs 0.0" in text
    assert "latest: first-position acceptance 0.08 < 0.60 over 2,412 draft tokens" in text
    history = render_history(body, {stable: 1, canary: 2})
    assert history.splitlines()[0].split() == [
        "#",
        "REVISION",
        "VERSION",
        "DRAFT",
        "PHASE",
        "AGE",
        "LAST",
        "VERDICT",
    ]
    assert f"2  {canary}" in history


def test_every_verb_is_on_the_command_line() -> None:
    parser = build_parser()
    for argv in (
        ["status", "chat", "--watch"],
        ["-n", "serving", "promote", "chat", "--full"],
        ["abort", "chat", "-n", "serving"],
        ["pause", "chat"],
        ["resume", "chat"],
        ["resume-speculation", "chat"],
        ["history", "chat"],
        ["undo", "chat", "--to-revision", "3"],
    ):
        args = parser.parse_args(argv)
        assert args.name == "chat"
