"""Status and metadata time stamps are read one way everywhere."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from specdeploy.api.times import RFC3339, parse_time


def test_a_stamp_reads_as_the_utc_second_it_names_and_writes_back_the_same() -> None:
    moment = parse_time("2026-11-27T13:51:26Z")
    assert moment == datetime(2026, 11, 27, 13, 51, 26, tzinfo=UTC)
    assert moment.strftime(RFC3339) == "2026-11-27T13:51:26Z"


@pytest.mark.parametrize("stamp", ["", "2026-11-27T13:51:26.5Z", "2026-11-27T13:51:26+01:00"])
def test_what_is_not_a_whole_second_utc_stamp_is_a_value_error(stamp: str) -> None:
    with pytest.raises(ValueError, match="does not match format"):
        parse_time(stamp)
