"""make test's last lines: the slowest e2e modules, summed from the junit file."""

from __future__ import annotations

from slowest_modules import module_seconds, render

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="e2e.test_a" name="test_one" time="10.5"/>
<testcase classname="e2e.test_a" name="test_two" time="4.5"/>
<testcase classname="e2e.test_b.TestGroup" name="test_three" time="30"/>
<testcase classname="e2e.test_c" name="test_four" time="1"/>
</testsuite></testsuites>"""


def test_modules_are_summed_and_listed_slowest_first() -> None:
    totals = module_seconds(JUNIT)
    assert totals == {"test_a": 15.0, "test_b": 30.0, "test_c": 1.0}
    assert render(totals, 2).splitlines() == [
        "The 2 slowest e2e modules (46 s in all):",
        "  test_b                                30.0 s",
        "  test_a                                15.0 s",
    ]
