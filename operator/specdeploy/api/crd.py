"""Generate the SpeculativeDeployment CustomResourceDefinition from the pydantic models.

The API server accepts only *structural* schemas, so pydantic's JSON Schema is rewritten:
`$ref`/`$defs` are inlined, `Optional[X]` becomes X with `nullable: true` (never `anyOf` with
null), numeric `exclusiveMinimum` becomes OpenAPI 3.0's boolean form, titles go, and defaults
are kept only for scalar fields outside status (the API server stores those). Cross-field rules
are CEL (`x-kubernetes-validations`), listed in `CEL_RULES` with the reasons for each.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from specdeploy import GROUP, VERSION
from specdeploy.api.contract import MULTI_NODE_FLAGS, OPERATOR_OWNED_FLAGS
from specdeploy.api.models import (
    KIND,
    LABEL_KEY_PATTERN,
    LABEL_VALUE_PATTERN,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    SpeculativeDeployment,
    SpeculativeDeploymentSpec,
    SpeculativeDeploymentStatus,
)

CATEGORIES = ("specdeploy", "all")
CRD_NAME = f"{PLURAL}.{GROUP}"
CRD_FILE_NAME = f"{GROUP}_{PLURAL}.yaml"

_MIG_REQUIRED = (
    "has(self.placement) && has(self.placement.gpu) && has(self.placement.gpu.mig)"
    " && self.placement.gpu.mig == 'Required'"
)
_TP_INT = (
    "has(self.engine) && has(self.engine.tensorParallelSize)"
    " && type(self.engine.tensorParallelSize) == int"
)
_HUB = "has(self.modelSource) && has(self.modelSource.hub)"
# A replica that spans more than one node (placement.nodesPerReplica a number above 1, or auto).
_MULTI_NODE_HERE = (
    "has(self.nodesPerReplica) && (type(self.nodesPerReplica) == int"
    " ? self.nodesPerReplica > 1 : self.nodesPerReplica == 'auto')"
)
_MULTI_NODE = "has(self.placement) && " + _MULTI_NODE_HERE.replace("self.", "self.placement.")
_NODES_INT = (
    "has(self.placement) && has(self.placement.nodesPerReplica)"
    " && type(self.placement.nodesPerReplica) == int"
)
_TP_ACROSS = (
    f"({_MULTI_NODE}) && has(self.engine) && has(self.engine.acrossNodes)"
    " && self.engine.acrossNodes == 'TensorParallel'"
)
_PVC = "has(self.modelSource) && has(self.modelSource.pvc)"
# A `..` path segment: joined under the volume's mount it would leave it.
_DOT_DOT = "'(^|/)[.][.](/|$)'"
# A label key's parts within their lengths: prefix up to 253, name up to 63 (the pattern on the
# field, or the rule's first match, checks the characters).
_LABEL_KEY_LENGTHS = "'^([^/]{1,253}/)?[^/]{1,63}$'"
# Hub tokens go in as a Secret reference (spec.modelSource.hub.tokenSecretRef), never as text in
# the spec, where anyone who can read the SD would read them.
HUB_TOKEN_ENV_NAMES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
# What extraArgs may not name: the operator's own flags, `--model` (a second model beside the
# positional one) and `--config` (a YAML file of more arguments, read past these checks).
REFUSED_EXTRA_FLAGS = (*OPERATOR_OWNED_FLAGS, "--model", "--config")


def _cel_regex(pattern: str) -> str:
    """A regex as a CEL string literal's content: CEL knows no `\\.` escape, `[.]` says it."""
    return pattern.replace("\\.", "[.]")


def refused_flags_regex(flags: tuple[str, ...]) -> str:
    """A regex matching an argument that names one of `flags` or a prefix of one (argparse takes
    unambiguous prefixes: `--served-model` is `--served-model-name`), alone, with `=value`, or
    with vLLM's `.key` form (`--speculative-config.method=...` edits the config flag)."""
    names = sorted(
        {flag[2:][:n] for flag in flags for n in range(1, len(flag) - 1)},
        key=lambda n: (-len(n), n),
    )
    return "^--(" + "|".join(names) + ")([=.].*)?$"


def _gpu_pin(field: str) -> str:
    return f"has(self.placement) && has(self.placement.gpu) && has(self.placement.gpu.{field})"


@dataclass(frozen=True)
class CelRule:
    """One `x-kubernetes-validations` entry.

    Every rule sits on an object (never on a list or a scalar); the API server's error reads
    `<error_path>: Invalid value: <message>` (Kubernetes v1.36; older servers put the type,
    `"object": `, before the message).

    `path` is the dotted location in the CR ("" for the root, "spec.pair.draft", ...);
    `field_path` (relative, starting with ".") is the field the API server's error names.
    """

    path: str
    rule: str
    message: str
    field_path: str | None = None

    @property
    def error_path(self) -> str:
        """The field path the API server puts in front of the message."""
        full = self.path + (self.field_path or "")
        return full.lstrip(".")


CEL_RULES: tuple[CelRule, ...] = (
    # vLLM loads eagle/eagle3 heads and draft models from a checkpoint; without one it fails
    # at start-up, long after `kubectl apply` said yes.
    CelRule(
        path="spec.pair.draft",
        rule="!(self.method in ['eagle3', 'eagle', 'draft_model']) || has(self.model)",
        message="draft.model is required for methods eagle3, eagle and draft_model",
        field_path=".model",
    ),
    # ngram and suffix propose from the text itself; a model there would be ignored and
    # mislead a reader (and the pair check). mtp may name one (default: the target's layers).
    CelRule(
        path="spec.pair.draft",
        rule="!(self.method in ['ngram', 'suffix', 'none']) || !has(self.model)",
        message="draft.model must be empty for methods ngram, suffix and none",
        field_path=".model",
    ),
    CelRule(
        path="spec.pair.draft",
        rule="self.method == 'none' || has(self.numSpeculativeTokens)",
        message="numSpeculativeTokens (at least 1) is required unless method is none",
        field_path=".numSpeculativeTokens",
    ),
    CelRule(
        path="spec.pair.draft",
        rule="self.method != 'none' || !has(self.schedule)",
        message="method none takes no schedule",
        field_path=".schedule",
    ),
    # A step may not speculate further than the pods were started with: k is fixed per pod.
    CelRule(
        path="spec.pair.draft",
        rule="self.method == 'none' || !has(self.schedule) || (has(self.numSpeculativeTokens)"
        " && self.schedule.all(s, s.tokens <= self.numSpeculativeTokens))",
        message="schedule tokens must not exceed numSpeculativeTokens",
        field_path=".schedule",
    ),
    # Ranges are [previous maxBatchSize + 1, maxBatchSize]; equal or descending bounds would
    # make empty or overlapping ranges. The first range starts at 1 (schema minimum).
    CelRule(
        path="spec.pair.draft",
        rule="!has(self.schedule) || (self.schedule.map(s, s.maxBatchSize).isSorted()"
        " && self.schedule.all(s, self.schedule.exists_one(t, t.maxBatchSize == s.maxBatchSize)))",
        message="schedule maxBatchSize values must ascend strictly",
        field_path=".schedule",
    ),
    # The last range ("off above") ends at maxNumSeqs, so it must be known and not below.
    CelRule(
        path="spec",
        rule="!has(self.pair.draft.schedule) || (has(self.engine) && has(self.engine.maxNumSeqs)"
        " && self.pair.draft.schedule.all(s, s.maxBatchSize <= self.engine.maxNumSeqs))",
        message="a schedule needs engine.maxNumSeqs, and no maxBatchSize may exceed it",
        field_path=".pair.draft.schedule",
    ),
    # The autotuner chooses numSpeculativeTokens: a method without one has nothing to tune.
    CelRule(
        path="spec.pair.draft",
        rule="!has(self.autotune) || !has(self.autotune.mode) || self.autotune.mode == 'Off'"
        " || self.method != 'none'",
        message="autotune needs a method with numSpeculativeTokens (not none)",
        field_path=".autotune.mode",
    ),
    # Apply replaces numSpeculativeTokens at every batch size; a schedule's steps could then
    # exceed the tuned k (pods start with k fixed) or contradict it.
    CelRule(
        path="spec.pair.draft",
        rule="!has(self.autotune) || !has(self.autotune.mode) || self.autotune.mode != 'Apply'"
        " || !has(self.schedule)",
        message="autotune mode Apply takes no schedule",
        field_path=".autotune.mode",
    ),
    # A tuned length is a prediction: it must pass the canary before it serves everyone.
    CelRule(
        path="spec",
        rule="!has(self.pair.draft.autotune) || !has(self.pair.draft.autotune.mode)"
        " || self.pair.draft.autotune.mode != 'Apply'"
        " || (has(self.rollout) && (has(self.rollout.canary) || has(self.rollout.analysis)))",
        message="autotune mode Apply needs a canary (rollout.canary or rollout.analysis)",
        field_path=".pair.draft.autotune.mode",
    ),
    # A schedule's last range ends at maxNumSeqs (see the schedule rule above).
    CelRule(
        path="spec",
        rule="!has(self.pair.draft.autotune) || !has(self.pair.draft.autotune.schedule)"
        " || self.pair.draft.autotune.schedule != 'Auto'"
        " || (has(self.engine) && has(self.engine.maxNumSeqs))",
        message="autotune schedule Auto needs engine.maxNumSeqs",
        field_path=".pair.draft.autotune.schedule",
    ),
    # Defaults are stored before the rules run, so both bounds are always there.
    CelRule(
        path="spec.pair.draft.autotune",
        rule="!has(self.minTokens) || !has(self.maxTokens) || self.minTokens <= self.maxTokens",
        message="minTokens must not exceed maxTokens",
        field_path=".minTokens",
    ),
    # vLLM accepts a draft tensor parallel size of 1 or the target's.
    CelRule(
        path="spec",
        rule="!has(self.pair.draft.draftTensorParallelSize)"
        " || self.pair.draft.draftTensorParallelSize == 1"
        f" || ({_TP_INT} && self.pair.draft.draftTensorParallelSize"
        " == self.engine.tensorParallelSize)",
        message="draftTensorParallelSize must be 1 or equal engine.tensorParallelSize",
        field_path=".pair.draft.draftTensorParallelSize",
    ),
    CelRule(
        path="spec.engine",
        rule="!has(self.tensorParallelSize) || (type(self.tensorParallelSize) == int"
        " ? self.tensorParallelSize >= 1 : self.tensorParallelSize == 'auto')",
        message="tensorParallelSize must be a positive integer or auto",
        field_path=".tensorParallelSize",
    ),
    # A MIG slice is one device with no NVLink peer: tensor parallelism needs whole GPUs.
    CelRule(
        path="spec",
        rule=f"!({_MIG_REQUIRED}) || !({_TP_INT}) || self.engine.tensorParallelSize <= 1",
        message="placement.gpu.mig Required allows no tensorParallelSize above 1",
        field_path=".engine.tensorParallelSize",
    ),
    CelRule(
        path="spec.modelSource",
        rule="has(self.hub) != has(self.pvc)",
        message="set exactly one of hub or pvc",
    ),
    # Pinning is what makes a revision reproducible: "main" today is another model tomorrow.
    CelRule(
        path="spec",
        rule=f"!({_HUB}) || has(self.pair.target.revision)",
        message="with modelSource.hub the target must be pinned by revision",
        field_path=".pair.target.revision",
    ),
    CelRule(
        path="spec",
        rule=f"!({_HUB}) || !has(self.pair.draft.model) || has(self.pair.draft.revision)",
        message="with modelSource.hub the draft model must be pinned by revision",
        field_path=".pair.draft.revision",
    ),
    CelRule(
        path="spec",
        rule="!has(self.placement) || !has(self.placement.speculation)"
        " || self.placement.speculation != 'Enabled' || self.pair.draft.method != 'none'",
        message="placement.speculation Enabled needs a draft method other than none",
        field_path=".placement.speculation",
    ),
    # Scaled to zero, the canary size does not matter; otherwise it may not outnumber the
    # stable pods it is compared with.
    CelRule(
        path="spec",
        rule="!has(self.rollout) || !has(self.rollout.canary) || !has(self.rollout.canary.replicas)"
        " || !has(self.replicas) || self.replicas == 0"
        " || self.rollout.canary.replicas <= self.replicas",
        message="rollout.canary.replicas must not exceed replicas",
        field_path=".rollout.canary.replicas",
    ),
    # Also under an abbreviation or vLLM's `--flag.key=value` form, which would edit the
    # operator's flag rather than repeat it.
    CelRule(
        path="spec.engine",
        rule="!has(self.extraArgs) || self.extraArgs.all(a, !a.matches('"
        + refused_flags_regex(REFUSED_EXTRA_FLAGS)
        + "'))",
        message="extraArgs must not set flags the operator sets (nor their abbreviations): "
        + ", ".join(REFUSED_EXTRA_FLAGS),
        field_path=".extraArgs",
    ),
    CelRule(
        path="spec",
        rule=f"!({_MULTI_NODE}) || !has(self.engine) || !has(self.engine.extraArgs)"
        " || self.engine.extraArgs.all(a, !a.matches('"
        + refused_flags_regex(MULTI_NODE_FLAGS)
        + "'))",
        message="extraArgs of a replica across nodes must not set the multi-node launch the "
        "operator sets (nor abbreviations): " + ", ".join(MULTI_NODE_FLAGS),
        field_path=".engine.extraArgs",
    ),
    CelRule(
        path="spec.engine",
        rule="!has(self.env) || self.env.all(e, !e.name.startsWith('SPECDEPLOY_'))",
        message="env names starting with SPECDEPLOY_ are reserved for the operator",
        field_path=".env",
    ),
    CelRule(
        path="spec.engine",
        rule="!has(self.env) || self.env.all(e, !(e.name in ["
        + ", ".join(f"'{name}'" for name in HUB_TOKEN_ENV_NAMES)
        + "]))",
        message="the hub token is not set in env: use modelSource.hub.tokenSecretRef",
        field_path=".env",
    ),
    # vLLM loads the models from paths; a `..` segment would leave the volume (pvc) or point
    # anywhere in the container.
    CelRule(
        path="spec.pair.target",
        rule=f"!has(self.model) || !self.model.matches({_DOT_DOT})",
        message="model must not contain a '..' path segment",
        field_path=".model",
    ),
    CelRule(
        path="spec.pair.draft",
        rule=f"!has(self.model) || !self.model.matches({_DOT_DOT})",
        message="model must not contain a '..' path segment",
        field_path=".model",
    ),
    CelRule(
        path="spec.modelSource.pvc",
        rule=f"!has(self.path) || !self.path.matches({_DOT_DOT})",
        message="path must not contain a '..' path segment",
        field_path=".path",
    ),
    CelRule(
        path="spec",
        rule=f"!({_PVC}) || !has(self.pair.target.model)"
        " || !self.pair.target.model.matches('^[/~]')",
        message="with modelSource.pvc the target model is a path relative to the volume",
        field_path=".pair.target.model",
    ),
    CelRule(
        path="spec",
        rule=f"!({_PVC}) || !has(self.pair.draft.model) || !self.pair.draft.model.matches('^[/~]')",
        message="with modelSource.pvc the draft model is a path relative to the volume",
        field_path=".pair.draft.model",
    ),
    # Node selector keys are label keys (a map's keys have no schema of their own).
    CelRule(
        path="spec.placement",
        rule="!has(self.nodeSelector) || self.nodeSelector.all(k, k.matches('"
        + _cel_regex(LABEL_KEY_PATTERN)
        + f"') && k.matches({_LABEL_KEY_LENGTHS}))",
        message="nodeSelector keys must be label keys ([prefix/]name, name at most 63 chars)",
        field_path=".nodeSelector",
    ),
    CelRule(
        path="spec.pair.target.shape",
        rule="self.kvHeads <= self.attentionHeads",
        message="kvHeads must not exceed attentionHeads",
        field_path=".kvHeads",
    ),
    CelRule(
        path="spec.pair.draft.shape",
        rule="self.kvHeads <= self.attentionHeads",
        message="kvHeads must not exceed attentionHeads",
        field_path=".kvHeads",
    ),
    # --- sizing pins, CPU serving, model cache, pod options ---
    # One full-length sequence is the least vLLM starts with; the default maxModelLen is the
    # model's own context, which admission cannot know, so the rule needs maxModelLen set.
    CelRule(
        path="spec.engine",
        rule="!has(self.kvCacheTokens) || !has(self.maxModelLen)"
        " || self.kvCacheTokens >= self.maxModelLen",
        message="kvCacheTokens must hold at least one full-length sequence (maxModelLen tokens)",
        field_path=".kvCacheTokens",
    ),
    CelRule(
        path="spec.placement.gpu",
        rule="!has(self.count) || !has(self.migProfile)",
        message="pin either count (whole GPUs) or migProfile (one slice), not both",
    ),
    CelRule(
        path="spec.placement.gpu",
        rule="!has(self.migProfile) || !has(self.mig) || self.mig != 'Never'",
        message="migProfile needs mig Auto or Required",
        field_path=".migProfile",
    ),
    CelRule(
        path="spec.placement.gpu",
        rule="!has(self.count) || !has(self.mig) || self.mig != 'Required'",
        message="count pins whole GPUs: it needs mig Auto or Never",
        field_path=".count",
    ),
    # The pinned count is the tensor parallel degree: two different numbers cannot both hold.
    CelRule(
        path="spec",
        rule=f"!({_gpu_pin('count')}) || !({_TP_INT}) || ({_TP_ACROSS})"
        " || self.engine.tensorParallelSize == self.placement.gpu.count",
        message="placement.gpu.count and engine.tensorParallelSize must be equal when both are set",
        field_path=".placement.gpu.count",
    ),
    CelRule(
        path="spec",
        rule=f"!({_gpu_pin('migProfile')}) || !({_TP_INT}) || self.engine.tensorParallelSize <= 1",
        message="a pinned migProfile allows no tensorParallelSize above 1",
        field_path=".engine.tensorParallelSize",
    ),
    # --- replicas across nodes (LeaderWorkerSet groups) ---
    CelRule(
        path="spec.placement",
        rule="!has(self.nodesPerReplica) || (type(self.nodesPerReplica) == int"
        " ? self.nodesPerReplica >= 1 && self.nodesPerReplica <= 64"
        " : self.nodesPerReplica == 'auto')",
        message="nodesPerReplica must be an integer from 1 to 64, or auto",
        field_path=".nodesPerReplica",
    ),
    # A MIG slice is a part of one GPU: nothing of it reaches another node.
    CelRule(
        path="spec.placement",
        rule=f"!({_MULTI_NODE_HERE}) || !has(self.gpu) || ((!has(self.gpu.mig)"
        " || self.gpu.mig != 'Required') && !has(self.gpu.migProfile))",
        message="a replica across nodes runs on whole GPUs: no mig Required, no migProfile",
        field_path=".nodesPerReplica",
    ),
    # The CPU engine is one process on one host.
    CelRule(
        path="spec.placement",
        rule=f"!({_MULTI_NODE_HERE}) || !has(self.device) || self.device != 'CPU'",
        message="device CPU serves a replica on one node: nodesPerReplica must be 1",
        field_path=".nodesPerReplica",
    ),
    CelRule(
        path="spec.placement",
        rule=f"!has(self.topologyKey) || ({_MULTI_NODE_HERE})",
        message="topologyKey places the nodes of one replica together: it needs "
        "nodesPerReplica other than 1",
        field_path=".topologyKey",
    ),
    # vLLM splits the world (tensor x pipeline ranks) evenly over --nnodes.
    CelRule(
        path="spec",
        rule=f"!({_TP_ACROSS}) || !({_TP_INT}) || !({_NODES_INT})"
        " || self.engine.tensorParallelSize % self.placement.nodesPerReplica == 0",
        message="with acrossNodes TensorParallel, tensorParallelSize must be a multiple of "
        "placement.nodesPerReplica (vLLM splits the ranks evenly over the nodes)",
        field_path=".engine.tensorParallelSize",
    ),
    CelRule(
        path="spec",
        rule=f"!({_TP_ACROSS}) || !({_TP_INT}) || !({_gpu_pin('count')})"
        " || (self.engine.tensorParallelSize % self.placement.gpu.count == 0"
        f" && (!({_NODES_INT}) || self.engine.tensorParallelSize"
        " == self.placement.gpu.count * self.placement.nodesPerReplica))",
        message="with acrossNodes TensorParallel, tensorParallelSize must be placement.gpu.count "
        "(GPUs per node) x nodesPerReplica",
        field_path=".engine.tensorParallelSize",
    ),
    CelRule(
        path="spec.placement",
        rule="!has(self.device) || self.device != 'CPU' || !has(self.gpu)",
        message="device CPU takes no gpu settings (no GPU, no MIG)",
        field_path=".gpu",
    ),
    CelRule(
        path="spec.modelCache",
        rule="has(self.claimName) != has(self.ephemeral)",
        message="set exactly one of claimName or ephemeral",
    ),
    # Weights on a volume are read where they are: there is nothing to download or cache.
    CelRule(
        path="spec",
        rule="!has(self.modelCache) || !has(self.modelSource) || !has(self.modelSource.pvc)",
        message="modelCache caches hub downloads; with modelSource.pvc nothing is downloaded",
        field_path=".modelCache",
    ),
    # The operator's labels select and count its pods: a pod label of the same key would make
    # its pods someone else's, or another revision's.
    CelRule(
        path="spec.pod",
        rule="!has(self.labels) || self.labels.all(k, !k.startsWith('specdeploy.dev/')"
        " && !k.startsWith('kueue.x-k8s.io/') && k != 'app.kubernetes.io/managed-by')",
        message="pod.labels must not set the operator's own keys (specdeploy.dev/*, "
        "kueue.x-k8s.io/*, app.kubernetes.io/managed-by)",
        field_path=".labels",
    ),
    CelRule(
        path="spec.pod",
        rule="!has(self.labels) || self.labels.all(k, size(self.labels[k]) <= 63"
        " && self.labels[k].matches('" + LABEL_VALUE_PATTERN + "'))",
        message="pod.labels values must be label values (63 characters of [-A-Za-z0-9_.], "
        "alphanumeric at both ends)",
        field_path=".labels",
    ),
    CelRule(
        path="spec.pod",
        rule="!has(self.annotations) || self.annotations.all(k,"
        " !k.startsWith('specdeploy.dev/') && !k.startsWith('prometheus.io/'))",
        message="pod.annotations must not set the operator's own keys (specdeploy.dev/*, "
        "prometheus.io/*)",
        field_path=".annotations",
    ),
    CelRule(
        path="spec.placement.tolerations.items",
        rule="!has(self.operator) || self.operator != 'Exists' || !has(self.value)"
        " || self.value == ''",
        message="a toleration with operator Exists takes no value",
        field_path=".value",
    ),
    CelRule(
        path="spec.placement.tolerations.items",
        rule="(has(self.key) && self.key != '')"
        " || (has(self.operator) && self.operator == 'Exists')",
        message="a toleration without a key needs operator Exists",
        field_path=".operator",
    ),
    CelRule(
        path="spec.placement.tolerations.items",
        rule="!has(self.key) || self.key.matches(" + _LABEL_KEY_LENGTHS + ")",
        message="a toleration key's name is at most 63 characters, its prefix 253",
        field_path=".key",
    ),
    CelRule(
        path="spec.placement.tolerations.items",
        rule="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
        message="tolerationSeconds needs effect NoExecute",
        field_path=".tolerationSeconds",
    ),
)

# Lists whose items are identified by a key: the API server rejects duplicates and server-side
# apply merges them by key.
LIST_MAP_KEYS: dict[str, list[str]] = {
    "status.conditions": ["type"],
    "spec.engine.env": ["name"],
}

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Pair", "type": "string", "jsonPath": ".spec.pair.version"},
    {"name": "Revision", "type": "string", "jsonPath": ".status.stableRevision"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
    {"name": "Acceptance", "type": "number", "jsonPath": ".status.acceptanceRate"},
    {"name": "Queue", "type": "string", "jsonPath": ".spec.placement.queue"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Canary", "type": "string", "jsonPath": ".status.canaryRevision", "priority": 1},
    {
        "name": "Speculation",
        "type": "string",
        "jsonPath": ".status.speculation.state",
        "priority": 1,
    },
    {"name": "Target", "type": "string", "jsonPath": ".spec.pair.target.model", "priority": 1},
    {"name": "Draft", "type": "string", "jsonPath": ".spec.pair.draft.method", "priority": 1},
]

# The name becomes the Service name (a DNS-1035 label) and, with "-<10 hex>", each Deployment's
# name and a label value: at most 63 characters. CRDs may restrict metadata.name this way, and a
# schema check costs nothing, where a CEL regex over an unbounded string would.
MAX_NAME_LENGTH = 52
METADATA_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {
            "type": "string",
            "maxLength": MAX_NAME_LENGTH,
            "pattern": "^[a-z]([-a-z0-9]*[a-z0-9])?$",
        }
    },
}

# propertyNames (a map's keys) is no part of a structural schema: CEL rules check those keys.
_DROPPED_KEYS = frozenset({"title", "$defs", "examples", "propertyNames"})


class SchemaError(ValueError):
    """The models use a construct a structural schema cannot express."""


def structural_schema(model: type[BaseModel], *, keep_defaults: bool) -> dict[str, Any]:
    """The model's schema in the structural OpenAPI v3 form the API server accepts."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _to_structural(raw, raw.get("$defs", {}), keep_defaults=keep_defaults)


def _to_structural(
    node: dict[str, Any], defs: dict[str, Any], *, keep_defaults: bool
) -> dict[str, Any]:
    node = dict(node)
    nullable = False
    base: dict[str, Any] = {}
    if "$ref" in node:
        base = copy.deepcopy(defs[node.pop("$ref").rsplit("/", 1)[-1]])
    elif "allOf" in node and len(node["allOf"]) == 1:
        base = node.pop("allOf")[0]
    elif "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        members = [m for m in node.pop("anyOf") if m != {"type": "null"}]
        if len(members) != 1:
            raise SchemaError(f"union without x-kubernetes-int-or-string: {members}")
        nullable = True
        base = members[0]
    if base:
        # The outer node's keys (description, default) win over the referenced model's.
        inner = _to_structural(base, defs, keep_defaults=keep_defaults)
        return _finish({**inner, **node}, nullable=nullable, keep_defaults=keep_defaults)

    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "properties":
            out[key] = {
                name: _to_structural(sub, defs, keep_defaults=keep_defaults)
                for name, sub in value.items()
            }
        elif key == "items":
            out[key] = _to_structural(value, defs, keep_defaults=keep_defaults)
        elif key == "additionalProperties":
            if isinstance(value, dict):
                out[key] = _to_structural(value, defs, keep_defaults=keep_defaults)
        elif key == "patternProperties":
            # A map with constrained keys: a structural schema has no patternProperties; its
            # values' schema stays (additionalProperties), CEL rules check the keys.
            (values,) = value.values()
            out["additionalProperties"] = _to_structural(values, defs, keep_defaults=keep_defaults)
        elif key == "const":
            out["enum"] = [value]
        else:
            out[key] = value
    return _finish(out, nullable=False, keep_defaults=keep_defaults)


def _finish(node: dict[str, Any], *, nullable: bool, keep_defaults: bool) -> dict[str, Any]:
    node = {k: v for k, v in node.items() if k not in _DROPPED_KEYS}
    if nullable:
        node["nullable"] = True
    if "default" in node:
        value = node["default"]
        if not keep_defaults or value is None or isinstance(value, dict | list):
            del node["default"]
    for bound, flag in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        value = node.get(bound)
        if isinstance(value, int | float) and not isinstance(value, bool):
            node[flag] = value
            node[bound] = True
    if "properties" in node:
        node.setdefault("type", "object")
    if "enum" in node and "type" not in node:
        node["type"] = "string"
    return node


_KEY_ORDER = (
    "description",
    "type",
    "nullable",
    "format",
    "pattern",
    "enum",
    "default",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "x-kubernetes-int-or-string",
    "anyOf",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "x-kubernetes-validations",
)


def _ordered(node: dict[str, Any]) -> dict[str, Any]:
    """Same schema, keys in a reading order (description first, rules last)."""
    rank = {key: index for index, key in enumerate(_KEY_ORDER)}
    out: dict[str, Any] = {}
    for key in sorted(node, key=lambda k: (rank.get(k, len(rank)), k)):
        value = node[key]
        if key == "properties":
            value = {name: _ordered(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            value = _ordered(value)
        out[key] = value
    return out


def _locate(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node = schema
    for part in [p for p in path.split(".") if p]:
        node = node["items"] if part == "items" else node["properties"][part]
    return node


def openapi_v3_schema() -> dict[str, Any]:
    """The complete openAPIV3Schema of the CRD, CEL rules and list types included."""
    spec = structural_schema(SpeculativeDeploymentSpec, keep_defaults=True)
    status = structural_schema(SpeculativeDeploymentStatus, keep_defaults=False)
    schema: dict[str, Any] = {
        "type": "object",
        "description": (SpeculativeDeployment.__doc__ or "").strip(),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": METADATA_SCHEMA,
            "spec": spec,
            "status": status,
        },
    }
    for path, keys in LIST_MAP_KEYS.items():
        node = _locate(schema, path)
        node["x-kubernetes-list-type"] = "map"
        node["x-kubernetes-list-map-keys"] = keys
    for rule in CEL_RULES:
        entry: dict[str, str] = {"rule": rule.rule, "message": rule.message}
        if rule.field_path:
            entry["fieldPath"] = rule.field_path
        _locate(schema, rule.path).setdefault("x-kubernetes-validations", []).append(entry)
    return _ordered(schema)


def build_crd() -> dict[str, Any]:
    """The SpeculativeDeployment CustomResourceDefinition as a dict."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/part-of": "specdeploy"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": list(CATEGORIES),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_v3_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def render_crd_yaml() -> str:
    """The CRD as the YAML committed under crds/ (stable key order, no aliases)."""
    header = "# Generated by `make crds` from specdeploy/api/models.py. Do not edit.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=100, allow_unicode=True)


def write_crds(out_dir: Path) -> list[Path]:
    """Write the CRD YAML into out_dir; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / CRD_FILE_NAME
    target.write_text(render_crd_yaml(), encoding="utf-8")
    return [target]
