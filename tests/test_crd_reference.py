"""docs/crd-reference.md is generated from the models and kept current, as crds/ is."""

from __future__ import annotations

from crd_reference import REFERENCE, main, render_reference, rows
from specdeploy.api.crd import CEL_RULES


def test_committed_reference_is_current() -> None:
    committed = REFERENCE.read_text(encoding="utf-8")
    assert committed == render_reference(), "docs/crd-reference.md is stale: run `make docs`"
    assert main(["--check"]) == 0


def test_every_cel_rule_sits_on_the_field_its_error_names() -> None:
    paths = {row.path for root in ("spec", "status") for row in rows(root)}
    for rule in CEL_RULES:
        assert rule.error_path.replace(".items", "[]") in paths, rule.error_path
    speculation = next(r for r in rows("spec") if r.path == "spec.placement.speculation")
    assert speculation.default == "`Auto`"
    assert speculation.validation[0].startswith("one of `")
    assert any(v.startswith("CEL: ") for v in speculation.validation)


def test_every_field_is_described() -> None:
    undocumented = [
        row.path
        for root in ("spec", "status")
        for row in rows(root)
        if not row.description and row.path not in ("spec", "status")
    ]
    assert not undocumented
