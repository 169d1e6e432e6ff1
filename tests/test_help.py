"""`--help` of the two commands a person types first: what they do, what they read, how they
end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specdeploy.api import contract
from specdeploy.cli import main as specdeploy_main
from specdeploy.engine.__main__ import main as engine_main

OPERATOR_SRC = Path(__file__).resolve().parents[1] / "operator"


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_engine_serve_help_explains_the_checks_env_and_exit_codes(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert engine_main(["serve", flag]) == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: specdeploy-engine serve [--] <vllm serve arguments>")
    assert "replaces itself with vLLM" in text
    for env in (contract.PAIR_ENV, "SPECDEPLOY_TERMINATION_LOG", "SPECDEPLOY_OFFLINE"):
        assert env in text
    for code in (
        contract.EXIT_USAGE,
        contract.EXIT_PAIR_INCOMPATIBLE,
        contract.EXIT_MODEL_UNAVAILABLE,
    ):
        assert f"\n  {code}  " in text


def test_engine_check_help_says_it_starts_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert engine_main(["check", "--help"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: specdeploy-engine check")
    assert "without starting vLLM" in text


def test_help_after_the_separator_is_vllms_not_ours() -> None:
    # `serve -- --help` goes to the launcher (and on to vLLM): with no model named it is
    # refused as unusable arguments rather than answered with our help.
    result = subprocess.run(
        [sys.executable, "-m", "specdeploy.engine", "check", "--", "--help"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(OPERATOR_SRC), "SPECDEPLOY_OFFLINE": "1"},
        check=False,
    )
    assert "usage: specdeploy-engine check" not in result.stdout
    assert result.returncode == contract.EXIT_USAGE, result.stdout + result.stderr


def test_engine_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert engine_main(["--help"]) == 0
    text = capsys.readouterr().out
    for command in ("serve --", "check --", "tiny-models --out", "COMMAND --help"):
        assert command in text


def test_operator_run_help_says_what_it_runs_and_how(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        specdeploy_main(["operator", "run", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: specdeploy operator run")
    assert "Runs the specdeploy operator until interrupted" in text
    for option in ("--config PATH|configmap:NS/NAME", "--namespace", "--log-reconciles"):
        assert option in text
    assert "KUBECONFIG" in text
    assert "leaderElection.enabled" in text


def test_the_license_file_is_the_one_pyproject_names() -> None:
    root = Path(__file__).resolve().parents[1]
    pyproject = (root / "pyproject.toml").read_text()
    assert 'license = "Apache-2.0"' in pyproject
    text = (root / "LICENSE").read_text()
    assert "Apache License" in text.splitlines()[1]
    assert "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
