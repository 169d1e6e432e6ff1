"""The Argo CD health check of a SpeculativeDeployment: run it, and write its argocd-cm entry.

`examples/argocd/health/health.lua` is the one source. `python hack/argocd_health.py` writes
`examples/argocd/argocd-cm-health.yaml` from it (tests/test_health_lua.py fails when that file
is stale). `health_of(obj)` runs the script the way Argo CD does (util/lua/lua.go in
argoproj/argo-cd): Lua 5.1 with only the base and table libraries, the resource as the global
`obj`, and the returned table read as {status, message}; the tests use it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
HEALTH_LUA = ROOT / "examples" / "argocd" / "health" / "health.lua"
ARGOCD_CM = ROOT / "examples" / "argocd" / "argocd-cm-health.yaml"
HEALTH_KEY = "resource.customizations.health.specdeploy.dev_SpeculativeDeployment"
# What Argo CD accepts from a health script (gitops-engine's HealthStatusCode).
HEALTH_STATUSES = ("Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown")

# Argo CD opens only `package`, `base`, `table` and a reduced `os`; without the string library
# strings have no methods either. Removing what it does not open makes a script that leans on
# them fail here as it would in Argo CD.
_SANDBOX = """
debug.getmetatable("").__index = nil
string, math, io, os, debug, coroutine = nil, nil, nil, nil, nil, nil
"""


@dataclass(frozen=True)
class Health:
    """What the health script returned."""

    status: str
    message: str


def health_of(obj: Mapping[str, Any], script: str | None = None) -> Health:
    """The health Argo CD would show for `obj` (a SpeculativeDeployment as the API returns it).

    Raises ValueError when the script returns no table or a status Argo CD does not know
    (Argo CD would show Unknown).
    """
    from lupa.lua51 import LuaRuntime  # noqa: PLC0415 (a dev dependency: only tests run this)

    lua = LuaRuntime(unpack_returned_tuples=False)
    lua.execute(_SANDBOX)
    lua.globals().obj = lua.table_from(dict(obj), recursive=True)
    result = lua.execute(script if script is not None else HEALTH_LUA.read_text())
    if result is None or not hasattr(result, "items"):
        raise ValueError(f"the health script returned {result!r}, not a table")
    returned = dict(result.items())
    status = str(returned.get("status", ""))
    if status not in HEALTH_STATUSES:
        raise ValueError(f"the health script returned status {status!r}")
    return Health(status=status, message=str(returned.get("message") or ""))


ARGOCD_CM_HEADER = """\
# Generated from examples/argocd/health/health.lua by hack/argocd_health.py. Do not edit.
# The health check of SpeculativeDeployments for Argo CD. Merge it into argocd-cm (other keys
# are kept), from examples/argocd/:
#   kubectl -n argocd patch configmap argocd-cm --type merge --patch-file argocd-cm-health.yaml
# With the argo-cd Helm chart, put the key and script under configs.cm instead (docs/chart.md).
"""


class _LiteralDumper(yaml.SafeDumper):
    """Writes multi-line strings as literal blocks, so the script reads as it is written."""


def _literal(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_LiteralDumper.add_representer(str, _literal)


def render_argocd_cm(script: str) -> str:
    """The argocd-cm ConfigMap (only its health key) that carries `script`."""
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "argocd-cm",
            "namespace": "argocd",
            "labels": {
                "app.kubernetes.io/name": "argocd-cm",
                "app.kubernetes.io/part-of": "argocd",
            },
        },
        "data": {HEALTH_KEY: script},
    }
    body = yaml.dump(config_map, Dumper=_LiteralDumper, sort_keys=False, width=200)
    return ARGOCD_CM_HEADER + body


def main() -> int:
    ARGOCD_CM.write_text(render_argocd_cm(HEALTH_LUA.read_text()))
    print(f"wrote {ARGOCD_CM.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
