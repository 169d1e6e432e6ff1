"""One level-based reconcile of a SpeculativeDeployment: observe, decide, apply.

Observe reads one snapshot (the SD, its revision Deployments and their records, the Service and
PodMonitor, pods, nodes, Kueue's Workloads, LocalQueue and WorkloadPriorityClass, model shapes);
`plan.decide.decide` turns it into every write and Event with no I/O; apply sends them in
order. A reconcile that writes children reads them again (the stores hold the API server's
answers to its writes) and decides once more before it writes status (`plan.decide.settle`), so
the status names what the writes made rather than leaving that to one more status write by the
reconcile their watch events start. A reconcile that finds every child holding its desired
fields and the status exact sends nothing.
"""

from __future__ import annotations

import base64
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any

from kubernetes.client.exceptions import ApiException

from specdeploy.adapters.kube import KubeAdapter, WriteRefusedError
from specdeploy.adapters.metrics import OperatorMetrics
from specdeploy.adapters.model_config import ModelShapes
from specdeploy.adapters.prometheus import PrometheusReader, RevisionPods
from specdeploy.api import labels
from specdeploy.api.conditions import Reason
from specdeploy.api.config import OperatorConfig
from specdeploy.api.models import SpeculativeDeployment, SpeculativeDeploymentStatus
from specdeploy.api.times import RFC3339, parse_time
from specdeploy.plan.children.manifests import (
    LWS_API_VERSION,
    LWS_KIND,
    RECORD_API_VERSION,
    RECORD_KIND,
)
from specdeploy.plan.children.ownership import foreign_holder
from specdeploy.plan.decide import Decision, Snapshot, decide, settle, watches_acceptance
from specdeploy.plan.placement.gpu_catalog import catalog_for_config
from specdeploy.plan.placement.kueue import (
    KUEUE_WORKLOAD_CRD,
    KueueWebhooks,
    read_kueue_webhooks,
)
from specdeploy.plan.placement.sizing import models_needing_shapes
from specdeploy.plan.rollout.analysis import (
    Measurement,
    describe_measurement,
    live_window,
)
from specdeploy.plan.rollout.autotune import AutotuneMeasurement, measurement_due
from specdeploy.plan.rollout.probe import ProbeResult
from specdeploy.plan.rollout.revisions import read_revision_deployment, ready_pods_by_revision
from specdeploy.plan.rollout.speculation import decide_speculation, served_spec
from specdeploy.plan.status.refusal import (
    RefusedWrite,
    merge_refusals,
    name_taken,
    recorded_refusals,
)

log = logging.getLogger("specdeploy.reconcile")

POD_MONITOR_API_VERSION = "monitoring.coreos.com/v1"

# (body, type, reason, message): how a reconcile posts a Kubernetes Event.
EventPoster = Callable[[Mapping[str, Any], str, str, str], None]


# (pods, window, stretch, at) -> what Prometheus measured of one SD's revision's pods over the
# window that ends at `at` (seconds since the epoch), with the step time of each stretch of the
# window (stretch: the analysis interval).
Measure = Callable[[RevisionPods, str, str, float], Measurement]
# (pods, window) -> the autotuner's inputs for the revision's pods.
MeasureAutotune = Callable[[RevisionPods, str], AutotuneMeasurement]
# (pods) -> what the revision's pods measured on the probe (None: nothing yet).
MeasureProbe = Callable[[RevisionPods], ProbeResult | None]


class Reconciler:
    """Reconciles SpeculativeDeployments, one SD at a time each (several SDs at once are fine)."""

    def __init__(
        self,
        kube: KubeAdapter,
        config: OperatorConfig,
        post_event: EventPoster,
        *,
        measure: Measure | None = None,
        measure_autotune: MeasureAutotune | None = None,
        measure_probe: MeasureProbe | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        metrics: OperatorMetrics | None = None,
    ) -> None:
        self.kube = kube
        self.config = config
        self.post_event = post_event
        reader = PrometheusReader(config.prometheus_url)
        self.measure = measure or reader.measure
        self.measure_autotune = measure_autotune or reader.measure_autotune
        self.measure_probe = measure_probe or reader.measure_probe
        self.clock = clock
        self.metrics = metrics or OperatorMetrics()
        self.catalog = catalog_for_config(config)
        self.shapes = ModelShapes(config.model_config_url)
        #: The last measurement logged per (namespace, name, revision); one worker per SD at
        #: a time (handlers.work_queue), so an SD's keys are never written by two at once.
        self._last_measured: dict[tuple[str, str, str], Measurement] = {}
        #: Kueue's API and webhooks as check_kueue last found them (None: not looked at yet).
        self.kueue: KueueWebhooks | None = None

    def reconcile(self, namespace: str, name: str) -> datetime | None:
        """Brings one SpeculativeDeployment's children and status in line with its spec; returns
        when its next verdict falls due (Decision.wake_at), None when nothing is due.

        Not to be called for one SD from two threads at once: the operator's work queue
        (handlers.work_queue) never hands one SD to two workers."""
        body = self.kube.get_speculative_deployment(namespace, name)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            return None
        writes = self.kube.write_requests
        with self.metrics.reconcile_seconds.time():
            try:
                snapshot, now = self.observe(body), self.clock()
                decision = decide(snapshot, self.config, self.catalog, now)
                refused = self.apply_children(body, decision)
                if decision.writes_children:
                    after = replace(
                        snapshot,
                        **self._children(snapshot.body),
                        refused_writes=merge_refusals(snapshot.refused_writes, refused),
                    )
                    after_decision = decide(after, self.config, self.catalog, now)
                    decision = settle(decision, after_decision, report=bool(refused))
                self.apply_status(body, decision)
                self.report_refusals(body, refused)
                if decision.status_due is not None:
                    log.debug(
                        "%s/%s: first status left for its pods' readiness (due %s)",
                        namespace,
                        name,
                        decision.status_due.strftime(RFC3339),
                    )
            except Exception:
                self.metrics.reconciles.labels("error").inc()
                raise
        self.metrics.reconciles.labels("ok").inc()
        self.metrics.count_events(decision.events)
        self.metrics.set_acceptance(namespace, name, decision.acceptance_rate)
        log.debug(
            "reconciled %s/%s (%d API writes meanwhile)",
            namespace,
            name,
            self.kube.write_requests - writes,
        )
        return decision.wake_at

    def check_kueue(self) -> KueueWebhooks | None:
        """Looks whether Kueue manages pods and Deployments (its API and mutating webhooks),
        says so in the log, and keeps it for the Admitted condition of every SD with a queue.
        A failed look is logged and keeps what was known (nothing is claimed from it)."""
        try:
            configurations, installed = self.kube.read_kueue_webhooks(KUEUE_WORKLOAD_CRD)
        except ApiException as error:
            log.warning("could not look for Kueue's webhooks (API %s): %s", error.status, error)
            return self.kueue
        found = read_kueue_webhooks(configurations, installed)
        if found != self.kueue:
            if found.bypassed_because is not None:
                log.warning("quota would be bypassed: %s", found.describe())
            else:
                log.info("%s", found.describe())
        self.kueue = found
        return found

    def report_refusals(self, body: Mapping[str, Any], refused: list[RefusedWrite]) -> None:
        """A log line and a Warning Event for each child this reconcile did not write (the
        status, written just before, lists them: plan.status.refusal)."""
        metadata = body.get("metadata") or {}
        for refusal in refused:
            log.warning(
                "%s/%s: %s", metadata.get("namespace"), metadata.get("name"), refusal.summary
            )
            self.post_event(body, "Warning", refusal.reason, refusal.summary)

    def observe(self, body: Mapping[str, Any]) -> Snapshot:
        """One read of everything the decision depends on."""
        sd = SpeculativeDeployment.from_body(dict(body))
        namespace = sd.metadata.namespace or ""
        queue = sd.spec.placement.queue
        priority_class = sd.spec.placement.priority_class if queue else None
        children = self._children(body)
        deployments, sets = children["deployments"], children["leader_worker_sets"]
        return Snapshot(
            body=body,
            nodes=self.kube.list_gpu_nodes(),
            **children,
            workloads=self.kube.list_workloads(namespace) if queue else [],
            local_queue=self.kube.get_local_queue(namespace, queue) if queue else None,
            priority_class=(
                self.kube.get_workload_priority_class(priority_class) if priority_class else None
            ),
            fetched_shapes=self._fetched_shapes(sd),
            kueue=self.kueue,
            measurements=self._measurements(sd, [*deployments, *sets], children["pods"]),
            probes=self._probes(sd, [*deployments, *sets]),
            autotune=self._autotune_measurement(sd),
            autotune_trial=self._autotune_measurement(sd, trial=True),
            refused_writes=self._refusals_in_force(sd),
        )

    def _refusals_in_force(self, sd: SpeculativeDeployment) -> tuple[RefusedWrite, ...]:
        """The refusals status records that still hold (plan.status.refusal): the API server's
        for this generation, and names still held by an object this SD does not own (each
        looked at again, one read)."""
        namespace, name = sd.metadata.namespace or "", sd.metadata.name
        kept = []
        for refusal in recorded_refusals(sd.status, sd.metadata.generation):
            if refusal.reason == Reason.NAME_TAKEN:
                api_version = CHILD_API_VERSIONS.get(refusal.kind)
                if api_version is None:
                    continue
                holder = self._name_holder(
                    api_version,
                    refusal.kind,
                    namespace,
                    refusal.name,
                    sd_name=name,
                    uid=sd.metadata.uid,
                )
                if holder is None:
                    continue
                kept.append(name_taken(refusal.kind, refusal.name, holder))
            else:
                kept.append(refusal)
        return tuple(kept)

    def _name_holder(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        child: str,
        *,
        sd_name: str,
        uid: str | None,
    ) -> str | None:
        """Why the object named `child` is not the SD's to write (plan.children.ownership),
        read as the API server holds it; None when it is the SD's, or absent."""
        live = self.kube.live_object(api_version, kind, namespace, child)
        return foreign_holder(live, sd_name, uid)

    def _children(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The SD's children and pods, as the Snapshot fields of those names."""
        metadata = body.get("metadata") or {}
        namespace, name = metadata.get("namespace") or "", metadata.get("name") or ""
        uid = metadata.get("uid")
        selector = f"{labels.NAME}={name}"
        pod_monitor_served = self.kube.has_pod_monitor_crd()
        lws_served = self.kube.serves_leader_worker_sets()
        return {
            "deployments": [
                d for d in self.kube.list_deployments(namespace, selector) if _owned_by(d, uid)
            ],
            "leader_worker_sets": [
                s
                for s in (
                    self.kube.list_leader_worker_sets(namespace, selector) if lws_served else []
                )
                if _owned_by(s, uid)
            ],
            "leader_worker_sets_served": lws_served,
            "records": [
                r
                for r in self.kube.list_objects(
                    RECORD_API_VERSION, RECORD_KIND, namespace, selector
                )
                if _owned_by(r, uid)
            ],
            # Another's object of the SD's name is no child (it is refused as NameTaken).
            "service": _own(self.kube.get("v1", "Service", namespace, name), name, uid),
            "pod_monitor_served": pod_monitor_served,
            "pod_monitor": (
                _own(
                    self.kube.get(POD_MONITOR_API_VERSION, "PodMonitor", namespace, name),
                    name,
                    uid,
                )
                if pod_monitor_served
                else None
            ),
            "pods": self.kube.list_pods(namespace, selector),
        }

    def _autotune_measurement(
        self, sd: SpeculativeDeployment, *, trial: bool = False
    ) -> AutotuneMeasurement | None:
        """The stable revision's speculation figures (with `trial`, those of the autotuner's
        revision under trial), when spec.pair.draft.autotune is on and its last recommendation
        is an analysis interval old (see plan.rollout.autotune)."""
        status = sd.status
        previous = status.autotune if status else None
        if trial:
            revision = previous.trial_revision if previous else None
        else:
            revision = status.stable_revision if status else None
        settings = self.config.analysis_for(sd.spec.rollout.analysis)
        if revision is None or not measurement_due(
            sd.spec, previous, settings.interval, self.clock()
        ):
            return None
        pods = RevisionPods(sd.metadata.namespace or "", sd.metadata.name or "", revision)
        return self.measure_autotune(pods, settings.window)

    def _measurements(
        self,
        sd: SpeculativeDeployment,
        deployments: list[dict[str, Any]],
        pods: list[dict[str, Any]],
    ) -> dict[str, Measurement]:
        """What Prometheus measured of each revision with ready pods, when spec.rollout asks
        for analysis (the canary's and the stable's figures), all over the same range: the
        analysis window, cut at a live canary's start (plan.rollout.analysis.live_window)."""
        if not watches_acceptance(sd.spec):
            return {}
        settings = self.config.analysis_for(sd.spec.rollout.analysis)
        window = settings.window
        analysis = sd.status.analysis if sd.status else None
        if (
            analysis is not None
            and analysis.stage == "Live"
            and analysis.outcome
            not in (
                "Promote",
                "Rollback",
            )
        ):
            started = parse_time(analysis.started_at)
            window = live_window(window, started.timestamp(), self.clock().timestamp())
        ready_pods = ready_pods_by_revision(pods)
        serving = (
            r for d in deployments if (r := read_revision_deployment(d, ready_pods)) is not None
        )
        namespace, name = sd.metadata.namespace or "", sd.metadata.name or ""
        # Every revision read at one instant, the one the window was cut at.
        at = self.clock().timestamp()
        measured = {
            r.revision: self.measure(
                RevisionPods(namespace, name, r.revision), window, settings.interval, at
            )
            for r in serving
            if r.ready_replicas > 0
        }
        for revision, measurement in measured.items():
            self._log_measurement(namespace, name, revision, window, measurement)
        return measured

    def _log_measurement(
        self, namespace: str, name: str, revision: str, window: str, measured: Measurement
    ) -> None:
        """Logs (at debug level, with --log-reconciles) what Prometheus answered for a
        revision, when it differs from the last answer logged for it: what a status field or a
        verdict was decided from."""
        key = (namespace, name, revision)
        if self._last_measured.get(key) == measured:
            return
        self._last_measured[key] = measured
        log.debug(
            "measured %s/%s revision %s over %s: %s",
            namespace,
            name,
            revision,
            window,
            describe_measurement(measured),
        )

    def _probes(
        self, sd: SpeculativeDeployment, deployments: list[dict[str, Any]]
    ) -> dict[str, ProbeResult]:
        """What each revision's pods measured on the probe, for revisions whose pods carry it
        and whose figures status does not keep yet (spec.rollout.analysis.probe)."""
        kept = {r.revision for r in (sd.status.revisions if sd.status else []) if r.probe}
        found: dict[str, ProbeResult] = {}
        for revision in map(read_revision_deployment, deployments):
            if revision is None or not revision.probe_gate or revision.revision in kept:
                continue
            if revision.pods == 0:
                continue
            measured = self.measure_probe(
                RevisionPods(sd.metadata.namespace or "", sd.metadata.name or "", revision.revision)
            )
            if measured is not None:
                found[revision.revision] = measured
        return found

    def _fetched_shapes(self, sd: SpeculativeDeployment) -> dict[str, Any]:
        """Shapes of the served pair's models outside the spec and catalog (config.json)."""
        spec = served_spec(sd.spec, decide_speculation(sd.spec, self.config))
        revisions = {spec.pair.target.model: spec.pair.target.revision}
        if spec.pair.draft.model:
            revisions[spec.pair.draft.model] = spec.pair.draft.revision
        needed = {model: revisions.get(model) for model in models_needing_shapes(spec)}
        if not needed:
            return {}
        found, problems = self.shapes.shapes(needed, self._hub_token(sd))
        for problem in problems:
            log.warning("no shape: %s", problem)
        return found

    def _hub_token(self, sd: SpeculativeDeployment) -> str | None:
        source = sd.spec.model_source
        if source is None or source.hub is None or source.hub.token_secret_ref is None:
            return None
        ref = source.hub.token_secret_ref
        try:
            secret = self.kube.get("v1", "Secret", sd.metadata.namespace or "", ref.name)
        except ApiException as error:
            if error.status != HTTPStatus.FORBIDDEN:
                raise
            # The chart may grant Secrets in some namespaces only (rbac.secretNamespaces).
            log.warning(
                "%s/%s: may not read Secret %s; sizing without the hub token",
                sd.metadata.namespace,
                sd.metadata.name,
                ref.name,
            )
            return None
        data = (secret or {}).get("data") or {}
        return base64.b64decode(data[ref.key]).decode() if ref.key in data else None

    def apply_children(self, body: Mapping[str, Any], decision: Decision) -> list[RefusedWrite]:
        """Sends every write of the decision but the status; returns the children it did not
        write: those the API server refused (400/422) and those whose name an object this SD
        does not own holds (looked at before each apply, nothing is sent to it). Every other
        write is sent all the same."""
        metadata = body.get("metadata") or {}
        namespace, name, uid = (
            metadata.get("namespace", ""),
            metadata.get("name", ""),
            metadata.get("uid"),
        )
        refused: list[RefusedWrite] = []

        def send(write: Callable[[], object]) -> None:
            try:
                write()
            except WriteRefusedError as error:
                refused.append(RefusedWrite(error.code, error.kind, error.name, error.message))

        for record_name in decision.replace_records:
            self.kube.delete(RECORD_API_VERSION, RECORD_KIND, namespace, record_name)
        # The Deployments before their records: a new revision's pods start one request
        # sooner, and a record missing after a crash between the two is made by the next
        # reconcile (plan.children.writes plans it whenever the desired revision has none).
        for manifest in decision.applies:
            kind, child = manifest["kind"], manifest["metadata"]["name"]
            holder = self._name_holder(
                manifest["apiVersion"], kind, namespace, child, sd_name=name, uid=uid
            )
            if holder is not None:
                refused.append(name_taken(kind, child, holder))
                continue
            send(functools.partial(self.kube.apply, manifest))
        for record in decision.create_records:
            send(functools.partial(self.kube.create, record))
        for deployment_name, replicas in decision.scales:
            send(
                functools.partial(self.kube.scale_deployment, namespace, deployment_name, replicas)
            )
        for deployment_name in decision.deletes:
            self.kube.delete("apps/v1", "Deployment", namespace, deployment_name)
            self.kube.delete(RECORD_API_VERSION, RECORD_KIND, namespace, deployment_name)
        for set_name in decision.delete_sets:
            self.kube.delete(LWS_API_VERSION, LWS_KIND, namespace, set_name)
            self.kube.delete(RECORD_API_VERSION, RECORD_KIND, namespace, set_name)
        for pod in decision.open_gates:
            self.kube.set_pod_condition(
                namespace,
                pod,
                labels.PROBE_GATE,
                "ProbeJudged",
                "the operator judged this revision's probe; the pod may take requests",
            )
        return refused

    def apply_status(self, body: Mapping[str, Any], decision: Decision) -> None:
        """Writes the decision's status, then hands its Events to the poster."""
        metadata = body.get("metadata") or {}
        namespace, name = metadata.get("namespace", ""), metadata.get("name", "")
        if decision.status_patch:
            self.kube.patch_status(namespace, name, decision.status_patch)
        for key, value in decision.spent_requests:
            # Only while it holds that value: a person's newer request stays.
            if self.kube.remove_annotation(namespace, name, key, value):
                log.info(
                    "%s/%s: removed %s=%s, its canary's analysis ended", namespace, name, key, value
                )
        for event in decision.events:
            self.post_event(
                body, "Warning" if event.warning else "Normal", event.reason, event.message
            )
        if decision.shape_unknown:
            log.warning("%s/%s: %s", namespace, name, decision.shape_unknown)


def _status_of(body: Mapping[str, Any]) -> SpeculativeDeploymentStatus | None:
    raw = body.get("status")
    return SpeculativeDeploymentStatus.model_validate(raw) if isinstance(raw, Mapping) else None


def _own(obj: Mapping[str, Any] | None, name: str, uid: str | None) -> Mapping[str, Any] | None:
    """`obj` when it is the SD's own child (plan.children.ownership), else None."""
    return obj if obj is not None and foreign_holder(obj, name, uid) is None else None


#: The apiVersion of each kind of child, to read one whose name was found taken.
CHILD_API_VERSIONS = {
    "Deployment": "apps/v1",
    "Service": "v1",
    "PodMonitor": POD_MONITOR_API_VERSION,
    LWS_KIND: LWS_API_VERSION,
    RECORD_KIND: RECORD_API_VERSION,
}


def _owned_by(obj: Mapping[str, Any], uid: str | None) -> bool:
    """Whether `obj` belongs to the SD with `uid`; an object without owner is adopted."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    if not refs:
        return True
    return any(r.get("uid") == uid for r in refs)
