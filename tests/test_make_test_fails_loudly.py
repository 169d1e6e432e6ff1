"""`make test` cannot pass by testing nothing: every pytest run in it fails when it collects no
test (pytest's exit code 5 is not swallowed), and the end-to-end run fails when a test skips or
no e2e test was collected (e2e/conftest.py under SPECDEPLOY_E2E_REQUIRED=1)."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

from testbed import lanes

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
    assert {name for name, _ in runs} >= {"unit", "chart-lint"}, runs
    for name, line in runs:
        # make stops on any non-zero exit unless told otherwise: nothing may tell it so.
        assert not line.startswith("-"), (name, line)
        assert not re.search(r"\|\|\s*(true|:)|;\s*(true|:)\s*$", line), (name, line)
        assert "--suppress-no-test-exit-code" not in line, (name, line)
    [e2e] = graph["e2e"][1]
    assert "SPECDEPLOY_E2E_REQUIRED=1" in e2e
    assert "-m testbed.lanes" in e2e
    assert not e2e.startswith("-"), e2e
    assert not re.search(r"\|\|\s*(true|:)", e2e), e2e


def test_the_e2e_lanes_fail_when_any_lane_fails_and_cover_every_test_once() -> None:
    assert lanes.verdict({"engines": 0, "cluster": 0, "serial": 0}) == 0
    for code in (1, 2, 5):
        assert lanes.verdict({"engines": 0, "cluster": code, "serial": 0}) == 1
    every = [*lanes.TOGETHER, lanes.ALONE]
    for engine, serial, image in itertools.product((False, True), repeat=3):
        names = {"e2e": True, "engine": engine, "serial": serial, "engine_image": image}
        chosen = [lane.name for lane in every if eval(lane.markers, {}, names)]
        assert len(chosen) == (0 if image else 1), (names, chosen)
    command = lanes.pytest_command(lanes.ALONE, ["--durations=25"])
    assert command[-1] == "--durations=25"
    assert command[command.index("e2e") + 1 :][:2] == ["-m", "e2e and not engine_image and serial"]


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
