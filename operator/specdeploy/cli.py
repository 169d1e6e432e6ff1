"""The `specdeploy` command: CRD generation, offline rendering, version, and the operator.

`specdeploy operator run` imports `specdeploy.handlers.run` only when it runs, so CRD
generation never needs the operator's runtime (kopf, a cluster) to import.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

from specdeploy import GROUP, VERSION, __version__
from specdeploy.api.config import OperatorConfig
from specdeploy.api.crd import write_crds
from specdeploy.render import (
    DoesNotPlaceError,
    InvalidSpeculativeDeploymentError,
    load_speculative_deployment,
    read_nodes,
    render,
    render_yaml,
)


def _crds(args: argparse.Namespace) -> int:
    for path in write_crds(Path(args.out)):
        print(path)
    return 0


# `specdeploy render` exit codes, beside argparse's 2 for a bad command line.
EXIT_INVALID = 1
EXIT_UNREADABLE = 2
EXIT_DOES_NOT_PLACE = 3


def _read_text(path: str) -> str:
    return sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")


def _render(args: argparse.Namespace) -> int:
    source = "stdin" if args.file == "-" else args.file
    try:
        text = _read_text(args.file)
        nodes = read_nodes(_read_text(args.nodes)) if args.nodes else None
        config = OperatorConfig.from_mapping(
            yaml.safe_load(_read_text(args.config)) if args.config else None
        )
    except (OSError, ValueError, yaml.YAMLError) as error:
        print(f"specdeploy render: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    try:
        body = load_speculative_deployment(text, source)
        rendering = render(body, nodes, config, namespace=args.namespace)
    except InvalidSpeculativeDeploymentError as error:
        print(f"specdeploy render: {source}: {error}", file=sys.stderr)
        return EXIT_INVALID
    except DoesNotPlaceError as error:
        print(f"specdeploy render: {source}: does not place: {error}", file=sys.stderr)
        return EXIT_DOES_NOT_PLACE
    nodes_source = (
        f"{args.nodes} ({len(nodes or [])} nodes)"
        if args.nodes
        else "the built-in GPU catalog (one node per product)"
    )
    sys.stdout.write(render_yaml(rendering, nodes_source, args.config or "defaults"))
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


OPERATOR_RUN_DESCRIPTION = """\
Runs the specdeploy operator until interrupted: every SpeculativeDeployment in the watched
namespaces becomes one Deployment per revision (the pair, its sizing and engine settings),
a Service and, when the Prometheus Operator's CRD is there, a PodMonitor; new pairs roll out
(as canaries when spec.rollout asks) and status says where each stands."""

OPERATOR_RUN_EPILOG = """\
cluster access:
  in a pod its ServiceAccount; elsewhere the current context of KUBECONFIG (~/.kube/config).
  The chart (charts/specdeploy) grants exactly the permissions used (docs/chart.md).

several replicas:
  with leaderElection.enabled in the config only the holder of the Lease reconciles; the
  others stand by and take over when it stops renewing. Without it run one process.

examples:
  specdeploy operator run --namespace serving --log-reconciles
  specdeploy operator run --config configmap:specdeploy-system/specdeploy"""


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

    render = commands.add_parser(
        "render",
        help="print what a SpeculativeDeployment becomes (Deployment, Service, PodMonitor)",
        description=(
            "Print the objects the operator applies for a SpeculativeDeployment, without a "
            "cluster, preceded by the sizing arithmetic, the revision and the vllm serve "
            "command as YAML comments. Exit 1: the CR is invalid; 2: an input is unreadable; "
            "3: the pair does not place on the nodes."
        ),
    )
    render.add_argument(
        "-f", "--file", required=True, help="the SpeculativeDeployment (- for stdin)"
    )
    render.add_argument(
        "--nodes",
        help="Node objects, as `kubectl get nodes -o yaml` prints them "
        "(default: one node of each GPU product in the built-in catalog)",
    )
    render.add_argument("--config", help="operator config file (default: the defaults)")
    render.add_argument(
        "-n",
        "--namespace",
        help="render as if applied in this namespace (default: the CR's, else default)",
    )
    render.set_defaults(func=_render)

    version = commands.add_parser("version", help="print the version")
    version.set_defaults(func=_version)

    operator = commands.add_parser("operator", help="run the operator")
    operator_commands = operator.add_subparsers(dest="operator_command", required=True)
    run = operator_commands.add_parser(
        "run",
        help="reconcile SpeculativeDeployments",
        description=OPERATOR_RUN_DESCRIPTION,
        epilog=OPERATOR_RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "--config",
        metavar="PATH|configmap:NS/NAME",
        help="operator config: a YAML file (camelCase keys, see docs/operator.md) or the key "
        "config.yaml of a ConfigMap; default: every setting's default",
    )
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
