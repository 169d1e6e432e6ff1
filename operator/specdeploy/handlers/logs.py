"""The operator's log lines: one format, and kopf's retried requests as warnings.

kopf logs every failed API request at ERROR, also those it is about to retry: a control plane
that restarts (an upgrade, a failover) answers 429 or 5xx for a few seconds while it warms its
cache, and each watch logs an ERROR per attempt though every one of them recovers. A log-based
alert on ERROR would fire on each control-plane restart. Those lines are logged at WARNING here;
a request kopf gives up on ("escalating") stays an ERROR.
"""

from __future__ import annotations

import logging

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: How kopf's request loop ends a line about an attempt that it retries.
RETRIED = ("; will retry", "; will re-authenticate")


class RetriedRequestsAsWarnings(logging.Filter):
    """Lowers kopf's ERROR lines about a request it retries to WARNING."""

    def filter(self, record: logging.LogRecord) -> bool:
        retried = any(marker in record.getMessage() for marker in RETRIED)
        if record.levelno == logging.ERROR and record.name.startswith("kopf") and retried:
            record.levelno, record.levelname = (
                logging.WARNING,
                logging.getLevelName(logging.WARNING),
            )
        return True


def configure_logging() -> None:
    """INFO and above to stderr, kopf's retried requests as warnings."""
    logging.basicConfig(level=logging.INFO, format=FORMAT)
    for handler in logging.getLogger().handlers:
        handler.addFilter(RetriedRequestsAsWarnings())
