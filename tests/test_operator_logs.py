"""kopf's retried API requests are logged as warnings; what it gives up on stays an error."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from specdeploy.handlers.logs import RetriedRequestsAsWarnings

# kopf's own words (kopf/_cogs/clients/api.py), as a restarted API server made it log them.
RETRIED = (
    "Request attempt #2/9 failed; will retry: GET https://127.0.0.1:6443/apis/specdeploy.dev/"
    "v1alpha1/namespaces/a/speculativedeployments?watch=true -> APITooManyRequestsError(429)"
)
TCP_CLOSED = "Request attempt #1/9 failed; TCP closed; will re-authenticate: GET /api/v1/pods"
ESCALATED = "Request attempt #9/9 failed; escalating: GET /api/v1/pods -> APIServerError(500)"


def _filtered(name: str, level: int, message: str) -> logging.LogRecord:
    record = logging.LogRecord(name, level, __file__, 1, message, None, None)
    assert RetriedRequestsAsWarnings().filter(record)
    return record


@pytest.mark.parametrize("message", [RETRIED, TCP_CLOSED])
@pytest.mark.parametrize("logger", ["kopf._cogs.clients.watching", "kopf.objects"])
def test_a_request_kopf_retries_is_a_warning(logger: str, message: str) -> None:
    record = _filtered(logger, logging.ERROR, message)
    assert (record.levelno, record.levelname) == (logging.WARNING, "WARNING")


@pytest.mark.parametrize(
    ("logger", "message"),
    [
        ("kopf._cogs.clients.api", ESCALATED),
        ("kopf.reactor.running", "Root task 'watcher of pods' is failed: boom"),
        ("specdeploy.operator", "reconcile failed; will retry"),
    ],
)
def test_other_errors_stay_errors(logger: str, message: str) -> None:
    record = _filtered(logger, logging.ERROR, message)
    assert (record.levelno, record.levelname) == (logging.ERROR, "ERROR")


def test_the_operators_logging_writes_a_retried_request_as_a_warning() -> None:
    program = (
        "import logging\n"
        "from specdeploy.handlers.logs import configure_logging\n"
        "configure_logging()\n"
        f"logging.getLogger('kopf._cogs.clients.watching').error({RETRIED!r})\n"
        f"logging.getLogger('kopf._cogs.clients.api').error({ESCALATED!r})\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    lines = done.stderr.splitlines()
    assert [line.split(" ", 3)[2:] for line in lines] == [
        ["WARNING", f"kopf._cogs.clients.watching: {RETRIED}"],
        ["ERROR", f"kopf._cogs.clients.api: {ESCALATED}"],
    ], lines
