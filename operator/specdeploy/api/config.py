"""The operator's own configuration (not part of the CRD).

Read from a YAML/JSON mapping with camelCase keys, like the CRD. Each setting has a default that
makes a development cluster work; the Helm chart sets the production ones.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from specdeploy.api import labels
from specdeploy.api.models import (
    LABEL_VALUE_PATTERN,
    AnalysisSpec,
    ApiModel,
    Duration,
    InconclusivePolicy,
    RolloutSpec,
)

#: The engine images by the local names `make images` builds them under (podman's `localhost/`):
#: names in no registry namespace the project does not own. On a cluster, push the images to a
#: registry of yours and set engineImage / engineCpuImage to that copy (docs/operator.md).
DEFAULT_ENGINE_IMAGE = "localhost/specdeploy/engine:0.1.0"
DEFAULT_ENGINE_CPU_IMAGE = "localhost/specdeploy/engine-cpu:0.1.0"
DEFAULT_ENGINE_COMMAND = ("specdeploy-engine",)


class AnalysisSettings(ApiModel):
    """Canary analysis with every value decided: the spec's values over the operator's defaults."""

    interval: Duration = Field(default="60s", description="Time between verdicts.")
    window: Duration = Field(default="5m", description="Prometheus range of one verdict.")
    warmup: Duration = Field(
        default="0s", description="Live time before the first counted window (cold caches)."
    )
    min_draft_tokens: int = Field(default=2000, ge=0, description="Draft tokens for a verdict.")
    min_acceptance_rate: float = Field(
        default=0.6, ge=0, le=1, description="Absolute floor on first-position acceptance."
    )
    max_drop_vs_stable: float = Field(default=0.1, ge=0, le=1, description="Drop vs stable.")
    max_time_per_output_token_increase: float = Field(
        default=1.10, ge=1, description="Time per output token, ratio to the stable's, that fails."
    )
    max_time_to_first_token_increase: float = Field(
        default=1.5,
        ge=1,
        description="Mean time to first token, ratio to the stable's, that fails.",
    )
    time_to_first_token_tolerance: Duration = Field(
        default="50ms", description="Differences of time to first token that never fail."
    )
    max_error_rate_increase: float = Field(
        default=0.05, ge=0, le=1, description="Error share above the stable's that fails."
    )
    max_batch_size_ratio: float = Field(
        default=1.5, ge=1, description="Running batch sizes further apart: latency Inconclusive."
    )
    max_throughput_drop: float = Field(
        default=0.02, ge=0, le=1, description="Tuned revision: tokens/s share below the stable's."
    )
    failure_limit: int = Field(default=2, ge=1, description="Failures that roll back.")
    promote_after: int = Field(default=3, ge=1, description="Passes that promote.")
    on_inconclusive: InconclusivePolicy = Field(default="Hold", description="Inconclusive.")
    inconclusive_limit: int = Field(
        default=20, ge=1, description="Inconclusive verdicts in a row that end a Hold."
    )


class GpuProductOverride(ApiModel):
    """A GPU product the built-in catalog lacks or gets wrong for this cluster."""

    product: str = Field(description="Node label nvidia.com/gpu.product value.")
    memory_gib: float = Field(alias="memoryGiB", gt=0, description="Device memory in GiB.")
    mig_profiles: list[str] = Field(
        default_factory=list, description="MIG profiles offered, e.g. 3g.40gb."
    )


# A label key: an optional DNS-subdomain prefix and a name of at most 63 characters,
# alphanumeric at both ends (Kubernetes' rule; values follow LABEL_VALUE_PATTERN).
LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
#: Labels the operator itself sets on its children and selects them by: never from config.
OWN_LABELS = frozenset({labels.MANAGED_BY, labels.NAME, labels.REVISION, labels.PAIR_VERSION})


class LeaderElection(ApiModel):
    """A Lease (coordination.k8s.io/v1) that one operator process holds while it reconciles;
    the others wait for it. The defaults are client-go's."""

    enabled: bool = Field(default=False, description="Reconcile only while holding the Lease.")
    namespace: str = Field(default="", description="Namespace of the Lease (required).")
    lease_name: str = Field(default="specdeploy-operator", description="Name of the Lease.")
    lease_duration_seconds: float = Field(
        default=15.0,
        gt=0,
        description="How long a Lease not renewed stays held: a standby takes over this long "
        "after the holder stops renewing.",
    )
    renew_deadline_seconds: float = Field(
        default=10.0,
        gt=0,
        description="The holder stops reconciling (and exits) when it could not renew for "
        "this long; shorter than leaseDurationSeconds.",
    )
    retry_period_seconds: float = Field(
        default=2.0, gt=0, description="Time between tries to take or renew the Lease."
    )

    @model_validator(mode="after")
    def _consistent(self) -> LeaderElection:
        if not self.enabled:
            return self
        if not self.namespace:
            raise ValueError("leaderElection.namespace is required when leader election is on")
        if (
            not self.retry_period_seconds
            < self.renew_deadline_seconds
            < (self.lease_duration_seconds)
        ):
            raise ValueError(
                "leaderElection needs retryPeriodSeconds < renewDeadlineSeconds < "
                f"leaseDurationSeconds, got {self.retry_period_seconds} < "
                f"{self.renew_deadline_seconds} < {self.lease_duration_seconds}"
            )
        return self


class OperatorConfig(ApiModel):
    """What the operator needs to know about its cluster and its engine image."""

    engine_image: str = Field(
        default=DEFAULT_ENGINE_IMAGE, description="Engine image when spec.engine.image is unset."
    )
    engine_cpu_image: str = Field(
        default=DEFAULT_ENGINE_CPU_IMAGE,
        description="Engine image of CPU-serving SDs (placement.device CPU) without engine.image.",
    )
    engine_command: list[str] = Field(
        default_factory=lambda: list(DEFAULT_ENGINE_COMMAND),
        description="Engine container command; args are ['serve', '--', *vllm args].",
    )
    local_process: bool = Field(
        default=False,
        description=(
            "Annotate pod templates with specdeploy.dev/local-process: 'true' so the test "
            "bed's process kubelet runs them."
        ),
    )
    pod_resource_defaults: bool = Field(
        default=True,
        description=(
            "GPU engine pods ask for CPU and memory sized from the pair where "
            "spec.engine.resources leaves them unset (plan.children.pod_defaults); false for a "
            "Kueue ClusterQueue that does not cover cpu and memory."
        ),
    )
    batch_queues: list[str] = Field(
        default_factory=list,
        description="Kueue LocalQueues treated as batch: speculation Auto means Off there.",
    )
    prometheus_url: str = Field(
        default="http://prometheus-operated.monitoring.svc:9090", description="Prometheus."
    )
    pod_monitor_labels: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Labels put on every PodMonitor the operator makes, e.g. {release: <name>} for the "
            "Prometheus of kube-prometheus-stack, which selects PodMonitors by that label."
        ),
    )
    leader_election: LeaderElection = Field(
        default_factory=LeaderElection,
        description="Only the holder of a Lease reconciles, so several replicas are safe.",
    )
    analysis_defaults: AnalysisSettings = Field(
        default_factory=AnalysisSettings, description="Used where spec.rollout.analysis is unset."
    )
    progress_deadline_seconds: int = Field(
        default=1800,
        ge=1,
        description=(
            "Used where spec.rollout.progressDeadlineSeconds is unset: how long a new revision "
            "beside a stable one may take to get ready and judged before it is rolled back."
        ),
    )
    gpu_catalog: list[GpuProductOverride] = Field(
        default_factory=list, description="Additions and corrections to the GPU catalog."
    )
    namespaces: list[str] = Field(
        default_factory=list, description="Namespaces to watch; empty means all."
    )
    reconcile_interval_seconds: float = Field(
        default=30.0,
        gt=0,
        description="Period of the level-based reconcile of every SpeculativeDeployment.",
    )
    store_check_seconds: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Period of the check of the watch-fed stores against the API server (one LIST of "
            "the objects' metadata per kind), which finds objects deleted during a watch gap."
        ),
    )
    liveness_endpoint: str | None = Field(
        default=None,
        description=(
            "Where the operator answers liveness probes, e.g. http://0.0.0.0:8080/healthz; "
            "none when unset."
        ),
    )
    metrics_endpoint: str | None = Field(
        default=None,
        description=(
            "Where the operator serves its Prometheus metrics, e.g. http://0.0.0.0:8081/metrics; "
            "none when unset."
        ),
    )
    model_config_url: str = Field(
        default="https://huggingface.co/{model}/resolve/{revision}/config.json",
        description=(
            "Where config.json of a model outside the shipped catalog is read, for sizing; "
            "{model} and {revision} are filled in."
        ),
    )

    @field_validator("pod_monitor_labels")
    @classmethod
    def _valid_labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label_value in value.items():
            if key in OWN_LABELS:
                raise ValueError(f"podMonitorLabels: {key} is set by the operator itself")
            if not LABEL_KEY.match(key):
                raise ValueError(f"podMonitorLabels: {key!r} is not a valid label key")
            if len(label_value) > 63 or not re.match(LABEL_VALUE_PATTERN, label_value):
                raise ValueError(
                    f"podMonitorLabels: {label_value!r} (of {key}) is not a valid label value"
                )
        return value

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None) -> OperatorConfig:
        """Build the config from a parsed YAML/JSON mapping; None gives the defaults."""
        return cls.model_validate(data or {})

    def analysis_for(self, spec: AnalysisSpec | None) -> AnalysisSettings:
        """The analysis a canary gets: each field set in the spec wins over the default."""
        if spec is None:
            return self.analysis_defaults
        overrides = spec.model_dump(exclude_none=True, exclude={"probe", "max_latency_increase"})
        if spec.max_time_per_output_token_increase is None and spec.max_latency_increase:
            # The field's former name: it is judged per output token now.
            overrides["max_time_per_output_token_increase"] = spec.max_latency_increase
        return self.analysis_defaults.model_copy(update=overrides)

    def progress_deadline_for(self, spec: RolloutSpec) -> int:
        """Seconds a new revision may take to be ready and judged: the spec's, else the config's."""
        return spec.progress_deadline_seconds or self.progress_deadline_seconds
