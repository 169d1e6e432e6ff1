"""The Applications the example ApplicationSets (examples/argocd/) generate, and what each renders.

No Argo CD controller runs on the test bed, so this stands in for the two steps it would take:
the ApplicationSet controller's generators (list elements; one parameter set per folder for a
Git directory generator, read from this checkout instead of a clone) and its Go templates, and
the repo server's `helm template` of each Application's chart. The templates are rendered only
as far as the examples use them: `{{ .a.b }}` lookups and `{{ toJson .a }}`; anything else left
in a template is an error, so an example that starts using more fails here instead of being
rendered wrongly. `templatePatch` is merged into the template as Argo CD merges it (maps merge,
everything else is replaced).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
ARGOCD_EXAMPLES = REPO / "examples" / "argocd"
APPLICATION_SETS = sorted(ARGOCD_EXAMPLES.glob("applicationset-*.yaml"))
# The repository the examples name; its files are this checkout's.
EXAMPLE_REPO_URL = "https://git.example.com/platform/models.git"

_ACTION = re.compile(r"\{\{-?\s*(toJson\s+)?\.([A-Za-z_][\w.]*)\s*-?\}\}")


class TemplateError(ValueError):
    """A template uses what this stand-in does not render, or names a missing parameter."""


@dataclass(frozen=True)
class GeneratedApp:
    """One Application an ApplicationSet generates, with where its chart and values are."""

    application: dict[str, Any]
    release: str
    namespace: str
    chart: Path
    values: dict[str, Any]
    value_files: tuple[Path, ...]


def _lookup(params: Mapping[str, Any], dotted: str) -> Any:
    value: Any = params
    for key in dotted.split("."):
        if not isinstance(value, Mapping) or key not in value:
            raise TemplateError(f"no parameter .{dotted} (missingkey=error)")
        value = value[key]
    return value


def render_text(text: str, params: Mapping[str, Any]) -> str:
    """`text` with each `{{ .x.y }}` and `{{ toJson .x }}` replaced from `params`."""

    def replace(match: re.Match[str]) -> str:
        value = _lookup(params, match.group(2))
        if match.group(1):
            return json.dumps(value)
        if isinstance(value, Mapping | list):
            raise TemplateError(f"{match.group(0)} renders an object: use toJson")
        return str(value)

    rendered = _ACTION.sub(replace, text)
    if "{{" in rendered:
        raise TemplateError(f"unrendered template action in: {rendered!r}")
    return rendered


def _render_tree(node: Any, params: Mapping[str, Any]) -> Any:
    if isinstance(node, str):
        return render_text(node, params)
    if isinstance(node, Mapping):
        return {k: _render_tree(v, params) for k, v in node.items()}
    if isinstance(node, list):
        return [_render_tree(v, params) for v in node]
    return node


def _merge(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in patch.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def generator_params(generator: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The parameter sets of one generator (list, or Git directories of this checkout)."""
    if "list" in generator:
        return [dict(e) for e in generator["list"]["elements"]]
    if "git" in generator:
        git = generator["git"]
        if git["repoURL"] != EXAMPLE_REPO_URL:
            raise TemplateError(f"git generator on {git['repoURL']}, not the examples' repo")
        params = []
        for directory in git["directories"]:
            for found in sorted(REPO.glob(directory["path"])):
                if found.is_dir():
                    path = found.relative_to(REPO)
                    params.append({"path": {"path": str(path), "basename": path.name}})
        return params
    raise TemplateError(f"generator {sorted(generator)} is not rendered here")


def generated_apps(appset: Mapping[str, Any]) -> list[GeneratedApp]:
    """Every Application `appset` generates, in the ApplicationSet's namespace."""
    spec = appset["spec"]
    apps = []
    for generator in spec["generators"]:
        for params in generator_params(generator):
            template = _render_tree(spec["template"], params)
            if "templatePatch" in spec:
                template = _merge(
                    template, yaml.safe_load(render_text(spec["templatePatch"], params))
                )
            application = {
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "Application",
                "metadata": {**template["metadata"], "namespace": appset["metadata"]["namespace"]},
                "spec": template["spec"],
            }
            source = application["spec"]["source"]
            if source["repoURL"] != EXAMPLE_REPO_URL:
                raise TemplateError(f"source {source['repoURL']} is not the examples' repo")
            chart = REPO / source["path"]
            helm = source.get("helm") or {}
            files = tuple((chart / f).resolve() for f in helm.get("valueFiles") or [])
            for file in files:
                if not file.is_relative_to(REPO) or not file.is_file():
                    raise TemplateError(f"value file {file} is not a file of the repository")
            apps.append(
                GeneratedApp(
                    application=application,
                    release=helm.get("releaseName") or application["metadata"]["name"],
                    namespace=application["spec"]["destination"]["namespace"],
                    chart=chart,
                    values=dict(helm.get("valuesObject") or {}),
                    value_files=files,
                )
            )
    return apps


def load(path: Path) -> dict[str, Any]:
    """The one object of an example file."""
    loaded: dict[str, Any] = yaml.safe_load(path.read_text())
    return loaded
