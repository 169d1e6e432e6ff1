"""The Argo CD examples without a cluster: every pair the ApplicationSets generate is a valid
SpeculativeDeployment spec, the pair chart's schema follows the CRD, and the stand-in for Argo
CD's templating refuses what it does not render (the server-side dry runs are in
e2e/test_argocd_examples.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from argocd_apps import (
    APPLICATION_SETS,
    ARGOCD_EXAMPLES,
    REPO,
    GeneratedApp,
    TemplateError,
    generated_apps,
    load,
    render_text,
)
from chart_harness import Helm, HelmError
from specdeploy.api.models import SpeculativeDeploymentSpec
from testbed.cluster import tools_dir

PAIR_CHART = ARGOCD_EXAMPLES / "pair-chart"
SCHEMA: dict[str, Any] = json.loads((PAIR_CHART / "values.schema.json").read_text())
APPS = [app for path in APPLICATION_SETS for app in generated_apps(load(path))]


def spec_values(app: GeneratedApp) -> dict[str, Any]:
    """The chart's values as helm merges them: values.yaml, the value files, valuesObject."""
    merged: dict[str, Any] = yaml.safe_load((PAIR_CHART / "values.yaml").read_text()) or {}
    for file in app.value_files:
        merged.update(yaml.safe_load(file.read_text()))
    merged.update(app.values)
    return merged


def test_both_generators_are_shown() -> None:
    generators = {next(iter(g)) for p in APPLICATION_SETS for g in load(p)["spec"]["generators"]}
    assert generators == {"list", "git"}
    assert len(APPS) == 4


@pytest.mark.parametrize("app", APPS, ids=lambda a: a.release)
def test_each_generated_pair_is_a_valid_spec_pinned_in_one_place(app: GeneratedApp) -> None:
    values = spec_values(app)
    jsonschema.validate(values, SCHEMA)
    spec = SpeculativeDeploymentSpec.model_validate(values)
    assert spec.pair.target.revision
    assert spec.pair.draft.model is None or spec.pair.draft.revision


def test_pair_chart_schema_names_exactly_the_crds_spec_fields() -> None:
    crd = yaml.safe_load((REPO / "crds" / "specdeploy.dev_speculativedeployments.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert set(SCHEMA["properties"]) == set(spec["properties"])
    assert SCHEMA["additionalProperties"] is False


def test_a_pair_without_its_draft_revision_is_refused_by_the_schema() -> None:
    values = spec_values(APPS[0])
    del values["pair"]["draft"]["revision"]
    with pytest.raises(jsonschema.ValidationError, match="'revision' is a required property"):
        jsonschema.validate(values, SCHEMA)


def test_the_templating_stand_in_refuses_what_it_does_not_render() -> None:
    params = {"name": "chat", "values": {"replicas": 2}}
    assert render_text("sd-{{ .name }}", params) == "sd-chat"
    assert render_text("{{ toJson .values }}", params) == '{"replicas": 2}'
    with pytest.raises(TemplateError, match=r"no parameter \.namespace"):
        render_text("{{ .namespace }}", params)
    with pytest.raises(TemplateError, match="unrendered"):
        render_text("{{ .name | upper }}", params)
    with pytest.raises(TemplateError, match="use toJson"):
        render_text("{{ .values }}", params)


# --- helm template --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def helm() -> Helm:
    """The pinned helm of the test bed's tools (`make tools`), without a cluster."""
    return Helm(tools_dir(build=False) / "helm")


@pytest.mark.helm
@pytest.mark.parametrize("app", APPS, ids=lambda a: a.release)
def test_pair_chart_lints_and_renders_one_sd_per_application(
    helm: Helm, app: GeneratedApp, tmp_path: Path
) -> None:
    values = tmp_path / "values.json"
    values.write_text(json.dumps(spec_values(app)))
    helm.run("lint", "--strict", str(PAIR_CHART), "-f", str(values))
    rendered = helm.run(
        "template", app.release, str(PAIR_CHART), "-n", app.namespace, "-f", str(values)
    ).stdout
    [sd] = [doc for doc in yaml.safe_load_all(rendered) if doc]
    assert sd["metadata"] | {"labels": None} == {
        "name": app.release,
        "namespace": app.namespace,
        "labels": None,
    }
    assert sd["spec"] == spec_values(app)


@pytest.mark.helm
def test_pair_chart_refuses_an_unknown_key(helm: Helm, tmp_path: Path) -> None:
    values = tmp_path / "values.json"
    values.write_text(json.dumps({**spec_values(APPS[0]), "replica": 3}))
    with pytest.raises(HelmError, match="additional properties 'replica' not allowed"):
        helm.run("template", "x", str(PAIR_CHART), "-f", str(values))


def test_each_generated_pair_names_a_queue_of_its_namespace_the_project_may_deploy_to() -> None:
    """A pair whose LocalQueue is not in its namespace would never be admitted (the list
    example's batch pair once went to `serving`, where the example setup has no `batch` queue)."""
    kueue = [d for d in yaml.safe_load_all((REPO / "examples/kueue/queues.yaml").read_text()) if d]
    local_queues = {
        (d["metadata"]["namespace"], d["metadata"]["name"])
        for d in kueue
        if d["kind"] == "LocalQueue"
    }
    project = load(ARGOCD_EXAMPLES / "appproject.yaml")
    destinations = {d["namespace"] for d in project["spec"]["destinations"]}
    for app in APPS:
        queue = spec_values(app)["placement"]["queue"]
        assert (app.namespace, queue) in local_queues, (app.release, app.namespace, queue)
        assert app.namespace in destinations, (app.release, app.namespace)
