"""logged_failures: what makes the e2e session fail when a test bed component failed inside."""

from __future__ import annotations

from pathlib import Path

from testbed.processes import logged_failures

#: As the process kubelet logged it when a pod's worker failed (a clean-clone run of ac40f98):
#: the test then timed out waiting for a container the worker would never restart.
FAILED_WORKER = """\
2026-11-29 10:00:47,000 INFO pod ns/op-5wzwc: ns/op-5wzwc/operator started as pid 4837 on CPU 0
Exception in thread netns 4837:
Traceback (most recent call last):
FileNotFoundError: [Errno 2] No such file or directory: '/proc/4837/ns/net'
2026-11-29 10:00:53,636 ERROR pod ns/op-5wzwc: worker for ns/op-5wzwc failed
Traceback (most recent call last):
IndexError: list index out of range
2026-11-29 10:00:53,638 INFO pod ns/op-5wzwc: stopping ns/op-5wzwc (pids 4837), grace 10s
"""

#: Warnings are the test bed doing its job (a watch that lost its CRD lists again).
QUIET = """\
2026-11-29 12:55:33,071 WARNING PodMonitor watch: PodMonitor watch failed ((404)
2026-11-29 12:34:12,307 WARNING pod watch: pod watch failed (Response ended prematurely)
2026-11-29 12:34:13,000 INFO pod ns/web: web (pid 24778) exited with 1
"""


def test_a_failed_worker_and_its_tracebacks_are_found(tmp_path: Path) -> None:
    log = tmp_path / "process-kubelet.log"
    log.write_text(FAILED_WORKER)
    found = logged_failures(log)
    assert found == [
        "Traceback (most recent call last):",
        "2026-11-29 10:00:53,636 ERROR pod ns/op-5wzwc: worker for ns/op-5wzwc failed",
        "Traceback (most recent call last):",
    ]


def test_warnings_and_lines_before_the_offset_are_not(tmp_path: Path) -> None:
    log = tmp_path / "process-kubelet.log"
    log.write_text(FAILED_WORKER + QUIET)
    assert logged_failures(log, offset=len(FAILED_WORKER.encode())) == []
    assert logged_failures(tmp_path / "missing.log") == []
