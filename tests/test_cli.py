"""The `specdeploy` command writes the CRD and reports its version."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specdeploy.api.crd import CRD_FILE_NAME, build_crd
from specdeploy.cli import main


def test_crds_writes_the_generated_crd(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crds", "--out", str(tmp_path / "out")]) == 0
    written = tmp_path / "out" / CRD_FILE_NAME
    assert capsys.readouterr().out.strip() == str(written)
    assert yaml.safe_load(written.read_text(encoding="utf-8")) == build_crd()


def test_version_names_the_api(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    assert "specdeploy.dev/v1alpha1" in capsys.readouterr().out


def test_a_command_is_required() -> None:
    with pytest.raises(SystemExit):
        main([])
