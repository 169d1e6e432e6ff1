"""The `specdeploy` command: CRD generation, version, and the operator itself.

`specdeploy operator run` imports `specdeploy.handlers.run` only when it runs, so CRD
generation never needs the operator's runtime (kopf, a cluster) to import.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from specdeploy import GROUP, VERSION, __version__
from specdeploy.api.crd import write_crds


def _crds(args: argparse.Namespace) -> int:
    for path in write_crds(Path(args.out)):
        print(path)
    return 0


def _version(_: argparse.Namespace) -> int:
    print(f"specdeploy {__version__} (API {GROUP}/{VERSION})")
    return 0


def _operator_run(args: argparse.Namespace) -> int:
    # The reconcile side provides `specdeploy.handlers.run:main(args) -> int`.
    try:
        module = importlib.import_module("specdeploy.handlers.run")
    except ModuleNotFoundError as error:
        if error.name != "specdeploy.handlers.run":
            raise
        print("specdeploy operator run: not built yet (specdeploy.handlers.run)", file=sys.stderr)
        return 2
    run: Callable[[argparse.Namespace], int] = module.main
    return run(args)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `specdeploy`, with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="specdeploy",
        description="Serve an LLM target and its speculative-decoding draft as one pair.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    crds = commands.add_parser("crds", help="write the CustomResourceDefinition YAML")
    crds.add_argument("--out", default="crds", help="directory to write into (default: crds)")
    crds.set_defaults(func=_crds)

    version = commands.add_parser("version", help="print the version")
    version.set_defaults(func=_version)

    operator = commands.add_parser("operator", help="run the operator")
    operator_commands = operator.add_subparsers(dest="operator_command", required=True)
    run = operator_commands.add_parser("run", help="reconcile SpeculativeDeployments")
    run.add_argument("--config", help="operator config file (YAML, camelCase keys)")
    run.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="namespace to watch (repeatable; default: the config's, else all)",
    )
    run.add_argument(
        "--log-reconciles",
        action="store_true",
        help="log one line per reconcile, also those that change nothing (to see it work)",
    )
    run.set_defaults(func=_operator_run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `specdeploy` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
