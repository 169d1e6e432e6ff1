"""GPU and MIG sizing of a pair: how much device memory one replica needs, and what gives it.

memory = target weights + draft weights + KV cache (target and draft layers, for the KV budget
engine.kvCacheTokens, by default maxModelLen x min(maxNumSeqs, 16), never below one maxModelLen
sequence) + engine overhead per device, all divided by gpuMemoryUtilization. vLLM itself turns
whatever is left of gpuMemoryUtilization into KV blocks, so the decision also says how many tokens
(and full-length sequences) the chosen device holds. The smallest MIG slice that fits wins (policy
Auto or Required); else the fewest whole GPUs of one node with a valid tensor-parallel degree;
else the pair is Unschedulable, with the numbers. A pinned device (placement.gpu.count or
.migProfile) is checked rather than chosen. CPU serving (placement.device CPU) is sized in host
memory. docs/sizing.md walks through the arithmetic for the examples.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from specdeploy.api.config import OperatorConfig
from specdeploy.api.models import MemoryBreakdown, ModelShape, SizingDecision
from specdeploy.api.models import SpeculativeDeploymentSpec as Spec
from specdeploy.plan.placement.gpu_catalog import (
    GPU_PRODUCTS,
    PRODUCT_LABEL,
    WHOLE_GPU_RESOURCE,
    GpuNodeInventory,
    GpuProduct,
    MigOffer,
    catalog_for_config,
    find_product,
)
from specdeploy.plan.placement.model_catalog import (
    bytes_per_parameter,
    catalog_shape,
    eagle3_head_shape_for,
    head_dim,
    kv_bytes_per_element,
)

GIB = 2**30
# CUDA context, activations at the largest batch, CUDA graphs and communication buffers: what a
# vLLM worker holds on each device beyond weights and KV cache (measured 1-2 GiB on H100 for
# 8B-70B models; the round figure keeps sizing on the safe side).
ENGINE_OVERHEAD_GIB_PER_DEVICE = 2.0
# vLLM's defaults where the spec leaves them unset. maxModelLen has no engine default that
# sizing can use (vLLM takes the model's full context), so sizing assumes 8192 and says so.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_MAX_MODEL_LEN = 8192
DEFAULT_MAX_NUM_SEQS = 16
# Without engine.kvCacheTokens, sizing reserves KV for this many full-length sequences (fewer
# when maxNumSeqs is lower): enough for interactive serving; vLLM fills the rest of the device
# with more KV blocks anyway, and a batch queue states its own budget.
DEFAULT_KV_SEQUENCES = 16
# What a CPU vLLM process holds beside weights and its KV space (VLLM_CPU_KVCACHE_SPACE):
# Python, torch, tokenizer, activations; about 3 GiB measured with the tiny models.
CPU_OVERHEAD_GIB = 3.0
CPU_MEMORY_RESOURCE = "memory"
# Draft methods that load a separate checkpoint into device memory.
METHODS_WITH_DRAFT_WEIGHTS = frozenset({"eagle3", "eagle", "draft_model", "mtp"})


@dataclass(frozen=True)
class PairShapes:
    """The shapes sizing uses for the target and the draft (None: the draft holds no weights)."""

    target: ModelShape
    draft: ModelShape | None


@dataclass(frozen=True)
class ShapeUnknown:
    """The shapes of these models are neither in the spec nor in the catalog, nor fetched."""

    models: tuple[str, ...]

    @property
    def message(self) -> str:
        return (
            "no architecture shape for "
            + ", ".join(self.models)
            + ": set spec.pair.target.shape / spec.pair.draft.shape or make config.json readable"
        )


@dataclass(frozen=True)
class Unschedulable:
    """No GPU or MIG slice in the cluster holds one replica of the pair."""

    memory: MemoryBreakdown | None
    message: str


def draft_loads_weights(spec: Spec) -> bool:
    """Whether the effective draft puts a checkpoint of its own on the device."""
    draft = spec.pair.draft
    return draft.method in METHODS_WITH_DRAFT_WEIGHTS and (
        draft.model is not None or draft.method == "eagle3"
    )


def models_needing_shapes(spec: Spec) -> list[str]:
    """Models whose config.json must be read because neither the spec nor the catalog has them.

    An EAGLE-3 head without a shape is estimated from its target, so it never needs a fetch.
    """
    needed: list[str] = []
    target = spec.pair.target
    if target.shape is None and catalog_shape(target.model) is None:
        needed.append(target.model)
    draft = spec.pair.draft
    if (
        draft_loads_weights(spec)
        and draft.model is not None
        and draft.shape is None
        and draft.method != "eagle3"
        and catalog_shape(draft.model) is None
    ):
        needed.append(draft.model)
    return needed


def resolve_shapes(spec: Spec, fetched: Mapping[str, ModelShape]) -> PairShapes | ShapeUnknown:
    """The target's and draft's shapes: from the spec, else the catalog, else `fetched`."""
    target = spec.pair.target
    target_shape = target.shape or catalog_shape(target.model) or fetched.get(target.model)
    if target_shape is None:
        return ShapeUnknown((target.model,))
    draft = spec.pair.draft
    if not draft_loads_weights(spec):
        return PairShapes(target_shape, None)
    draft_shape = draft.shape
    if draft_shape is None and draft.model is not None:
        draft_shape = catalog_shape(draft.model) or fetched.get(draft.model)
    if draft_shape is None and draft.method == "eagle3":
        draft_shape = eagle3_head_shape_for(target_shape)
    if draft_shape is None and draft.method == "mtp":
        # MTP without a separate checkpoint reuses one target layer's worth of weights.
        draft_shape = target_shape.model_copy(
            update={
                "parameters_billion": target_shape.parameters_billion / target_shape.layers,
                "layers": 1,
            }
        )
    if draft_shape is None:
        return ShapeUnknown((draft.model or draft.method,))
    return PairShapes(target_shape, draft_shape)


@dataclass(frozen=True)
class MemoryNeed:
    """Memory of one replica before it is split across devices, in GiB."""

    target_weights_gib: float
    draft_weights_gib: float
    kv_cache_gib: float
    gpu_memory_utilization: float
    #: KV bytes one cached token takes (target and draft layers).
    kv_bytes_per_token: float = 0.0
    #: The context one sequence may reach (maxModelLen, or the default sizing assumes).
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    #: The KV budget reserved, in tokens.
    kv_tokens: int = 0

    def tokens_held(self, device_gib: float, devices: int) -> int:
        """KV tokens `devices` devices of `device_gib` hold once weights and overhead are in."""
        usable = device_gib * devices * self.gpu_memory_utilization
        free = usable - self.target_weights_gib - self.draft_weights_gib
        free -= ENGINE_OVERHEAD_GIB_PER_DEVICE * devices
        if free <= 0 or self.kv_bytes_per_token <= 0:
            return 0
        return int(free * GIB // self.kv_bytes_per_token)

    def held(self, device_gib: float, devices: int) -> tuple[int, int]:
        """(KV tokens, full-length sequences) the devices hold."""
        tokens = self.tokens_held(device_gib, devices)
        return tokens, tokens // self.max_model_len

    def breakdown(self, devices: int) -> MemoryBreakdown:
        """The breakdown when the replica spans `devices` devices (each pays the overhead)."""
        overhead = ENGINE_OVERHEAD_GIB_PER_DEVICE * devices
        required = (
            self.target_weights_gib + self.draft_weights_gib + self.kv_cache_gib + overhead
        ) / self.gpu_memory_utilization
        return MemoryBreakdown(
            target_weights_gib=round(self.target_weights_gib, 2),
            draft_weights_gib=round(self.draft_weights_gib, 2),
            kv_cache_gib=round(self.kv_cache_gib, 2),
            overhead_gib=round(overhead, 2),
            required_gib=round(required, 2),
            per_device_gib=round(required / devices, 2),
        )

    def per_device_gib(self, devices: int) -> float:
        """Unrounded GiB each of `devices` devices must have."""
        total = self.target_weights_gib + self.draft_weights_gib + self.kv_cache_gib
        total += ENGINE_OVERHEAD_GIB_PER_DEVICE * devices
        return total / self.gpu_memory_utilization / devices


def weights_gib(shape: ModelShape) -> float:
    """Device memory of a model's weights: parameters x bytes per parameter."""
    return shape.parameters_billion * 1e9 * bytes_per_parameter(shape) / GIB


def kv_bytes_per_token(shape: ModelShape) -> float:
    """KV bytes of one cached token: 2 (K and V) x layers x kvHeads x headDim x bytes."""
    return 2 * shape.layers * shape.kv_heads * head_dim(shape) * kv_bytes_per_element(shape)


def kv_cache_gib(shape: ModelShape, tokens: int) -> float:
    """KV cache for `tokens` cached tokens of this model."""
    return kv_bytes_per_token(shape) * tokens / GIB


def kv_budget_tokens(spec: Spec) -> int:
    """The KV tokens sizing reserves: engine.kvCacheTokens, else maxModelLen x
    min(maxNumSeqs, 16); never below one full-length sequence (maxModelLen tokens)."""
    engine = spec.engine
    max_model_len = engine.max_model_len or DEFAULT_MAX_MODEL_LEN
    if engine.kv_cache_tokens is not None:
        return max(engine.kv_cache_tokens, max_model_len)
    sequences = min(engine.max_num_seqs or DEFAULT_MAX_NUM_SEQS, DEFAULT_KV_SEQUENCES)
    return max_model_len * sequences


def memory_need(spec: Spec, shapes: PairShapes) -> MemoryNeed:
    """The pair's memory for its KV budget (kv_budget_tokens), weights and utilization."""
    engine = spec.engine
    tokens = kv_budget_tokens(spec)
    draft_weights = weights_gib(shapes.draft) if shapes.draft else 0.0
    per_token = kv_bytes_per_token(shapes.target)
    if shapes.draft is not None:
        per_token += kv_bytes_per_token(shapes.draft)
    return MemoryNeed(
        target_weights_gib=weights_gib(shapes.target),
        draft_weights_gib=draft_weights,
        kv_cache_gib=per_token * tokens / GIB,
        gpu_memory_utilization=engine.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION,
        kv_bytes_per_token=per_token,
        max_model_len=engine.max_model_len or DEFAULT_MAX_MODEL_LEN,
        kv_tokens=tokens,
    )


def valid_tensor_parallel_sizes(shape: ModelShape, max_devices: int) -> list[int]:
    """Powers of two up to `max_devices` that divide both the attention and the KV heads."""
    sizes: list[int] = []
    tp = 1
    while tp <= max_devices:
        if shape.attention_heads % tp == 0 and shape.kv_heads % tp == 0:
            sizes.append(tp)
        tp *= 2
    return sizes


def _wanted_product(spec: Spec, catalog: Sequence[GpuProduct]) -> GpuProduct | str | None:
    gpu = spec.placement.gpu
    if gpu is None or not gpu.product:
        return None
    return find_product(gpu.product, catalog) or gpu.product


def _product_matches(node: GpuNodeInventory, wanted: GpuProduct | str | None) -> bool:
    if wanted is None:
        return True
    if isinstance(wanted, GpuProduct):
        return node.product is not None and node.product.name == wanted.name
    return node.product_label == wanted


def choose_mig_profile(
    need: MemoryNeed,
    nodes: Iterable[GpuNodeInventory],
    wanted: GpuProduct | str | None = None,
    profile: str | None = None,
) -> tuple[GpuNodeInventory, MigOffer] | None:
    """The smallest MIG slice offered in the cluster that holds the whole replica (no TP).

    Smallest means least memory, then fewest compute slices; ties go to the node name.
    `profile` pins the slice: only offers of that profile count.
    """
    required = need.per_device_gib(1)
    fitting = [
        (node, offer)
        for node in nodes
        if _product_matches(node, wanted)
        for offer in node.mig_offers
        if offer.count > 0
        and offer.profile.memory_gib >= required
        and (profile is None or offer.profile.name == profile)
    ]
    if not fitting:
        return None
    return min(
        fitting,
        key=lambda pair: (
            pair[1].profile.memory_gib,
            pair[1].profile.compute_slices,
            pair[0].node_name,
        ),
    )


def choose_whole_gpus(
    need: MemoryNeed,
    target: ModelShape,
    nodes: Iterable[GpuNodeInventory],
    wanted: GpuProduct | str | None = None,
    forced_tp: int | None = None,
) -> tuple[GpuProduct, GpuNodeInventory, int] | None:
    """The fewest whole GPUs of one product on one node that hold the replica.

    Tensor parallel sizes are powers of two dividing the attention and KV heads; among equal
    counts the product with the least memory wins, leaving bigger GPUs for bigger models.
    """
    options: list[tuple[int, float, str, GpuProduct, GpuNodeInventory]] = []
    for node in nodes:
        if node.product is None or node.whole_gpus <= 0 or not _product_matches(node, wanted):
            continue
        for tp in valid_tensor_parallel_sizes(target, node.whole_gpus):
            if forced_tp is not None and tp != forced_tp:
                continue
            if need.per_device_gib(tp) <= node.product.memory_gib:
                options.append((tp, node.product.memory_gib, node.node_name, node.product, node))
                break
    if not options:
        return None
    tp, _, _, product, node = min(options, key=lambda o: (o[0], o[1], o[2]))
    return product, node, tp


def _largest_option(
    need: MemoryNeed, target: ModelShape, nodes: Sequence[GpuNodeInventory]
) -> tuple[str, MemoryBreakdown]:
    """A sentence on the biggest thing the cluster offers, and the breakdown at that size."""
    best: tuple[float, str, int] | None = None
    for node in nodes:
        if node.product is not None and node.whole_gpus > 0:
            sizes = valid_tensor_parallel_sizes(target, node.whole_gpus)
            if sizes:
                tp = sizes[-1]
                capacity = tp * node.product.memory_gib
                text = f"{tp} x {node.product.name} ({node.product.memory_gib:.1f} GiB each)"
                if best is None or capacity > best[0]:
                    best = (capacity, text, tp)
        for offer in node.mig_offers:
            capacity = offer.profile.memory_gib
            text = f"MIG {offer.profile.name} ({capacity:.1f} GiB)"
            if best is None or capacity > best[0]:
                best = (capacity, text, 1)
    if best is None:
        return "the cluster has no GPU nodes", need.breakdown(1)
    return f"the largest option is {best[1]}", need.breakdown(best[2])


def _describe(memory: MemoryBreakdown, utilization: float) -> str:
    return (
        f"{memory.required_gib:.1f} GiB per replica = (target weights "
        f"{memory.target_weights_gib:.1f} + draft weights {memory.draft_weights_gib:.1f} + "
        f"KV cache {memory.kv_cache_gib:.1f} + overhead {memory.overhead_gib:.1f}) / "
        f"gpuMemoryUtilization {utilization:g}"
    )


def _pinned_refusal(
    need: MemoryNeed,
    *,
    target: ModelShape,
    nodes: Sequence[GpuNodeInventory],
    catalog: Sequence[GpuProduct],
    wanted: GpuProduct | str | None,
    count: int | None,
    profile: str | None,
) -> str | None:
    """Why a pinned device cannot hold the replica, with the arithmetic; None when the pin
    holds it by memory (then no node offers it)."""
    utilization = need.gpu_memory_utilization
    if profile is not None:
        offered = [
            o.profile
            for n in nodes
            if _product_matches(n, wanted)
            for o in n.mig_offers
            if o.profile.name == profile
        ]
        known = offered or [
            p
            for product in catalog
            if wanted is None or wanted in (product, product.name)
            for p in product.mig_profiles
            if p.name == profile
        ]
        if not known:
            return None
        slice_ = max(known, key=lambda p: p.memory_gib)
        device, devices, device_gib = f"MIG {profile}", 1, slice_.memory_gib
    else:
        assert count is not None
        if count not in valid_tensor_parallel_sizes(target, count):
            return (
                f"the pinned count {count} is no valid tensor parallel size: it must be a power "
                f"of two dividing the target's {target.attention_heads} attention heads and "
                f"{target.kv_heads} KV heads"
            )
        products = [
            n.product
            for n in nodes
            if n.product is not None and n.whole_gpus >= count and _product_matches(n, wanted)
        ]
        if not products and isinstance(wanted, GpuProduct):
            products = [wanted]
        if not products:
            return None
        product = max(products, key=lambda p: p.memory_gib)
        device, devices, device_gib = f"{count} x {product.name}", count, product.memory_gib
    per_device = need.per_device_gib(devices)
    if per_device <= device_gib:
        return None
    tokens = need.tokens_held(device_gib, devices)
    memory = need.breakdown(devices)
    return (
        f"the pinned device {device} ({device_gib:.1f} GiB each) is too small: it needs "
        f"{per_device:.1f} GiB per device, {_describe(memory, utilization)}; after weights and "
        f"overhead {devices} x {device_gib:.1f} GiB x {utilization:g} holds {tokens} KV tokens, "
        f"below the budget of {need.kv_tokens} (engine.kvCacheTokens; one full-length sequence "
        f"is {need.max_model_len})"
    )


def _held_fields(need: MemoryNeed, device_gib: float, devices: int) -> dict[str, int]:
    tokens, sequences = need.held(device_gib, devices)
    return {"kv_cache_tokens": tokens, "full_length_sequences": sequences}


def nodes_giving(
    decision: SizingDecision, nodes: Iterable[GpuNodeInventory]
) -> list[GpuNodeInventory]:
    """The nodes, reduced to the offers that give exactly `decision`'s device (its resource,
    MIG profile and count, on nodes matching its node selector)."""
    found: list[GpuNodeInventory] = []
    for node in nodes:
        if any(node.labels.get(k) != v for k, v in decision.node_selector.items()):
            continue
        if decision.mig_profile is not None:
            offers = tuple(
                o
                for o in node.mig_offers
                if o.profile.name == decision.mig_profile
                and o.resource_name == decision.resource_name
            )
            if offers:
                found.append(replace(node, whole_gpus=0, mig_offers=offers))
        elif decision.resource_name == WHOLE_GPU_RESOURCE and node.whole_gpus >= decision.count:
            found.append(replace(node, mig_offers=()))
    return found


def keep_sizing(
    spec: Spec,
    previous: SizingDecision,
    known_nodes: Sequence[GpuNodeInventory],
    config: OperatorConfig,
    *,
    catalog: Sequence[GpuProduct] | None = None,
    fetched_shapes: Mapping[str, ModelShape] | None = None,
) -> SizingDecision | None:
    """`previous` re-decided for `spec` on the devices that give it, among every node the
    cluster knows (cordoned ones too); None when the spec's policy, pins or memory no longer
    allow that device, or for CPU serving (which no node changes)."""
    if previous.host_memory is not None or spec.placement.device == "CPU":
        return None
    result = size_pair(spec, nodes_giving(previous, known_nodes), config, catalog, fetched_shapes)
    if not isinstance(result, SizingDecision):
        return None
    same = (
        result.resource_name == previous.resource_name
        and result.count == previous.count
        and result.node_selector == previous.node_selector
    )
    return result if same else None


def size_for_cpu(need: MemoryNeed) -> SizingDecision:
    """CPU serving: host memory for weights, the KV space (whole GiB, as vLLM's CPU backend
    takes VLLM_CPU_KVCACHE_SPACE) and the process's overhead; no GPU, no MIG."""
    kv_gib = float(max(1, math.ceil(need.kv_cache_gib)))
    required = need.target_weights_gib + need.draft_weights_gib + kv_gib + CPU_OVERHEAD_GIB
    host = math.ceil(required)
    tokens = int(kv_gib * GIB // need.kv_bytes_per_token) if need.kv_bytes_per_token else 0
    memory = MemoryBreakdown(
        target_weights_gib=round(need.target_weights_gib, 2),
        draft_weights_gib=round(need.draft_weights_gib, 2),
        kv_cache_gib=kv_gib,
        overhead_gib=CPU_OVERHEAD_GIB,
        required_gib=round(required, 2),
        per_device_gib=round(required, 2),
    )
    return SizingDecision(
        resource_name=CPU_MEMORY_RESOURCE,
        count=1,
        tensor_parallel_size=1,
        memory=memory,
        kv_cache_tokens=tokens,
        full_length_sequences=tokens // need.max_model_len,
        host_memory=f"{host}Gi",
        message=(
            f"CPU serving: {host}Gi of host memory = target weights "
            f"{memory.target_weights_gib:.2f} + draft weights {memory.draft_weights_gib:.2f} + "
            f"KV space {kv_gib:g} (VLLM_CPU_KVCACHE_SPACE) + overhead {CPU_OVERHEAD_GIB:g} GiB, "
            f"rounded up"
        ),
    )


def downloads_weights(spec: Spec) -> bool:
    """Whether the engine downloads the weights at start (hub ids), rather than reading them
    from a volume (modelSource.pvc) or a local path."""
    source = spec.model_source
    if source is not None and source.pvc is not None:
        return False
    return not spec.pair.target.model.startswith(("/", "./", "../"))


def download_storage(spec: Spec, sizing: SizingDecision) -> str | None:
    """The ephemeral-storage request of a pod that downloads its weights into its writable
    layer (no modelCache): the weights on disk plus 10 % and 1 GiB for tokenizer, config and
    logs, whole GiB. None when nothing is downloaded, or a cache volume holds it."""
    if spec.model_cache is not None or not downloads_weights(spec) or sizing.memory is None:
        return None
    weights = sizing.memory.target_weights_gib + sizing.memory.draft_weights_gib
    return f"{math.ceil(weights * 1.1 + 1)}Gi"


def cpu_kv_space_gib(sizing: SizingDecision) -> int | None:
    """VLLM_CPU_KVCACHE_SPACE for a CPU sizing decision (None for GPU sizing)."""
    if sizing.host_memory is None or sizing.memory is None:
        return None
    return int(sizing.memory.kv_cache_gib)


def size_pair(
    spec: Spec,
    nodes: Sequence[GpuNodeInventory],
    config: OperatorConfig,
    catalog: Sequence[GpuProduct] | None = None,
    fetched_shapes: Mapping[str, ModelShape] | None = None,
) -> SizingDecision | Unschedulable | ShapeUnknown:
    """Decides what one replica of the pair runs on.

    Order: with MIG policy Auto or Required, the smallest MIG slice that fits (tensor parallel
    1); with Auto or Never, the fewest whole GPUs of one node; else Unschedulable with the
    memory it needs and the largest option the cluster has. A pinned count or MIG profile
    restricts the choice to that device, and a pin too small is Unschedulable with the
    arithmetic. CPU serving needs no node inventory. Shapes come from the spec, the shipped
    catalog, then `fetched_shapes`; without them the answer is ShapeUnknown.
    """
    products = tuple(catalog) if catalog is not None else catalog_for_config(config, GPU_PRODUCTS)
    shapes = resolve_shapes(spec, fetched_shapes or {})
    if isinstance(shapes, ShapeUnknown):
        return shapes
    need = memory_need(spec, shapes)
    if spec.placement.device == "CPU":
        return size_for_cpu(need)
    gpu = spec.placement.gpu
    mig_policy = gpu.mig if gpu else "Auto"
    pinned_count = gpu.count if gpu else None
    pinned_profile = gpu.mig_profile if gpu else None
    wanted = _wanted_product(spec, products)
    forced_tp = spec.engine.tensor_parallel_size
    forced = pinned_count or (forced_tp if isinstance(forced_tp, int) else None)
    spread = spec.placement.nodes_per_replica
    if isinstance(spread, int) and spread > 1:
        # Pinned across nodes: one node is never tried.
        across = size_across_nodes(spec, need, shapes, nodes, wanted)
        if across is not None:
            return across
        return _unschedulable_across(spec, need, shapes, nodes, wanted=wanted, spread=spread)

    if mig_policy != "Never" and pinned_count is None and forced in (None, 1):
        mig = choose_mig_profile(need, nodes, wanted, pinned_profile)
        if mig is not None:
            node, offer = mig
            memory = need.breakdown(1)
            selector: dict[str, str] = {}
            # Under `single` the resource is nvidia.com/gpu: only the label tells the slice.
            if node.product_label and (
                offer.resource_name == WHOLE_GPU_RESOURCE or wanted is not None
            ):
                selector[PRODUCT_LABEL] = node.product_label
            held = _held_fields(need, offer.profile.memory_gib, 1)
            chosen = "the pinned slice" if pinned_profile else "the smallest slice that"
            return SizingDecision(
                resource_name=offer.resource_name,
                count=1,
                tensor_parallel_size=1,
                gpu_product=node.product_name,
                mig_profile=offer.profile.name,
                node_selector=selector,
                memory=memory,
                **held,
                message=(
                    f"MIG {offer.profile.name} ({offer.profile.memory_gib:.1f} GiB) is {chosen} "
                    f"holds {_describe(memory, need.gpu_memory_utilization)}; it holds "
                    f"{held['kv_cache_tokens']} KV tokens, "
                    f"{held['full_length_sequences']} full-length sequences"
                ),
            )

    if mig_policy != "Required" and pinned_profile is None:
        whole = choose_whole_gpus(need, shapes.target, nodes, wanted, forced)
        if whole is not None:
            product, node, tp = whole
            memory = need.breakdown(tp)
            selector = {PRODUCT_LABEL: node.product_label} if node.product_label else {}
            noun = "GPU" if tp == 1 else "GPUs"
            held = _held_fields(need, product.memory_gib, tp)
            return SizingDecision(
                resource_name=WHOLE_GPU_RESOURCE,
                count=tp,
                tensor_parallel_size=tp,
                gpu_product=product.name,
                mig_profile=None,
                node_selector=selector,
                memory=memory,
                **held,
                message=(
                    f"{tp} {product.name} {noun} with tensor parallel {tp} "
                    f"({memory.per_device_gib:.1f} of {product.memory_gib:.1f} GiB each) hold "
                    f"{_describe(memory, need.gpu_memory_utilization)}; they hold "
                    f"{held['kv_cache_tokens']} KV tokens, "
                    f"{held['full_length_sequences']} full-length sequences"
                ),
            )

    if spread == "auto" and mig_policy != "Required":
        across = size_across_nodes(spec, need, shapes, nodes, wanted)
        if across is not None:
            return across

    if pinned_count is not None or pinned_profile is not None:
        refusal = _pinned_refusal(
            need,
            target=shapes.target,
            nodes=nodes,
            catalog=products,
            wanted=wanted,
            count=pinned_count,
            profile=pinned_profile,
        )
        if refusal is not None:
            devices = pinned_count or 1
            return Unschedulable(memory=need.breakdown(devices), message=refusal)
        device = f"MIG {pinned_profile}" if pinned_profile else f"{pinned_count} whole GPUs"
        scope = f" of product {gpu.product}" if gpu and gpu.product else ""
        return Unschedulable(
            memory=need.breakdown(pinned_count or 1),
            message=(
                f"the pinned device {device} would hold the pair, but no schedulable node "
                f"offers it{scope}"
            ),
        )

    relevant = [n for n in nodes if _product_matches(n, wanted)]
    if mig_policy == "Required":
        relevant = [
            GpuNodeInventory(
                n.node_name, n.product, n.product_label, n.mig_strategy, 0, n.mig_offers, n.labels
            )
            for n in relevant
        ]
    elif mig_policy == "Never":
        relevant = [
            GpuNodeInventory(
                n.node_name, n.product, n.product_label, n.mig_strategy, n.whole_gpus, (), n.labels
            )
            for n in relevant
        ]
    largest, memory = _largest_option(need, shapes.target, relevant)
    limits = []
    if wanted is not None:
        limits.append(f"product {wanted.name if isinstance(wanted, GpuProduct) else wanted}")
    if mig_policy != "Auto":
        limits.append(f"MIG {mig_policy}")
    if forced is not None:
        limits.append(f"tensor parallel {forced}")
    scope = f" (with {', '.join(limits)})" if limits else ""
    hint = ""
    if spread == 1 and mig_policy != "Required":
        # What spreading the replica over nodes would take, so the user knows the way on.
        across = size_across_nodes(
            spec.model_copy(
                update={
                    "placement": spec.placement.model_copy(update={"nodes_per_replica": "auto"})
                }
            ),
            need,
            shapes,
            nodes,
            wanted,
        )
        if across is not None and across.nodes_per_replica is not None:
            hint = (
                f"; with placement.nodesPerReplica auto it would span {across.nodes_per_replica}"
                f" nodes x {across.count} {across.gpu_product} GPUs"
            )
    return Unschedulable(
        memory=memory,
        message=(
            f"needs {_describe(memory, need.gpu_memory_utilization)}; nothing in the "
            f"cluster fits{scope}: {largest}, {memory.per_device_gib:.1f} GiB needed per "
            f"device{hint}"
        ),
    )


def _unschedulable_across(
    spec: Spec,
    need: MemoryNeed,
    shapes: PairShapes,
    nodes: Sequence[GpuNodeInventory],
    *,
    wanted: GpuProduct | str | None,
    spread: int,
) -> Unschedulable:
    """Why no `spread` nodes hold the replica: the most loaded GPU at the largest layout the
    cluster's nodes allow, against the GPU's memory."""
    best: tuple[float, str] | None = None
    for node in nodes:
        if node.product is None or node.whole_gpus <= 0 or not _product_matches(node, wanted):
            continue
        gpus = 1
        while gpus * 2 <= node.whole_gpus:
            gpus *= 2
        layout = layout_for(spec, shapes, spread, gpus)
        if layout is None:
            continue
        per_gpu = rank_memory(need, shapes, layout).total_gib / need.gpu_memory_utilization
        text = (
            f"{spread} nodes x {gpus} {node.product.name} GPUs would need {per_gpu:.1f} GiB on "
            f"the most loaded GPU, which has {node.product.memory_gib:.1f}"
        )
        if best is None or node.product.memory_gib - per_gpu > best[0]:
            best = (node.product.memory_gib - per_gpu, text)
    memory = need.breakdown(spread)
    where = best[1] if best else "the cluster has no whole GPUs of a product that fits the layout"
    within = (
        f" sharing a value of {spec.placement.topology_key}" if spec.placement.topology_key else ""
    )
    return Unschedulable(
        memory=memory,
        message=(
            f"needs {_describe(memory, need.gpu_memory_utilization)}; no {spread} nodes"
            f"{within} hold it (placement.nodesPerReplica {spread}, engine.acrossNodes "
            f"{spec.engine.across_nodes}): {where}"
        ),
    )


# --- replicas across nodes ------------------------------------------------------------------------

#: The most nodes `nodesPerReplica: auto` considers for one replica.
MAX_AUTO_NODES = 8


@dataclass(frozen=True)
class NodeLayout:
    """How one replica spans nodes: `gpus` GPUs on each of `nodes` nodes, the target split into
    `pipeline` stages (one per node) of tensor parallel `tensor`, the draft at tensor parallel
    `draft_tensor` on the last stage's GPUs (with pipeline 1, on every GPU of the replica)."""

    nodes: int
    gpus: int
    tensor: int
    pipeline: int
    draft_tensor: int

    @property
    def devices(self) -> int:
        return self.nodes * self.gpus


def layout_for(spec: Spec, shapes: PairShapes, nodes: int, gpus: int) -> NodeLayout | None:
    """The parallel layout of `nodes` x `gpus` GPUs under engine.acrossNodes, or None when vLLM
    cannot split the target so (tensor parallel must divide the attention heads, and the KV
    heads or be a multiple of them; no more pipeline stages than layers)."""
    target = shapes.target
    if spec.engine.across_nodes == "TensorParallel":
        tensor, pipeline = nodes * gpus, 1
    else:
        tensor, pipeline = gpus, nodes
    heads_ok = target.attention_heads % tensor == 0 and (
        target.kv_heads % tensor == 0 or tensor % target.kv_heads == 0
    )
    if not heads_ok or pipeline > target.layers:
        return None
    wanted = spec.pair.draft.draft_tensor_parallel_size
    draft_tensor = wanted if wanted is not None else tensor
    if draft_tensor not in (1, tensor):
        return None
    return NodeLayout(nodes, gpus, tensor, pipeline, draft_tensor)


@dataclass(frozen=True)
class RankMemory:
    """What one GPU of the replica's most loaded rank holds, in GiB (before utilization)."""

    target_weights_gib: float
    target_kv_gib: float
    draft_weights_gib: float
    draft_kv_gib: float
    #: Layers of the target on this rank's stage, of how many.
    stage_layers: int
    layers: int
    #: KV bytes one cached token takes on this GPU (target layers of its stage, and the draft).
    kv_bytes_per_token: float

    @property
    def total_gib(self) -> float:
        return (
            self.target_weights_gib
            + self.target_kv_gib
            + self.draft_weights_gib
            + self.draft_kv_gib
            + ENGINE_OVERHEAD_GIB_PER_DEVICE
        )


def _kv_split(shape: ModelShape, tensor: int) -> int:
    """Ranks the KV heads are split over: tensor parallel beyond the KV heads replicates them."""
    return min(tensor, shape.kv_heads)


def rank_memory(need: MemoryNeed, shapes: PairShapes, layout: NodeLayout) -> RankMemory:
    """One GPU of the last pipeline stage (the most loaded: it also runs the draft): its share
    of the target's layers (ceil(layers / stages)), their weights and KV split over the stage's
    tensor parallel ranks, and the draft's weights and KV split over its own tensor parallel."""
    target = shapes.target
    stage_layers = math.ceil(target.layers / layout.pipeline)
    share = stage_layers / target.layers
    target_kv_token = kv_bytes_per_token(target) * share / _kv_split(target, layout.tensor)
    draft_kv_token = 0.0
    draft_weights = 0.0
    if shapes.draft is not None:
        draft_kv_token = kv_bytes_per_token(shapes.draft) / _kv_split(
            shapes.draft, layout.draft_tensor
        )
        draft_weights = need.draft_weights_gib / layout.draft_tensor
    return RankMemory(
        target_weights_gib=need.target_weights_gib * share / layout.tensor,
        target_kv_gib=target_kv_token * need.kv_tokens / GIB,
        draft_weights_gib=draft_weights,
        draft_kv_gib=draft_kv_token * need.kv_tokens / GIB,
        stage_layers=stage_layers,
        layers=target.layers,
        kv_bytes_per_token=target_kv_token + draft_kv_token,
    )


def _rank_tokens(need: MemoryNeed, rank: RankMemory, device_gib: float) -> int:
    """KV tokens the replica holds: what the most loaded GPU has left after its weights and
    overhead, over the KV bytes a token takes there."""
    free = device_gib * need.gpu_memory_utilization - rank.target_weights_gib
    free -= rank.draft_weights_gib + ENGINE_OVERHEAD_GIB_PER_DEVICE
    if free <= 0 or rank.kv_bytes_per_token <= 0:
        return 0
    return int(free * GIB // rank.kv_bytes_per_token)


def draft_placement(shapes: PairShapes, layout: NodeLayout) -> str:
    """Which GPUs of a multi-node replica run the draft."""
    if shapes.draft is None:
        return "no draft weights (the target alone, or a draft without a checkpoint)"
    where = (
        f"the last pipeline stage (node {layout.nodes} of {layout.nodes})"
        if layout.pipeline > 1
        else f"every node ({layout.devices} ranks)"
    )
    return f"on {where}, tensor parallel {layout.draft_tensor}"


def _domains(nodes: Sequence[GpuNodeInventory], key: str | None) -> list[list[GpuNodeInventory]]:
    """The nodes grouped by their value of the topology label (one group of all without one);
    nodes without the label belong to no group when a key is given."""
    if key is None:
        return [list(nodes)]
    groups: dict[str, list[GpuNodeInventory]] = {}
    for node in nodes:
        value = node.labels.get(key)
        if value is not None:
            groups.setdefault(value, []).append(node)
    return [groups[v] for v in sorted(groups)]


@dataclass(frozen=True)
class MultiNodeChoice:
    product: GpuProduct
    node: GpuNodeInventory
    layout: NodeLayout
    rank: RankMemory


def choose_nodes(
    spec: Spec,
    need: MemoryNeed,
    shapes: PairShapes,
    nodes: Sequence[GpuNodeInventory],
    *,
    wanted: GpuProduct | str | None,
    node_counts: Sequence[int],
) -> MultiNodeChoice | None:
    """The fewest nodes (of `node_counts`), then the fewest GPUs per node, then the product with
    less memory, whose most loaded GPU holds its share of the replica; the nodes must be of one
    product, each offering the GPUs, and share a value of placement.topologyKey when it is set."""
    gpu = spec.placement.gpu
    pinned_count = gpu.count if gpu else None
    forced = spec.engine.tensor_parallel_size
    options: list[tuple[int, int, float, str, MultiNodeChoice]] = []
    for domain in _domains(nodes, spec.placement.topology_key):
        by_product: dict[str, list[GpuNodeInventory]] = {}
        for node in domain:
            if node.product is None or node.whole_gpus <= 0 or not _product_matches(node, wanted):
                continue
            by_product.setdefault(node.product.name, []).append(node)
        for members in by_product.values():
            product = members[0].product
            assert product is not None
            for count in node_counts:
                for gpus in (1, 2, 4, 8, 16, 32, 64):
                    if pinned_count is not None and gpus != pinned_count:
                        continue
                    offering = [n for n in members if n.whole_gpus >= gpus]
                    if len(offering) < count:
                        continue
                    layout = layout_for(spec, shapes, count, gpus)
                    if layout is None or (isinstance(forced, int) and layout.tensor != forced):
                        continue
                    rank = rank_memory(need, shapes, layout)
                    if rank.total_gib / need.gpu_memory_utilization > product.memory_gib:
                        continue
                    node = min(offering, key=lambda n: n.node_name)
                    choice = MultiNodeChoice(product, node, layout, rank)
                    options.append((count, gpus, product.memory_gib, node.node_name, choice))
                    break
    if not options:
        return None
    return min(options, key=lambda o: o[:4])[4]


def multi_node_counts(spec: Spec) -> list[int]:
    """The node counts a replica may span beyond one: the pinned one, or 2 to MAX_AUTO_NODES."""
    wanted = spec.placement.nodes_per_replica
    if isinstance(wanted, int):
        return [wanted] if wanted > 1 else []
    return list(range(2, MAX_AUTO_NODES + 1))


def size_across_nodes(
    spec: Spec,
    need: MemoryNeed,
    shapes: PairShapes,
    nodes: Sequence[GpuNodeInventory],
    wanted: GpuProduct | str | None,
) -> SizingDecision | None:
    """A replica spread over nodes (placement.nodesPerReplica above 1 or auto), or None."""
    counts = multi_node_counts(spec)
    choice = (
        choose_nodes(spec, need, shapes, nodes, wanted=wanted, node_counts=counts)
        if counts
        else None
    )
    if choice is None:
        return None
    layout, rank, product = choice.layout, choice.rank, choice.product
    memory = need.breakdown(layout.devices)
    per_gpu = rank.total_gib / need.gpu_memory_utilization
    memory = memory.model_copy(update={"per_device_gib": round(per_gpu, 2)})
    tokens = _rank_tokens(need, rank, product.memory_gib)
    selector = {PRODUCT_LABEL: choice.node.product_label} if choice.node.product_label else {}
    split = (
        f"pipeline parallel {layout.pipeline} x tensor parallel {layout.tensor}"
        if layout.pipeline > 1
        else f"tensor parallel {layout.tensor} across the nodes"
    )
    draft = draft_placement(shapes, layout)
    return SizingDecision(
        resource_name=WHOLE_GPU_RESOURCE,
        count=layout.gpus,
        tensor_parallel_size=layout.tensor,
        nodes_per_replica=layout.nodes,
        pipeline_parallel_size=layout.pipeline,
        draft_placement=draft,
        gpu_product=product.name,
        node_selector=selector,
        memory=memory,
        kv_cache_tokens=tokens,
        full_length_sequences=tokens // need.max_model_len,
        message=(
            f"{layout.nodes} nodes x {layout.gpus} {product.name} GPUs, {split}, hold "
            f"{_describe(memory, need.gpu_memory_utilization)}; the most loaded GPU (last "
            f"stage: {rank.stage_layers} of {rank.layers} layers, draft {draft}) needs "
            f"{per_gpu:.1f} of {product.memory_gib:.1f} GiB = (target weights "
            f"{rank.target_weights_gib:.1f} + target KV {rank.target_kv_gib:.1f} + draft "
            f"weights {rank.draft_weights_gib:.1f} + draft KV {rank.draft_kv_gib:.1f} + "
            f"overhead {ENGINE_OVERHEAD_GIB_PER_DEVICE:.1f}) / gpuMemoryUtilization "
            f"{need.gpu_memory_utilization:g}; the replica holds {tokens} KV tokens, "
            f"{tokens // need.max_model_len} full-length sequences"
        ),
    )
