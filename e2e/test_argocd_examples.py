"""The Argo CD examples (examples/argocd/) against the real Argo CD and SpeculativeDeployment CRDs.

The test bed serves Argo CD's Application, ApplicationSet and AppProject CRDs (the pinned
release, docs/testbed.md) but runs no Argo CD. So the ApplicationSets and the AppProject go
through `kubectl apply --dry-run=server`; each Application they would generate
(e2e/argocd_apps.py) goes through it too, is checked against the AppProject as Argo CD would
check it at sync, and its chart is rendered with the test bed's helm as Argo CD's repo server
would render it; the SpeculativeDeployments that come out go through a server-side dry run
against the real SD CRD, CEL rules included. A bad pair in a list element or a pair folder
fails here. Everything is applied in the test's namespace instead of `argocd` and `serving`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from argocd_apps import APPLICATION_SETS, ARGOCD_EXAMPLES, generated_apps, load
from chart_harness import Helm
from testbed import ClusterEnv, Kubectl

pytestmark = pytest.mark.e2e

APP_PROJECT = ARGOCD_EXAMPLES / "appproject.yaml"


@pytest.fixture(scope="module")
def helm(cluster: ClusterEnv) -> Helm:
    """The test bed's helm; `helm template` needs no cluster."""
    return Helm(Path(cluster.bin_dir) / "helm")


def in_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    return {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}


def dry_run(kubectl: Kubectl, objects: list[dict[str, Any]]) -> str:
    """Server-side apply in dry-run mode: the API server validates, admits and stores nothing."""
    out = kubectl.run(
        "apply",
        "--server-side",
        "--dry-run=server",
        "--field-manager=specdeploy-e2e",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(objects),
    ).stdout
    assert out.count("(server dry run)") == len(objects), out
    return out


def test_application_sets_and_the_project_pass_a_server_side_dry_run(
    kubectl: Kubectl, namespace: str
) -> None:
    objects = [in_namespace(load(p), namespace) for p in [*APPLICATION_SETS, APP_PROJECT]]
    assert {o["kind"] for o in objects} == {"ApplicationSet", "AppProject"}
    print(dry_run(kubectl, objects))
    # Nothing was stored.
    assert kubectl.get_json("applicationsets.argoproj.io", "-n", namespace)["items"] == []


def test_each_generated_application_and_its_pair_pass_a_server_side_dry_run(
    kubectl: Kubectl, namespace: str, helm: Helm, sd_crd: None, tmp_path: Path
) -> None:
    project = load(APP_PROJECT)
    allowed_kinds = {(k["group"], k["kind"]) for k in project["spec"]["namespaceResourceWhitelist"]}
    names: list[str] = []
    for path in APPLICATION_SETS:
        apps = generated_apps(load(path))
        assert len(apps) >= 2, f"{path.name} generates {len(apps)} Applications"
        for app in apps:
            name = app.application["metadata"]["name"]
            names.append(name)
            # What Argo CD checks before it syncs: the project admits the destination.
            spec = app.application["spec"]
            assert spec["project"] == project["metadata"]["name"], name
            assert spec["destination"] in project["spec"]["destinations"], name
            assert spec["source"]["repoURL"] in project["spec"]["sourceRepos"], name
            dry_run(kubectl, [in_namespace(app.application, namespace)])

            values = tmp_path / f"{name}.json"
            values.write_text(json.dumps(app.values))
            flags = ["-f", str(values), *(x for f in app.value_files for x in ("-f", str(f)))]
            rendered = helm.run(
                "template", app.release, str(app.chart), "--namespace", namespace, *flags
            ).stdout
            objects = [o for o in yaml.safe_load_all(rendered) if o]
            assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
                ("SpeculativeDeployment", app.release)
            ], name
            for obj in objects:
                group = obj["apiVersion"].rpartition("/")[0]
                assert (group, obj["kind"]) in allowed_kinds, f"{name}: project refuses {obj}"
            print(f"{path.name}: {name}: {dry_run(kubectl, objects).strip()}")
    assert len(names) == len(set(names)), f"Application names collide: {names}"
