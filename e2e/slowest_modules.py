"""`python -m slowest_modules JUNIT [N]`: the N slowest e2e modules of a junit file (default 10).

`make test` prints it last, so growth shows at every run: each module's seconds are the sum of
its test cases' times (setup, call and teardown, as pytest's junit writes them), slowest first.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path


def module_seconds(junit: str) -> dict[str, float]:
    """Seconds by test module (`e2e.test_x` or `test_x` → `test_x`) of a junit XML text."""
    totals: dict[str, float] = {}
    for case in ET.fromstring(junit).iter("testcase"):
        module = case.get("classname", "").split(".")
        name = next((part for part in reversed(module) if part.startswith("test_")), "")
        key = name or ".".join(module) or "?"
        totals[key] = totals.get(key, 0.0) + float(case.get("time") or 0.0)
    return totals


def render(totals: dict[str, float], count: int = 10) -> str:
    whole = sum(totals.values())
    lines = [f"The {min(count, len(totals))} slowest e2e modules ({whole:.0f} s in all):"]
    slowest = sorted(totals.items(), key=lambda item: item[1], reverse=True)[:count]
    for name, seconds in slowest:
        lines.append(f"  {name:<34} {seconds:7.1f} s")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    path = Path(args[0])
    if not path.is_file():
        print(f"slowest_modules: no junit file at {path}", file=sys.stderr)
        return 1
    print(render(module_seconds(path.read_text()), int(args[1]) if len(args) > 1 else 10))
    return 0


if __name__ == "__main__":
    sys.exit(main())
