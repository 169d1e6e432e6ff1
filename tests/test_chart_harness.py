"""How the chart's RBAC test reads rules and the API server's audit log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chart_harness import audited_requests, format_access, granted_access

USER = "system:serviceaccount:ops:specdeploy"


def _event(verb: str, code: int, ref: dict[str, str] | None, user: str = USER) -> dict[str, Any]:
    event: dict[str, Any] = {
        "user": {"username": user},
        "verb": verb,
        "requestURI": "/apis/x?watch=true",
        "responseStatus": {"code": code},
    }
    if ref is not None:
        event["objectRef"] = ref
    return event


def test_audited_requests_by_group_resource_and_verb(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    events = [
        _event("watch", 200, {"resource": "pods"}),
        _event("patch", 200, {"apiGroup": "sd.dev", "resource": "sds", "subresource": "status"}),
        # A server-side apply that created its object needs create as well.
        _event("patch", 201, {"apiGroup": "apps", "resource": "deployments"}),
        _event("get", 403, {"resource": "secrets"}),
        _event("get", 200, None),  # discovery
        _event("delete", 200, {"resource": "nodes"}, user="someone-else"),
    ]
    log.write_text("\n".join(json.dumps(e) for e in events) + "\nnot json\n")
    audited = audited_requests(log, USER)
    assert audited.used == {
        ("", "pods", "watch"),
        ("sd.dev", "sds/status", "patch"),
        ("apps", "deployments", "patch"),
        ("apps", "deployments", "create"),
        ("", "secrets", "get"),
    }
    assert audited.forbidden == ["get /apis/x"]


def test_granted_access_expands_every_rule_of_roles_only() -> None:
    objects: list[dict[str, Any]] = [
        {
            "kind": "ClusterRole",
            "metadata": {"name": "a"},
            "rules": [{"apiGroups": ["", "apps"], "resources": ["x", "y"], "verbs": ["get"]}],
        },
        {"kind": "ConfigMap", "metadata": {"name": "b"}, "rules": "not rules"},
    ]
    assert granted_access(objects) == {
        ("", "x", "get"),
        ("", "y", "get"),
        ("apps", "x", "get"),
        ("apps", "y", "get"),
    }
    assert format_access({("", "x", "get")}) == "  get core/x"


def test_a_wildcard_is_refused() -> None:
    wildcard = {
        "kind": "Role",
        "metadata": {"name": "w"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}],
    }
    with pytest.raises(AssertionError, match="wildcard"):
        granted_access([wildcard])
