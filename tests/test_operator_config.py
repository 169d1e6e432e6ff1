"""The operator config file: camelCase YAML, defaults when absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdeploy.handlers.run import load_config


def test_defaults_without_a_file() -> None:
    config = load_config(None)
    assert config.reconcile_interval_seconds == 30
    assert config.batch_queues == []


def test_reads_camel_case_yaml(tmp_path: Path) -> None:
    path = tmp_path / "operator.yaml"
    path.write_text("reconcileIntervalSeconds: 2\nbatchQueues: [batch]\nlocalProcess: true\n")
    config = load_config(str(path))
    assert config.reconcile_interval_seconds == 2
    assert config.batch_queues == ["batch"]
    assert config.local_process


def test_refuses_a_non_mapping(tmp_path: Path) -> None:
    path = tmp_path / "operator.yaml"
    path.write_text("- a list\n")
    with pytest.raises(ValueError, match="mapping"):
        load_config(str(path))


def test_a_configmap_needs_a_cluster() -> None:
    with pytest.raises(ValueError, match="cluster"):
        load_config("configmap:specdeploy/operator")
