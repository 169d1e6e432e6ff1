"""The simulator's 70B pair under one operator, for the e2e modules of the operator's decisions.

`sim_bed(cluster, kubectl, workdir)` gives a namespace with LocalQueues, the probe's ConfigMap,
an operator watching it through a Prometheus proxy that can fail queries (`bed.proxy`), and the
modules' own simulator profiles (`CATALOG`, in a file the pods name with SIM_CATALOG). The
operator's pods run the launcher from this environment, which execs the simulator for their
`sim/...` pairs: no vLLM is needed (docs/testbed.md, "Which engine proves what").
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from engine_cluster import OperatorProcess, apply_crds, get_sd, operator_config, sd_status
from load import PerPodLoad
from query_faults import QueryFaultProxy, query_fault_proxy
from sd_bodies import SIM_70B, sim_70b
from specdeploy.engine.tiny_models import PROBE_PROMPTS
from testbed import ClusterEnv, Kubectl, create_namespace_with_queues, eventually
from testbed.conditions import is_ready

SD = "judge"
INTERVAL_S = 5
ANALYSIS = {"interval": f"{INTERVAL_S}s", "window": "30s"}
READY_S = 180
VERDICT_S = 300
BATCH = 8
#: Three draft tokens a step, a length users run. The good head's acceptance rate (accepted over
#: draft tokens) reads about 0.58 at k=3, under the default minAcceptanceRate of 0.6, while each
#: of its steps emits 2.5 tokens: the floor is on the first position's acceptance (0.8).
TOKENS = 3
GOOD_ACCEPTANCE = [0.8, 0.72, 0.65, 0.6, 0.55, 0.5, 0.45, 0.4]
#: Profiles of these modules' own (added to the built-in catalog through the pods' env).
CATALOG = {
    "drafts": {
        # Accepted as well as the target would, at ten times the good head's cost a token.
        "sim/eagle3-slow": {
            "method": "eagle3",
            "verifier": SIM_70B,
            "acceptance": [0.95],
            "draftMs": 30.0,
        },
        # The good head on pods whose first token waits 400 ms (a cold prefix cache).
        "sim/eagle3-cold": {
            "method": "eagle3",
            "verifier": SIM_70B,
            "acceptance": GOOD_ACCEPTANCE,
            "draftMs": 1.8,
            "draftMsPerSeq": 0.55,
            "draftSaturation": 4,
            "faults": {"firstTokenExtraMs": 400},
        },
        # A head whose acceptance varies much with the prompt (±20 %).
        "sim/eagle3-varied": {
            "method": "eagle3",
            "verifier": SIM_70B,
            "acceptance": [0.95, 0.9],
            "draftMs": 1.8,
            "draftMsPerSeq": 0.55,
            "draftSaturation": 4,
            "promptSpread": 0.2,
        },
    }
}


class Bed:
    def __init__(
        self,
        cluster: ClusterEnv,
        kubectl: Kubectl,
        namespace: str,
        proxy: QueryFaultProxy,
        operator: OperatorProcess,
    ) -> None:
        self.operator = operator
        self.cluster = cluster
        self.kubectl = kubectl
        self.namespace = namespace
        self.proxy = proxy
        self.catalog = Path(cluster.run_dir) / f"sim-catalog-{namespace}.yaml"
        self.catalog.write_text(yaml.safe_dump(CATALOG))

    def body(self, draft: str | None, version: str, name: str = SD) -> dict[str, Any]:
        body = sim_70b(
            name,
            self.namespace,
            draft,
            version,
            tokens=TOKENS,
            env={"SIM_CATALOG": str(self.catalog)},
        )
        body["spec"]["rollout"] = {
            "canary": {"replicas": 1},
            "analysis": {**ANALYSIS, "probe": {"configMapKeyRef": {"name": "judge-probe"}}},
        }
        return body

    def apply(self, draft: str | None, version: str) -> None:
        self.kubectl.apply([self.body(draft, version)])

    def status(self, name: str = SD) -> dict[str, Any]:
        return sd_status(self.kubectl, self.namespace, name)

    def sd(self, name: str = SD) -> dict[str, Any]:
        return get_sd(self.kubectl, self.namespace, name)

    def load(self, name: str = SD, **options: Any) -> PerPodLoad:
        """BATCH clients per ready pod of the SD, each a request at a time."""
        return PerPodLoad(
            self.kubectl,
            self.namespace,
            name,
            SIM_70B,
            self.cluster,
            clients_per_pod=BATCH,
            **options,
        )

    def serving(self, version: str, name: str = SD) -> str:
        def found() -> str | None:
            status = self.status(name)
            stable = status.get("stableRevision")
            ours = {
                r["revision"] for r in status.get("revisions") or [] if r["pairVersion"] == version
            }
            return stable if is_ready({"status": status}) and stable in ours else None

        revision: str = eventually(found, READY_S, f"pair {version} serving")
        return revision

    def canary_of(self, version: str) -> str:
        def found() -> str | None:
            status = self.status()
            ours = {
                r["revision"] for r in status.get("revisions") or [] if r["pairVersion"] == version
            }
            revision = (status.get("analysis") or {}).get("revision")
            return revision if revision in ours else None

        revision: str = eventually(found, 120, f"the analysis of pair {version}")
        return revision

    def wait_live(self, canary: str, what: str = "the canary live") -> None:
        """Until the canary's analysis is at its Live stage (its probe, if any, passed)."""

        def live_stage() -> bool:
            analysis = self.status().get("analysis") or {}
            return analysis.get("revision") == canary and analysis.get("stage") == "Live"

        eventually(live_stage, READY_S, what)

    def outcome(self, canary: str) -> tuple[dict[str, Any], float]:
        """status.analysis once the canary's analysis ended, and the seconds it took."""
        started = time.monotonic()

        def ended() -> dict[str, Any] | None:
            analysis = self.status().get("analysis") or {}
            done = analysis.get("revision") == canary and analysis.get("outcome") in (
                "Promote",
                "Rollback",
            )
            return analysis if done else None

        try:
            found: dict[str, Any] = eventually(ended, READY_S + VERDICT_S, "an outcome")
        except TimeoutError as error:
            raise AssertionError(self.verdicts(canary)) from error
        return found, time.monotonic() - started

    def canary(
        self, draft: str | None, version: str, **load: Any
    ) -> tuple[str, dict[str, Any], list[dict[str, Any]], PerPodLoad]:
        """Apply the pair as a canary under load until its analysis ends; the canary, its
        outcome, its verdicts and the load (what each revision answered, and its errors).
        Fails when the revision serving before it failed a request meanwhile."""
        stable = self.status().get("stableRevision")
        with self.load(**load) as sent:
            self.apply(draft, version)
            canary = self.canary_of(version)
            analysis, took = self.outcome(canary)
        verdicts = self.verdicts(canary)
        report(f"{version} ({draft})", verdicts, took)
        if analysis.get("outcome") == "Rollback":
            # The stable kept serving: every request the load sent it was answered.
            assert sent.sent[str(stable)] > 0, dict(sent.sent)
            assert not [e for e in sent.errors if e.startswith(f"{stable}:")], sent.errors
        return canary, analysis, verdicts, sent

    def verdicts(self, revision: str) -> list[dict[str, Any]]:
        for record in self.status().get("revisions") or []:
            if record["revision"] == revision:
                return list(record.get("verdicts") or [])
        return []


@contextlib.contextmanager
def sim_bed(cluster: ClusterEnv, kubectl: Kubectl, workdir: Path, prefix: str) -> Iterator[Bed]:
    """A namespace of its own and an operator watching it, for one module; removed after."""
    namespace = f"{prefix}-{uuid.uuid4().hex[:5]}"
    create_namespace_with_queues(kubectl, namespace)
    apply_crds(kubectl)
    probe = {"prompts": json.dumps(PROBE_PROMPTS)}
    kubectl.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "judge-probe", "namespace": namespace},
                "data": probe,
            }
        ]
    )
    with query_fault_proxy(cluster.prometheus_url) as proxy:
        config = operator_config(sys.executable, proxy.url, interval=2)
        running = OperatorProcess(cluster.kubeconfig, config, workdir, (namespace,))
        running.start()
        try:
            yield Bed(cluster, kubectl, namespace, proxy, running)
        finally:
            kubectl.run(
                "delete", "sd", "--all", "-n", namespace, "--timeout=90s", check=False, timeout=100
            )
            running.stop()
            kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)
            print(f"--- operator log ({running.log_path}) ---\n{running.log_tail()}")


def live(verdicts: list[dict[str, Any]], result: str | None = None) -> list[dict[str, Any]]:
    return [
        v for v in verdicts if v["source"] == "Live" and (result is None or v["result"] == result)
    ]


def report(what: str, verdicts: list[dict[str, Any]], seconds: float) -> None:
    shown = [
        (v["source"], v["result"], v.get("timePerOutputTokenSeconds"), v.get("message", "")[:160])
        for v in verdicts
    ]
    print(f"\n{what}: outcome after {seconds:.0f} s; verdicts:\n" + json.dumps(shown, indent=1))
