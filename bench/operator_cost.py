"""What the operator costs on KWOK pods: rollout overhead against a raw Deployment (P1), and scale
to many SpeculativeDeployments under one operator (P2).

    make bench-rollout bench-scale
    PYTHONPATH=operator:e2e:. python -m bench.operator_cost p1 scale     # the same by hand

p1: the same pod template applied as an SD (apply -> Ready condition) and as a raw Deployment
(create -> ready replicas), alternating, medians; KWOK pods are ready at once, so only the
control plane and the operator count. Writes bench/results/p1-kwok.json.

scale: N SDs (replicas 1 on KWOK MIG slices; bench nodes added as needed) under one operator
with the default 30 s timer: time until all Ready, operator RSS, API requests of an idle minute
(reads and writes apart, from the API server's audit log), time for every SD to be reconciled
after a restart, reconcile duration p50/p99. Writes bench/results/scale.json.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import urllib.error
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.bed import (
    GROUP,
    PLURAL,
    VERSION,
    Bed,
    audited,
    bucket_delta,
    counter_total,
    histogram_quantile,
    log,
    raw_copy,
    reconcile_buckets,
    reconciled_names,
    rss_mib,
    scrape,
    time_deployment_ready,
    time_sd_ready,
)
from bench.figures import rollout_figures
from bench.record import LoadWatch, machine, write_result
from engine_cluster import OperatorProcess
from sd_bodies import llama_8b
from specdeploy.api import labels
from testbed import eventually
from testbed.conditions import is_ready

DEFAULT_INTERVAL_S = 30.0  # the operator's default reconcile timer


def kwok_sd(name: str, namespace: str) -> dict[str, Any]:
    """Llama 8B + EAGLE-3 on a MIG 3g.40gb slice of a KWOK node, outside Kueue (no queue: Kueue's
    admission would add the same delay to both sides and hide the operator's share)."""
    body = llama_8b(name, namespace)
    del body["spec"]["placement"]["queue"]
    return body


def serves_metrics(metrics_url: str) -> bool:
    try:
        scrape(metrics_url)
    except (OSError, urllib.error.URLError):
        return False
    return True


def wait_operator(metrics_url: str, running: OperatorProcess) -> None:
    def serving() -> bool:
        assert running.process is not None
        assert running.process.poll() is None, running.log_tail()
        return serves_metrics(metrics_url)

    eventually(serving, 60, "the operator's metrics endpoint")


def pods_gone(bed: Bed, namespace: str) -> None:
    eventually(
        lambda: not bed.core.list_namespaced_pod(namespace).items,
        120,
        f"no pods left in {namespace}",
    )


# --- P1 ------------------------------------------------------------------------------------------


def time_sd(bed: Bed, namespace: str, name: str) -> float:
    return time_sd_ready(bed, kwok_sd(name, namespace), 120)


def p1(bed: Bed, runs: int, workdir: Path) -> dict[str, Any]:
    """Paired rounds: each round times an SD and the raw Deployment of its pod template back to
    back (which goes first alternates), so a round's ratio is SD / raw under the same load;
    bench.figures.rollout_figures judges the rounds (median, 95 % interval, verdict)."""
    namespace = bed.namespace("bench-p1")
    bed.ensure_mig_slices(16)
    running, metrics_url = bed.operator(workdir / "p1", (namespace,), {})
    running.start()
    try:
        wait_operator(metrics_url, running)
        # A first SD warms the operator and gives the pod template to copy.
        time_sd(bed, namespace, "warm")
        [deployment] = bed.kubectl.get_json(
            "deployments", "-n", namespace, "-l", f"{labels.NAME}=warm"
        )["items"]
        bed.delete_sds(namespace)
        pods_gone(bed, namespace)
        sd_times: list[float] = []
        raw_times: list[float] = []
        with LoadWatch("p1") as load:
            for run in range(runs):
                # Alternate which goes first, so a drift of the machine's load hits both alike.
                order = ("sd", "raw") if run % 2 == 0 else ("raw", "sd")
                for kind in order:
                    if kind == "sd":
                        took = time_sd(bed, namespace, f"sd-{run}")
                        sd_times.append(took)
                        bed.delete_sds(namespace)
                    else:
                        body = raw_copy(deployment, f"raw-{run}")
                        took = time_deployment_ready(bed, body, 120)
                        raw_times.append(took)
                        bed.apps.delete_namespaced_deployment(
                            body["metadata"]["name"], namespace, propagation_policy="Foreground"
                        )
                    log(f"p1 run {run} {kind}: {took:.3f}s")
                    pods_gone(bed, namespace)
        bed.delete_sds(namespace)
    finally:
        running.stop()
        bed.drop_namespace(namespace)
    sd_median, raw_median = statistics.median(sd_times), statistics.median(raw_times)
    return {
        "what": "apply of an SD -> its Ready condition vs the same pod template as a raw "
        "Deployment -> ready replicas, in paired rounds (order alternating); KWOK pods (ready "
        f"at once), no Kueue queue, operator timer {DEFAULT_INTERVAL_S:.0f}s (default); times "
        "taken by a watch from before the create",
        "runs": runs,
        "sd_seconds": [round(t, 3) for t in sd_times],
        "raw_seconds": [round(t, 3) for t in raw_times],
        "sd_median_s": round(sd_median, 3),
        "raw_median_s": round(raw_median, 3),
        "ratio": round(sd_median / raw_median, 2),
        "target_ratio": 1.5,
        "load": {"p1": load.summary()},
    }


# --- P2 ------------------------------------------------------------------------------------------


def scale_point(
    bed: Bed,
    count: int,
    *,
    workdir: Path,
    kubeconfig: Path,
    username: str,
    ready_timeout: float,
    idle_s: float,
) -> dict[str, Any]:
    namespace = bed.namespace(f"bench-scale-{count}")
    nodes = bed.ensure_mig_slices(count)
    running, metrics_url = bed.operator(
        workdir / f"scale-{count}", (namespace,), {}, kubeconfig=str(kubeconfig)
    )
    running.start()
    assert running.process is not None
    point: dict[str, Any] = {"sds": count, "bench_nodes": nodes}
    names = [f"sd-{i:04d}" for i in range(count)]
    try:
        wait_operator(metrics_url, running)
        began = time.monotonic()
        for name in names:
            bed.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, kwok_sd(name, namespace)
            )
        point["create_s"] = round(time.monotonic() - began, 1)
        curve: list[tuple[float, int]] = []
        ready = 0
        poll = 2.0 if count <= 100 else 5.0
        while time.monotonic() - began < ready_timeout:
            ready = sum(1 for sd in bed.list_sds(namespace) if is_ready(sd))
            curve.append((round(time.monotonic() - began, 1), ready))
            if ready == count:
                break
            time.sleep(poll)
        point["ready"] = ready
        point["all_ready_s"] = round(curve[-1][0], 1) if ready == count else None
        point["ready_curve"] = curve
        log(f"scale {count}: {ready}/{count} Ready after {curve[-1][0]:.0f}s")
        point["rss_after_ready_mib"] = round(rss_mib(running.process.pid), 1)
        time.sleep(10)  # the last status writes and their watch events settle
        before = reconcile_buckets(scrape(metrics_url))
        since = datetime.now(UTC)
        time.sleep(idle_s)
        until = datetime.now(UTC)
        page = scrape(metrics_url)
        after = reconcile_buckets(page)
        # Events the operator could not post while the SDs came up (too many waiting).
        point["events_dropped"] = counter_total(page, "specdeploy_events_dropped_total")
        point["rss_idle_mib"] = round(rss_mib(running.process.pid), 1)
        requests = audited(bed.env, username, since, until)
        minutes = (until - since).total_seconds() / 60
        point["idle_reads_per_min"] = round(requests["reads"] / minutes, 1)
        point["idle_writes_per_min"] = round(requests["writes"] / minutes, 1)
        point["idle_requests"] = requests["by_request"]
        idle = bucket_delta(after, before)
        point["reconciles_idle_per_min"] = round(idle[-1][1] / minutes, 1) if idle else 0
        for q in (0.5, 0.99):
            whole = histogram_quantile(q, after)
            point[f"reconcile_p{int(q * 100)}_s"] = round(whole, 4) if whole is not None else None
        # A restart: every SD reconciled again by a fresh process (its stores filled first).
        running.stop()
        offset = len(running.log_text())
        restarted = time.monotonic()
        running.start()
        wanted = set(names)
        seen: set[str] = set()
        started_s: float | None = None
        while time.monotonic() - restarted < ready_timeout:
            if started_s is None and serves_metrics(metrics_url):
                started_s = time.monotonic() - restarted
            seen = reconciled_names(running.log_text()[offset:]) & wanted
            if seen == wanted:
                break
            time.sleep(0.5)
        # How much of it the process took to start (imports, before kopf runs: the metrics
        # endpoint answers from then on).
        point["restart_startup_s"] = round(started_s, 1) if started_s is not None else None
        point["resync_s"] = round(time.monotonic() - restarted, 1) if seen == wanted else None
        point["resynced"] = len(seen)
        # A restart changes nothing: every SD is read and none written.
        point["resync_writes"] = len(running.writes_since(offset))
        log(f"scale {count}: resync of {len(seen)} SDs in {time.monotonic() - restarted:.1f}s")
        point["rss_after_resync_mib"] = round(rss_mib(running.process.pid), 1)
    finally:
        if count <= 100:
            bed.delete_sds(namespace)
        running.stop()
        bed.drop_namespace(namespace)
    return point


def scale(
    bed: Bed, counts: list[int], workdir: Path, ready_timeout: float, idle_s: float
) -> dict[str, Any]:
    kubeconfig, username = bed.service_account_kubeconfig(workdir / "operator-sa.kubeconfig")
    points = []
    for count in counts:
        points.append(
            scale_point(
                bed,
                count,
                workdir=workdir,
                kubeconfig=kubeconfig,
                username=username,
                ready_timeout=ready_timeout,
                idle_s=idle_s,
            )
        )
        write_result("scale", scale_result(points, ready_timeout, idle_s))
    return scale_result(points, ready_timeout, idle_s)


def scale_result(
    points: list[dict[str, Any]], ready_timeout: float, idle_s: float
) -> dict[str, Any]:
    return {
        "what": "N SDs (Llama 8B + EAGLE-3, replicas 1, MIG 3g.40gb on KWOK nodes, no queue) "
        f"under one operator, timer {DEFAULT_INTERVAL_S:.0f}s; requests counted by the API "
        f"server's audit log over {idle_s:.0f}s idle; reconcile p50/p99 from the operator's "
        "histogram over the whole run (bucket interpolation)",
        "ready_timeout_s": ready_timeout,
        "targets": {
            "rss_mib": 250,
            "idle_writes_per_min": 0,
            "resync_s": 30,
            "resync_writes": 0,
            "events_dropped": 0,
        },
        "points": points,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("parts", nargs="*", default=["p1", "scale"], choices=["p1", "scale"])
    parser.add_argument("--runs", type=int, default=15, help="P1 paired rounds")
    parser.add_argument("--counts", default="10,100,1000", help="P2 numbers of SDs")
    parser.add_argument("--ready-timeout", type=float, default=900)
    parser.add_argument("--idle", type=float, default=60, help="P2 idle window in seconds")
    parser.add_argument("--workdir", default=None, help="keep the operator logs here")
    args = parser.parse_args(argv)
    bed = Bed()
    with tempfile.TemporaryDirectory(prefix="bench-operator-") as folder:
        workdir = Path(args.workdir or folder)
        try:
            if "p1" in args.parts:
                result = p1(bed, args.runs, workdir)
                [figure] = rollout_figures({"machine": machine(), **result}, None)
                log(f"p1: SD {result['sd_median_s']}s raw {result['raw_median_s']}s; "
                    f"{figure.verdict}: {figure.reason}")  # fmt: skip
                write_result("p1-kwok", result)
            if "scale" in args.parts:
                counts = [int(c) for c in args.counts.split(",") if c]
                scale(bed, counts, workdir, args.ready_timeout, args.idle)
        finally:
            bed.remove_bench_nodes()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
