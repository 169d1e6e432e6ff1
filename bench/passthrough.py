"""The operator with real CPU engines (process kubelet): rollout overhead (P1), pass-through of the
engine it starts (P4), and how fast a bad canary and a collapse are acted on (P3).

    make bench-engine-cluster   # or: PYTHONPATH=operator:e2e:. python -m bench.passthrough p1 p3

p1+p4: the tiny pair as an SD (apply -> Ready) and the same pod template as a raw Deployment
(create -> ready replicas), alternating; while the SD's engine serves, streamed completions
measure its tokens/s and inter-token latency beside the very same vLLM command line and
environment (read from the running engine's /proc) started by hand, in alternating rounds.
Writes bench/results/p1-engine.json and passthrough.json.

p3: a canary of a bad draft (about 0 % accepted) under load: from its pod Ready, as a watch on
the pods sees it, to the stable revision being the only one with a Ready pod not being deleted,
over its floor (interval x failureLimit: the analysis starts when the canary is ready); then a
collapse guard whose floor the serving pair cannot reach, set while the pair serves under load:
from the guard applied to the fallback decided (and to the fallback serving), over its floor
(collapseGuard.for).
Writes bench/results/p3-reaction.json. At most two engines run at once; request counts are
small (the CPU is shared).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import subprocess
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from bench.bed import (
    Bed,
    log,
    poll_until,
    raw_copy,
    time_deployment_ready,
    time_sd_ready,
)
from bench.record import LoadWatch, write_result
from bench.serving_watch import PodWatch, reaction_seconds
from engine_cluster import (
    engine_url,
    operator_config,
    revision_pods,
    tiny_sd,
)
from engine_harness import build_tiny_models, engine_python_path
from load import CompletionLoad
from specdeploy.api import labels

# The canary settings of the e2e suite: interval 10 s, failureLimit 2, scrape 2 s.
from test_canary_engine import FAILURE_LIMIT, INTERVAL_S, SCRAPE_S, canary_sd
from testbed import eventually
from testbed.conditions import is_ready
from testbed.ports import free_port

TIMER_S = 2.0  # the operator's timer in P3 (as in the canary e2e suite)
COLLAPSE_FOR_S = 10
ENGINE_TIMEOUT_S = 600
PROMPTS = ["The cat sat on the", "In the morning the queue", "A node sees", "The scheduler"]


# --- streaming completions ---------------------------------------------------------------------


def stream_one(url: str, model: str, prompt: str, max_tokens: int) -> tuple[float, float, int]:
    """(seconds to the last token, mean seconds between tokens after the first, tokens) of one
    greedy streamed completion."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    request = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    began = time.monotonic()
    first = last = began
    tokens = 0
    with urllib.request.urlopen(request, timeout=300) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                now = time.monotonic()
                if first == began:
                    first = now
                last = now
    itl = (last - first) / (tokens - 1) if tokens > 1 else 0.0
    return last - began, itl, tokens


def measure_engine(url: str, model: str, requests: int, max_tokens: int) -> dict[str, Any]:
    """`requests` sequential streamed completions (none: two unmeasured warm-up ones)."""
    if requests == 0:
        for prompt in PROMPTS[:2]:
            stream_one(url, model, prompt, max_tokens)
        return {}
    walls, itls, tokens = [], [], 0
    for i in range(requests):
        wall, itl, count = stream_one(url, model, PROMPTS[i % len(PROMPTS)], max_tokens)
        walls.append(wall)
        itls.append(itl)
        tokens += count
    return {
        "requests": requests,
        "max_tokens": max_tokens,
        "output_tokens": tokens,
        "tokens_per_s": round(tokens / sum(walls), 2),
        "itl_median_ms": round(statistics.median(itls) * 1000, 2),
    }


def engine_process(port: int) -> tuple[list[str], dict[str, str], int]:
    """The command line, environment and pid of the engine serving on a local port (the
    launcher execs vLLM, so that process is vLLM itself)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")[:-1]
            if b"vllm" not in b" ".join(argv) or str(port).encode() not in argv:
                continue
            env_items = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        env = dict(item.decode().split("=", 1) for item in env_items if b"=" in item)
        return [a.decode() for a in argv], env, int(proc.name)
    raise RuntimeError(f"no vLLM process serving port {port}")


@contextlib.contextmanager
def hand_started(
    argv: list[str], env: dict[str, str], log_path: Path, cpus: set[int]
) -> Iterator[tuple[str, int]]:
    """The same command line started by hand on a free port, pinned to `cpus`; yields (its
    URL, its pid) once healthy."""
    port = free_port()
    args = list(argv)
    index = args.index("--port")
    args[index + 1] = str(port)
    with log_path.open("wb") as out:
        process = subprocess.Popen(
            args,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=partial(os.sched_setaffinity, 0, cpus),  # noqa: PLW1509
        )
    url = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            assert process.poll() is None, log_path.read_text(errors="replace")[-3000:]
            try:
                urllib.request.urlopen(url + "/health", timeout=2).close()
            except OSError:
                return False
            return True

        eventually(healthy, ENGINE_TIMEOUT_S, "the hand-started engine")
        yield url, process.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 15)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, 9)
            process.wait(10)


# --- P1 with engines, and P4 ---------------------------------------------------------------------


def pods_gone(bed: Bed, namespace: str) -> None:
    eventually(
        lambda: not bed.core.list_namespaced_pod(namespace).items,
        180,
        f"no pods left in {namespace}",
    )


def p1_and_p4(
    bed: Bed,
    *,
    python: Path,
    models: dict[str, str],
    workdir: Path,
    runs: int,
    requests: int,
    max_tokens: int,
    rounds: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    namespace = bed.namespace("bench-engine")
    config = operator_config(str(python), bed.env.prometheus_url, interval=30)
    running, _ = bed.operator(workdir / "p1-engine", (namespace,), config)
    running.start()
    sd_times: list[float] = []
    raw_times: list[float] = []
    passthrough: dict[str, Any] = {}
    template: dict[str, Any] | None = None
    try:
        # Not timed: the first engine start on the machine reads vLLM and torch from a cold page
        # cache, which would fall on whichever side goes first.
        warm = tiny_sd("warm-up", namespace, models, "draft-small", "1")
        log(f"p1-engine warm-up (not timed): {time_sd_ready(bed, warm, ENGINE_TIMEOUT_S):.1f}s")
        bed.delete_sds(namespace)
        pods_gone(bed, namespace)
        for run in range(runs):
            order = ("sd", "raw") if run % 2 == 0 or template is None else ("raw", "sd")
            for kind in order:
                if kind == "sd":
                    name = f"e-{run}"
                    body = tiny_sd(name, namespace, models, "draft-small", "1")
                    took = time_sd_ready(bed, body, ENGINE_TIMEOUT_S)
                    sd_times.append(took)
                    [deployment] = bed.kubectl.get_json(
                        "deployments", "-n", namespace, "-l", f"{labels.NAME}={name}"
                    )["items"]
                    template = copy.deepcopy(deployment)
                    if not passthrough:
                        passthrough = p4(
                            bed, namespace=namespace, name=name, models=models,
                            workdir=workdir, requests=requests, max_tokens=max_tokens,
                            rounds=rounds,
                        )  # fmt: skip
                    bed.delete_sds(namespace)
                else:
                    assert template is not None
                    raw = raw_copy(template, f"raw-{run}")
                    took = time_deployment_ready(bed, raw, ENGINE_TIMEOUT_S)
                    raw_times.append(took)
                    bed.apps.delete_namespaced_deployment(
                        raw["metadata"]["name"], namespace, propagation_policy="Foreground"
                    )
                log(f"p1-engine run {run} {kind}: {took:.1f}s")
                pods_gone(bed, namespace)
    finally:
        bed.delete_sds(namespace)
        running.stop()
        bed.drop_namespace(namespace)
    p1 = {
        "what": "tiny pair (draft_model) as an SD -> Ready vs the same pod template as a raw "
        "Deployment -> ready replicas; real CPU vLLM engines run by the process kubelet; "
        "operator timer 30s; alternating, after one untimed warm-up start",
        "runs": runs,
        "sd_seconds": [round(t, 2) for t in sd_times],
        "raw_seconds": [round(t, 2) for t in raw_times],
        "sd_median_s": round(statistics.median(sd_times), 2),
        "raw_median_s": round(statistics.median(raw_times), 2),
        "ratio": round(statistics.median(sd_times) / statistics.median(raw_times), 3),
        "target_ratio": 1.05,
    }
    return p1, passthrough


def process_context(pid: int) -> dict[str, Any]:
    """What could make two runs of one command line differ: its environment, CPUs, niceness
    and cgroup (from /proc)."""
    proc = Path("/proc") / str(pid)
    env_items = (proc / "environ").read_bytes().split(b"\0")
    status = dict(
        line.split(":", 1) for line in (proc / "status").read_text().splitlines() if ":" in line
    )
    stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
    return {
        "env": dict(item.decode().split("=", 1) for item in env_items if b"=" in item),
        # How many, not which: each engine is pinned to CPUs of its own.
        "cpus_allowed": len(os.sched_getaffinity(pid)),
        "cpus_allowed_list": status.get("Cpus_allowed_list", "").strip(),
        "nice": int(stat[16]),  # field 19 of /proc/<pid>/stat, counted after the command name
        "cgroup": (proc / "cgroup").read_text().strip(),
    }


def context_differences(operator: dict[str, Any], hand: dict[str, Any]) -> list[str]:
    """Every difference between the two engines' process context, as readable lines."""
    found = [
        f"{key}: operator {operator[key]!r}, hand {hand[key]!r}"
        for key in ("cpus_allowed", "nice", "cgroup")
        if operator[key] != hand[key]
    ]
    for name in sorted(set(operator["env"]) | set(hand["env"])):
        ours, theirs = operator["env"].get(name), hand["env"].get(name)
        if ours != theirs:
            found.append(f"env {name}: operator {ours!r}, hand {theirs!r}")
    return found


def p4(
    bed: Bed,
    *,
    namespace: str,
    name: str,
    models: dict[str, str],
    workdir: Path,
    requests: int,
    max_tokens: int,
    rounds: int,
) -> dict[str, Any]:
    """The SD's engine and the same command line started by hand, both up at once, measured in
    turns (operator first in even rounds, hand first in odd ones): each round sees the same
    machine load on both sides, and the medians over the rounds are compared."""
    [pod] = [
        p
        for p in revision_pods(bed.kubectl, namespace, name)
        if not p["metadata"].get("deletionTimestamp")
    ]
    url = engine_url(bed.env, pod)
    port = int(url.rsplit(":", 1)[1])
    argv, env, operator_pid = engine_process(port)
    model = models["target"]
    served = argv[argv.index("--served-model-name") + 1] if "--served-model-name" in argv else model
    log("p4: the same command line started by hand beside the operator's engine")
    sides: dict[str, list[dict[str, Any]]] = {"operator": [], "hand": []}
    # The process kubelet pins the pod's engine to a CPU of its own (docs/testbed.md); the
    # hand-started one gets as many CPUs, the others where there are any, as a second pod would.
    ours = os.sched_getaffinity(operator_pid)
    others = sorted(os.sched_getaffinity(0) - ours) or sorted(ours)
    cpus = set(others[: len(ours)])
    with hand_started(argv, env, workdir / "hand-engine.log", cpus) as (hand_url, hand_pid):
        differences = context_differences(process_context(operator_pid), process_context(hand_pid))
        urls = {"operator": url, "hand": hand_url}
        for side in ("operator", "hand"):  # warm-up, not measured
            measure_engine(urls[side], served, 0, max_tokens)
        for turn in range(rounds):
            order = ("operator", "hand") if turn % 2 == 0 else ("hand", "operator")
            for side in order:
                sides[side].append(measure_engine(urls[side], served, requests, max_tokens))
                log(f"p4 round {turn} {side}: {sides[side][-1]}")
    by_operator = summarize(sides["operator"])
    by_hand = summarize(sides["hand"])
    return {
        "what": "the engine of an SD pod (operator -> process kubelet -> launcher -> vLLM) vs "
        "the same vLLM command line and environment started by hand, both running, measured in "
        f"{rounds} alternating rounds of {requests} streamed greedy completions at concurrency "
        "1 (medians over the rounds)",
        "command": argv,
        "rounds": rounds,
        "context_differences": differences,
        "operator": by_operator,
        "hand": by_hand,
        "tokens_per_s_ratio": round(by_operator["tokens_per_s"] / by_hand["tokens_per_s"], 3),
        "itl_ratio": round(by_hand["itl_median_ms"] / by_operator["itl_median_ms"], 3),
        "target_ratio": 0.97,
    }


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds of one side, with every round kept."""
    return {
        "tokens_per_s": round(statistics.median([r["tokens_per_s"] for r in rounds]), 2),
        "itl_median_ms": round(statistics.median([r["itl_median_ms"] for r in rounds]), 2),
        "tokens_per_s_rounds": [r["tokens_per_s"] for r in rounds],
        "itl_ms_rounds": [r["itl_median_ms"] for r in rounds],
        "requests": sum(r["requests"] for r in rounds),
        "max_tokens": rounds[0]["max_tokens"],
    }


# --- P3 ------------------------------------------------------------------------------------------


class FirstServed(Counter[str]):
    """A Counter that notes when each key was first counted (monotonic seconds)."""

    def __init__(self) -> None:
        super().__init__()
        self.first: dict[str, float] = {}

    def __setitem__(self, key: str, value: int) -> None:
        if value > 0 and key not in self.first:
            self.first[key] = time.monotonic()
        super().__setitem__(key, value)


class Reaction:
    """The canary SD of P3 and what the measurements read of it."""

    def __init__(self, bed: Bed, namespace: str, models: dict[str, str]) -> None:
        self.bed, self.namespace, self.models = bed, namespace, models

    def status(self) -> dict[str, Any]:
        found: dict[str, Any] = self.bed.get_sd(self.namespace, "canary").get("status") or {}
        return found

    def serving(self) -> set[str]:
        """Revisions with a pod not being deleted."""
        return {
            p["metadata"]["labels"][labels.REVISION]
            for p in revision_pods(self.bed.kubectl, self.namespace, "canary")
            if not p["metadata"].get("deletionTimestamp")
        }

    def serving_ready(
        self, other_than: str | None = None, timeout: float = ENGINE_TIMEOUT_S
    ) -> str:
        """Waits for the SD to be Ready with a stable revision (other than `other_than`)."""

        def found() -> str | None:
            sd = self.bed.get_sd(self.namespace, "canary")
            stable = (sd.get("status") or {}).get("stableRevision")
            ok = is_ready(sd) and stable and stable != other_than
            return str(stable) if ok else None

        revision: str = eventually(found, timeout, "the SD Ready")
        return revision

    def load(self, counter: FirstServed) -> CompletionLoad:
        return CompletionLoad(
            self.bed.kubectl,
            self.namespace,
            "canary",
            self.models["target"],
            self.bed.env,
            sent=counter,
        )

    def apply(self, body: dict[str, Any]) -> None:
        self.bed.kubectl.apply([body])

    def rollback(self, runs: int) -> dict[str, Any]:
        """A bad draft's canary under load, `runs` times: from the canary serving (its pod
        Ready, as a watch on the pods sees it) to the stable the only revision serving. The
        operator cannot do it sooner than `failureLimit` intervals after the canary is ready
        (its analysis starts then), so a figure under that floor means the clock is wrong."""
        self.apply(canary_sd(self.namespace, self.models, "draft-small", "1-small"))
        stable = self.serving_ready()
        floor = INTERVAL_S * FAILURE_LIMIT
        seen: set[str] = {stable}
        took: list[float] = []
        for run in range(runs):
            watcher = PodWatch(
                self.bed.core, self.namespace, f"{labels.NAME}=canary", labels.REVISION
            ).start()
            try:
                with self.load(FirstServed()):
                    self.apply(canary_sd(self.namespace, self.models, "draft-bad", f"2-bad-{run}"))
                    canary = eventually(
                        lambda: (
                            (self.status().get("canaryRevision") or "") not in seen
                            and self.status().get("canaryRevision")
                        ),
                        ENGINE_TIMEOUT_S,
                        "the canary",
                    )
                    seen.add(str(canary))
                    reacted = poll_until(
                        partial(reaction_seconds, watcher.events, str(canary), stable),
                        ENGINE_TIMEOUT_S,
                        "the bad canary serving, then the stable alone",
                    )
            finally:
                watcher.stop()
            outcome = (self.status().get("analysis") or {}).get("outcome")
            assert outcome == "Rollback", f"run {run}: the canary ended {outcome}, not rolled back"
            took.append(round(float(reacted), 2))
            log(f"p3 rollback run {run + 1}: {took[-1]}s, floor {floor}s")
            # The spec names the stable pair again: its revision serves, nothing new starts.
            self.apply(canary_sd(self.namespace, self.models, "draft-small", "1-small"))
            self.serving_ready()
        middle = statistics.median(took)
        return {
            "runs_s": took,
            "seconds": middle,
            "floor_s": floor,
            "ratio": round(middle / floor, 2),
            # The sanity check of the clock: never under the floor.
            "below_floor": [t for t in took if t < floor],
        }

    def collapse(self) -> dict[str, Any]:
        """A guard whose floor the serving pair cannot meet, set while the pair serves under
        load (so its condition holds from then on): guard applied -> speculation off decided,
        and -> the fallback serving."""
        guarded = canary_sd(self.namespace, self.models, "draft-small", "1-small")
        guarded["spec"]["rollout"]["collapseGuard"] = {
            "floor": 0.99,
            "for": f"{COLLAPSE_FOR_S}s",
            "action": "DisableSpeculation",
        }
        # The stable pair of the rollback, serving (the SD is not Ready: its spec still names
        # the rolled-back canary until the guarded spec below names the stable pair again).
        pair = str(self.status()["stableRevision"])
        counter = FirstServed()
        with self.load(counter) as load:
            eventually(lambda: pair in counter.first, 120, "the pair served")
            # The guard names the serving pair (no new revision): from here acceptance is
            # below its floor, and `for` of that (seen through a scrape) must fire it.
            self.apply(guarded)
            onset = time.monotonic()

            def decided() -> bool:
                speculation = self.status().get("speculation") or {}
                return (speculation.get("state"), speculation.get("reason")) == (
                    "Disabled",
                    "DisabledAfterCollapse",
                )

            poll_until(decided, 300, "the collapse acted on")
            decided_s = time.monotonic() - onset
            fallback = self.serving_ready(other_than=pair)
            eventually(lambda: fallback in counter.first, ENGINE_TIMEOUT_S, "the fallback served")
            served_s = load.first_sent[fallback] - onset
        # The guard decides `for` after it first saw the acceptance below its floor, which is
        # no sooner than the guard was set.
        floor = COLLAPSE_FOR_S
        log(f"p3 collapse: decided {decided_s:.1f}s, fallback served {served_s:.1f}s")
        return {
            "decided_s": round(decided_s, 1),
            "fallback_served_s": round(served_s, 1),
            "floor_s": floor,
            "ratio": round(decided_s / floor, 2),
            "ratio_to_fallback_served": round(served_s / floor, 2),
        }


def p3(bed: Bed, python: Path, models: dict[str, str], workdir: Path, runs: int) -> dict[str, Any]:
    namespace = bed.namespace("bench-reaction")
    config = operator_config(str(python), bed.env.prometheus_url, interval=TIMER_S)
    running, _ = bed.operator(workdir / "p3", (namespace,), config)
    running.start()
    result: dict[str, Any] = {
        "what": f"{runs} canaries of a bad draft under load, each timed from its pod Ready to "
        "the stable the only revision with a Ready pod not being deleted (a watch on the pods), "
        "and a collapse guard the serving pair cannot meet, timed from its setting to the "
        f"fallback decided; Prometheus scrape {SCRAPE_S:.0f}s, operator timer {TIMER_S:.0f}s, "
        f"analysis interval {INTERVAL_S}s, failureLimit {FAILURE_LIMIT}, collapseGuard.for "
        f"{COLLAPSE_FOR_S}s",
        "scrape_s": SCRAPE_S,
        "timer_s": TIMER_S,
        "interval_s": INTERVAL_S,
        "failure_limit": FAILURE_LIMIT,
        "collapse_for_s": COLLAPSE_FOR_S,
        "target_ratio": 1.2,
    }
    reaction = Reaction(bed, namespace, models)
    try:
        with LoadWatch("p3") as load:
            result["rollback"] = reaction.rollback(runs)
            result["collapse"] = reaction.collapse()
        result["load"] = {"p3": load.summary()}
    except (TimeoutError, AssertionError) as error:
        result["error"] = f"{type(error).__name__}: {error}"
        log(f"p3 stopped: {result['error']}")
    finally:
        bed.delete_sds(namespace)
        running.stop()
        bed.drop_namespace(namespace)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("parts", nargs="*", default=["p1", "p3"], choices=["p1", "p3"])
    parser.add_argument("--runs", type=int, default=2, help="P1 runs of each kind")
    parser.add_argument(
        "--requests", type=int, default=3, help="P4 measured completions per engine per round"
    )
    parser.add_argument("--rounds", type=int, default=4, help="P4 alternating rounds")
    parser.add_argument("--p3-runs", type=int, default=5, help="P3 bad canaries rolled back")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--workdir", default=None, help="keep logs here")
    args = parser.parse_args(argv)
    bed = Bed()
    python = engine_python_path()
    models = build_tiny_models(python)
    with tempfile.TemporaryDirectory(prefix="bench-engine-cluster-") as folder:
        workdir = Path(args.workdir or folder)
        workdir.mkdir(parents=True, exist_ok=True)
        if "p1" in args.parts:
            p1, passthrough = p1_and_p4(
                bed, python=python, models=models, workdir=workdir, runs=args.runs,
                requests=args.requests, max_tokens=args.max_tokens, rounds=args.rounds,
            )  # fmt: skip
            write_result("p1-engine", p1)
            write_result("passthrough", passthrough)
        if "p3" in args.parts:
            result = p3(bed, python, models, workdir, args.p3_runs)
            write_result("p3-reaction", result)
            if "error" in result:
                raise SystemExit(f"p3: {result['error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
