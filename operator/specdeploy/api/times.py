"""The time stamps of status and metadata (Kubernetes' `metav1.Time`), written and read once.

The API server keeps them as RFC 3339 in UTC, cut to whole seconds, and the operator writes its
own status times the same way.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

RFC3339: Final = "%Y-%m-%dT%H:%M:%SZ"


def parse_time(stamp: str) -> datetime:
    """A stamp as an aware UTC datetime; ValueError when it is not one (`2026-11-27T13:51:26Z`)."""
    return datetime.strptime(stamp, RFC3339).replace(tzinfo=UTC)
