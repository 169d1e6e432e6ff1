"""The SpeculativeDeployment API (specdeploy.dev/v1alpha1) as pydantic models.

These models are the single source of the CRD: `specdeploy.api.crd` turns them into the
OpenAPI schema, and each field's description is what `kubectl explain` shows. Python code uses
snake_case attributes; the YAML uses the camelCase aliases. Build a model from a CR with
`SpeculativeDeploymentSpec.model_validate(body["spec"])` and write one back with
`model.model_dump(by_alias=True, exclude_none=True, mode="json")`.

Cross-field rules (draft model required for some methods, schedule ordering, ...) are CEL rules
attached in `specdeploy.api.crd`, so the API server enforces them at admission time.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

from specdeploy import GROUP, VERSION

KIND = "SpeculativeDeployment"
PLURAL = "speculativedeployments"
SINGULAR = "speculativedeployment"
SHORT_NAMES = ("sd",)
API_VERSION = f"{GROUP}/{VERSION}"

# Go-style durations as the API server and Prometheus understand them: "90s", "5m", "1h30m".
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
# Kubernetes resource.Quantity as the core API's own schema spells it, less the minus sign: a
# container's requests and limits may not be negative.
QUANTITY_PATTERN = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)

# Every string the operator copies into another object is held at admission to what that object
# accepts (docs/contracts.md, "What a spec value may become"), so a CR the API server accepts
# never leaves the operator retrying a write the API server refuses.
#: A label value (pair version, queue, priority class, GPU product, node selector values).
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
#: A label key: an optional DNS subdomain prefix and `/`, then a name of at most 63 characters
#: (node selector keys, toleration keys). The lengths are checked by a CEL rule.
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$"
)
#: A name that is both a label value and a DNS-1123 subdomain (Kueue LocalQueue and
#: WorkloadPriorityClass names, which are also copied into label values).
LABEL_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
#: A DNS-1123 subdomain: Secret and PersistentVolumeClaim names.
SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: A Secret's data key.
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
#: An environment variable name: a C identifier (what every shell and the pod API accept).
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
#: A model: a hub id (org/name) or a path. Passed to vLLM as an argument of its own, so it may
#: not start with `-` (vLLM would read it as a flag); no spaces, quotes or control characters.
#: `..` segments are refused by a CEL rule.
MODEL_PATTERN = r"^[A-Za-z0-9_./~@+][-A-Za-z0-9_./~@+=:]*$"
#: A hub revision (commit id, branch or tag); not a flag either.
REVISION_PATTERN = r"^[A-Za-z0-9_.][-A-Za-z0-9_./+]*$"
#: A directory inside a volume, relative to it (`..` segments refused by a CEL rule).
RELATIVE_PATH_PATTERN = r"^([A-Za-z0-9_.@+~][-A-Za-z0-9_./@+~=]*)?$"
#: A container image reference.
IMAGE_PATTERN = r"^[A-Za-z0-9][-A-Za-z0-9_./:@+]*$"
#: One `vllm serve` argument: a long flag (lowercase with dashes, optionally with `.key`s and
#: `=value`), or a value that does not start with `-` (a negative number goes as `--flag=-1`).
#: Single-dash short flags (`-tp`, `-sc`, `-O`) are aliases of long ones and are refused, so the
#: operator's own flags cannot come back under another name. No control characters anywhere.
EXTRA_ARG_PATTERN = (
    r"^(--[a-z0-9][-a-z0-9]*(\.[-A-Za-z0-9_.]+\+?)?(=[^\x00-\x1f\x7f]*)?"
    r"|[^-\x00-\x1f\x7f][^\x00-\x1f\x7f]*)$"
)
#: An environment variable's value: text, tabs and line breaks, no other control characters.
ENV_VALUE_PATTERN = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$"

Duration = Annotated[str, Field(max_length=32, pattern=DURATION_PATTERN)]
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]
ExtraArg = Annotated[str, Field(min_length=1, max_length=2048, pattern=EXTRA_ARG_PATTERN)]
LabelKey = Annotated[str, Field(min_length=1, max_length=317, pattern=LABEL_KEY_PATTERN)]
# The anyOf of exactly integer and string is the one anyOf a structural schema allows.
_INT_OR_STRING: dict[str, Any] = {
    "x-kubernetes-int-or-string": True,
    "anyOf": [{"type": "integer"}, {"type": "string"}],
}
Quantity = Annotated[
    int | str,
    WithJsonSchema({**_INT_OR_STRING, "pattern": QUANTITY_PATTERN, "minimum": 0}),
]
# An int or the word "auto"; the CEL rule on the field (see crd.py) rejects other strings.
IntOrAuto = Annotated[
    int | Literal["auto"],
    WithJsonSchema(_INT_OR_STRING),
]

DraftMethod = Literal["eagle3", "eagle", "draft_model", "ngram", "mtp", "suffix", "none"]
# Methods whose proposals come from a separate checkpoint that must be named.
METHODS_NEEDING_MODEL: frozenset[str] = frozenset({"eagle3", "eagle", "draft_model"})
# Methods that must not name a model: they draft from the prompt/history (ngram, suffix) or not
# at all (none). `mtp` may name one, but by default uses the target's own MTP layers.
METHODS_WITHOUT_MODEL: frozenset[str] = frozenset({"ngram", "suffix", "none"})

Dtype = Literal["bfloat16", "float16", "float32", "fp8", "int8", "int4"]
MigPolicy = Literal["Auto", "Never", "Required"]
Device = Literal["GPU", "CPU"]
SpeculationPolicy = Literal["Enabled", "Disabled", "Auto"]
InconclusivePolicy = Literal["Hold", "Promote", "Rollback"]
CollapseAction = Literal["DisableSpeculation", "RollbackToPrevious", "AlertOnly"]
ConditionStatus = Literal["True", "False", "Unknown"]
SpeculationState = Literal["Enabled", "Disabled"]
VerdictResult = Literal["Pass", "Fail", "Inconclusive", "Error"]
AutotuneMode = Literal["Off", "Recommend", "Apply"]
AutotuneSchedule = Literal["Off", "Auto"]
AcrossNodes = Literal["PipelineParallel", "TensorParallel"]


class ApiModel(BaseModel):
    """Base of every API model: camelCase in YAML, snake_case in Python.

    Unknown keys are ignored rather than refused: the API server already prunes fields the CRD
    does not know, and status may carry keys written by kopf itself.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        # `model_source` and friends are API names, not pydantic internals.
        protected_namespaces=(),
    )


# --- the pair ---------------------------------------------------------------------------------


class ModelShape(ApiModel):
    """The architecture numbers sizing needs when the model is not in the operator's catalog."""

    parameters_billion: float = Field(
        gt=0, description="Number of parameters, in billions (e.g. 8.03 for Llama-3.1-8B)."
    )
    layers: int = Field(ge=1, description="Number of transformer layers (num_hidden_layers).")
    hidden_size: int = Field(ge=1, description="Hidden size (hidden_size).")
    attention_heads: int = Field(ge=1, description="Attention heads (num_attention_heads).")
    kv_heads: int = Field(ge=1, description="Key/value heads (num_key_value_heads).")
    head_dim: int | None = Field(
        default=None, ge=1, description="Head dimension; defaults to hiddenSize/attentionHeads."
    )
    vocab_size: int = Field(ge=1, description="Vocabulary size.")
    dtype: Dtype = Field(description="Data type of the weights as served.")
    quantization: str | None = Field(
        default=None,
        max_length=63,
        pattern=r"^[a-z0-9][-a-z0-9_]*$",
        description="Quantization method of the checkpoint, e.g. fp8, awq, gptq.",
    )


class TargetSpec(ApiModel):
    """The model that verifies and serves: its output is the output users get."""

    model: str = Field(
        min_length=1,
        max_length=512,
        pattern=MODEL_PATTERN,
        description=(
            "Model id on the hub (org/name), or a path when modelSource is pvc or absent "
            "(a path inside the image or on the node)."
        ),
    )
    revision: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        pattern=REVISION_PATTERN,
        description="Hub commit or tag the model is pinned to. Required with modelSource.hub.",
    )
    shape: ModelShape | None = Field(
        default=None,
        description="Architecture numbers for sizing, when the operator's catalog lacks them.",
    )


class ScheduleStep(ApiModel):
    """Speculation length up to a running batch size."""

    max_batch_size: int = Field(
        ge=1,
        description=(
            "Largest running batch size this step applies to; the step starts one above the "
            "previous step's maxBatchSize (the first step starts at 1)."
        ),
    )
    tokens: int = Field(
        ge=0,
        description="Speculative tokens per step in this range; 0 turns speculation off.",
    )


class AutotuneSpec(ApiModel):
    """Speculation length chosen from what the serving pods measure (docs/autotune.md).

    The modes follow the Vertical Pod Autoscaler's update modes: Off computes nothing,
    Recommend writes status.autotune only, Apply rolls the recommendation out as a new
    revision through the canary.
    """

    mode: AutotuneMode = Field(
        default="Off",
        description=(
            "Off, Recommend (status.autotune shows the recommended numSpeculativeTokens; "
            "nothing changes) or Apply (the recommendation becomes a new revision, judged by "
            "the canary, when its predicted gain reaches minGain)."
        ),
    )
    min_gain: float = Field(
        default=0.05,
        ge=0,
        le=10,
        description=(
            "Predicted relative gain in tokens per second (0.05 = 5 %) below which the "
            "current length is kept."
        ),
    )
    cooldown: Duration = Field(
        default="30m", description="Least time between two tuned revisions (mode Apply)."
    )
    min_tokens: int = Field(
        default=1, ge=1, le=32, description="Smallest numSpeculativeTokens recommended."
    )
    max_tokens: int = Field(
        default=8, ge=1, le=32, description="Largest numSpeculativeTokens recommended."
    )
    schedule: AutotuneSchedule = Field(
        default="Off",
        description=(
            "Off: one length at every batch size. Auto: status.autotune also recommends a "
            "length per running batch-size range (vLLM's num_speculative_tokens_per_batch_size) "
            "once step times were measured at two or more batch sizes; mode Apply rolls a "
            "recommended schedule out as a tuned revision through the canary, like a tuned "
            "length. Needs spec.engine.maxNumSeqs."
        ),
    )
    draft_cost_ratio: float | None = Field(
        default=None,
        gt=0,
        le=10,
        description=(
            "Cost of one speculative token (drafting and verifying it) relative to a decode "
            "step without speculation. Default: measured once two lengths have served, else "
            "the operator's configured ratio."
        ),
    )


class DraftSpec(ApiModel):
    """How tokens are proposed for the target to verify."""

    method: DraftMethod = Field(
        description=(
            "Speculation method, passed to vLLM explicitly: eagle3, eagle and draft_model need "
            "a model; ngram and suffix draft from the text itself and take no model; mtp uses "
            "the target's own multi-token-prediction layers unless a model is given; none "
            "serves the target alone."
        ),
    )
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        pattern=MODEL_PATTERN,
        description="Draft checkpoint (hub id or path), trained for exactly this target.",
    )
    revision: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        pattern=REVISION_PATTERN,
        description="Hub commit or tag of the draft. Required with modelSource.hub and a model.",
    )
    num_speculative_tokens: int | None = Field(
        default=None,
        ge=1,
        le=32,
        description="Tokens proposed per step (k). Required unless method is none.",
    )
    schedule: list[ScheduleStep] | None = Field(
        default=None,
        max_length=16,
        description=(
            "Speculation length by running batch size, in strictly ascending maxBatchSize. "
            "Above the last step speculation is off. Needs spec.engine.maxNumSeqs. "
            "Without a schedule, numSpeculativeTokens applies at every batch size."
        ),
    )
    shape: ModelShape | None = Field(
        default=None, description="Architecture numbers of the draft, for sizing."
    )
    draft_tensor_parallel_size: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Tensor parallel size of the draft: 1, or the target's tensorParallelSize. "
            "Default: vLLM's choice (the target's)."
        ),
    )
    autotune: AutotuneSpec | None = Field(
        default=None,
        description="Choose numSpeculativeTokens from live measurements (default: Off).",
    )


class PairSpec(ApiModel):
    """A target and its draft, versioned together: they only ever move as one."""

    version: str = Field(
        min_length=1,
        max_length=63,
        pattern=LABEL_VALUE_PATTERN,
        description='Human version of the pair (a label value), e.g. "3.1".',
    )
    target: TargetSpec = Field(description="The served model.")
    draft: DraftSpec = Field(description="The speculative draft for this target.")


# --- engine, source, placement -----------------------------------------------------------------


class EnvVar(ApiModel):
    """An environment variable for the engine container."""

    name: str = Field(
        min_length=1, max_length=256, pattern=ENV_NAME_PATTERN, description="Variable name."
    )
    value: str = Field(
        default="", max_length=32768, pattern=ENV_VALUE_PATTERN, description="Variable value."
    )


class EngineResources(ApiModel):
    """CPU and memory for the engine container; GPUs come from the sizing decision."""

    cpu: Quantity | None = Field(default=None, description="CPU request and limit, e.g. 8.")
    memory: Quantity | None = Field(
        default=None, description="Memory request and limit, e.g. 64Gi."
    )


class EngineSpec(ApiModel):
    """The vLLM engine settings shared by target and draft."""

    image: str | None = Field(
        default=None,
        max_length=512,
        pattern=IMAGE_PATTERN,
        description="Engine image; defaults to the operator's configured image.",
    )
    tensor_parallel_size: IntOrAuto = Field(
        default="auto",
        description=(
            "The target's tensor parallel size (vLLM's --tensor-parallel-size), or auto to let "
            "sizing decide. On one node: the GPUs of a replica. Across nodes: the GPUs of each "
            "node with acrossNodes PipelineParallel, of all nodes with TensorParallel."
        ),
    )
    across_nodes: AcrossNodes = Field(
        default="PipelineParallel",
        description=(
            "How the target spans the nodes of a replica when placement.nodesPerReplica is "
            "not 1: PipelineParallel (tensor parallel within each node, one pipeline stage per "
            "node; the draft runs on the last stage) or TensorParallel (tensor parallel over "
            "every GPU of every node of the replica, for NVLink domains that span nodes)."
        ),
    )
    max_model_len: int | None = Field(
        default=None, ge=1, description="Maximum context length (prompt + output)."
    )
    gpu_memory_utilization: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Fraction of device memory vLLM may use (vLLM's default: 0.9).",
    )
    max_num_seqs: int | None = Field(
        default=None, ge=1, description="Maximum concurrent sequences (running batch size)."
    )
    kv_cache_tokens: int | None = Field(
        default=None,
        ge=1,
        description=(
            "KV cache budget per replica in tokens (all running sequences together), which "
            "sizing reserves on the device; at least maxModelLen (one full-length sequence). "
            "vLLM turns whatever memory is left into more KV blocks. Default: maxModelLen x "
            "min(maxNumSeqs, 16). docs/sizing.md has the arithmetic."
        ),
    )
    # The bounds keep the CEL rule over every argument within the API server's cost budget.
    extra_args: list[ExtraArg] = Field(
        default_factory=list,
        max_length=32,
        description=(
            "More `vllm serve` arguments, appended after the ones the operator sets: long flags "
            "(`--name`, `--name=value`) and values; a value starting with `-` goes as "
            "`--name=value`. Passed as arguments, never through a shell."
        ),
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=128,
        description="Extra environment variables for the engine (names SPECDEPLOY_* are reserved).",
    )
    resources: EngineResources | None = Field(
        default=None, description="CPU and memory of the engine container."
    )
    startup_timeout_seconds: int | None = Field(
        default=None,
        ge=60,
        le=86400,
        description=(
            "How long the engine may take to start (download and load the weights, warm up) "
            "before its startup probe gives up and the container is restarted. Default: 600 s, "
            "plus 2 s per GiB of weights, or 12 s per GiB when they come from the hub (a first "
            "start downloads them). docs/operator.md."
        ),
    )
    termination_grace_period_seconds: int | None = Field(
        default=None,
        ge=20,
        le=3600,
        description=(
            "How long a stopping engine pod has to finish the requests it is serving (a rollout, "
            "a rollback, a scale-down): it keeps serving for 5 s while it leaves the Service "
            "(preStop), then vLLM drains its running requests for up to this minus 10 s "
            "(--shutdown-timeout) and exits; Kubernetes kills it at the end. Default: 120."
        ),
    )


class SecretKeyRef(ApiModel):
    """A key of a Secret in the SpeculativeDeployment's namespace."""

    name: str = Field(
        min_length=1, max_length=253, pattern=SUBDOMAIN_PATTERN, description="Secret name."
    )
    key: str = Field(
        min_length=1,
        max_length=253,
        pattern=SECRET_KEY_PATTERN,
        description="Key within the Secret.",
    )


class HubSource(ApiModel):
    """Models are downloaded from the hub by id and revision at pod start."""

    token_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret key holding the hub access token (gated models)."
    )


class PvcSource(ApiModel):
    """Models are read from a PersistentVolumeClaim."""

    claim_name: str = Field(
        min_length=1,
        max_length=253,
        pattern=SUBDOMAIN_PATTERN,
        description="PersistentVolumeClaim name.",
    )
    path: str = Field(
        default="",
        max_length=512,
        pattern=RELATIVE_PATH_PATTERN,
        description=(
            "Directory inside the claim holding the models; target.model and draft.model "
            "are paths relative to it."
        ),
    )


class ModelSource(ApiModel):
    """Where the weights come from: exactly one of hub or pvc."""

    hub: HubSource | None = Field(default=None, description="Download from the hub.")
    pvc: PvcSource | None = Field(default=None, description="Read from a volume.")


class Toleration(ApiModel):
    """A pod toleration, as in core/v1."""

    key: str | None = Field(
        default=None,
        max_length=317,
        pattern=LABEL_KEY_PATTERN,
        description="Taint key; empty matches all keys (with operator Exists).",
    )
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Operator.")
    value: str | None = Field(
        default=None, max_length=63, pattern=LABEL_VALUE_PATTERN, description="Taint value."
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        default=None, description="How long a NoExecute taint is tolerated."
    )


class GpuPlacement(ApiModel):
    """Which GPUs the pair may run on."""

    product: str | None = Field(
        default=None,
        max_length=63,
        pattern=LABEL_VALUE_PATTERN,
        description="Preferred GPU product (node label nvidia.com/gpu.product), e.g. "
        "NVIDIA-H100-80GB-HBM3.",
    )
    mig: MigPolicy = Field(
        default="Auto",
        description=(
            "MIG slices: Auto uses the smallest slice that fits, else whole GPUs; Never uses "
            "whole GPUs only; Required fails sizing unless a slice fits (no tensor parallel)."
        ),
    )
    count: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description=(
            "Pinned number of whole GPUs per replica (tensor parallel size): the operator "
            "checks that they hold the pair instead of choosing, and refuses a count too small."
        ),
    )
    mig_profile: str | None = Field(
        default=None,
        pattern=r"^[0-9]+g\.[0-9]+gb$",
        description=(
            "Pinned MIG profile per replica, e.g. 3g.40gb: the operator checks that the slice "
            "holds the pair instead of choosing, and refuses a slice too small."
        ),
    )


class PlacementSpec(ApiModel):
    """Where and with which priority the pods run."""

    queue: str | None = Field(
        default=None,
        max_length=63,
        pattern=LABEL_NAME_PATTERN,
        description="Kueue LocalQueue name (label kueue.x-k8s.io/queue-name).",
    )
    priority_class: str | None = Field(
        default=None,
        max_length=63,
        pattern=LABEL_NAME_PATTERN,
        description="Kueue WorkloadPriorityClass (label kueue.x-k8s.io/priority-class).",
    )
    device: Device = Field(
        default="GPU",
        description=(
            "GPU serves on GPUs or MIG slices; CPU serves on the host's CPUs with the "
            "operator's CPU engine image (engineCpuImage), sized in host memory, for kind "
            "clusters and laptops. CPU takes no gpu settings."
        ),
    )
    gpu: GpuPlacement | None = Field(default=None, description="GPU product and MIG policy.")
    nodes_per_replica: IntOrAuto = Field(
        default=1,
        description=(
            "Nodes one replica spans (a LeaderWorkerSet group of a leader and nodes - 1 "
            "workers, admitted whole by Kueue): 1 (one pod per replica), a number, or auto "
            "(sizing chooses the fewest nodes that hold the pair). gpu.count is then per node."
        ),
    )
    topology_key: LabelKey | None = Field(
        default=None,
        description=(
            "With more than one node per replica: a node label whose value every pod of a "
            "group shares (an NVLink domain such as nvidia.com/gpu.clique, or a rack), one "
            "group per value (LeaderWorkerSet's exclusive topology)."
        ),
    )
    node_selector: dict[LabelKey, LabelValue] | None = Field(
        default=None, max_length=32, description="Extra node labels the pods require."
    )
    tolerations: list[Toleration] | None = Field(
        default=None, max_length=32, description="Tolerations for the pods."
    )
    speculation: SpeculationPolicy = Field(
        default="Auto",
        description=(
            "Enabled, Disabled or Auto; Auto speculates except on queues the operator is "
            "configured to treat as batch queues, where throughput matters more than latency."
        ),
    )


# --- model cache and pod options ---------------------------------------------------------------


class EphemeralCache(ApiModel):
    """A generic ephemeral volume: a PVC made with each pod and deleted with it."""

    size: Quantity = Field(description="Storage requested, e.g. 200Gi (more than the weights).")
    storage_class_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=SUBDOMAIN_PATTERN,
        description="StorageClass; the cluster's default when unset.",
    )


class ModelCacheSpec(ApiModel):
    """A volume mounted as the engine's hub cache (HF_HOME), so restarts do not download again."""

    claim_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=SUBDOMAIN_PATTERN,
        description=(
            "An existing PersistentVolumeClaim (ReadWriteMany when replicas share it; pre-warm "
            "it as docs/operator.md shows)."
        ),
    )
    ephemeral: EphemeralCache | None = Field(
        default=None, description="A volume made per pod (survives container restarts)."
    )


class LocalObjectReference(ApiModel):
    """A reference to an object of the same namespace, by name."""

    name: str = Field(min_length=1, max_length=253, pattern=SUBDOMAIN_PATTERN, description="Name.")


class PodOptions(ApiModel):
    """What the engine pods carry for the cluster beside what the operator sets."""

    labels: dict[str, Annotated[str, Field(max_length=63)]] | None = Field(
        default=None,
        max_length=64,
        description="Extra pod labels; the operator's own keys (specdeploy.dev/*, "
        "app.kubernetes.io/managed-by, kueue.x-k8s.io/*) are refused.",
    )
    annotations: dict[str, Annotated[str, Field(max_length=4096)]] | None = Field(
        default=None,
        max_length=64,
        description="Extra pod annotations; specdeploy.dev/* and prometheus.io/* are refused.",
    )
    service_account_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=SUBDOMAIN_PATTERN,
        description="ServiceAccount the engine pods run as.",
    )
    image_pull_secrets: list[LocalObjectReference] | None = Field(
        default=None, max_length=16, description="Secrets for pulling the engine image."
    )
    priority_class_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=SUBDOMAIN_PATTERN,
        description=(
            "Kubernetes PriorityClass for the kube scheduler (preemption between pods); "
            "placement.priorityClass is Kueue's WorkloadPriorityClass (queueing order)."
        ),
    )


# --- rollout -----------------------------------------------------------------------------------


class CanarySpec(ApiModel):
    """The canary: pods of a new pair next to the stable ones while it is judged."""

    replicas: int = Field(default=1, ge=1, description="Canary pods during analysis.")


class ConfigMapKeyRef(ApiModel):
    """A key of a ConfigMap in the SpeculativeDeployment's namespace."""

    name: str = Field(
        min_length=1, max_length=253, pattern=SUBDOMAIN_PATTERN, description="ConfigMap name."
    )
    key: str = Field(
        default="prompts",
        min_length=1,
        max_length=253,
        pattern=SECRET_KEY_PATTERN,
        description="Key within the ConfigMap.",
    )


class ProbeSpec(ApiModel):
    """The same prompts sent by every pod of every revision to its own vLLM before it serves.

    Each pod runs the probe once its model is loaded and reports Ready only after it; with a
    stable revision beside, the canary's pods get no user request until the judge compared
    the two revisions' probe figures (docs/operator.md, "The probe").
    """

    config_map_key_ref: ConfigMapKeyRef = Field(
        description=(
            "The prompts: a JSON list of strings, or one prompt per non-empty line (at most "
            "128 KiB: it reaches the engine as an environment variable)."
        )
    )
    max_tokens: int = Field(
        default=64, ge=1, le=4096, description="Tokens generated per prompt (end of text ignored)."
    )
    temperature: float = Field(
        default=0.0,
        ge=0,
        le=2,
        description=(
            "Sampling temperature. 0 (greedy) makes each revision's answer to a prompt "
            "deterministic, so acceptance compares exactly; a draft never changes a greedy answer."
        ),
    )
    timeout_seconds: int = Field(
        default=600,
        ge=1,
        le=86400,
        description=(
            "Longest the probe may run on a pod; a pod whose probe ran out reports Ready with "
            "what it measured, marked incomplete, and the judge does not compare it."
        ),
    )


class AnalysisSpec(ApiModel):
    """How a canary is judged. Unset fields take the operator's configured defaults."""

    interval: Duration | None = Field(default=None, description="Time between verdicts.")
    window: Duration | None = Field(
        default=None, description="Prometheus range each verdict looks at."
    )
    warmup: Duration | None = Field(
        default=None,
        description=(
            "Live time before the first counted window: the canary takes its share of "
            "requests meanwhile (its prefix cache, its compiled graphs warm up), and no verdict "
            "reads them. Intervals count from its end. Default 0s."
        ),
    )
    min_draft_tokens: int | None = Field(
        default=None,
        ge=0,
        description="Draft tokens a window needs for a verdict; fewer is Inconclusive.",
    )
    min_acceptance_rate: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description=(
            "A canary whose first-position acceptance (the share of drafts whose first token "
            "is accepted) is below this fails, live and on the probe. Unlike the acceptance "
            "rate it does not fall with numSpeculativeTokens; at k=1 the two are one."
        ),
    )
    max_drop_vs_stable: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description=(
            "A canary whose acceptance rate is more than this below the stable's fails; on the "
            "probe's prompts when both revisions ran the same probe, else on live traffic. With "
            "another numSpeculativeTokens than the stable's, on the mean acceptance over the "
            "draft positions both propose (a longer k's later positions are accepted less)."
        ),
    )
    max_time_per_output_token_increase: float | None = Field(
        default=None,
        ge=1,
        description=(
            "A canary whose time per output token (its mean decode step time over the tokens "
            "a step emits) is more than this many times the stable's over the same window "
            "fails: a draft that is accepted but slow to run loses. Compared per token, never "
            "per step: a speculative step is longer than a target-only one and emits more."
        ),
    )
    max_latency_increase: float | None = Field(
        default=None,
        ge=1,
        description=(
            "Deprecated name of maxTimePerOutputTokenIncrease (it is judged per output token); "
            "used when that is unset."
        ),
    )
    max_time_to_first_token_increase: float | None = Field(
        default=None,
        ge=1,
        description=(
            "A canary whose mean time to first token is more than this many times the "
            "stable's over the same window fails (a draft adds prefill work)."
        ),
    )
    time_to_first_token_tolerance: Duration | None = Field(
        default=None,
        description=(
            "A longer time to first token fails only when it is also more than this much "
            "longer than the stable's (e.g. 50ms): a draft's own first step adds milliseconds "
            "nobody notices, however large their ratio on a fast engine."
        ),
    )
    max_error_rate_increase: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description=(
            "A canary fails when the share of its finished requests that ended with an error "
            "or were aborted (vLLM's request_success_total by finished_reason) is more than "
            "this above the stable's share over the same window."
        ),
    )
    max_batch_size_ratio: float | None = Field(
        default=None,
        ge=1,
        description=(
            "Latency figures of the two revisions compare only when their running batch sizes "
            "(sequences per engine step over the window) are within this ratio of each other; "
            "beyond it the verdict is Inconclusive, since a busier engine steps slower."
        ),
    )
    max_throughput_drop: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description=(
            "An autotuned canary (it differs from the stable only by its speculation length) "
            "fails when its tokens per second are more than this share below the stable's; "
            "maxDropVsStable and maxTimePerOutputTokenIncrease do not apply to it."
        ),
    )
    failure_limit: int | None = Field(
        default=None,
        ge=1,
        description="Failed verdicts over the canary run that roll it back (reached).",
    )
    promote_after: int | None = Field(
        default=None, ge=1, description="Consecutive passing verdicts that promote the canary."
    )
    on_inconclusive: InconclusivePolicy | None = Field(
        default=None,
        description=(
            "What an inconclusive verdict does: Hold (wait, at most inconclusiveLimit verdicts "
            "in a row, then roll back), Promote or Rollback (at once)."
        ),
    )
    inconclusive_limit: int | None = Field(
        default=None,
        ge=1,
        le=10000,
        description=(
            "Inconclusive verdicts in a row after which a held canary is rolled back, so a "
            "canary nobody can judge (no traffic, no metrics) does not keep its GPUs."
        ),
    )
    probe: ProbeSpec | None = Field(
        default=None,
        description=(
            "Judge on identical prompts: every pod runs these prompts against its own vLLM "
            "before it serves, and the canary is compared with the stable on them first."
        ),
    )


class CollapseGuardSpec(ApiModel):
    """Watches the stable pair: acceptance can collapse when traffic drifts."""

    floor: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description=(
            "First-position acceptance (the share of drafts whose first token is accepted) "
            "below which speculation collapsed; it does not fall with numSpeculativeTokens."
        ),
    )
    for_: Duration = Field(
        default="10m",
        alias="for",
        description="How long acceptance must stay below the floor before the action.",
    )
    action: CollapseAction = Field(
        default="DisableSpeculation",
        description=(
            "DisableSpeculation rolls out the same target without a draft; RollbackToPrevious "
            "serves the previous revision; AlertOnly sets Degraded and emits an Event."
        ),
    )


class RolloutSpec(ApiModel):
    """How a new pair replaces the stable one."""

    canary: CanarySpec | None = Field(default=None, description="Canary size.")
    analysis: AnalysisSpec | None = Field(default=None, description="Canary verdicts.")
    progress_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Longest a new revision beside a stable one may take to get all its pods ready "
            "and, as a canary, its first conclusive verdict; past it the revision is rolled "
            "back (reason ProgressDeadlineExceeded) and its pods freed. Default: the "
            "operator's (1800)."
        ),
    )
    collapse_guard: CollapseGuardSpec | None = Field(
        default=None, description="Acceptance collapse guard on the stable pair."
    )
    max_surge: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Pods a new revision may run beyond replicas while it replaces the stable one "
            "(without a canary, or once a canary is promoted): it starts this many, and each "
            "of its pods that is ready lets one stable pod go, so the rollout never needs more "
            "than replicas + maxSurge pods' worth of GPUs and quota, and never fewer than "
            "replicas ready pods serve. Unset: all replicas at once beside the stable ones."
        ),
    )


class SpeculativeDeploymentSpec(ApiModel):
    """Desired state: the pair to serve, on what, and how to roll it out."""

    replicas: int = Field(default=1, ge=0, description="Serving pods of the stable pair.")
    pair: PairSpec = Field(description="The target and draft, versioned together.")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="vLLM settings.")
    model_source: ModelSource | None = Field(
        default=None,
        description="Where weights come from; absent means model ids are used as given.",
    )
    placement: PlacementSpec = Field(
        default_factory=PlacementSpec, description="Queue, GPUs, speculation policy."
    )
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="Canary and guard.")
    model_cache: ModelCacheSpec | None = Field(
        default=None,
        description=(
            "Volume for the hub cache (downloads survive restarts); without one the pods "
            "request ephemeral storage for the weights."
        ),
    )
    pod: PodOptions | None = Field(
        default=None,
        description="Labels, annotations, ServiceAccount, pull secrets, PriorityClass of pods.",
    )
    revision_history_limit: int = Field(
        default=5,
        ge=1,
        le=50,
        description="Past revisions kept in status and as scaled-down Deployments for rollback.",
    )


# --- status ------------------------------------------------------------------------------------


class Condition(ApiModel):
    """A condition as in metav1.Condition. Types and reasons: specdeploy.api.conditions."""

    type: str = Field(description="Condition type, e.g. Ready.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="CamelCase reason.")
    message: str = Field(default="", description="Human-readable detail.")
    observed_generation: int | None = Field(
        default=None, description="metadata.generation the condition was computed for."
    )
    last_transition_time: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When status last changed (RFC 3339).",
    )


class MemoryBreakdown(ApiModel):
    """Device memory the pair needs, in GiB."""

    target_weights_gib: float = Field(alias="targetWeightsGiB", description="Target weights.")
    draft_weights_gib: float = Field(alias="draftWeightsGiB", description="Draft weights.")
    kv_cache_gib: float = Field(
        alias="kvCacheGiB", description="KV cache reserved for engine.kvCacheTokens."
    )
    overhead_gib: float = Field(alias="overheadGiB", description="Activations and runtime.")
    required_gib: float = Field(alias="requiredGiB", description="Total for one replica.")
    per_device_gib: float = Field(
        alias="perDeviceGiB",
        description=(
            "Per GPU or slice, after tensor parallelism; across nodes, the GPU that holds the "
            "most (a rank of the last pipeline stage, which also runs the draft)."
        ),
    )


class SizingDecision(ApiModel):
    """What each replica gets: whole GPUs or a MIG slice, and why."""

    resource_name: str = Field(
        description=(
            "Extended resource, e.g. nvidia.com/gpu or nvidia.com/mig-3g.40gb; memory for CPU "
            "serving."
        )
    )
    count: int = Field(ge=1, description="Devices per pod (per node of a multi-node replica).")
    tensor_parallel_size: int = Field(ge=1, description="Target tensor parallel size.")
    nodes_per_replica: int | None = Field(
        default=None,
        description="Nodes (pods) of one replica when it spans more than one; none for one.",
    )
    pipeline_parallel_size: int | None = Field(
        default=None, description="Pipeline stages of the target across nodes; none for one."
    )
    draft_placement: str | None = Field(
        default=None,
        description="Multi-node replicas: which GPUs run the draft, and its tensor parallel size.",
    )
    gpu_product: str | None = Field(default=None, description="GPU product chosen.")
    mig_profile: str | None = Field(default=None, description="MIG profile, e.g. 3g.40gb.")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the sizing requires."
    )
    memory: MemoryBreakdown | None = Field(default=None, description="Memory estimate.")
    kv_cache_tokens: int | None = Field(
        default=None,
        description=(
            "Tokens of KV cache the chosen device holds once weights and overhead are in "
            "(target and draft layers), at gpuMemoryUtilization."
        ),
    )
    full_length_sequences: int | None = Field(
        default=None, description="kvCacheTokens / maxModelLen: full-length sequences that fit."
    )
    host_memory: str | None = Field(
        default=None,
        description="CPU serving: memory request and limit per replica (weights + KV + overhead).",
    )
    message: str = Field(default="", description="Why this size.")


class RevisionTarget(ApiModel):
    """The target of a recorded revision."""

    model: str = Field(description="Target model.")
    revision: str | None = Field(default=None, description="Target revision.")


class RevisionDraft(ApiModel):
    """The draft of a recorded revision."""

    method: str = Field(description="Draft method as served (none when speculation is off).")
    model: str | None = Field(default=None, description="Draft model.")
    revision: str | None = Field(default=None, description="Draft revision.")
    num_speculative_tokens: int | None = Field(default=None, description="k.")


class Verdict(ApiModel):
    """One analysis verdict on a revision, with the figures it was taken on (the stable's beside
    the canary's, over the same window)."""

    time: str = Field(json_schema_extra={"format": "date-time"}, description="When (RFC 3339).")
    interval: int | None = Field(
        default=None,
        description="The analysis interval it closed, counted from startedAt (-1: the probe).",
    )
    source: str = Field(
        default="Live",
        description=(
            "What was judged: Probe (the probe's identical prompts), Live (the window's "
            "traffic), Person (a kubectl specdeploy verb) or Deadline."
        ),
    )
    acceptance_rate: float | None = Field(default=None, description="Accepted/draft tokens.")
    stable_acceptance_rate: float | None = Field(
        default=None, description="The stable's, on the same prompts or over the same window."
    )
    mean_acceptance_length: float | None = Field(
        default=None, description="1 + accepted tokens per draft."
    )
    draft_tokens: int | None = Field(default=None, description="Draft tokens in the window.")
    step_seconds: float | None = Field(
        default=None,
        description=(
            "Decode step time as judged: the median of the window's stretches (one analysis "
            "interval each), each vLLM's inter-token latency sum over its count (one "
            "observation per step of each running sequence); the window's mean with fewer "
            "than three stretches."
        ),
    )
    time_per_output_token_seconds: float | None = Field(
        default=None,
        description=(
            "Decode time per decoded token, the latency a user feels: the median of the "
            "window's stretches' own (each its inter-token latency sum over the tokens it "
            "decoded); the window's with fewer than three stretches."
        ),
    )
    stable_time_per_output_token_seconds: float | None = Field(
        default=None, description="The stable's, over the same window."
    )
    time_to_first_token_seconds: float | None = Field(
        default=None, description="Mean time to first token (histogram sum over count)."
    )
    stable_time_to_first_token_seconds: float | None = Field(
        default=None, description="The stable's, over the same window."
    )
    error_rate: float | None = Field(
        default=None, description="Share of finished requests that ended in error or abort."
    )
    stable_error_rate: float | None = Field(
        default=None, description="The stable's, over the same window."
    )
    batch_size: float | None = Field(
        default=None, description="Running sequences per engine step over the window."
    )
    stable_batch_size: float | None = Field(
        default=None, description="The stable's, over the same window."
    )
    result: VerdictResult = Field(
        description=(
            "Pass, Fail or Inconclusive; Error when Prometheus could not be asked (not a "
            "verdict: nothing counts and the analysis is held)."
        )
    )
    message: str = Field(default="", description="Why.")


class ProbeFigures(ApiModel):
    """What one revision's pods measured on the probe's prompts (spec.rollout.analysis.probe),
    from vLLM's own counters over the probe alone, summed over the pods that reported."""

    prompt_set: str = Field(
        description="Fingerprint of the prompts and sampling settings: equal sets compare."
    )
    prompts: int = Field(default=0, description="Prompts in the set.")
    pods: int = Field(default=0, description="Pods whose probe figures are summed here.")
    complete: bool = Field(
        default=True, description="Every pod sent every prompt before its probe timed out."
    )
    requests: int = Field(default=0, description="Probe requests that finished.")
    errors: int = Field(default=0, description="Of those, ended in error or abort.")
    output_tokens: int = Field(default=0, description="Tokens generated.")
    draft_tokens: int = Field(default=0, description="Draft tokens proposed.")
    acceptance_rate: float | None = Field(default=None, description="Accepted/draft tokens.")
    mean_acceptance_length: float | None = Field(
        default=None, description="1 + accepted tokens per draft."
    )
    acceptance_per_position: list[float] = Field(
        default_factory=list, max_length=32, description="Accepted per draft, by position."
    )
    tokens_per_step: float | None = Field(
        default=None,
        description="Tokens a decode step emitted per sequence (1 without speculation).",
    )
    time_per_output_token_seconds: float | None = Field(
        default=None, description="Decode time per generated token (after the first)."
    )
    time_to_first_token_seconds: float | None = Field(
        default=None, description="Mean time to first token."
    )
    tokens_per_second: float | None = Field(
        default=None, description="Tokens one sequence got per second while decoding."
    )
    measured_at: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When the operator first read these figures.",
    )


class RevisionStatus(ApiModel):
    """One pair revision the SpeculativeDeployment has served or tried."""

    revision: str = Field(description="Revision hash (10 hex chars).")
    pair_version: str = Field(description="spec.pair.version of this revision.")
    target: RevisionTarget = Field(description="Target as served.")
    draft: RevisionDraft = Field(description="Draft as served.")
    phase: str = Field(description="Revision phase: see specdeploy.api.conditions.RevisionPhase.")
    created_at: str | None = Field(
        default=None, json_schema_extra={"format": "date-time"}, description="First seen."
    )
    verdicts: list[Verdict] = Field(
        default_factory=list,
        max_length=64,
        description="Its probe verdict and the latest others (10 in all), oldest first.",
    )
    probe: ProbeFigures | None = Field(
        default=None, description="What its pods measured on the probe's prompts, if any."
    )
    record: int | None = Field(
        default=None,
        description="Its revision record's number (kubectl specdeploy undo --to-revision N).",
    )
    retried: str | None = Field(
        default=None,
        description=(
            "The specdeploy.dev/retry value last honoured for it (kubectl specdeploy retry): "
            "it was tried again as a new canary; a later retry needs a new value."
        ),
    )


class SpeculationStatus(ApiModel):
    """Whether the serving pods speculate, and why."""

    state: SpeculationState = Field(description="Enabled or Disabled.")
    reason: str = Field(default="", description="CamelCase reason.")
    message: str = Field(default="", description="Detail.")


class AnalysisStatus(ApiModel):
    """The canary analysis under way (or last finished), kept here so restarts resume it."""

    revision: str = Field(description="The canary revision judged.")
    started_at: str = Field(
        json_schema_extra={"format": "date-time"},
        description=(
            "When it went live, intervals count from here: the second after its last canary pod"
            " turned Ready, or the whole second after the operator saw it if sooner, never"
            " before it was Ready (with a probe: when the probe was judged, cut to its second)."
        ),
    )
    last_interval: int = Field(default=-1, description="The last interval judged (-1: none).")
    passes_in_a_row: int = Field(default=0, description="Passing verdicts in a row.")
    failures: int = Field(default=0, description="Failed verdicts over the run.")
    inconclusive_in_a_row: int = Field(default=0, description="Inconclusive verdicts in a row.")
    restarts_at_live: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Container restarts of the canary's pods when its live analysis began: a restart "
            "after it rolls the canary back."
        ),
    )
    errors_in_a_row: int = Field(
        default=0,
        description=(
            "Intervals in a row Prometheus could not be asked about: not verdicts, the analysis "
            "is held while they last."
        ),
    )
    outcome: str = Field(default="Continue", description="Continue, Hold, Promote or Rollback.")
    message: str = Field(default="", description="The latest verdict's reason.")
    stage: str = Field(
        default="Live",
        description=(
            "Starting: its pods are not all ready yet; Probe: they ran the probe and get no "
            "user request until it is judged; Live: judged on live traffic every interval."
        ),
    )
    reason: str | None = Field(
        default=None,
        description=(
            "Why the analysis ended: Analysis, ProgressDeadlineExceeded, "
            "InconclusiveLimitReached, Aborted or Promoted (by a person)."
        ),
    )
    paused: bool = Field(
        default=False, description="A person paused it (kubectl specdeploy pause)."
    )
    judged_at: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When its first conclusive verdict (Pass or Fail) came.",
    )


class CollapseStatus(ApiModel):
    """The collapse guard's watch over the serving pair."""

    revision: str = Field(description="The pair revision (with its draft) watched.")
    below_since: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="Since when acceptance has stayed below the floor; none when it is not.",
    )
    triggered: bool = Field(default=False, description="The guard fired; its action holds.")
    action: str = Field(default="", description="The action taken when it fired.")
    message: str = Field(default="", description="The figures behind the latest decision.")
    resumed_with: str | None = Field(
        default=None,
        description="The resume annotation's value last acted on (a later resume needs a new one).",
    )


class AutotuneRecommendation(ApiModel):
    """The speculation length the autotuner recommends, and what it expects of it."""

    num_speculative_tokens: int = Field(description="Recommended k.")
    predicted_gain: float = Field(
        description="Predicted tokens per second over the current k's, relative (0.1 = +10 %)."
    )
    predicted_tokens_per_second: float | None = Field(
        default=None, description="Predicted tokens per second of one sequence at this k."
    )
    changed: bool = Field(
        default=False, description="The recommendation differs from the k served now."
    )
    message: str = Field(default="", description="Why this k.")
    calibration: bool = Field(
        default=False,
        description=(
            "A calibration trial (mode Apply): the draft's cost ratio has not been measured "
            "(one k served, no draftCostRatio), so a neighbouring k is served once through the "
            "canary to measure its step time, whatever its predicted gain."
        ),
    )
    schedule: list[ScheduleStep] | None = Field(
        default=None,
        max_length=16,
        description=(
            "Recommended length per running batch size (autotune.schedule Auto), when the "
            "batch size changes the best k; as spec.pair.draft.schedule it needs "
            "numSpeculativeTokens at least its largest tokens."
        ),
    )
    schedule_message: str = Field(
        default="", description="The schedule's predicted figures, or why there is none."
    )


class AutotuneStepCost(ApiModel):
    """The mean decode step time measured at one speculation length."""

    num_speculative_tokens: int = Field(description="k served (0: no speculation).")
    step_seconds: float = Field(description="Mean time between a sequence's decode steps.")
    batch_size: float | None = Field(default=None, description="Mean running batch size then.")
    beside_tokens: int | None = Field(
        default=None,
        description=(
            "Once measured as a tuned revision under trial: the k the stable revision served "
            "beside it over the same window."
        ),
    )
    step_ratio: float | None = Field(
        default=None,
        description=(
            "This k's mean step time over the stable's (besideTokens), both over that same "
            "window: a ratio that measures the draft cost ratio whatever the load then "
            "(docs/autotune.md). Kept when this k's step time is measured again alone."
        ),
    )


class AutotuneAcceptance(ApiModel):
    """The per-position acceptance measured at one speculation length of this pair."""

    revision: str = Field(description="The revision measured.")
    num_speculative_tokens: int = Field(description="k that revision served.")
    drafts: float = Field(description="Drafts in its window.")
    acceptance_per_position: list[float] = Field(
        default_factory=list,
        max_length=32,
        description="Accepted tokens per draft at each position (0-based), as measured.",
    )


class AutotuneInputs(ApiModel):
    """What the recommendation was computed from."""

    revision: str = Field(description="The serving revision measured.")
    num_speculative_tokens: int = Field(description="k that revision serves.")
    window: str = Field(description="Prometheus range read.")
    drafts: float = Field(description="Drafts in the window.")
    draft_tokens: float = Field(description="Draft tokens in the window.")
    acceptance_per_position: list[float] = Field(
        default_factory=list,
        max_length=32,
        description="Accepted tokens per draft at each position (0-based), as measured.",
    )
    mean_batch_size: float | None = Field(
        default=None,
        description="Running sequences per engine step over the window, exact from vLLM's "
        "counters (sequence steps over engine steps).",
    )
    max_batch_size: float | None = Field(
        default=None,
        description="The most running sequences a scrape saw in the window, never below "
        "meanBatchSize (a scrape can fall between short batches).",
    )
    step_costs: list[AutotuneStepCost] = Field(
        default_factory=list,
        max_length=33,
        description="Step times measured per k and batch-size range.",
    )
    longest_acceptance: AutotuneAcceptance | None = Field(
        default=None,
        description=(
            "The acceptance measured at the longest k this pair has served (a tuned revision "
            "under trial too, promoted or not). Past the served k's positions, the served "
            "acceptance continues with this one's conditional acceptance per position."
        ),
    )
    draft_cost_ratio: float = Field(description="Cost ratio of one speculative token used.")
    draft_cost_source: str = Field(
        description="Where the ratio came from: Spec, Measured or OperatorDefault."
    )


class AutotuneStatus(ApiModel):
    """The autotuner's latest recommendation and what it has rolled out (docs/autotune.md)."""

    recommendation: AutotuneRecommendation | None = Field(
        default=None, description="The latest recommendation; none until enough was measured."
    )
    inputs: AutotuneInputs | None = Field(default=None, description="Its measured inputs.")
    computed_at: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When the recommendation was last computed.",
    )
    message: str = Field(default="", description="Why there is no recommendation, if none.")
    applied_tokens: int | None = Field(
        default=None, description="k served instead of spec's numSpeculativeTokens (Apply)."
    )
    applied_at: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When the latest tuned revision was rolled out (cooldown counts from it).",
    )
    trial_revision: str | None = Field(
        default=None, description="The tuned revision the canary is judging."
    )
    previous_tokens: int | None = Field(
        default=None, description="k served before the tuned revision under trial."
    )
    rejected_tokens: list[int] = Field(
        default_factory=list,
        max_length=32,
        description="Tuned lengths the canary rolled back; not tried again for this spec.",
    )
    applied_schedule: list[ScheduleStep] | None = Field(
        default=None,
        max_length=16,
        description="Batch-size schedule served with applied_tokens as its largest k (Apply).",
    )
    previous_schedule: list[ScheduleStep] | None = Field(
        default=None, max_length=16, description="Schedule served before the trial, if any."
    )
    rejected_schedules: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="Tuned schedules the canary rolled back (as b<=max:k,...); not tried again.",
    )
    spec_fingerprint: str | None = Field(
        default=None,
        description="The draft spec the applied and rejected lengths belong to.",
    )


class RolloutProgress(ApiModel):
    """The revision the spec asks for, and since when: the progress deadline counts from here."""

    revision: str = Field(description="The desired revision.")
    since: str = Field(
        json_schema_extra={"format": "date-time"},
        description="When it became the desired revision (again).",
    )


class RefusedChildWrite(ApiModel):
    """A child the operator did not write: the API server refused it, or its name is taken."""

    kind: str = Field(description="The child's kind (Deployment, Service, PodMonitor, ...).")
    name: str = Field(description="The child's name.")
    reason: str = Field(
        description=(
            "ChildRejected: the API server answered 400 or 422 (not sent again for this "
            "generation); NameTaken: an object of that name exists that this SD does not own "
            "(looked at again at every reconcile; nothing is changed on it)."
        )
    )
    code: int | None = Field(default=None, description="The API server's HTTP status, if any.")
    message: str = Field(description="Why, with the API server's message and its field path.")
    generation: int | None = Field(
        default=None, description="metadata.generation whose write was refused."
    )
    since: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When it was first refused.",
    )


class SpeculativeDeploymentStatus(ApiModel):
    """Observed state, written by the operator."""

    observed_generation: int | None = Field(
        default=None, description="metadata.generation last acted on."
    )
    phase: str | None = Field(
        default=None, description="Summary phase: see specdeploy.api.conditions.Phase."
    )
    conditions: list[Condition] = Field(
        default_factory=list, description="Ready, Progressing, Degraded, PairCompatible, ..."
    )
    stable_revision: str | None = Field(default=None, description="Revision serving traffic.")
    canary_revision: str | None = Field(default=None, description="Revision being judged.")
    analysis: AnalysisStatus | None = Field(
        default=None, description="The canary analysis under way or last finished."
    )
    progress: RolloutProgress | None = Field(
        default=None, description="The desired revision and since when (progress deadline)."
    )
    collapse: CollapseStatus | None = Field(
        default=None, description="The collapse guard's watch over the serving pair."
    )
    revisions: list[RevisionStatus] = Field(
        default_factory=list, description="Bounded revision history, oldest first."
    )
    acceptance_rate: float | None = Field(
        default=None, description="Current acceptance rate of the stable revision."
    )
    mean_acceptance_length: float | None = Field(
        default=None, description="Current mean acceptance length of the stable revision."
    )
    measured_at: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When the acceptance figures last changed (read from Prometheus).",
    )
    speculation: SpeculationStatus | None = Field(
        default=None, description="Effective speculation."
    )
    sizing: SizingDecision | None = Field(default=None, description="Current sizing decision.")
    autotune: AutotuneStatus | None = Field(
        default=None, description="The speculation-length autotuner (spec.pair.draft.autotune)."
    )
    replicas: int | None = Field(default=None, description="Pods of this SD (scale subresource).")
    ready_replicas: int | None = Field(default=None, description="Ready pods.")
    selector: str | None = Field(
        default=None, description="Label selector of the pods (scale subresource)."
    )
    refused_writes: list[RefusedChildWrite] = Field(
        default_factory=list,
        max_length=32,
        description=(
            "Children not written, each with why; the rest of the reconcile goes on "
            "(the stable serves, a canary is judged, deadlines run)."
        ),
    )


class ObjectMeta(ApiModel):
    """The part of metadata the operator reads."""

    name: str = Field(description="Name.")
    namespace: str | None = Field(default=None, description="Namespace.")
    uid: str | None = Field(default=None, description="UID.")
    generation: int | None = Field(default=None, description="Generation.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations.")


class SpeculativeDeployment(ApiModel):
    """A target model and its speculative-decoding draft served as one versioned pair."""

    api_version: Literal["specdeploy.dev/v1alpha1"] = Field(
        default="specdeploy.dev/v1alpha1", description="specdeploy.dev/v1alpha1."
    )
    kind: Literal["SpeculativeDeployment"] = Field(
        default="SpeculativeDeployment", description="SpeculativeDeployment."
    )
    metadata: ObjectMeta = Field(description="Standard object metadata.")
    spec: SpeculativeDeploymentSpec = Field(description="Desired state.")
    status: SpeculativeDeploymentStatus | None = Field(default=None, description="Observed state.")

    @classmethod
    def from_body(cls, body: Any) -> SpeculativeDeployment:
        """Parse a CR as kopf or the Kubernetes client returns it (a mapping)."""
        return cls.model_validate(dict(body))
