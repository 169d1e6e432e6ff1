"""What counts as a child holding its desired fields, and when a write reverts drift."""

from __future__ import annotations

import copy
from typing import Any

from specdeploy.plan.children.drift import (
    APPLIED_HASH_ANNOTATION,
    decide_apply,
    differences,
    manifest_hash,
    parse_quantity,
    with_applied_hash,
)


def deployment() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "chat-abc", "namespace": "ns", "labels": {"a": "1"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"specdeploy.dev/name": "chat"}},
            "template": {
                "metadata": {"labels": {"specdeploy.dev/name": "chat"}},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": "H100"},
                    "containers": [
                        {
                            "name": "engine",
                            "image": "engine:1",
                            "args": ["serve", "--", "m"],
                            "env": [{"name": "A", "value": "1"}],
                            "ports": [{"name": "http", "containerPort": 8000}],
                            "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "1Gi"}},
                        }
                    ],
                },
            },
        },
    }


def as_stored(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest as the API server returns it: defaults, strings for quantities, extras."""
    live = copy.deepcopy(manifest)
    live["metadata"].setdefault("annotations", {})["deployment.kubernetes.io/revision"] = "1"
    live["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "q"
    live["spec"]["strategy"] = {"type": "RollingUpdate"}
    container = live["spec"]["template"]["spec"]["containers"][0]
    container["imagePullPolicy"] = "IfNotPresent"
    container["ports"][0]["protocol"] = "TCP"
    container["resources"] = {
        "limits": {"nvidia.com/gpu": "1", "memory": "1024Mi"},
        "requests": {"nvidia.com/gpu": "1"},
    }
    live["status"] = {"readyReplicas": 1}
    return live


def test_defaults_extras_and_canonical_quantities_are_not_differences() -> None:
    assert differences(deployment(), as_stored(deployment())) == []


def test_each_changed_field_is_named_by_its_path() -> None:
    live = as_stored(deployment())
    container = live["spec"]["template"]["spec"]["containers"][0]
    container["image"] = "other:latest"
    container["args"].append("--extra")
    container["env"][0]["value"] = "2"
    container["resources"]["limits"]["nvidia.com/gpu"] = "2"
    live["spec"]["replicas"] = 3
    assert differences(deployment(), live) == [
        "spec.replicas",
        "spec.template.spec.containers[engine].image",
        "spec.template.spec.containers[engine].args",
        "spec.template.spec.containers[engine].env[A].value",
        "spec.template.spec.containers[engine].resources.limits.nvidia.com/gpu",
    ]


def test_a_missing_named_item_differs_but_another_managers_extra_item_does_not() -> None:
    live = as_stored(deployment())
    env = live["spec"]["template"]["spec"]["containers"][0]["env"]
    env.append({"name": "ADDED_BY_SOMEONE", "value": "x"})
    assert differences(deployment(), live) == []
    env.pop(0)
    assert differences(deployment(), live) == ["spec.template.spec.containers[engine].env[A]"]


def test_selectors_must_match_exactly_since_an_extra_key_changes_what_they_select() -> None:
    live = as_stored(deployment())
    live["spec"]["template"]["spec"]["nodeSelector"]["pinned"] = "elsewhere"
    assert differences(deployment(), live) == ["spec.template.spec.nodeSelector"]
    service = {"spec": {"selector": {"specdeploy.dev/name": "chat"}}}
    changed = {"spec": {"selector": {"specdeploy.dev/name": "chat", "app": "other"}}}
    assert differences(service, changed) == ["spec.selector"]


def test_quantities_compare_by_value() -> None:
    assert parse_quantity("1Gi") == parse_quantity("1024Mi") == parse_quantity(2**30)
    assert parse_quantity("500m") == parse_quantity("0.5")
    assert parse_quantity("abc") is None


def test_applied_hash_ignores_itself() -> None:
    body = with_applied_hash(deployment())
    assert body["metadata"]["annotations"][APPLIED_HASH_ANNOTATION] == manifest_hash(deployment())
    assert manifest_hash(body) == manifest_hash(deployment())


def test_a_write_is_needed_when_missing_or_different_and_drift_only_when_we_applied_it() -> None:
    desired = with_applied_hash(deployment())
    assert decide_apply(desired, None).write
    assert decide_apply(desired, None).reverted == ()

    live = as_stored(desired)
    assert not decide_apply(desired, live).write

    # Someone else changed a field of a manifest we applied as it is: drift, reverted.
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "other:latest"
    decision = decide_apply(desired, live)
    assert decision.write
    assert decision.reverted == ("spec.template.spec.containers[engine].image",)

    # Our own desired manifest moved on (say, replicas): a write, but nobody's change reverted.
    scaled = deployment()
    scaled["spec"]["replicas"] = 2
    decision = decide_apply(with_applied_hash(scaled), as_stored(desired))
    assert decision.write
    assert decision.reverted == ()
