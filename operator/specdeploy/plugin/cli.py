"""`kubectl-specdeploy` (installed with the package; `kubectl specdeploy ...` finds it on PATH).

    kubectl specdeploy [-n NS] status NAME [--watch]      the rollout: revisions, verdicts, probe
    kubectl specdeploy [-n NS] promote NAME [--full]      promote the canary (past its probe only)
    kubectl specdeploy [-n NS] abort NAME                 roll the canary back now
    kubectl specdeploy [-n NS] pause NAME | resume NAME   hold the canary's analysis / go on
    kubectl specdeploy [-n NS] resume-speculation NAME    bring a collapsed pair back
    kubectl specdeploy [-n NS] history NAME               revisions kept, with record numbers
    kubectl specdeploy [-n NS] undo NAME [--to-revision N]  serve an earlier revision
    kubectl specdeploy [-n NS] retry NAME                 try a revision rolled back unjudged again

Each verb sets or removes one annotation on the SD (specdeploy.plugin.verbs), which the
operator honours; none touches a Deployment or a pod. Exit codes: 0 done (or already so), 1 the
verb does not apply (one line says why), 2 a bad command line, 3 the API refused or the SD is
not there.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from specdeploy import GROUP, VERSION
from specdeploy.api import labels
from specdeploy.api.models import PLURAL, SpeculativeDeployment
from specdeploy.plugin import render, verbs

EXIT_REFUSED = 1
EXIT_API = 3
PROG = "kubectl specdeploy"


class Cluster:
    """The few API calls the plugin makes, with the user's own kubeconfig and rights."""

    def __init__(self, kubeconfig: str | None, context: str | None) -> None:
        from kubernetes import client, config  # noqa: PLC0415 (only when talking to a cluster)

        config.load_kube_config(config_file=kubeconfig, context=context)  # type: ignore[no-untyped-call]
        self.api = client.ApiClient()
        self.custom = client.CustomObjectsApi(self.api)
        self.apps = client.AppsV1Api(self.api)
        listed = config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        contexts, active = listed
        chosen = context or (active or {}).get("name")
        found = next((c for c in contexts if c.get("name") == chosen), active or {})
        self.default_namespace = (found.get("context") or {}).get("namespace") or "default"

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        found = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        return dict(found) if isinstance(found, dict) else {}

    def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch)

    def records(self, namespace: str, name: str) -> dict[str, int]:
        """Revision → record number (the ControllerRevision's .revision), kept revisions only."""
        found = self.api.sanitize_for_serialization(  # type: ignore[no-untyped-call]
            self.apps.list_namespaced_controller_revision(
                namespace, label_selector=f"{labels.NAME}={name}"
            )
        )
        records: dict[str, int] = {}
        for item in found.get("items") or []:
            revision = ((item.get("metadata") or {}).get("labels") or {}).get(labels.REVISION)
            if revision:
                records[str(revision)] = int(item.get("revision") or 0)
        return records


def _api_error(error: Exception) -> str:
    reason = getattr(error, "reason", "") or ""
    status = getattr(error, "status", "")
    return f"{status} {reason}".strip() or str(error)


def _status(cluster: Cluster, args: argparse.Namespace) -> int:
    def show() -> str:
        return render.render_status(cluster.get(args.namespace, args.name))

    if not args.watch:
        sys.stdout.write(show())
        return 0
    deadline = time.monotonic() + args.timeout if args.timeout else None
    while True:
        text = show()
        if sys.stdout.isatty():
            sys.stdout.write("\x1b[H\x1b[2J")
        else:
            sys.stdout.write(f"--- {time.strftime('%H:%M:%S')}\n")
        sys.stdout.write(text)
        sys.stdout.flush()
        if deadline is not None and time.monotonic() >= deadline:
            return 0
        time.sleep(args.interval)


def _history(cluster: Cluster, args: argparse.Namespace) -> int:
    body = cluster.get(args.namespace, args.name)
    sys.stdout.write(render.render_history(body, cluster.records(args.namespace, args.name)))
    return 0


Choose = Callable[[SpeculativeDeployment, "Cluster", argparse.Namespace], verbs.Request]


def _act(choose: Choose) -> Callable[[Cluster, argparse.Namespace], int]:
    def run(cluster: Cluster, args: argparse.Namespace) -> int:
        sd = SpeculativeDeployment.from_body(cluster.get(args.namespace, args.name))
        try:
            request = choose(sd, cluster, args)
        except verbs.NotApplicableError as refused:
            print(f"{PROG} {args.verb}: {refused}", file=sys.stderr)
            return EXIT_REFUSED
        if request.already:
            print(f"{args.name}: already asked: {request.said}")
            return 0
        cluster.patch(args.namespace, args.name, verbs.annotation_patch(request))
        print(f"{args.name}: {request.said}")
        return 0

    return run


VERBS: dict[str, Callable[[Cluster, argparse.Namespace], int]] = {
    "status": _status,
    "history": _history,
    "promote": _act(lambda sd, _c, a: verbs.promote(sd, full=a.full)),
    "abort": _act(lambda sd, _c, _a: verbs.abort(sd)),
    "pause": _act(lambda sd, _c, _a: verbs.pause(sd)),
    "resume": _act(lambda sd, _c, _a: verbs.resume(sd)),
    "resume-speculation": _act(lambda sd, _c, _a: verbs.resume_speculation(sd)),
    "retry": _act(lambda sd, _c, _a: verbs.retry(sd)),
    "undo": _act(
        lambda sd, c, a: verbs.undo(
            sd,
            {n: r for r, n in c.records(a.namespace, a.name).items()},
            to_record=a.to_revision,
        )
    ),
}

HELP = {
    "status": "the rollout: conditions, stable and canary, the probe, verdicts, revisions",
    "history": "the revisions kept, with the record numbers undo takes",
    "promote": "promote the canary now (at its probe: skip the probe; --full: promote)",
    "abort": "roll the canary back now; the stable keeps serving",
    "pause": "hold the canary: no verdict, promotion, rollback or deadline",
    "resume": "take verdicts on the paused canary again",
    "resume-speculation": "bring back the pair the collapse guard took off",
    "undo": "serve an earlier revision until the spec changes",
    "retry": "try the spec's revision again, rolled back with no failed verdict (deadline, limit)",
}


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-n", "--namespace", default=argparse.SUPPRESS, help="the SD's namespace")
    common.add_argument("--context", default=argparse.SUPPRESS, help="kubeconfig context")
    common.add_argument("--kubeconfig", default=argparse.SUPPRESS, help="kubeconfig file")
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Steer SpeculativeDeployment rollouts: every verb acts through the SD's API.",
        parents=[common],
    )
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb in VERBS:
        command = sub.add_parser(verb, help=HELP[verb], description=HELP[verb], parents=[common])
        command.add_argument("name", help="the SpeculativeDeployment")
        if verb == "status":
            command.add_argument("-w", "--watch", action="store_true", help="refresh until ^C")
            command.add_argument("--interval", type=float, default=2.0, help="seconds (2)")
            command.add_argument("--timeout", type=float, default=0, help="stop watching after")
        if verb == "promote":
            command.add_argument("--full", action="store_true", help="promote, even at the probe")
        if verb == "undo":
            command.add_argument(
                "--to-revision", type=int, default=None, help="record number (see history)"
            )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cluster = Cluster(getattr(args, "kubeconfig", None), getattr(args, "context", None))
    except Exception as error:  # no kubeconfig, a bad context: say it in one line
        print(f"{PROG}: cannot reach the cluster: {error}", file=sys.stderr)
        return EXIT_API
    if not getattr(args, "namespace", None):
        args.namespace = cluster.default_namespace
    try:
        return VERBS[args.verb](cluster, args)
    except Exception as error:
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

        if isinstance(error, ApiException):
            print(
                f"{PROG} {args.verb}: {args.namespace}/{args.name}: {_api_error(error)}",
                file=sys.stderr,
            )
            return EXIT_API
        raise


if __name__ == "__main__":
    sys.exit(main())
