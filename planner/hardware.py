"""GPU catalog: peak FLOP/s, memory, links; loaded from data/gpus.toml.

Called by the spec conversion, the memory model and the performance model. Pure: reads only the
package's own data file.
"""

from __future__ import annotations

import enum
import re
import tomllib
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources

from servingtopology.planner.errors import InvalidSpec, did_you_mean

__all__ = ["Precision", "Gpu", "Link", "gpu_catalog", "gpu_names", "resolve_gpu", "gpu_for_product", "product_label", "PRODUCT_LABEL", "GIB", "pcie_gbps"]

GIB = 1024**3
PRODUCT_LABEL = "nvidia.com/gpu.product"   # the node label GPU feature discovery writes the NVML name to


class Precision(enum.StrEnum):
    BF16 = "bf16"
    FP8 = "fp8"
    FP4 = "fp4"
    INT4 = "int4"

    @property
    def weight_bytes(self) -> float:
        """Bytes per weight, including block scales (fp4: one fp8 scale per 16 weights)."""
        return {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5625, "int4": 0.5625}[self.value]


class Link(enum.StrEnum):
    """What carries traffic between the GPUs of one node (collectives are priced by it, planner.perf.step)."""

    NVLINK = "nvlink"        # NVLink / NVSwitch (or AMD Infinity Fabric): GPUs load and store each other's memory
    PCIE_P2P = "pcie_p2p"    # PCIe with peer-to-peer DMA between the cards
    PCIE_HOST = "pcie_host"  # PCIe without peer-to-peer: every transfer bounces through pinned host memory


# GB/s per lane and direction after line coding (PCI-SIG: 8 GT/s 128b/130b for gen 3, doubled per generation).
_PCIE_LANE_GBPS = {3: 0.985, 4: 1.969, 5: 3.938, 6: 7.877}


def pcie_gbps(gen: int, lanes: int) -> float:
    """One-way bandwidth of a PCIe link of generation `gen` and `lanes` lanes (x16 gen 4: 31.5 GB/s, gen 5: 63)."""
    if gen not in _PCIE_LANE_GBPS:
        raise InvalidSpec("pcie_gen", f"{gen} is not a PCIe generation this catalog knows; allowed: {sorted(_PCIE_LANE_GBPS)}")
    return _PCIE_LANE_GBPS[gen] * lanes


@dataclass(frozen=True, slots=True)
class Gpu:
    id: str
    name: str
    memory_gib: float
    hbm_gbps: float
    bf16_tflops: float
    fp8_tflops: float
    fp4_tflops: float
    int4_tflops: float
    nvlink_gbps: float
    pcie_gbps: float
    nic_gbit: float
    gpus_per_node: int
    # Share of a GQA group's redundant KV re-reads that reach memory when decode rows share a step with a
    # prefill chunk (vLLM's mixed batches); 0 where the kernel packs GQA or where it was not measured.
    mixed_kv_reread: float = 0.0
    # Measured dense BF16 matmul throughput of large GEMMs (TFLOP/s); 0: unknown, the fitted share of the peak applies.
    matmul_bf16_tflops: float = 0.0
    # The card's host link, and whether the driver lets two cards of a node read each other's memory over it.
    pcie_gen: int = 5
    pcie_lanes: int = 16
    p2p: bool = True

    @property
    def scaleup_link(self) -> Link:
        """How two GPUs of one node talk: NVLink when the card has it, else PCIe with or without peer-to-peer."""
        if self.nvlink_gbps > 0:
            return Link.NVLINK
        return Link.PCIE_P2P if self.p2p else Link.PCIE_HOST

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB

    @property
    def scaleup_gbps(self) -> float:
        """One-way bandwidth between two GPUs of one node: NVLink, else PCIe."""
        return self.nvlink_gbps if self.nvlink_gbps > 0 else self.pcie_gbps

    def peak_tflops(self, precision: Precision) -> float:
        """Dense tensor peak for GEMMs in `precision`; falls back to the next wider type it supports."""
        order = {"fp4": ("fp4", "fp8", "bf16"), "int4": ("int4", "fp8", "bf16"), "fp8": ("fp8", "bf16"), "bf16": ("bf16",)}
        for p in order[precision.value]:
            value = float(getattr(self, f"{p}_tflops"))
            if value > 0:
                return value
        return self.bf16_tflops

    def supports(self, precision: Precision) -> bool:
        """Whether the GPU has native tensor cores for `precision` (int4 weights run as weight-only on all)."""
        if precision is Precision.BF16 or precision is Precision.INT4:
            return True
        return float(getattr(self, f"{precision.value}_tflops")) > 0


def _norm(name: str) -> str:
    return name.strip().lower().replace("-", "_").replace(" ", "_")


@cache
def gpu_catalog() -> dict[str, Gpu]:
    """Every GPU in data/gpus.toml, by catalog id."""
    text = resources.files(__package__).joinpath("data/gpus.toml").read_text()
    raw = tomllib.loads(text)
    return {
        gid: Gpu(
            id=gid,
            name=str(e["name"]),
            memory_gib=float(e["memory_gib"]),
            hbm_gbps=float(e["hbm_gbps"]),
            bf16_tflops=float(e["bf16_tflops"]),
            fp8_tflops=float(e["fp8_tflops"]),
            fp4_tflops=float(e["fp4_tflops"]),
            int4_tflops=float(e["int4_tflops"]),
            nvlink_gbps=float(e["nvlink_gbps"]),
            pcie_gbps=pcie_gbps(int(e["pcie_gen"]), int(e["pcie_lanes"])),
            nic_gbit=float(e["nic_gbit"]),
            gpus_per_node=int(e["gpus_per_node"]),
            mixed_kv_reread=float(e.get("mixed_kv_reread", 0.0)),
            matmul_bf16_tflops=float(e.get("matmul_bf16_tflops", 0.0)),
            pcie_gen=int(e["pcie_gen"]),
            pcie_lanes=int(e["pcie_lanes"]),
            p2p=bool(e["p2p"]),
        )
        for gid, e in raw.items()
    }


@cache
def _aliases() -> dict[str, str]:
    text = resources.files(__package__).joinpath("data/gpus.toml").read_text()
    table: dict[str, str] = {}
    for gid, e in tomllib.loads(text).items():
        table[_norm(gid)] = gid
        for alias in e.get("aliases", []):
            table[_norm(alias)] = gid
    return table


def gpu_names() -> tuple[str, ...]:
    """Every name `resolve_gpu` accepts (catalog ids and aliases), normalised as it compares them: stripped, lower
    case, '-' and ' ' as '_'. The CRD's admission rule for spec.hardware.gpu is generated from this list."""
    return tuple(sorted(_aliases()))


def resolve_gpu(name: str, *, field: str = "hardware.gpu", nvlink_gbps: float | None = None,
                nic_gbit: float | None = None, gpus_per_node: int | None = None) -> Gpu:
    """Find a GPU by id or alias (case and '-'/'_' insensitive), with optional link overrides."""
    gid = _aliases().get(_norm(name))
    if gid is None:
        allowed = ", ".join(sorted(gpu_catalog()))
        raise InvalidSpec(field, f"unknown GPU {name!r}{did_you_mean(name, gpu_catalog())}; allowed: {allowed} (or an alias such as H100, h100-sxm)")
    gpu = gpu_catalog()[gid]
    if nvlink_gbps is not None:
        gpu = replace(gpu, nvlink_gbps=nvlink_gbps)
    if nic_gbit is not None:
        gpu = replace(gpu, nic_gbit=nic_gbit)
    if gpus_per_node is not None:
        gpu = replace(gpu, gpus_per_node=gpus_per_node)
    return gpu


# GPU feature discovery's suffixes for shared or partitioned GPUs (time-slicing, MPS, MIG): not whole GPUs.
_SHARED_SUFFIX = re.compile(r"-(SHARED|MIG-.*)$", re.IGNORECASE)


def gpu_for_product(product: str | None) -> Gpu | None:
    """The catalog GPU a node's `nvidia.com/gpu.product` label names, or None (no label, unknown, or a shared/MIG slice).

    GPU feature discovery labels a node with the NVML name, spaces as dashes (`NVIDIA H100 80GB HBM3` →
    `NVIDIA-H100-80GB-HBM3`): matched against the catalog's names, then its ids and aliases (`H100`, `h100-sxm`).
    A product the catalog does not know is never guessed from a part of its name (an `NVIDIA-A100-SXM4-40GB` is not
    the 80 GB A100). The one rule for the operator's capacity and the emulator.
    """
    if not product or _SHARED_SUFFIX.search(product):
        return None
    wanted = _norm_product(product)
    for gpu in gpu_catalog().values():
        if _norm_product(gpu.name) == wanted:
            return gpu
    gid = _aliases().get(_norm(product))
    return None if gid is None else gpu_catalog()[gid]


# A Kubernetes label value: at most 63 characters, alphanumerics with '-', '_', '.' inside.
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")


def product_label(gpu: Gpu) -> str | None:
    """The `nvidia.com/gpu.product` value GPU feature discovery gives a node of this GPU: its NVML name, spaces as
    dashes (`NVIDIA A100-SXM4-80GB`'s nodes read `NVIDIA-A100-SXM4-80GB`). The inverse of `gpu_for_product` on the
    catalog's names: the value the operator's pods select nodes of one kind by. None where the catalog's name is no
    label value (`NVIDIA GB200 (NVL72)`): nodes of that kind cannot be selected by it."""
    value = re.sub(r"\s+", "-", gpu.name.strip())
    return value if _LABEL_VALUE.match(value) else None


def _norm_product(text: str) -> str:
    return re.sub(r"[-_ ]+", "_", text.strip().lower())
