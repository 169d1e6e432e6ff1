"""Condition types, reasons and phases of a SpeculativeDeployment, as named constants.

Every condition written to status uses one of these types and reasons, so that people and
alerts can match on them. Reasons are CamelCase, as Kubernetes conventions ask.
"""

from __future__ import annotations

from typing import Final


class ConditionType:
    """The `type` of each condition in status.conditions."""

    READY: Final = "Ready"
    PROGRESSING: Final = "Progressing"
    DEGRADED: Final = "Degraded"
    PAIR_COMPATIBLE: Final = "PairCompatible"
    ADMITTED: Final = "Admitted"
    SIZED: Final = "Sized"
    SPECULATING: Final = "Speculating"


class Reason:
    """CamelCase reasons for conditions, speculation status and Events."""

    # Ready / Progressing
    ALL_REPLICAS_READY: Final = "AllReplicasReady"
    REPLICAS_NOT_READY: Final = "ReplicasNotReady"
    ENGINE_CRASH_LOOPING: Final = "EngineCrashLooping"
    # Ready / Progressing: pods of the revision cannot start (plan.status.pod_failure)
    IMAGE_PULL_FAILED: Final = "ImagePullFailed"
    CREATE_CONTAINER_CONFIG_ERROR: Final = "CreateContainerConfigError"
    OOM_KILLED: Final = "OOMKilled"
    POD_UNSCHEDULABLE: Final = "PodUnschedulable"
    NEW_REVISION: Final = "NewRevision"
    CANARY_ANALYSING: Final = "CanaryAnalysing"
    CANARY_PROMOTED: Final = "CanaryPromoted"
    ROLLED_BACK: Final = "RolledBack"
    ROLLOUT_COMPLETE: Final = "RolloutComplete"
    # A new revision not ready (or, as a canary, not judged) in time: rolled back.
    PROGRESS_DEADLINE_EXCEEDED: Final = "ProgressDeadlineExceeded"
    # A canary held on inconclusive verdicts for analysis.inconclusiveLimit in a row.
    INCONCLUSIVE_LIMIT_REACHED: Final = "InconclusiveLimitReached"
    # A person's kubectl specdeploy request.
    ABORTED: Final = "Aborted"
    PAUSED: Final = "Paused"
    UNDONE: Final = "Undone"
    # The canary's stages before its live analysis.
    CANARY_STARTING: Final = "CanaryStarting"
    CANARY_PROBING: Final = "CanaryProbing"
    SCALED_TO_ZERO: Final = "ScaledToZero"
    REVISION_PRUNED: Final = "RevisionPruned"
    # Analysis
    ANALYSIS_PASSED: Final = "AnalysisPassed"
    ANALYSIS_FAILED: Final = "AnalysisFailed"
    ANALYSIS_INCONCLUSIVE: Final = "AnalysisInconclusive"
    METRICS_UNAVAILABLE: Final = "MetricsUnavailable"
    # Degraded / collapse guard
    ACCEPTANCE_COLLAPSED: Final = "AcceptanceCollapsed"
    ACCEPTANCE_HEALTHY: Final = "AcceptanceHealthy"
    HEALTHY: Final = "Healthy"
    # PairCompatible
    PAIR_VERIFIED: Final = "PairVerified"
    PAIR_UNVERIFIED: Final = "PairUnverified"
    PAIR_INCOMPATIBLE: Final = "PairIncompatible"
    MODEL_NOT_FOUND: Final = "ModelNotFound"
    ARGUMENTS_REFUSED: Final = "ArgumentsRefused"
    # Admitted (Kueue)
    ADMITTED: Final = "Admitted"
    WAITING_FOR_QUOTA: Final = "WaitingForQuota"
    NO_QUEUE: Final = "NoQueue"
    LOCAL_QUEUE_NOT_FOUND: Final = "LocalQueueNotFound"
    PRIORITY_CLASS_NOT_FOUND: Final = "PriorityClassNotFound"
    #: Kueue does not manage the pods (not installed, or its pod or deployment integration
    #: off): they schedule without quota.
    QUOTA_BYPASSED: Final = "QuotaBypassed"
    # Sized
    SIZED: Final = "Sized"
    UNSCHEDULABLE: Final = "Unschedulable"
    # Speculation on/off
    SPECULATION_ENABLED: Final = "SpeculationEnabled"
    SPECULATION_DISABLED_BY_SPEC: Final = "DisabledBySpec"
    SPECULATION_DISABLED_BATCH_QUEUE: Final = "BatchQueue"
    SPECULATION_DISABLED_COLLAPSE: Final = "DisabledAfterCollapse"
    NO_DRAFT: Final = "NoDraft"
    # Speculation-length autotuner (Events)
    TUNED_REVISION_ROLLED_OUT: Final = "TunedRevisionRolledOut"
    TUNED_REVISION_PROMOTED: Final = "TunedRevisionPromoted"
    TUNED_REVISION_REJECTED: Final = "TunedRevisionRejected"
    # Children changed out of band and set back
    DRIFT_REVERTED: Final = "DriftReverted"
    # A child write the API server refused (400/422): not sent again for this generation
    CHILD_REJECTED: Final = "ChildRejected"
    # A child's name is held by an object this SD does not own: left as it is
    NAME_TAKEN: Final = "NameTaken"
    # Generic
    RECONCILE_ERROR: Final = "ReconcileError"
    INVALID_SPEC: Final = "InvalidSpec"


class Phase:
    """status.phase: the one-word summary `kubectl get sd` shows."""

    PENDING: Final = "Pending"
    PROGRESSING: Final = "Progressing"
    CANARY: Final = "Canary"
    SERVING: Final = "Serving"
    DEGRADED: Final = "Degraded"
    ROLLED_BACK: Final = "RolledBack"
    FAILED: Final = "Failed"


class RevisionPhase:
    """status.revisions[].phase."""

    PENDING: Final = "Pending"
    CANARY: Final = "Canary"
    STABLE: Final = "Stable"
    SUPERSEDED: Final = "Superseded"
    FAILED: Final = "Failed"
