"""`make test` cannot pass by testing nothing: every pytest run in it fails when it collects no
test (pytest's exit code 5 is not swallowed), and the end-to-end run fails when a test skips or
no e2e test was collected (e2e/conftest.py under SPECDEPLOY_E2E_REQUIRED=1)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAKEFILE = ROOT / "Makefile"
TARGET = re.compile(r"^([A-Za-z0-9_.-]+):([^=]*)$")


def recipes() -> dict[str, tuple[list[str], list[str]]]:
    """Each Makefile target's prerequisites and recipe lines."""
    found: dict[str, tuple[list[str], list[str]]] = {}
    current: str | None = None
    for line in MAKEFILE.read_text().splitlines():
        if line.startswith("\t") and current is not None:
            found[current][1].append(line.strip())
            continue
        match = TARGET.match(line)
        if match and not line.startswith("."):
            current = match.group(1)
            prerequisites = match.group(2).split("##")[0].split()
            found[current] = (prerequisites, [])
        elif not line.strip().startswith("#"):
            current = None if line and not line.startswith("\t") else current
    return found


def reachable(target: str, graph: dict[str, tuple[list[str], list[str]]]) -> set[str]:
    """The targets `make <target>` runs: prerequisites, and targets its recipe makes."""
    seen: set[str] = set()
    todo = [target]
    while todo:
        name = todo.pop()
        if name in seen or name not in graph:
            continue
        seen.add(name)
        prerequisites, lines = graph[name]
        todo += prerequisites
        for line in lines:
            if "$(MAKE)" in line:
                todo += [w for w in line.split() if w in graph]
    return seen


def test_every_pytest_run_of_make_test_fails_on_exit_code_5() -> None:
    graph = recipes()
    targets = reachable("test", graph)
    assert {"lint", "unit", "chart-lint", "e2e"} <= targets
    runs = [
        (name, line)
        for name in sorted(targets)
        for line in graph[name][1]
        if re.search(r"-m pytest\b", line)
    ]
    assert {name for name, _ in runs} >= {"unit", "chart-lint", "e2e"}, runs
    for name, line in runs:
        # make stops on any non-zero exit unless told otherwise: nothing may tell it so.
        assert not line.startswith("-"), (name, line)
        assert not re.search(r"\|\|\s*(true|:)|;\s*(true|:)\s*$", line), (name, line)
        assert "--suppress-no-test-exit-code" not in line, (name, line)
    [e2e] = [line for name, line in runs if name == "e2e"]
    assert "SPECDEPLOY_E2E_REQUIRED=1" in e2e


def run_pytest(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SPECDEPLOY_E2E_REQUIRED": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "e2e"), str(ROOT)]),
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_an_e2e_run_that_collects_nothing_fails(tmp_path: Path) -> None:
    done = run_pytest(
        [str(ROOT / "e2e"), "-m", "e2e", "-k", "no_test_is_named_like_this"], tmp_path
    )
    assert done.returncode != 0, done.stdout[-2000:]
    assert "no e2e test was collected" in done.stdout


def test_a_skipped_e2e_test_fails_the_run(tmp_path: Path) -> None:
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.e2e\n"
        "def test_that_skips():\n"
        "    pytest.skip('no cluster here')\n"
    )
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\nmarkers =\n    e2e: end to end\n    engine: real engine\n")
    done = run_pytest(["-p", "conftest", "-m", "e2e", "test_skips.py"], tmp_path)
    assert done.returncode == 1, done.stdout[-2000:]
    assert "may not skip" in done.stdout
    assert "no cluster here" in done.stdout
