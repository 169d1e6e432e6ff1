"""`specdeploy-engine` / `python -m specdeploy.engine`: the engine container's launcher.

Commands:

    serve -- <vllm serve arguments>   check the pair, then exec vLLM with those arguments
    check -- <vllm serve arguments>   only check the pair: print the results, exit 0, 3 or 4
    tiny-models --out DIR             write the tiny test models (needs torch and transformers)

`specdeploy-engine COMMAND --help` describes one command.
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

_PAIR_CHECKS = f"""\
The target and the draft are found in the vLLM arguments (the model, --revision and
--speculative-config's "model" and "revision"). Each is resolved to a folder holding its
config.json: a local or volume path as it is, a hub id and revision by downloading its config
and tokenizer files only into the hub cache vLLM also uses (HF_HOME, HF_TOKEN). The checks
then compare the two: the method, the target the draft was trained for, an EAGLE-3 head's
shape, the vocabularies and the tokenizer (docs/engine.md).

Environment:
  {contract.PAIR_ENV:<27} the pair the operator deployed (JSON), checked against the args
  {launcher.TERMINATION_LOG_ENV:<27} where the one-line refusal goes
  {"":<27} (default {launcher.DEFAULT_TERMINATION_LOG})
  {launcher.OFFLINE_ENV + "=1":<27} never download: a hub id counts as a missing model
  {launcher.VLLM_ENTRY_ENV:<27} how vLLM starts: cli (`vllm serve`) or module

Exit codes:
  {contract.EXIT_OK}  the pair passed{" (serve: never returns, vLLM replaces the launcher)"}
  {contract.EXIT_USAGE}  unusable arguments (no model, --speculative-config not JSON)
  {contract.EXIT_PAIR_INCOMPATIBLE}  the draft does not belong to the target
  {contract.EXIT_MODEL_UNAVAILABLE}  a model could not be found or read
"""

COMMAND_HELP = {
    "serve": f"""\
usage: specdeploy-engine serve [--] <vllm serve arguments>

Checks that the draft belongs to the target, then replaces itself with vLLM given the same
arguments, unchanged: `specdeploy-engine serve -- MODEL --revision R --speculative-config
JSON ...` serves as `vllm serve MODEL ...` would. A refused pair never starts vLLM. Put
`--help` after `--` for vLLM's own help.

{_PAIR_CHECKS}""",
    "check": f"""\
usage: specdeploy-engine check [--] <vllm serve arguments>

Runs the pair checks of `serve` and prints them as JSON (ok, exitCode, message, checks)
without starting vLLM.

{_PAIR_CHECKS}""",
}


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
    if command in COMMAND_HELP and rest[:1] in (["-h"], ["--help"]):
        print(COMMAND_HELP[command].strip())
        return 0
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
