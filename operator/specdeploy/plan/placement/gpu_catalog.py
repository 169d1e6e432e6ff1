"""GPU products, their MIG profiles, and the GPU inventory read from Node objects.

Pure: the functions here take plain node dicts (as the API server returns them) and return
values; nothing talks to a cluster.

Memory figures are GiB of device memory. A whole GPU's figure is the framebuffer size that GPU
feature discovery reports in `nvidia.com/gpu.memory` (MiB), e.g. 81559 MiB = 79.6 GiB for an
H100 80GB. A MIG profile's figure is 95 % of the number in its name (a 3g.40gb slice reports
40192 MiB, a 1g.5gb 4864 MiB): the name rounds up, so sizing takes the lower bound.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from specdeploy.api.config import OperatorConfig

# A MIG profile name's GB figure rounds the slice's memory up; 95 % of it (in GiB) is below
# what every profile in NVIDIA's tables reports.
MIG_NAME_TO_GIB = 0.95

# Labels and resources written by NVIDIA's GPU feature discovery and device plugin.
PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"
COUNT_LABEL = "nvidia.com/gpu.count"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
WHOLE_GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"

MigStrategy = Literal["none", "single", "mixed"]


@dataclass(frozen=True)
class MigProfile:
    """One MIG slice shape of a GPU product, e.g. `3g.40gb`."""

    name: str
    compute_slices: int
    memory_gb: int
    # What GPU feature discovery reports for the slice (`nvidia.com/mig-<profile>.memory`).
    reported_memory_mib: int | None = None

    @property
    def memory_gib(self) -> float:
        """The reported memory when a node label gives it, else 95 % of the name's figure."""
        if self.reported_memory_mib is not None:
            return self.reported_memory_mib / 1024
        return self.memory_gb * MIG_NAME_TO_GIB

    @property
    def mixed_resource(self) -> str:
        """The extended resource a pod requests for this slice under the `mixed` strategy."""
        return f"{MIG_RESOURCE_PREFIX}{self.name}"


@dataclass(frozen=True)
class GpuProduct:
    """A GPU model as GPU feature discovery names it, with its memory and MIG profiles."""

    name: str
    memory_gib: float
    mig_profiles: tuple[MigProfile, ...] = ()
    aliases: tuple[str, ...] = ()

    def mig_profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.name == name), None)


def _profiles(*names: str) -> tuple[MigProfile, ...]:
    return tuple(parse_mig_profile_name(n) for n in names)


def parse_mig_profile_name(name: str) -> MigProfile:
    """Parses `3g.40gb` into its compute slices and memory; raises ValueError otherwise."""
    match = re.fullmatch(r"(\d+)g\.(\d+)gb", name)
    if match is None:
        raise ValueError(f"not a MIG profile name: {name!r}")
    return MigProfile(name=name, compute_slices=int(match[1]), memory_gb=int(match[2]))


_A100_80_H100_80_PROFILES = _profiles(
    "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"
)

# The MIG tables of docs/sizing.md (NVIDIA's MIG user guide, largest-memory profiles per product).
GPU_PRODUCTS: tuple[GpuProduct, ...] = (
    GpuProduct(
        "NVIDIA-A100-SXM4-40GB",
        40960 / 1024,
        _profiles("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
        aliases=("NVIDIA-A100-PCIE-40GB", "A100-40GB"),
    ),
    GpuProduct(
        "NVIDIA-A100-SXM4-80GB",
        81920 / 1024,
        _A100_80_H100_80_PROFILES,
        aliases=("NVIDIA-A100-80GB-PCIe", "A100-80GB"),
    ),
    GpuProduct(
        "NVIDIA-H100-80GB-HBM3",
        81559 / 1024,
        _A100_80_H100_80_PROFILES,
        aliases=("NVIDIA-H100-PCIe", "NVIDIA-H100-SXM5-80GB", "H100-80GB"),
    ),
    GpuProduct(
        "NVIDIA-H100-NVL",
        95830 / 1024,
        _profiles("1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
        aliases=("H100-NVL", "H100-94GB"),
    ),
    GpuProduct(
        "NVIDIA-H200",
        143771 / 1024,
        _profiles("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
        aliases=("NVIDIA-H200-141GB-HBM3e", "NVIDIA-H200-141GB", "H200-141GB"),
    ),
    GpuProduct(
        "NVIDIA-A30",
        24576 / 1024,
        _profiles("1g.6gb", "2g.12gb", "4g.24gb"),
        aliases=("A30-24GB",),
    ),
    GpuProduct("NVIDIA-L40S", 46068 / 1024, aliases=("L40S",)),
    GpuProduct("NVIDIA-L4", 23034 / 1024, aliases=("L4",)),
)


def find_product(label: str, catalog: Iterable[GpuProduct] = GPU_PRODUCTS) -> GpuProduct | None:
    """The catalog product a `nvidia.com/gpu.product` value names (case-insensitive), if any.

    A `-MIG-<profile>` suffix (the `single` strategy's relabelling) is ignored; unknown
    products return None.
    """
    base = split_single_strategy_product(label)[0].lower()
    for product in catalog:
        names = (product.name, *product.aliases)
        if any(base == n.lower() for n in names):
            return product
    return None


def split_single_strategy_product(label: str) -> tuple[str, str | None]:
    """Splits `NVIDIA-H100-80GB-HBM3-MIG-3g.40gb` into the product and the MIG profile name."""
    match = re.fullmatch(r"(.+)-MIG-(\d+g\.\d+gb)", label)
    if match is None:
        return label, None
    return match[1], match[2]


def products_with_profile(
    profile_name: str, catalog: Iterable[GpuProduct] = GPU_PRODUCTS
) -> list[GpuProduct]:
    """Every catalog product that offers a MIG profile of this name."""
    return [p for p in catalog if p.mig_profile(profile_name) is not None]


@dataclass(frozen=True)
class MigOffer:
    """MIG slices of one profile a node offers, and how a pod asks for them."""

    profile: MigProfile
    count: int
    resource_name: str


@dataclass(frozen=True)
class GpuNodeInventory:
    """What one node offers: whole GPUs of a product and MIG slices, and how to select it."""

    node_name: str
    product: GpuProduct | None
    product_label: str | None
    mig_strategy: MigStrategy
    whole_gpus: int
    mig_offers: tuple[MigOffer, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def product_name(self) -> str | None:
        return self.product.name if self.product is not None else None


def _quantity_count(value: Any) -> int:
    """Whole-number count of an extended resource quantity ("8", 8); malformed counts as 0."""
    try:
        return int(str(value))
    except ValueError:
        return 0


def _infer_product_from_memory(
    memory_mib: str | None, catalog: Iterable[GpuProduct]
) -> GpuProduct | None:
    if memory_mib is None:
        return None
    try:
        gib = int(memory_mib) / 1024
    except ValueError:
        return None
    # GFD reports the board's full memory, a little above the nominal GB figure converted.
    candidates = [p for p in catalog if abs(p.memory_gib - gib) <= 0.08 * p.memory_gib]
    return min(candidates, key=lambda p: abs(p.memory_gib - gib)) if candidates else None


def _with_reported_memory(profile: MigProfile, labels: Mapping[str, str]) -> MigProfile:
    """The profile with the memory GPU feature discovery reports for it on this node, if any."""
    reported = labels.get(f"{MIG_RESOURCE_PREFIX}{profile.name}.memory")
    if reported is None or not reported.isdigit():
        return profile
    return MigProfile(profile.name, profile.compute_slices, profile.memory_gb, int(reported))


def read_gpu_inventory(
    node: Mapping[str, Any],
    catalog: Iterable[GpuProduct] = GPU_PRODUCTS,
    *,
    include_cordoned: bool = False,
) -> GpuNodeInventory | None:
    """Reads one Node object into its GPU inventory; None when it offers no GPU at all.

    Cordoned nodes offer nothing, unless `include_cordoned` (the devices the cluster knows,
    which keep a serving revision's sizing while a node is drained). Under the `mixed` strategy
    every `nvidia.com/mig-<profile>` allocatable resource is a slice offer and `nvidia.com/gpu`
    counts whole GPUs; under `single` the node's `nvidia.com/gpu` units are slices of the profile
    its product label names.
    """
    catalog = tuple(catalog)
    metadata = node.get("metadata") or {}
    labels: dict[str, str] = dict(metadata.get("labels") or {})
    if (node.get("spec") or {}).get("unschedulable") and not include_cordoned:
        return None
    allocatable: Mapping[str, Any] = (node.get("status") or {}).get("allocatable") or {}
    gpu_units = _quantity_count(allocatable.get(WHOLE_GPU_RESOURCE, 0))
    product_label = labels.get(PRODUCT_LABEL)
    single_profile_name = split_single_strategy_product(product_label)[1] if product_label else None
    declared_strategy = labels.get(MIG_STRATEGY_LABEL, "")

    mixed_offers: list[MigOffer] = []
    for resource, quantity in sorted(allocatable.items()):
        if not resource.startswith(MIG_RESOURCE_PREFIX):
            continue
        count = _quantity_count(quantity)
        if count <= 0:
            continue
        try:
            profile = parse_mig_profile_name(resource.removeprefix(MIG_RESOURCE_PREFIX))
        except ValueError:
            continue
        mixed_offers.append(MigOffer(profile, count, resource))

    product = find_product(product_label, catalog) if product_label else None
    if product is None and mixed_offers:
        # Without a product label, a profile name that only one product offers names it.
        owners = {p.name: p for o in mixed_offers for p in products_with_profile(o.profile.name)}
        if len(owners) == 1:
            product = next(iter(owners.values()))
    if product is None:
        product = _infer_product_from_memory(labels.get(MEMORY_LABEL), catalog)
    if product is not None:
        # Prefer the catalog's own profile (same name, same numbers) for a stable identity.
        mixed_offers = [
            MigOffer(product.mig_profile(o.profile.name) or o.profile, o.count, o.resource_name)
            for o in mixed_offers
        ]
    mixed_offers = [
        MigOffer(_with_reported_memory(o.profile, labels), o.count, o.resource_name)
        for o in mixed_offers
    ]

    strategy: MigStrategy
    if single_profile_name is not None or (declared_strategy == "single" and gpu_units):
        strategy = "single"
    elif mixed_offers or declared_strategy == "mixed":
        strategy = "mixed"
    else:
        strategy = "none"

    if strategy == "single":
        if single_profile_name is None or gpu_units <= 0:
            return None
        profile = (product.mig_profile(single_profile_name) if product else None) or (
            parse_mig_profile_name(single_profile_name)
        )
        profile = _with_reported_memory(profile, labels)
        return GpuNodeInventory(
            node_name=str(metadata.get("name", "")),
            product=product,
            product_label=product_label,
            mig_strategy="single",
            whole_gpus=0,
            mig_offers=(MigOffer(profile, gpu_units, WHOLE_GPU_RESOURCE),),
            labels=labels,
        )

    if gpu_units <= 0 and not mixed_offers:
        return None
    return GpuNodeInventory(
        node_name=str(metadata.get("name", "")),
        product=product,
        product_label=product_label if product_label else None,
        mig_strategy=strategy,
        whole_gpus=gpu_units,
        mig_offers=tuple(mixed_offers),
        labels=labels,
    )


def read_gpu_inventories(
    nodes: Iterable[Mapping[str, Any]],
    catalog: Iterable[GpuProduct] = GPU_PRODUCTS,
    *,
    include_cordoned: bool = False,
) -> list[GpuNodeInventory]:
    """Reads every node that offers GPUs or MIG slices, in node-name order."""
    catalog = tuple(catalog)
    held = _READ.get(catalog)
    if held is None:
        if len(_READ) >= _CATALOGS_HELD:
            _READ.clear()
        held = _READ[catalog] = {}
    found = (_read_once(n, catalog, include_cordoned, held) for n in nodes)
    return sorted((i for i in found if i is not None), key=lambda i: i.node_name)


#: The inventories read, by catalog, then by (node uid or name, cordoned ones too): the
#: resourceVersion read and what it gave. Every reconcile reads every node, and nodes seldom
#: change: a node at the resourceVersion read before is not parsed again (at 1,000 SDs on 67
#: nodes, parsing them was 44 % of a resync's reconcile time). One entry per node, replaced when
#: its version moves; a node without a resourceVersion is always parsed.
_Held = dict[tuple[str, bool], tuple[str, "GpuNodeInventory | None"]]
_READ: dict[tuple[GpuProduct, ...], _Held] = {}
_CATALOGS_HELD = 8
_NODES_HELD = 20_000


def _read_once(
    node: Mapping[str, Any],
    catalog: tuple[GpuProduct, ...],
    include_cordoned: bool,
    held: _Held,
) -> GpuNodeInventory | None:
    metadata = node.get("metadata") or {}
    version = metadata.get("resourceVersion")
    if not version:
        return read_gpu_inventory(node, catalog, include_cordoned=include_cordoned)
    key = (str(metadata.get("uid") or metadata.get("name")), include_cordoned)
    before = held.get(key)
    if before is not None and before[0] == version:
        return before[1]
    found = read_gpu_inventory(node, catalog, include_cordoned=include_cordoned)
    if len(held) >= _NODES_HELD:
        held.clear()
    held[key] = (str(version), found)
    return found


def catalog_with_overrides(
    overrides: Iterable[GpuProduct], base: Iterable[GpuProduct] = GPU_PRODUCTS
) -> tuple[GpuProduct, ...]:
    """The base catalog with products of the same name replaced, and new ones appended."""
    by_name = {p.name: p for p in base}
    for product in overrides:
        by_name[product.name] = product
    return tuple(by_name.values())


def catalog_for_config(
    config: OperatorConfig, base: Iterable[GpuProduct] = GPU_PRODUCTS
) -> tuple[GpuProduct, ...]:
    """The GPU catalog with the operator config's `gpuCatalog` additions and corrections."""
    overrides = [
        GpuProduct(
            name=o.product,
            memory_gib=o.memory_gib,
            mig_profiles=tuple(parse_mig_profile_name(p) for p in o.mig_profiles),
        )
        for o in config.gpu_catalog
    ]
    return catalog_with_overrides(overrides, base)
