"""Writes the chart's generated files: its CRD template from crds/ and its README from values.yaml.

`make crds` and `make chart-docs` run it; tests/test_chart_files.py fails when either file is
stale. The README lists each value with the `# --` comment written above it in values.yaml.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "specdeploy"
CRDS = ROOT / "crds"
CRD_TEMPLATE_PREFIX = "crd-"

CRD_HEADER = """\
{{- /* Generated from crds/%(source)s by hack/render_chart.py (make crds). Do not edit. */}}
{{- if .Values.crds.enabled }}
apiVersion: %(apiVersion)s
kind: %(kind)s
metadata:
  name: %(name)s
  labels:
    {{- include "specdeploy.labels" . | nindent 4 }}
  {{- if .Values.crds.keep }}
  annotations:
    # helm uninstall leaves the CRD, and so every SpeculativeDeployment, in place.
    helm.sh/resource-policy: keep
  {{- end }}
"""
CRD_FOOTER = "{{- end }}\n"


def render_crd_template(source_name: str, crd_text: str) -> str:
    """The chart template of one CRD: its spec verbatim, the chart's labels, the keep policy and
    the `crds.enabled` switch around it."""
    crd = yaml.safe_load(crd_text)
    header = CRD_HEADER % {
        "source": source_name,
        "apiVersion": crd["apiVersion"],
        "kind": crd["kind"],
        "name": crd["metadata"]["name"],
    }
    spec = yaml.safe_dump({"spec": crd["spec"]}, sort_keys=False, width=100, allow_unicode=True)
    if "{{" in spec or "}}" in spec:
        raise ValueError(f"{source_name}: the CRD holds template delimiters; escape them first")
    return header + spec + CRD_FOOTER


def crd_templates() -> dict[Path, str]:
    """Every CRD template the chart should hold, by path, rendered from crds/."""
    return {
        CHART / "templates" / f"{CRD_TEMPLATE_PREFIX}{source.name}": render_crd_template(
            source.name, source.read_text(encoding="utf-8")
        )
        for source in sorted(CRDS.glob("*.yaml"))
    }


# --- README from values.yaml ------------------------------------------------------------------


@dataclass(frozen=True)
class ValueDoc:
    """One documented value: its dotted key, default and the `# --` comment above it."""

    key: str
    default: Any
    description: str


_KEY = re.compile(r"^(?P<indent> *)(?:- )?(?P<key>[A-Za-z0-9_]+):(?P<rest>.*)$")


def document_values(values_text: str) -> list[ValueDoc]:
    """Each key of values.yaml preceded by a `# --` comment, in file order."""
    values = yaml.safe_load(values_text)
    docs: list[ValueDoc] = []
    path: list[tuple[int, str]] = []
    comment: list[str] | None = None
    for line in values_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            comment = [stripped.removeprefix("# --").strip()]
            continue
        if stripped.startswith("#") and comment is not None:
            comment.append(stripped.removeprefix("#").strip())
            continue
        match = _KEY.match(line)
        if not match or line.lstrip().startswith("- "):
            if stripped and not stripped.startswith("#"):
                comment = None if not match else comment
            continue
        indent = len(match["indent"])
        while path and path[-1][0] >= indent:
            path.pop()
        path.append((indent, match["key"]))
        if comment is not None:
            key = ".".join(name for _, name in path)
            docs.append(ValueDoc(key, _lookup(values, key), " ".join(comment)))
            comment = None
    return docs


def _lookup(values: Any, key: str) -> Any:
    for part in key.split("."):
        values = values[part]
    return values


def _default_cell(value: Any) -> str:
    if isinstance(value, dict | list) and value and len(json.dumps(value)) > 60:
        return "see values.yaml"
    text = json.dumps(value)
    return f"`{text}`".replace("|", "\\|")


def render_readme(chart_yaml: str, values_text: str) -> str:
    """The chart's README: what it installs, how, and a table of every documented value."""
    chart = yaml.safe_load(chart_yaml)
    replicas = int(yaml.safe_load(values_text).get("replicas", 1))
    pods = "one replica" if replicas == 1 else f"{replicas} replicas, one leader at a time"
    rows = "\n".join(
        f"| `{doc.key}` | {_default_cell(doc.default)} | {doc.description} |"
        for doc in document_values(values_text)
    )
    return f"""<!-- Generated from values.yaml by hack/render_chart.py (make chart-docs). -->
# {chart["name"]} {chart["version"]}

{" ".join(chart["description"].split())}

```
helm install specdeploy charts/specdeploy --namespace specdeploy-system --create-namespace
```

It installs the SpeculativeDeployment CRD (kept on uninstall), the operator Deployment
({pods}, non-root, read-only root filesystem), its ConfigMap, ServiceAccount and least-privilege
RBAC, a Service for its probe and metrics endpoints and a `helm test` pod that asks the probe
endpoint; optionally a ServiceMonitor and a NetworkPolicy. The CRD upgrade path, the RBAC rules
and the security context are described in docs/chart.md.

## Values

values.schema.json refuses unknown keys at every level of these values (objects passed through
to Kubernetes, such as `resources` or `tolerations`, are checked by the API server).

| key | default | description |
|---|---|---|
{rows}
"""


def expected_files() -> dict[Path, str]:
    """Every generated file of the chart with the content it should have."""
    files = crd_templates()
    files[CHART / "README.md"] = render_readme(
        (CHART / "Chart.yaml").read_text(encoding="utf-8"),
        (CHART / "values.yaml").read_text(encoding="utf-8"),
    )
    return files


def main() -> int:
    """Writes the generated files and removes CRD templates whose source is gone."""
    files = expected_files()
    for stale in (CHART / "templates").glob(f"{CRD_TEMPLATE_PREFIX}*.yaml"):
        if stale not in files:
            stale.unlink()
    for path, text in files.items():
        path.write_text(text, encoding="utf-8")
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
