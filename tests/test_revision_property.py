"""Property: one revision hash never names two different pod templates.

Each revision is one Deployment `<sd>-<hash>` whose pod template must never change, so any two
inputs of the reconcile (spec, sizing decision, operator config, collapse flag) that give
different pod templates must give different hashes. The inputs are drawn from the schemas
(the CRD's spec schema with its CEL rules, the SizingDecision and OperatorConfig models), not
from a list of fields kept here; each example is a base and a dozen neighbours, each one edit
away at any schema path, since unrelated inputs almost never share a hash and would prove
nothing. All go through the reconcile's own path: decide_speculation, served_spec,
revision_hash and build_revision_deployment.

The converse holds only where revision.py promises it: an edit outside the pod template
(replicas, rollout, queue, ...; see OUTSIDE_TEMPLATE) changes the hash only if it changes the
pod template through another decision (a batch queue turning speculation off).
"""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, assume, event, given, reject, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from schema_strategies import Path, single_edits, value_strategy
from specdeploy.api.admission import admission_errors, apply_defaults, crd_schema
from specdeploy.api.config import OperatorConfig
from specdeploy.api.crd import structural_schema
from specdeploy.api.models import API_VERSION, KIND, SizingDecision, SpeculativeDeployment
from specdeploy.plan.children.manifests import build_revision_deployment
from specdeploy.plan.children.revision import revision_hash
from specdeploy.plan.rollout.speculation import decide_speculation, served_spec

METADATA = {"name": "chat", "namespace": "serving", "uid": "0b8c5c0e-uid"}

# Everything one reconcile builds a revision from. The reconcile only builds a Deployment when
# sizing gave a decision, so sizing is required here.
INPUTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["spec", "sizing", "config", "collapsed"],
    "properties": {
        "spec": crd_schema()["properties"]["spec"],
        "sizing": structural_schema(SizingDecision, keep_defaults=True),
        "config": structural_schema(OperatorConfig, keep_defaults=True),
        # The collapse guard's DisableSpeculation verdict (decide_speculation's `collapsed`).
        "collapsed": {"type": "boolean"},
    },
}

# Inputs revision.py declares outside the pod template: they reach the Deployment's labels and
# replica counts, the status, or another decision (speculation, sizing) whose result is an
# input of its own here. An edit below one of these paths that leaves the pod template alone
# must leave the hash alone.
OUTSIDE_TEMPLATE: tuple[Path, ...] = (
    ("spec", "replicas"),
    ("spec", "rollout"),
    ("spec", "revisionHistoryLimit"),
    ("spec", "placement", "queue"),
    ("spec", "placement", "priorityClass"),
    ("spec", "placement", "speculation"),
    ("spec", "placement", "gpu"),
    ("spec", "pair", "target", "shape"),
    ("spec", "pair", "draft", "shape"),
    ("sizing", "gpuProduct"),
    ("sizing", "migProfile"),
    ("sizing", "memory"),
    ("sizing", "message"),
    ("config", "batchQueues"),
    ("config", "prometheusUrl"),
    ("config", "analysisDefaults"),
    ("config", "gpuCatalog"),
    ("config", "namespaces"),
    ("config", "reconcileIntervalSeconds"),
    ("config", "livenessEndpoint"),
    ("config", "modelConfigUrl"),
    ("collapsed",),
)

# Bounded and derandomized: the same examples on every run and in CI, in a few seconds on a
# shared two-core machine (SPECDEPLOY_PROPERTY_EXAMPLES=1000 for a deeper run by hand). No
# shrinking: shrinking inputs this large takes minutes, and the assertion already names the
# edit and how the pod templates differ.
PROPERTY_SETTINGS = settings(
    max_examples=int(os.environ.get("SPECDEPLOY_PROPERTY_EXAMPLES", "80")),
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
# Edits judged against each base: a base costs far more to draw than an edit of it.
EDITS_PER_BASE = 12

Reconciled = tuple[SpeculativeDeployment, SizingDecision, OperatorConfig]


def _reconciled(inputs: dict[str, Any]) -> Reconciled | None:
    """The served SD, sizing and config the reconcile would build a revision from.

    None when the API server would refuse the spec or the models cannot parse the inputs.
    """
    body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": METADATA, "spec": inputs["spec"]}
    if admission_errors(body) != ([], []):
        return None
    stored = apply_defaults(crd_schema(), copy.deepcopy(body))
    try:
        sd = SpeculativeDeployment.from_body(stored)
        sizing = SizingDecision.model_validate(inputs["sizing"])
        config = OperatorConfig.from_mapping(inputs["config"])
    except ValidationError:
        return None
    speculation = decide_speculation(sd.spec, config, collapsed=inputs["collapsed"])
    served = sd.model_copy(update={"spec": served_spec(sd.spec, speculation)})
    return served, sizing, config


def _hash(reconciled: Reconciled) -> str:
    served, sizing, config = reconciled
    return revision_hash(served.spec, sizing, config)


def _pod_template(reconciled: Reconciled, revision: str) -> dict[str, Any]:
    served, sizing, config = reconciled
    deployment = build_revision_deployment(served, revision, sizing, config)
    template: dict[str, Any] = deployment["spec"]["template"]
    return template


def _differences(a: Any, b: Any, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            line
            for key in sorted(a.keys() | b.keys())
            for line in _differences(a.get(key), b.get(key), f"{where}.{key}")
        ]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            line
            for index, (x, y) in enumerate(zip(a, b, strict=True))
            for line in _differences(x, y, f"{where}[{index}]")
        ]
    return [] if a == b else [f"{where.lstrip('.')}: {a!r} -> {b!r}"]


def _outside_template(path: Path) -> bool:
    return any(path[: len(prefix)] == prefix for prefix in OUTSIDE_TEMPLATE)


@PROPERTY_SETTINGS
@given(st.data())
def test_an_edit_changes_the_hash_when_it_changes_the_pods(data: st.DataObject) -> None:
    base = data.draw(value_strategy(INPUTS_SCHEMA), label="inputs")
    before = _reconciled(base)
    if before is None:
        reject()
    revision = _hash(before)
    template = _pod_template(before, revision)
    edits = data.draw(single_edits(INPUTS_SCHEMA, base, EDITS_PER_BASE), label="edits")
    for edit in edits:
        site = edit.site
        after = _reconciled(edit.value)
        if after is None:
            event("edit refused by the API server or the models")
            continue
        # Both templates under one name: what the Deployment `<sd>-<revision>` would hold if
        # the edited inputs hashed to the same revision.
        changes = _differences(template, _pod_template(after, revision))
        event(f"{site.path[0]}: pods {'changed' if changes else 'unchanged'}")
        if changes:
            assert _hash(after) != revision, (
                f"{site.describe()} changed the pod template but not the revision {revision}: "
                + "; ".join(changes)
            )
        elif _outside_template(site.path):
            assert _hash(after) == revision, (
                f"{site.describe()} is outside the pod template and left it alone, "
                f"yet moved the revision {revision} -> {_hash(after)}"
            )


# Hypothesis's health check fails this test if the strategy's specs are mostly refused.
@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
)
@given(value_strategy(INPUTS_SCHEMA["properties"]["spec"]))
def test_specs_the_api_server_accepts_parse_as_models(spec: dict[str, Any]) -> None:
    body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": METADATA, "spec": spec}
    assume(admission_errors(body) == ([], []))
    SpeculativeDeployment.from_body(apply_defaults(crd_schema(), body))


@pytest.mark.parametrize("path", OUTSIDE_TEMPLATE, ids=".".join)
def test_outside_template_paths_exist_in_the_schemas(path: Path) -> None:
    node = INPUTS_SCHEMA
    for part in path:
        assert isinstance(part, str)
        node = node["properties"][part]
