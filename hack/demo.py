#!/usr/bin/env python3
"""`make demo`: the operator serving a real pair on this machine's CPU, refusing a mismatched one,
rolling a bad draft back by its measured acceptance, and falling back when acceptance collapses.

    make demo          # installs what it needs, runs the steps, stops what it started
    KEEP=1 make demo   # leaves the cluster, the release, the operator and the pair running

Steps: start (or reuse) the local test-bed cluster; write the tiny models; install the Helm
chart into `specdeploy-system`: its CRD, RBAC, config and its operator Deployment, whose two pods
the test bed's process kubelet runs from the operator image's entry point (one holds the Lease
and reconciles, with the chart's ServiceAccount token and ConfigMap, in-cluster; local-process
engines; watching the namespace `specdeploy-demo`), and `helm test`; apply the tiny target with its
good draft (`draft-small`) and wait for Ready; send a completion and read the acceptance rate
from Prometheus; then point the same SpeculativeDeployment at a draft trained for another
target and show it refused (PairCompatible=False, a Warning Event) while the good pair keeps
serving; then, with completions flowing to every serving pod, a draft that is almost never
accepted runs as a canary and is rolled back on its probe (the same prompts every revision's
pods run before they serve) before any completion reaches it, shown by `kubectl specdeploy
status`; last, the collapse guard takes speculation off the good pair. Exits non-zero, naming
the step, when one fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "e2e"), str(REPO / "operator")]

from chart_harness import (  # noqa: E402
    CHART,
    ChartOperator,
    Helm,
    local_process_values,
    set_values,
)
from engine_cluster import (  # noqa: E402
    complete,
    engine_url,
    get_sd,
    operator_config,
    prometheus_value,
    ready_pod,
    tiny_sd,
    what_the_operator_measured,
)
from engine_harness import (  # noqa: E402
    ACCEPTED_TOKENS,
    DRAFT_TOKENS,
    build_tiny_models,
    engine_python_path,
)
from load import CompletionLoad  # noqa: E402
from testbed import (  # noqa: E402
    ClusterEnv,
    Kubectl,
    create_namespace_with_queues,
    down,
    eventually,
    up,
)
from testbed.conditions import condition, is_ready  # noqa: E402

NAMESPACE = "specdeploy-demo"
RELEASE = "specdeploy"
RELEASE_NAMESPACE = "specdeploy-system"
# The chart names its objects `<release>-<chart>`, or the release alone when it holds the
# chart's name (as helm create's helpers do).
FULLNAME = RELEASE
SD = "tiny-chat"
GOOD_DRAFT = "draft-small"
BAD_DRAFT = "eagle3-other-verifier"
USELESS_DRAFT = "draft-bad"
# A canary judged every 10 s on a 20 s window, rolled back at 2 failures, promoted at 2 passes;
# every pod runs the probe's prompts before it serves. Every criterion is the default.
PROBE = "demo-probe"
ROLLOUT = {
    "canary": {"replicas": 1},
    "analysis": {
        "interval": "10s",
        "window": "20s",
        "minDraftTokens": 60,
        "failureLimit": 2,
        "promoteAfter": 2,
        "probe": {"configMapKeyRef": {"name": PROBE, "key": "prompts"}, "maxTokens": 48},
    },
}
RUN = REPO / ".run" / "demo"
MAKE_OPERATOR_PID = REPO / ".run" / "operator.pid"
KEEP = os.environ.get("KEEP") == "1"
READY_TIMEOUT_S = 480
CONDITIONS_JSONPATH = (
    "jsonpath={range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{'\\n'}{end}"
)
PROMPTS = [
    "The cat sat on the",
    "In the morning the queue",
    "A node sees the",
    "The draft and the target",
]


class StepFailedError(RuntimeError):
    pass


_steps: list[str] = []


def header(title: str) -> None:
    _steps.append(title)
    print(f"\n=== [{len(_steps)}] {title} ===", flush=True)


def say(text: str) -> None:
    print(f"    {text}", flush=True)


@contextlib.contextmanager
def step(title: str) -> Iterator[None]:
    header(title)
    began = time.monotonic()
    try:
        yield
    except Exception as error:
        raise StepFailedError(f"step {len(_steps)} ({title}) failed: {error}") from error
    say(f"({time.monotonic() - began:.1f}s)")


def show(kubectl: Kubectl, *args: str) -> None:
    """Runs kubectl and prints what it printed, as a person typing it would see."""
    print(f"    $ kubectl {' '.join(args)}", flush=True)
    done = kubectl.run(*args, check=False)
    for line in (done.stdout + done.stderr).rstrip().splitlines():
        print(f"      {line}")


def show_plugin(kubectl: Kubectl, *args: str) -> None:
    """`kubectl specdeploy ...`, as a person runs it: kubectl finds the package's
    `kubectl-specdeploy` on PATH."""
    print(f"    $ kubectl specdeploy -n {NAMESPACE} {' '.join(args)}", flush=True)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "KUBECONFIG": str(kubectl.kubeconfig),
    }
    done = subprocess.run(
        [str(kubectl.binary), "specdeploy", "-n", NAMESPACE, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    for line in (done.stdout or done.stderr).rstrip().splitlines():
        print(f"      {line}")
    if done.returncode != 0:
        raise RuntimeError(f"kubectl specdeploy {' '.join(args)} exited {done.returncode}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def refuse_a_second_operator() -> None:
    """An operator from `make operator-up` watches every namespace with its own config."""
    if MAKE_OPERATOR_PID.exists():
        text = MAKE_OPERATOR_PID.read_text().strip()
        if text.isdigit() and alive(int(text)):
            raise RuntimeError(
                f"an operator started by `make operator-up` runs (pid {text}) and would "
                "reconcile the demo's SD with its own config: `make operator-down` first"
            )


# What a wait that runs out prints after its message (set once the operator runs): the status
# the operator wrote, what it last measured and what Prometheus holds, so a failure explains itself.
_explain_timeout: list[Callable[[], str]] = []


def wait_for(probe: Callable[[], Any], timeout: float, what: str) -> Any:
    say(f"waiting for {what} (up to {timeout:.0f}s)")
    try:
        return eventually(probe, timeout, what)
    except TimeoutError as error:
        raise TimeoutError("\n".join([str(error), *(f() for f in _explain_timeout)])) from None


def acceptance(prometheus_url: str, revision: str) -> tuple[float, float]:
    labels = f'namespace="{NAMESPACE}",specdeploy_dev_revision="{revision}"'
    draft = prometheus_value(prometheus_url, f"sum({DRAFT_TOKENS}{{{labels}}})") or 0.0
    accepted = prometheus_value(prometheus_url, f"sum({ACCEPTED_TOKENS}{{{labels}}})") or 0.0
    return accepted, draft


def run(env: ClusterEnv, kubectl: Kubectl, operator: ChartOperator) -> None:
    with step("Tiny models (written on disk, never downloaded)"):
        python = engine_python_path()
        models = build_tiny_models(python)
        say(f"engine python: {python}")
        say(f"target: {models['target']}")
        say(f"good draft ({GOOD_DRAFT}): {models[GOOD_DRAFT]}")
        say(f"mismatched draft ({BAD_DRAFT}): {models[BAD_DRAFT]}")

    with step(f"The Helm chart: CRD, RBAC for {NAMESPACE}, config, the operator's Deployment"):
        refuse_a_second_operator()
        create_namespace_with_queues(kubectl, NAMESPACE)
        install_chart(env, kubectl, str(python))
        kubectl.apply(
            [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": PROBE, "namespace": NAMESPACE},
                    "data": {"prompts": json.dumps(PROMPTS)},
                }
            ]
        )
        say(f"ConfigMap {PROBE}: the probe's prompts, run by every engine pod before it serves")

    with step("The operator as the chart's two pods: one leads, one stands by"):
        pods = wait_for(lambda: operator.ready_pods(2), 180, "two operator pods Ready")
        leader = wait_for(operator.leader, 60, "a holder of the Lease")
        show(kubectl, "get", "pods,lease", "-n", RELEASE_NAMESPACE, "-o", "wide")
        say(f"leader {leader}; standby {next(p for p in pods if p != leader)}")
        say("each pod: the operator image's entry point (`specdeploy operator run --config")
        say("/etc/specdeploy/config.yaml`), the ConfigMap mounted there, the ServiceAccount's")
        say("token at /var/run/secrets/kubernetes.io/serviceaccount: in-cluster configuration")
        say(f"engine command: {python} -m specdeploy.engine serve -- <vllm args>")
        show_grants(kubectl)
        _explain_timeout.append(
            lambda: what_the_operator_measured(
                kubectl, env.prometheus_url, operator.log_text(), NAMESPACE, SD
            )
        )
        print(f"    $ helm test {RELEASE} -n {RELEASE_NAMESPACE}", flush=True)
        tested = helm_for(env).run("test", RELEASE, "-n", RELEASE_NAMESPACE, timeout=180)
        for line in tested.stdout.strip().splitlines()[:8]:
            print(f"      {line}")

    with step(f"Apply the pair: tiny target + {GOOD_DRAFT} (draft_model, 3 speculative tokens)"):
        kubectl.apply([demo_sd(models, GOOD_DRAFT, "1.0-small")])
        say(f"applied SpeculativeDeployment {NAMESPACE}/{SD}")

        def ready() -> dict[str, Any] | None:
            sd = get_sd(kubectl, NAMESPACE, SD)
            return sd if is_ready(sd) else None

        sd = wait_for(ready, READY_TIMEOUT_S, "Ready=True (vLLM loading the pair on the CPU)")
        stable = sd["status"]["stableRevision"]
        show(kubectl, "get", "sd", "-n", NAMESPACE, "-o", "wide")
        show(kubectl, "get", "deployments,pods", "-n", NAMESPACE, "-o", "wide")
        pair = condition(sd, "PairCompatible")
        say(f"PairCompatible={pair.get('status')} ({pair.get('reason')}): {pair.get('message')}")
        say(f"sizing: {sd['status']['sizing']['message']}")

    with step("A completion from the pod's vLLM (greedy, with speculation)"):
        pod = ready_pod(kubectl, NAMESPACE, SD, stable)
        if pod is None:
            raise RuntimeError(f"no ready pod of revision {stable}")
        url = engine_url(env, pod)
        say(f"pod {pod['metadata']['name']} on node {pod['spec']['nodeName']} listens on {url}")
        answer = complete(url, models["target"], PROMPTS[0], max_tokens=32)
        say(f"prompt: {PROMPTS[0]!r} (the tiny target has random weights: expect no sense)")
        say(
            f"completion ({answer['usage']['completion_tokens']} tokens): "
            f"{json.dumps(answer['choices'][0]['text'])}"
        )

    with step("Acceptance rate, as Prometheus scraped it from the pod"):
        for prompt in PROMPTS:
            complete(url, models["target"], prompt, max_tokens=64)
        _, drafted = acceptance(env.prometheus_url, stable)

        def scraped() -> tuple[float, float] | None:
            accepted, draft = acceptance(env.prometheus_url, stable)
            return (accepted, draft) if draft > drafted else None

        accepted, draft = wait_for(scraped, 60, "the next scrape (every 2s)")
        say(
            f'query: sum({ACCEPTED_TOKENS}{{namespace="{NAMESPACE}",'
            f'specdeploy_dev_revision="{stable}"}}) / sum({DRAFT_TOKENS}{{...}})'
        )
        say(
            f"accepted {accepted:.0f} of {draft:.0f} draft tokens: "
            f"acceptance rate {accepted / draft:.2f}"
        )
        wait_for(
            lambda: get_sd(kubectl, NAMESPACE, SD)["status"].get("acceptanceRate"),
            60,
            "the operator's own reading in status.acceptanceRate",
        )
        show(kubectl, "get", "sd", "-n", NAMESPACE)

    with step(f"Apply a mismatched pair: the same target + {BAD_DRAFT}"):
        kubectl.apply([demo_sd(models, BAD_DRAFT, "1.1-eagle3")])
        say("this EAGLE-3 head declares it was trained for specdeploy-tiny/other-target")

        def refused() -> dict[str, Any] | None:
            sd = get_sd(kubectl, NAMESPACE, SD)
            return sd if condition(sd, "PairCompatible").get("status") == "False" else None

        sd = wait_for(refused, 120, "PairCompatible=False")
        show(
            kubectl,
            "get",
            "sd",
            SD,
            "-n",
            NAMESPACE,
            "-o",
            CONDITIONS_JSONPATH,
        )
        show(
            kubectl,
            "get",
            "events",
            "-n",
            NAMESPACE,
            "--field-selector",
            f"involvedObject.name={SD},involvedObject.kind=SpeculativeDeployment,type=Warning",
        )
        failed = [r["revision"] for r in sd["status"]["revisions"] if r["phase"] == "Failed"]
        say(f"revisions marked Failed: {failed}; stable revision: {sd['status']['stableRevision']}")
        if sd["status"]["stableRevision"] != stable:
            raise RuntimeError(f"the stable revision moved from {stable}")

    with step("The good pair keeps serving; the refused revision is stopped, not crash-looping"):
        wait_for(
            lambda: all(
                kubectl.get_json("deployment", f"{SD}-{r}", "-n", NAMESPACE)["spec"]["replicas"]
                == 0
                for r in failed
            ),
            60,
            "the refused revision at zero replicas",
        )
        show(kubectl, "get", "sd,deployments,pods", "-n", NAMESPACE)
        answer = complete(url, models["target"], PROMPTS[1], max_tokens=16)
        say(f"completion from revision {stable}: {json.dumps(answer['choices'][0]['text'])}")

    with step(f"A draft that is almost never accepted ({USELESS_DRAFT}) as a canary, under load"):
        with CompletionLoad(kubectl, NAMESPACE, SD, models["target"], env) as load:
            kubectl.apply([demo_sd(models, USELESS_DRAFT, "1.2-useless")])
            say("the launcher passes this pair (it is made for this target): only its measured")
            say("acceptance can tell. Its pod runs the probe's prompts against its own vLLM and")
            say("stays out of the Service (a readiness gate) until the operator compared them")
            say("with the stable's; completions go to every serving pod meanwhile")

            def rolled_back() -> dict[str, Any] | None:
                sd = get_sd(kubectl, NAMESPACE, SD)
                analysis = sd["status"].get("analysis") or {}
                return sd if analysis.get("outcome") == "Rollback" else None

            sd = wait_for(rolled_back, READY_TIMEOUT_S, "the canary's analysis to roll it back")
        canary = sd["status"]["analysis"]["revision"]
        [record] = [r for r in sd["status"]["revisions"] if r["revision"] == canary]
        probe = record["verdicts"][0]
        say(f"the probe's verdict ({probe['source']}, {probe['result']}): {probe['message']}")
        say(
            f"completions sent by revision: {dict(load.sent)}: none to {canary}, which served "
            f"only the probe's {record['probe']['requests']} requests"
        )
        show_plugin(kubectl, "status", SD)
        show(
            kubectl,
            "get",
            "events",
            "-n",
            NAMESPACE,
            "--field-selector",
            f"involvedObject.name={SD},involvedObject.kind=SpeculativeDeployment",
        )
        if sd["status"]["stableRevision"] != stable:
            raise RuntimeError(f"the stable revision moved from {stable}")
        if load.sent[canary]:
            raise RuntimeError(f"{load.sent[canary]} completions reached the canary {canary}")
        show(kubectl, "get", "sd", "-n", NAMESPACE, "-o", "wide")

    with step("The collapse guard: acceptance below its floor takes speculation off"):
        body = demo_sd(models, GOOD_DRAFT, "1.0-small")
        body["spec"]["rollout"]["collapseGuard"] = {
            "floor": 0.99,
            "for": "10s",
            "action": "DisableSpeculation",
        }
        say("the good pair again, guarded by a floor of 0.99: above the ~0.9 this draft's first")
        say("token reaches here, so to the guard it has collapsed (the tiny drafts accept about")
        say(
            "as well whatever the prompt; on a real cluster the floor stays ~0.5 and traffic moves)"
        )
        with CompletionLoad(kubectl, NAMESPACE, SD, models["target"], env):
            kubectl.apply([body])

            def fallen_back() -> dict[str, Any] | None:
                sd = get_sd(kubectl, NAMESPACE, SD)
                speculation = sd["status"].get("speculation") or {}
                ready = is_ready(sd)
                off = speculation.get("reason") == "DisabledAfterCollapse"
                return sd if off and ready else None

            sd = wait_for(fallen_back, READY_TIMEOUT_S, "the target alone serving")
        speculation = sd["status"]["speculation"]
        say(f"status.speculation: {speculation['state']} ({speculation['reason']})")
        say(f"  {speculation['message']}")
        show(kubectl, "get", "sd", "-n", NAMESPACE, "-o", "wide")


SERVICE_ACCOUNT_USER = f"system:serviceaccount:{RELEASE_NAMESPACE}:{FULLNAME}"


def helm_for(env: ClusterEnv) -> Helm:
    """The test bed's pinned helm, bound to its admin kubeconfig."""
    return Helm(Path(env.bin_dir) / "helm", Path(env.kubeconfig))


def install_chart(env: ClusterEnv, kubectl: Kubectl, engine_python: str) -> None:
    """`helm upgrade --install` of charts/specdeploy with the demo's operator config; its pods
    (and `helm test`'s) annotated for the test bed's process kubelet, which runs them."""
    config = {**operator_config(engine_python, env.prometheus_url), "namespaces": [NAMESPACE]}
    args = ["upgrade", "--install", RELEASE, str(CHART), "-n", RELEASE_NAMESPACE]
    # --take-ownership: a CRD applied earlier with kubectl (the e2e suites do) joins the release.
    args += ["--create-namespace", "--take-ownership"]
    print(
        f"    $ helm {' '.join(args)} --set-json config=<the demo's> "
        "--set-json podAnnotations=<the process kubelet's>",
        flush=True,
    )
    # --log-reconciles: a wait that runs out prints the last measurement the leader logged.
    args += set_values({"config": config, "logReconciles": True, **local_process_values()})
    out = helm_for(env).run(*args)
    for line in out.stdout.strip().splitlines()[:6]:
        print(f"      {line}")
    show(kubectl, "get", "crd", "speculativedeployments.specdeploy.dev")
    show(kubectl, "get", "deployment,serviceaccount,configmap,role", "-n", RELEASE_NAMESPACE)
    show(kubectl, "get", "role,rolebinding", "-n", NAMESPACE)


def show_grants(kubectl: Kubectl) -> None:
    """What the chart lets its ServiceAccount do in the demo's namespace (API resources only)."""
    args = ("auth", "can-i", "--list", "-n", NAMESPACE, f"--as={SERVICE_ACCOUNT_USER}")
    print(f"    $ kubectl {' '.join(args)}  (API resources)", flush=True)
    for line in kubectl.run(*args).stdout.splitlines():
        if "[/" not in line and "selfsubject" not in line:
            print(f"      {line.rstrip()}")


def where_to_look_next(env: ClusterEnv | None, kept: bool) -> None:
    header("Where to look next")
    if kept and env is not None:
        say(f"export KUBECONFIG={env.kubeconfig}")
        say(f"kubectl get sd -n {NAMESPACE} -o wide        # the pair, its revision, acceptance")
        say(f"kubectl describe sd {SD} -n {NAMESPACE}      # conditions and the rollout Events")
        say(f"helm list -n {RELEASE_NAMESPACE}                # the release the CRD/RBAC came from")
        say(f"Prometheus {env.prometheus_url}: vllm:spec_decode_num_accepted_tokens_total")
        say(f"operator logs: {env.run_dir}/process-kubelet/pods/{RELEASE_NAMESPACE}_*/operator.log")
    else:
        say("KEEP=1 make demo leaves the cluster, the release and the pair running to look at")
    say("specdeploy render -f examples/llama-8b-eagle3-mig.yaml   # a CR's objects, no cluster")
    say("docs/demo.md (what each step shows), docs/chart.md (the chart on a real cluster)")


def demo_sd(models: dict[str, str], draft: str, version: str) -> dict[str, Any]:
    """The demo's SD: the tiny target with `draft`, rolled out as a judged canary."""
    body = tiny_sd(SD, NAMESPACE, models, draft, version)
    body["spec"]["rollout"] = json.loads(json.dumps(ROLLOUT))
    return body


def main() -> int:
    began = time.monotonic()
    RUN.mkdir(parents=True, exist_ok=True)
    started_cluster = False
    operator: ChartOperator | None = None
    env: ClusterEnv | None = None
    failure: str | None = None
    try:
        with step("The local cluster (etcd, API server, KWOK GPU nodes, Kueue, Prometheus)"):
            env, started_cluster = up(log=say, die_with_parent=not KEEP)
            say(f"{'started' if started_cluster else 'reusing'}: KUBECONFIG={env.kubeconfig}")
            say(f"Prometheus {env.prometheus_url}")
        kubectl = env.kubectl()
        operator = ChartOperator(env, RELEASE, RELEASE_NAMESPACE)
        run(env, kubectl, operator)
    except StepFailedError as error:
        failure = str(error)
    except Exception as error:  # outside a step: still clean up and say what broke
        failure = f"{type(error).__name__}: {error}"
    except KeyboardInterrupt:
        failure = "interrupted"

    if failure and operator is not None:
        print("\n--- the operator pods' logs (last lines) ---")
        print(operator.log_tail(4000))

    if KEEP and not failure:
        header("KEEP=1: left running")
        assert env is not None
        say("the operator: the release's two pods")
        say(f"  stop them with the release: helm uninstall {RELEASE} -n {RELEASE_NAMESPACE}")
        say("the cluster: make cluster-down")
    else:
        header("Clean up: what the demo started")
        if env is not None and operator is not None:
            # While the operator's pods run, so that the SD's engines stop with their pods.
            done = env.kubectl().run(
                "delete", "sd", "--all", "-n", NAMESPACE, "--timeout=90s", check=False
            )
            say(done.stdout.strip() or done.stderr.strip())
            env.kubectl().run("delete", "namespace", NAMESPACE, "--wait=false", check=False)
            say(f"namespace {NAMESPACE} deleted")
        if env is not None and not started_cluster:
            helm_for(env).run("uninstall", RELEASE, "-n", RELEASE_NAMESPACE, "--wait", check=False)
            env.kubectl().run("delete", "namespace", RELEASE_NAMESPACE, "--wait=false", check=False)
            say(f"release {RELEASE} uninstalled, its operator pods with it (its CRD stays:")
            say("helm.sh/resource-policy keep)")
        if started_cluster:
            down(log=say)
            say("cluster stopped")
        elif env is not None:
            say("the cluster was running before the demo: left running")

    if failure:
        print(f"\nDEMO FAILED: {failure}", file=sys.stderr)
        return 1
    where_to_look_next(env, KEEP)
    print(f"\nDemo finished in {time.monotonic() - began:.0f}s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
