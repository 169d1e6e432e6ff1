"""Sizing: MIG tables, inventory from node labels, the MIG / whole-GPU / Unschedulable choice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from specdeploy.api.config import OperatorConfig
from specdeploy.api.models import ModelShape, SizingDecision
from specdeploy.api.models import SpeculativeDeploymentSpec as Spec
from specdeploy.plan.placement.gpu_catalog import (
    GPU_PRODUCTS,
    GpuNodeInventory,
    catalog_for_config,
    find_product,
    read_gpu_inventories,
    read_gpu_inventory,
)
from specdeploy.plan.placement.model_catalog import catalog_shape
from specdeploy.plan.placement.sizing import (
    ENGINE_OVERHEAD_GIB_PER_DEVICE,
    GIB,
    ShapeUnknown,
    Unschedulable,
    keep_sizing,
    kv_budget_tokens,
    models_needing_shapes,
    size_pair,
    valid_tensor_parallel_sizes,
)
from specdeploy.plan.rollout.speculation import decide_speculation, served_spec

CONFIG = OperatorConfig()
H100 = "NVIDIA-H100-80GB-HBM3"

# The MIG tables of DESIGN.md, row by row: product -> its profiles.
MIG_TABLE: dict[str, list[str]] = {
    "NVIDIA-A100-SXM4-40GB": ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
    "NVIDIA-A100-SXM4-80GB": ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    H100: ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "NVIDIA-H100-NVL": ["1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"],
    "NVIDIA-H200": ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
    "NVIDIA-A30": ["1g.6gb", "2g.12gb", "4g.24gb"],
}
MIG_ROWS = [(product, profile) for product, profiles in MIG_TABLE.items() for profile in profiles]


def node(
    name: str,
    product: str | None,
    allocatable: dict[str, Any],
    labels: dict[str, str] | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    all_labels = {"nvidia.com/gpu.product": product} if product else {}
    all_labels.update(labels or {})
    return {
        "metadata": {"name": name, "labels": all_labels},
        "spec": {"unschedulable": unschedulable},
        "status": {"allocatable": {"cpu": "64", **allocatable}},
    }


def bed_nodes() -> list[GpuNodeInventory]:
    """The e2e test bed: two 8 x H100 nodes, an H100 MIG-mixed node, one 8 x H200 node."""
    return read_gpu_inventories(
        [
            node("gpu-h100-a", H100, {"nvidia.com/gpu": "8"}),
            node("gpu-h100-b", H100, {"nvidia.com/gpu": "8"}),
            node(
                "gpu-h100-mig",
                H100,
                {"nvidia.com/mig-3g.40gb": "2", "nvidia.com/mig-1g.10gb": "1"},
                {"nvidia.com/mig.strategy": "mixed"},
            ),
            node("gpu-h200", "NVIDIA-H200", {"nvidia.com/gpu": "8"}),
            node("cpu-only", None, {}),
        ]
    )


def pair_spec(
    target: str,
    draft: str | None,
    *,
    method: str = "eagle3",
    max_model_len: int = 8192,
    max_num_seqs: int = 32,
    utilization: float = 0.92,
    kv_cache_tokens: int | None = -1,
    **extra: Any,
) -> Spec:
    """A spec of the pair; its KV budget is maxModelLen x maxNumSeqs unless given (None: the
    default budget)."""
    engine: dict[str, Any] = {
        "maxModelLen": max_model_len,
        "maxNumSeqs": max_num_seqs,
        "gpuMemoryUtilization": utilization,
    }
    if kv_cache_tokens == -1:
        engine["kvCacheTokens"] = max_model_len * max_num_seqs
    elif kv_cache_tokens is not None:
        engine["kvCacheTokens"] = kv_cache_tokens
    draft_spec: dict[str, Any] = {"method": method}
    if method != "none":
        draft_spec["numSpeculativeTokens"] = 3
    if draft:
        draft_spec["model"] = draft
    return Spec.model_validate(
        {
            "pair": {"version": "1", "target": {"model": target}, "draft": draft_spec},
            "engine": engine,
            **extra,
        }
    )


def spec_needing(gib: float, mig: str = "Auto", product: str | None = None) -> Spec:
    """A target-only spec whose replica needs `gib` GiB on one device (tiny KV cache)."""
    weights_gib = gib - ENGINE_OVERHEAD_GIB_PER_DEVICE - 0.001
    shape = {
        "parametersBillion": weights_gib * GIB / 2e9,
        "layers": 1,
        "hiddenSize": 64,
        "attentionHeads": 8,
        "kvHeads": 8,
        "headDim": 1,
        "vocabSize": 1000,
        "dtype": "bfloat16",
    }
    gpu: dict[str, Any] = {"mig": mig}
    if product:
        gpu["product"] = product
    return Spec.model_validate(
        {
            "pair": {
                "version": "1",
                "target": {"model": "org/custom", "shape": shape},
                "draft": {"method": "none"},
            },
            "engine": {"maxModelLen": 1, "maxNumSeqs": 1, "gpuMemoryUtilization": 1.0},
            "placement": {"gpu": gpu},
        }
    )


def decided(result: SizingDecision | Unschedulable | ShapeUnknown) -> SizingDecision:
    assert isinstance(result, SizingDecision), getattr(result, "message", result)
    return result


# --- the catalog matches DESIGN.md ------------------------------------------------------------


def test_catalog_has_every_mig_table_row_in_order() -> None:
    for product_name, profiles in MIG_TABLE.items():
        product = find_product(product_name)
        assert product is not None, product_name
        assert [p.name for p in product.mig_profiles] == profiles


@pytest.mark.parametrize(("product_name", "profile_name"), MIG_ROWS)
def test_each_mig_row_is_chosen_when_it_is_the_smallest_that_fits(
    product_name: str, profile_name: str
) -> None:
    product = find_product(product_name)
    assert product is not None
    profile = product.mig_profile(profile_name)
    assert profile is not None
    # The node offers every profile of its product, mixed strategy.
    offers = {f"nvidia.com/mig-{p.name}": "1" for p in product.mig_profiles}
    nodes = read_gpu_inventories([node("mig", product_name, offers)])
    smaller_same_memory = [
        p
        for p in product.mig_profiles
        if p.memory_gb == profile.memory_gb and p.compute_slices < profile.compute_slices
    ]
    decision = decided(size_pair(spec_needing(profile.memory_gib), nodes, CONFIG))
    expected = smaller_same_memory[0] if smaller_same_memory else profile
    assert decision.resource_name == f"nvidia.com/mig-{expected.name}"
    assert decision.mig_profile == expected.name
    assert decision.count == 1
    assert decision.tensor_parallel_size == 1
    assert decision.memory is not None
    assert decision.memory.per_device_gib <= profile.memory_gib + 0.01


@pytest.mark.parametrize(("product_name", "profile_name"), MIG_ROWS)
def test_each_mig_row_under_the_single_strategy(product_name: str, profile_name: str) -> None:
    label = f"{product_name}-MIG-{profile_name}"
    nodes = read_gpu_inventories(
        [node("single", label, {"nvidia.com/gpu": "7"}, {"nvidia.com/mig.strategy": "single"})]
    )
    assert nodes[0].mig_strategy == "single"
    profile = nodes[0].mig_offers[0].profile
    decision = decided(size_pair(spec_needing(profile.memory_gib * 0.99), nodes, CONFIG))
    assert decision.resource_name == "nvidia.com/gpu"
    assert decision.mig_profile == profile_name
    assert decision.node_selector == {"nvidia.com/gpu.product": label}
    # One GiB more than the slice has: it no longer fits, and there is nothing else.
    assert isinstance(size_pair(spec_needing(profile.memory_gib + 1), nodes, CONFIG), Unschedulable)


# --- inventory ------------------------------------------------------------------------------


def test_inventory_reads_whole_gpus_mig_slices_and_skips_cpu_and_cordoned_nodes() -> None:
    nodes = read_gpu_inventories(
        [
            node("a", H100, {"nvidia.com/gpu": "8"}),
            node(
                "b",
                None,
                {"nvidia.com/mig-3g.40gb": "2", "nvidia.com/mig-1g.10gb": "1"},
                {"nvidia.com/gpu.memory": "81559"},
            ),
            node("c", None, {}),
            node("d", H100, {"nvidia.com/gpu": "8"}, unschedulable=True),
        ]
    )
    assert [n.node_name for n in nodes] == ["a", "b"]
    assert nodes[0].whole_gpus == 8
    assert nodes[0].mig_strategy == "none"
    assert nodes[1].mig_strategy == "mixed"
    assert nodes[1].product_name == H100
    assert {(o.profile.name, o.count) for o in nodes[1].mig_offers} == {
        ("3g.40gb", 2),
        ("1g.10gb", 1),
    }


def versioned(body: dict[str, Any], version: str) -> dict[str, Any]:
    return {**body, "metadata": {**body["metadata"], "resourceVersion": version}}


def test_a_node_is_parsed_once_per_resource_version() -> None:
    slices = node("m", H100, {"nvidia.com/mig-3g.40gb": "7"})
    [first] = read_gpu_inventories([versioned(slices, "10")])
    [again] = read_gpu_inventories([versioned(slices, "10")])
    assert again is first  # not parsed again
    # The node changed: a new resourceVersion, read afresh.
    fewer = node("m", H100, {"nvidia.com/mig-3g.40gb": "3"})
    [changed] = read_gpu_inventories([versioned(fewer, "11")])
    assert [(o.profile.name, o.count) for o in changed.mig_offers] == [("3g.40gb", 3)]
    # Cordoned at the next version: offers nothing, unless cordoned nodes are asked for.
    cordoned = versioned(node("m", H100, {"nvidia.com/mig-3g.40gb": "3"}, unschedulable=True), "12")
    assert read_gpu_inventories([cordoned]) == []
    [kept] = read_gpu_inventories([cordoned], include_cordoned=True)
    assert kept.node_name == "m"
    assert read_gpu_inventories([cordoned]) == []
    # Another catalog reads the node for itself: here one without the H100's MIG profiles.
    other = [p for p in GPU_PRODUCTS if p.name != H100]
    assert read_gpu_inventories([versioned(slices, "10")], other)[0] is not first


def test_a_node_without_a_resource_version_is_always_parsed() -> None:
    [first] = read_gpu_inventories([node("n", H100, {"nvidia.com/gpu": "8"})])
    [second] = read_gpu_inventories([node("n", H100, {"nvidia.com/gpu": "4"})])
    assert (first.whole_gpus, second.whole_gpus) == (8, 4)


def test_inventory_of_a_node_without_gpus_is_none() -> None:
    assert read_gpu_inventory(node("cpu", None, {"nvidia.com/gpu": "0"})) is None


def test_operator_config_adds_gpu_products() -> None:
    config = OperatorConfig.model_validate(
        {"gpuCatalog": [{"product": "ACME-X1", "memoryGiB": 200, "migProfiles": ["2g.100gb"]}]}
    )
    catalog = catalog_for_config(config)
    acme = find_product("ACME-X1", catalog)
    assert acme is not None
    assert acme.memory_gib == 200
    assert len(catalog) == len(GPU_PRODUCTS) + 1


# --- the examples' choices --------------------------------------------------------------------


def test_llama_8b_with_its_eagle3_head_takes_a_3g_40gb_slice() -> None:
    spec = pair_spec(
        "meta-llama/Llama-3.1-8B-Instruct", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", max_num_seqs=8
    )
    decision = decided(size_pair(spec, bed_nodes(), CONFIG))
    assert decision.resource_name == "nvidia.com/mig-3g.40gb"
    assert decision.mig_profile == "3g.40gb"
    assert decision.gpu_product == H100
    assert decision.memory is not None
    # 15.0 target + 0.8 head + 8.2 KV + 2 overhead = 26 GiB, / 0.92 = 28.2 GiB
    assert decision.memory.target_weights_gib == pytest.approx(14.96, abs=0.01)
    assert decision.memory.draft_weights_gib == pytest.approx(0.78, abs=0.01)
    assert decision.memory.kv_cache_gib == pytest.approx(8.25, abs=0.01)
    assert decision.memory.required_gib == pytest.approx(28.2, abs=0.1)
    assert "3g.40gb" in decision.message


def test_llama_70b_takes_four_h100s_with_tensor_parallel_4() -> None:
    spec = pair_spec(
        "meta-llama/Llama-3.1-70B-Instruct",
        "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B",
        placement={"gpu": {"product": H100}},
    )
    decision = decided(size_pair(spec, bed_nodes(), CONFIG))
    assert decision.resource_name == "nvidia.com/gpu"
    assert decision.count == 4
    assert decision.tensor_parallel_size == 4
    assert decision.node_selector == {"nvidia.com/gpu.product": H100}
    assert decision.memory is not None
    assert decision.memory.per_device_gib < 79.6 < decision.memory.required_gib / 2


def test_fewest_gpus_wins_over_product_when_no_product_is_asked_for() -> None:
    spec = pair_spec("meta-llama/Llama-3.1-70B-Instruct", "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B")
    decision = decided(size_pair(spec, bed_nodes(), CONFIG))
    assert (decision.gpu_product, decision.count) == ("NVIDIA-H200", 2)


def test_405b_bf16_on_h100s_is_unschedulable_with_the_memory_it_needs() -> None:
    spec = pair_spec(
        "meta-llama/Llama-3.1-405B-Instruct",
        None,
        method="eagle3",
        placement={"gpu": {"product": H100}},
    )
    result = size_pair(spec, bed_nodes(), CONFIG)
    assert isinstance(result, Unschedulable)
    assert result.memory is not None
    assert result.memory.target_weights_gib == pytest.approx(756.0, abs=0.5)
    assert result.memory.required_gib > 8 * 79.6
    assert "756.0" in result.message
    assert "8 x NVIDIA-H100-80GB-HBM3" in result.message


def test_405b_at_long_context_does_not_fit_even_eight_h200s() -> None:
    spec = pair_spec("meta-llama/Llama-3.1-405B-Instruct", None, method="none", max_model_len=32768)
    result = size_pair(spec, bed_nodes(), CONFIG)
    assert isinstance(result, Unschedulable)
    assert "8 x NVIDIA-H200" in result.message


# --- policies -------------------------------------------------------------------------------


def test_mig_never_uses_whole_gpus() -> None:
    decision = decided(size_pair(spec_needing(20, mig="Never"), bed_nodes(), CONFIG))
    assert decision.resource_name == "nvidia.com/gpu"
    assert decision.gpu_product == H100
    assert decision.count == 1


def test_mig_required_is_unschedulable_when_no_slice_fits() -> None:
    result = size_pair(spec_needing(60, mig="Required"), bed_nodes(), CONFIG)
    assert isinstance(result, Unschedulable)
    assert "MIG Required" in result.message


def test_mig_auto_falls_back_to_a_whole_gpu_when_slices_are_too_small() -> None:
    decision = decided(size_pair(spec_needing(60), bed_nodes(), CONFIG))
    assert (decision.resource_name, decision.count, decision.gpu_product) == (
        "nvidia.com/gpu",
        1,
        H100,
    )


def test_smallest_slice_wins_among_several() -> None:
    decision = decided(size_pair(spec_needing(9), bed_nodes(), CONFIG))
    assert decision.mig_profile == "1g.10gb"


def test_unknown_requested_product_is_unschedulable() -> None:
    result = size_pair(spec_needing(9, product="NVIDIA-B200"), bed_nodes(), CONFIG)
    assert isinstance(result, Unschedulable)
    assert "NVIDIA-B200" in result.message


def test_tensor_parallel_sizes_divide_attention_and_kv_heads() -> None:
    qwen_7b = catalog_shape("Qwen/Qwen2.5-7B-Instruct")
    assert qwen_7b is not None
    assert valid_tensor_parallel_sizes(qwen_7b, 8) == [1, 2, 4]
    llama_70b = catalog_shape("meta-llama/Llama-3.1-70B-Instruct")
    assert llama_70b is not None
    assert valid_tensor_parallel_sizes(llama_70b, 8) == [1, 2, 4, 8]
    odd = ModelShape(
        parameters_billion=1,
        layers=1,
        hidden_size=96,
        attention_heads=12,
        kv_heads=6,
        vocab_size=10,
        dtype="bfloat16",
    )
    assert valid_tensor_parallel_sizes(odd, 8) == [1, 2]


def test_whole_gpu_tensor_parallel_skips_invalid_degrees() -> None:
    # Qwen2.5-7B's 4 KV heads rule out TP 8; a replica needing > 4 GPUs is unschedulable.
    shape = {
        "parametersBillion": 300,
        "layers": 28,
        "hiddenSize": 3584,
        "attentionHeads": 28,
        "kvHeads": 4,
        "vocabSize": 152064,
        "dtype": "bfloat16",
    }
    spec = Spec.model_validate(
        {
            "pair": {
                "version": "1",
                "target": {"model": "x/y", "shape": shape},
                "draft": {"method": "none"},
            },
            "placement": {"gpu": {"product": H100}},
        }
    )
    result = size_pair(spec, bed_nodes(), CONFIG)
    assert isinstance(result, Unschedulable)
    assert "4 x NVIDIA-H100-80GB-HBM3" in result.message


def test_forced_tensor_parallel_is_respected() -> None:
    spec = pair_spec(
        "meta-llama/Llama-3.1-8B-Instruct",
        "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        max_num_seqs=8,
        placement={"gpu": {"product": H100}},
    )
    spec = spec.model_copy(
        update={"engine": spec.engine.model_copy(update={"tensor_parallel_size": 2})}
    )
    decision = decided(size_pair(spec, bed_nodes(), CONFIG))
    assert (decision.resource_name, decision.count) == ("nvidia.com/gpu", 2)


def test_quantization_shrinks_the_weights() -> None:
    shape = catalog_shape("meta-llama/Llama-3.1-70B-Instruct")
    assert shape is not None
    fp8 = shape.model_copy(update={"quantization": "fp8"}).model_dump(by_alias=True)
    spec = Spec.model_validate(
        {
            "pair": {
                "version": "1",
                "target": {"model": "x/y", "shape": fp8},
                "draft": {"method": "none"},
            },
            "engine": {"maxModelLen": 8192, "maxNumSeqs": 8},
            "placement": {"gpu": {"product": H100}},
        }
    )
    decision = decided(size_pair(spec, bed_nodes(), CONFIG))
    assert decision.memory is not None
    assert decision.memory.target_weights_gib == pytest.approx(65.7, abs=0.1)
    assert decision.count == 2


# --- shapes -----------------------------------------------------------------------------------


def test_unknown_models_need_a_fetched_shape() -> None:
    spec = pair_spec("acme/secret-13b", "acme/secret-13b-draft", method="draft_model")
    assert models_needing_shapes(spec) == ["acme/secret-13b", "acme/secret-13b-draft"]
    assert isinstance(size_pair(spec, bed_nodes(), CONFIG), ShapeUnknown)
    shape = catalog_shape("meta-llama/Llama-3.1-8B-Instruct")
    small = catalog_shape("meta-llama/Llama-3.2-1B-Instruct")
    assert shape is not None
    assert small is not None
    fetched = {"acme/secret-13b": shape, "acme/secret-13b-draft": small}
    decision = decided(size_pair(spec, bed_nodes(), CONFIG, fetched_shapes=fetched))
    assert decision.memory is not None
    assert decision.memory.draft_weights_gib == pytest.approx(2.31, abs=0.01)


def test_an_eagle3_head_without_a_shape_is_estimated_from_its_target() -> None:
    spec = pair_spec("meta-llama/Llama-3.1-405B-Instruct", "someone/unknown-eagle3-head")
    assert models_needing_shapes(spec) == []
    result = size_pair(spec, bed_nodes(), CONFIG)
    assert not isinstance(result, ShapeUnknown)


def test_reported_slice_memory_from_node_labels_wins_over_the_name() -> None:
    labels = {"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-3g.40gb.memory": "40320"}
    nodes = read_gpu_inventories([node("mig", H100, {"nvidia.com/mig-3g.40gb": "8"}, labels)])
    assert nodes[0].mig_offers[0].profile.memory_gib == pytest.approx(39.375)
    # 38.5 GiB: above 95 % of 40 GB (38.0), below the reported 39.4 GiB.
    decision = decided(size_pair(spec_needing(38.5), nodes, CONFIG))
    assert decision.mig_profile == "3g.40gb"


# --- the KV budget, what the device holds, pins --------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def example_spec(filename: str) -> Spec:
    body = yaml.safe_load((EXAMPLES / filename).read_text(encoding="utf-8"))
    return Spec.model_validate(body["spec"])


def test_the_batch_example_sizes_to_one_gpu_with_its_stated_kv_budget() -> None:
    spec = example_spec("llama-8b-batch-queue.yaml")
    assert spec.engine.kv_cache_tokens == 32 * 8192
    config = OperatorConfig(batch_queues=["batch"])
    served = served_spec(spec, decide_speculation(spec, config))
    assert served.pair.draft.method == "none"
    decision = decided(size_pair(served, bed_nodes(), config))
    assert decision.resource_name == "nvidia.com/gpu"
    assert decision.count == 1
    assert decision.gpu_product == H100
    assert decision.memory is not None
    # 128 KiB per token x 262,144 tokens = 32 GiB of KV; (14.96 + 32 + 2) / 0.9 = 54.4 GiB.
    assert decision.memory.kv_cache_gib == pytest.approx(32.0, abs=0.01)
    assert decision.memory.required_gib == pytest.approx(54.4, abs=0.05)
    # What one H100 holds: 79.65 x 0.9 - 14.96 - 2 = 54.72 GiB of KV = 448,295 tokens.
    held = int((81559 / 1024 * 0.9 - 8.03e9 * 2 / GIB - 2) * GIB // (128 * 1024))
    assert decision.kv_cache_tokens == held
    assert decision.kv_cache_tokens >= 32 * 8192
    assert decision.full_length_sequences == held // 8192 == 54
    # The same example with the old budget (maxModelLen x maxNumSeqs: 2M tokens, 256 GiB of
    # KV) needed 4 GPUs.
    old = served.model_copy(
        update={"engine": served.engine.model_copy(update={"kv_cache_tokens": 8192 * 256})}
    )
    assert decided(size_pair(old, bed_nodes(), config)).count == 4


def test_default_kv_budget_is_at_most_16_full_sequences_and_never_below_one() -> None:
    target = "meta-llama/Llama-3.1-8B-Instruct"
    assert kv_budget_tokens(pair_spec(target, None, max_num_seqs=256, kv_cache_tokens=None)) == (
        8192 * 16
    )
    assert kv_budget_tokens(pair_spec(target, None, max_num_seqs=4, kv_cache_tokens=None)) == (
        8192 * 4
    )
    # Without maxModelLen sizing assumes 8192, and a smaller budget is raised to it.
    spec = Spec.model_validate(
        {
            "pair": {"version": "1", "target": {"model": target}, "draft": {"method": "none"}},
            "engine": {"kvCacheTokens": 100},
        }
    )
    assert kv_budget_tokens(spec) == 8192


def test_status_says_how_many_tokens_and_sequences_the_slice_holds() -> None:
    spec = pair_spec(
        "meta-llama/Llama-3.1-8B-Instruct", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", max_num_seqs=8
    )
    decision = decided(size_pair(spec, bed_nodes(), CONFIG))
    assert decision.mig_profile == "3g.40gb"
    # 3g.40gb = 38.0 GiB (95 % of its name) x 0.92 - 14.96 - 0.78 - 2 = 17.22 GiB of KV at
    # 132 KiB per token (target 128 + head 4).
    free = 40 * 0.95 * 0.92 - 8.03e9 * 2 / GIB - 0.42 * 1e9 * 2 / GIB - 2
    assert decision.memory is not None
    assert decision.kv_cache_tokens is not None
    assert decision.kv_cache_tokens == pytest.approx(free * GIB / (132 * 1024), rel=0.01)
    assert decision.full_length_sequences == decision.kv_cache_tokens // 8192
    assert f"{decision.kv_cache_tokens} KV tokens" in decision.message


def test_a_pinned_slice_too_small_is_refused_with_the_arithmetic() -> None:
    spec = pair_spec(
        "meta-llama/Llama-3.1-8B-Instruct",
        "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        max_num_seqs=8,
        placement={"gpu": {"migProfile": "1g.10gb"}},
    )
    result = size_pair(spec, bed_nodes(), CONFIG)
    assert isinstance(result, Unschedulable), result
    message = result.message
    assert "the pinned device MIG 1g.10gb (9.5 GiB each) is too small" in message
    assert "it needs 28.2 GiB per device" in message
    assert "target weights 15.0 + draft weights 0.8 + KV cache 8.2 + overhead 2.0" in message
    assert "holds 0 KV tokens, below the budget of 65536" in message


def test_a_pinned_gpu_count_too_small_is_refused_with_the_arithmetic() -> None:
    spec = pair_spec(
        "meta-llama/Llama-3.1-70B-Instruct",
        None,
        method="none",
        placement={"gpu": {"product": H100, "count": 2, "mig": "Never"}},
    )
    result = size_pair(spec, bed_nodes(), CONFIG)
    assert isinstance(result, Unschedulable), result
    # (131.4 weights + 80 KV + 4 overhead) / 0.92 / 2 = 117.1 GiB per H100 of 79.6.
    assert "the pinned device 2 x NVIDIA-H100-80GB-HBM3 (79.6 GiB each) is too small" in (
        result.message
    )
    assert "it needs 117.1 GiB per device" in result.message


def test_a_pinned_count_that_is_no_tensor_parallel_size_is_refused() -> None:
    spec = pair_spec(
        "meta-llama/Llama-3.1-8B-Instruct", None, method="none", placement={"gpu": {"count": 3}}
    )
    result = size_pair(spec, bed_nodes(), CONFIG)
    assert isinstance(result, Unschedulable)
    assert "pinned count 3 is no valid tensor parallel size" in result.message


def test_a_pinned_device_that_fits_is_taken_rather_than_the_smallest() -> None:
    eight_b = "meta-llama/Llama-3.1-8B-Instruct"
    two = decided(
        size_pair(
            pair_spec(eight_b, None, method="none", placement={"gpu": {"count": 2}}),
            bed_nodes(),
            CONFIG,
        )
    )
    assert (two.resource_name, two.count, two.tensor_parallel_size) == ("nvidia.com/gpu", 2, 2)
    spec = pair_spec(eight_b, None, method="none", max_num_seqs=1)
    assert decided(size_pair(spec, bed_nodes(), CONFIG)).mig_profile == "3g.40gb"
    pinned = pair_spec(
        eight_b, None, method="none", max_num_seqs=1, placement={"gpu": {"migProfile": "3g.40gb"}}
    )
    assert decided(size_pair(pinned, bed_nodes(), CONFIG)).mig_profile == "3g.40gb"


def test_a_pinned_slice_no_node_offers_says_so() -> None:
    spec = pair_spec(
        "meta-llama/Llama-3.1-8B-Instruct",
        None,
        method="none",
        max_num_seqs=1,
        placement={"gpu": {"migProfile": "4g.40gb"}},
    )
    result = size_pair(spec, bed_nodes(), CONFIG)
    assert isinstance(result, Unschedulable)
    assert "pinned device MIG 4g.40gb would hold the pair, but no schedulable node offers it" in (
        result.message
    )


def test_cpu_serving_is_sized_in_host_memory_without_gpus() -> None:
    spec = pair_spec(
        "meta-llama/Llama-3.1-8B-Instruct",
        None,
        method="none",
        max_num_seqs=4,
        kv_cache_tokens=None,
        placement={"device": "CPU"},
    )
    decision = decided(size_pair(spec, [], CONFIG))
    assert decision.resource_name == "memory"
    assert decision.mig_profile is None
    assert decision.gpu_product is None
    assert decision.memory is not None
    # 4 x 8192 tokens x 128 KiB = 4 GiB of KV; 14.96 + 4 + 3 = 21.96 -> 22Gi.
    assert decision.memory.kv_cache_gib == 4
    assert decision.host_memory == "22Gi"
    assert decision.kv_cache_tokens == 4 * 8192
    assert decision.full_length_sequences == 4


# --- a serving revision keeps its device while the inventory changes -----------------------------


def test_a_cordoned_mig_node_does_not_move_a_serving_revision() -> None:
    spec = pair_spec(
        "meta-llama/Llama-3.1-8B-Instruct", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", max_num_seqs=8
    )
    nodes = [
        node("gpu-h100-a", H100, {"nvidia.com/gpu": "8"}),
        node("gpu-h100-mig", H100, {"nvidia.com/mig-3g.40gb": "2"}, unschedulable=True),
    ]
    serving = decided(size_pair(spec, bed_nodes(), CONFIG))
    assert serving.mig_profile == "3g.40gb"
    # What a fresh decision gives with the MIG node cordoned: a whole GPU.
    assert decided(size_pair(spec, read_gpu_inventories(nodes), CONFIG)).count == 1
    assert decided(size_pair(spec, read_gpu_inventories(nodes), CONFIG)).mig_profile is None
    known = read_gpu_inventories(nodes, include_cordoned=True)
    kept = keep_sizing(spec, serving, known, CONFIG)
    assert kept is not None
    assert (kept.resource_name, kept.count, kept.node_selector) == (
        serving.resource_name,
        serving.count,
        serving.node_selector,
    )
    # Gone from the cluster altogether (the node deleted): the device is not kept.
    assert keep_sizing(spec, serving, read_gpu_inventories(nodes[:1]), CONFIG) is None
    # A spec that now refuses slices does not keep one.
    never = pair_spec(
        "meta-llama/Llama-3.1-8B-Instruct",
        "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        max_num_seqs=8,
        placement={"gpu": {"mig": "Never"}},
    )
    assert keep_sizing(never, serving, known, CONFIG) is None
