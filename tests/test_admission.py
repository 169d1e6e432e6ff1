"""The CRD accepts every example and rejects every invalid fixture for the stated reason.

Each file in tests/fixtures/invalid/ starts with `# expect: <text>`, a piece of the API server's
error that names the field. Here the API server is stood in for by specdeploy.api.admission;
the test bed runs the same files against a real one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from specdeploy.api.admission import admission_errors
from specdeploy.api.crd import CEL_RULES
from specdeploy.api.models import SpeculativeDeployment

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
INVALID = sorted((ROOT / "tests" / "fixtures" / "invalid").glob("*.yaml"))


def _expectation(path: Path) -> str:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name} must start with '# expect: '"
    return first.removeprefix("# expect: ")


def _load(path: Path) -> dict[str, Any]:
    body = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(body, dict)
    return body


def _cel_message(expect: str) -> str | None:
    """The CEL rule message an expectation names, if it names one."""
    tail = expect.split(": Invalid value: ", 1)[-1]
    return next((rule.message for rule in CEL_RULES if rule.message.startswith(tail)), None)


def test_there_are_examples_and_fixtures() -> None:
    assert len(EXAMPLES) >= 4
    assert len(INVALID) >= len(CEL_RULES)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_accepted(path: Path) -> None:
    body = _load(path)
    assert admission_errors(body) == ([], [])
    SpeculativeDeployment.from_body(body)


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_fixture_is_rejected_for_its_reason(path: Path) -> None:
    expect = _expectation(path)
    schema, cel = admission_errors(_load(path))
    if _cel_message(expect) is not None:
        # A CEL rule: the object is otherwise valid, and exactly this rule fails.
        assert schema == []
        assert len(cel) == 1, cel
        assert expect in cel[0]
    else:
        # A schema constraint: jsonschema words errors differently, so match the field path.
        field = expect.split(": ", 1)[0]
        assert cel == []
        assert [error for error in schema if error.split(": ", 1)[0] == field], schema


def test_every_cel_rule_has_a_rejecting_fixture() -> None:
    expectations = [_expectation(path) for path in INVALID]
    for rule in CEL_RULES:
        where = rule.error_path.replace(".items", "[0]")
        assert any(
            expect.startswith(f"{where}: Invalid value: ")
            and rule.message.startswith(expect.split(": Invalid value: ", 1)[1])
            for expect in expectations
        ), f"no fixture for: {where}: {rule.message}"
