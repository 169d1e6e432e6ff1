"""`specdeploy-engine` / `python -m specdeploy.engine`.

Commands:

    serve -- <vllm serve arguments>   check the pair, then exec vLLM with those arguments
    check -- <vllm serve arguments>   only check the pair: print the results, exit 0, 3 or 4
    tiny-models --out DIR             write the tiny test models (needs torch and transformers)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from specdeploy.api import contract
from specdeploy.engine import launcher
from specdeploy.engine.checks import summarize_failures

USAGE = __doc__ or ""


def _vllm_args(rest: Sequence[str]) -> list[str]:
    rest = list(rest)
    return rest[1:] if rest and rest[0] == "--" else rest


def _check(argv: Sequence[str]) -> int:
    try:
        results = launcher.check_serve_args(argv, dict(os.environ))
    except launcher.LaunchError as err:
        print(json.dumps({"ok": False, "exitCode": err.code, "message": err.message}))
        return err.code
    failed = [r for r in results if r.failed]
    print(
        json.dumps(
            {
                "ok": not failed,
                "exitCode": contract.EXIT_PAIR_INCOMPATIBLE if failed else 0,
                "message": summarize_failures(results),
                "checks": [
                    {"check": r.check, "status": str(r.status), "message": r.message}
                    for r in results
                ],
            },
            indent=2,
        )
    )
    return contract.EXIT_PAIR_INCOMPATIBLE if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE.strip())
        return 0 if argv else contract.EXIT_USAGE
    command, rest = argv[0], argv[1:]
    if command == "serve":
        launcher.serve(_vllm_args(rest))
    if command == "check":
        return _check(_vllm_args(rest))
    if command == "tiny-models":
        parser = argparse.ArgumentParser(prog="specdeploy-engine tiny-models")
        parser.add_argument("--out", required=True, help="folder to write the models into")
        opts = parser.parse_args(rest)
        from specdeploy.engine import tiny_models  # noqa: PLC0415 (needs torch)

        print(json.dumps(tiny_models.write_tiny_models(opts.out), indent=2, sort_keys=True))
        return 0
    print(f"unknown command {command!r}\n\n{USAGE.strip()}", file=sys.stderr)
    return contract.EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
