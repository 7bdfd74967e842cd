"""Layouts: how GPUs are grouped into engine instances and roles, plus the engine knobs.

Owned values shared by the funnel, the simulator, the operator's manifest builders and the CLI.
Pure frozen dataclasses; no behaviour beyond derived counts and a short label.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from servingtopology.planner.hardware import Precision

__all__ = ["Engine", "KvDtype", "LayoutKind", "Role", "Parallelism", "EngineKnobs", "RoleLayout", "Layout", "layout_to_dict"]


class Engine(enum.StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"


class KvDtype(enum.StrEnum):
    AUTO = "auto"
    BF16 = "bf16"
    FP8 = "fp8"

    @property
    def bytes_per_value(self) -> int:
        """AUTO follows the model's activation dtype, which is bf16 for every catalog model."""
        return 1 if self is KvDtype.FP8 else 2


class LayoutKind(enum.StrEnum):
    REPLICAS = "replicas"
    PD = "pd"


class Role(enum.StrEnum):
    AGGREGATED = "aggregated"
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True, slots=True)
class Parallelism:
    """One engine instance: `tp` GPUs per attention group, `dp` attention data-parallel ranks, `pp` stages.

    The instance spans tp × dp × pp GPUs. MoE experts are sharded over tp × dp (expert parallel when `ep`: over all of
    them, or over `ep_size` of them where it is set, SGLang's `--ep-size`, the rest of each expert tensor-sharded).
    vLLM spells this `-tp tp -dp dp`; SGLang `--tp tp*dp --dp dp --enable-dp-attention`.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: bool = False
    # Experts spread over this many GPUs of a stage when fewer than tp × dp (SGLang --ep-size); 0: all of them when `ep`.
    # Left out of repr so that a layout without it keeps its set name (planner.live.transition.set_name adds it).
    ep_size: int = field(default=0, repr=False)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def moe_ep(self) -> int:
        """GPUs one expert-parallel group spreads the experts over: ep_size, else tp × dp under `ep`, else 1 (tensor-sharded)."""
        return self.ep_size if self.ep_size else (self.tp * self.dp if self.ep else 1)

    @staticmethod
    def with_ep(*, tp: int, pp: int = 1, dp: int = 1, ep: int) -> Parallelism:
        """The shape with experts over `ep` GPUs of each stage, canonical: 1 is none, tp × dp is `ep` (the whole stage),
        anything between is `ep_size`. `ep` must divide tp × dp (the spec checks it, naming the field)."""
        if ep <= 1:
            return Parallelism(tp=tp, pp=pp, dp=dp)
        return Parallelism(tp=tp, pp=pp, dp=dp, ep=True, ep_size=0 if ep == tp * dp else ep)

    @property
    def label(self) -> str:
        """The planner's own label, vLLM's spelling: `TP1·DP4` is `-tp 1 -dp 4`."""
        return self.label_for(Engine.VLLM)

    def label_for(self, engine: Engine) -> str:
        """The label in the engine's own words (EngineNamed). vLLM: `TP1·DP4` (`-tp 1 -dp 4`). SGLang counts the whole
        attention-DP group as its TP size: the same four GPUs are `TP4·DP4-attn` (`--tp-size 4` with attention split
        four ways, `--enable-dp-attention`), as its users write "TP4/DP4 attention"."""
        sglang_dp = engine is Engine.SGLANG and self.dp > 1
        parts = [f"TP{self.tp * self.dp if sglang_dp else self.tp}"]
        if self.pp > 1:
            parts.append(f"PP{self.pp}")
        if self.dp > 1:
            parts.append(f"DP{self.dp}-attn" if sglang_dp else f"DP{self.dp}")
        if self.ep:
            parts.append("EP" if self.moe_ep == self.tp * self.dp else f"EP{self.moe_ep}")   # EP2: experts over 2 of the GPUs
        return "·".join(parts)


@dataclass(frozen=True, slots=True)
class EngineKnobs:
    """Capacity knobs of one instance, in engine-neutral names.

    max_num_seqs: vLLM --max-num-seqs / SGLang --max-running-requests (per DP rank).
    max_num_batched_tokens: vLLM --max-num-batched-tokens / SGLang --chunked-prefill-size (per step).
    memory_fraction: vLLM --gpu-memory-utilization / SGLang --mem-fraction-static.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    memory_fraction: float = 0.9
    kv_dtype: KvDtype = KvDtype.AUTO
    block_size_tokens: int = 16
    enable_prefix_caching: bool = True


@dataclass(frozen=True, slots=True)
class RoleLayout:
    """`count` instances of one shape. `gpu`: the catalog id of the GPU kind this role runs on; empty: the problem's
    GPU (the spec's hardware.gpu). A layout whose roles name different kinds is a mixed-kind layout (planner.perf.mixed_pd)."""

    count: int
    parallelism: Parallelism
    knobs: EngineKnobs = field(default_factory=EngineKnobs)
    gpu: str = ""

    @property
    def gpus(self) -> int:
        return self.count * self.parallelism.gpus


@dataclass(frozen=True, slots=True)
class Layout:
    """A whole deployment: replicas (one AGGREGATED role) or PD (PREFILL and DECODE roles)."""

    kind: LayoutKind
    roles: Mapping[Role, RoleLayout]
    precision: Precision = Precision.BF16

    @property
    def gpus(self) -> int:
        return sum(r.gpus for r in self.roles.values())

    @property
    def kinds_named(self) -> bool:
        """Whether any role names its GPU kind (RoleLayout.gpu): such a layout's pods select nodes by kind."""
        return any(r.gpu for r in self.roles.values())

    def role_gpus(self, default: str) -> dict[Role, str]:
        """Each role's GPU kind (catalog id), `default` (the problem's GPU) where the role names none."""
        return {role: r.gpu or default for role, r in self.roles.items()}

    def _kinds_suffix(self) -> str:
        """`@a100_sxm` (every role on one named kind), `@h100_sxm→a100_sxm` (prefill→decode), `@?→a100_sxm` (one named)."""
        if not self.kinds_named:
            return ""
        if self.kind is LayoutKind.REPLICAS:
            return f"@{self.roles[Role.AGGREGATED].gpu}"
        p, d = self.roles[Role.PREFILL].gpu or "?", self.roles[Role.DECODE].gpu or "?"
        return f"@{p}" if p == d else f"@{p}→{d}"

    @property
    def label(self) -> str:
        """Short human label: `4×TP2`, `2P3D@TP4`, `2P(TP2)·3D(TP4)`; roles on named GPU kinds add them:
        `4×TP2@a100_sxm`, `1P(TP2)·2D(TP1)@h100_sxm→a100_sxm`. In vLLM's words; `label_for` in the engine's."""
        return self.label_for(Engine.VLLM)

    def label_for(self, engine: Engine) -> str:
        """`label` with each instance named as `engine` names it (Parallelism.label_for): a user reads the layout in
        the words of the engine the plan is for."""
        if self.kind is LayoutKind.REPLICAS:
            r = self.roles[Role.AGGREGATED]
            return f"{r.count}×{r.parallelism.label_for(engine)}{self._kinds_suffix()}"
        p, d = self.roles[Role.PREFILL], self.roles[Role.DECODE]
        if p.parallelism == d.parallelism and not self.kinds_named:
            return f"{p.count}P{d.count}D@{p.parallelism.label_for(engine)}"
        return (f"{p.count}P({p.parallelism.label_for(engine)})·{d.count}D({d.parallelism.label_for(engine)})"
                f"{self._kinds_suffix()}")

    @property
    def structure(self) -> str:
        """The layout without its scale: instance shapes and, for PD, the reduced P:D ratio.

        Goodput per GPU depends on the structure (and knobs), not on how many copies are deployed.
        """
        if self.kind is LayoutKind.REPLICAS:
            return self.roles[Role.AGGREGATED].parallelism.label + self._kinds_suffix()
        p, d = self.roles[Role.PREFILL], self.roles[Role.DECODE]
        g = math.gcd(p.count, d.count)
        return f"{p.count // g}P({p.parallelism.label}):{d.count // g}D({d.parallelism.label}){self._kinds_suffix()}"

    @staticmethod
    def replicas(count: int, parallelism: Parallelism, knobs: EngineKnobs | None = None,
                 precision: Precision = Precision.BF16) -> Layout:
        return Layout(LayoutKind.REPLICAS, {Role.AGGREGATED: RoleLayout(count, parallelism, knobs or EngineKnobs())}, precision)

    @staticmethod
    def pd(prefill: RoleLayout, decode: RoleLayout, precision: Precision = Precision.BF16) -> Layout:
        return Layout(LayoutKind.PD, {Role.PREFILL: prefill, Role.DECODE: decode}, precision)


def _knobs_dict(k: EngineKnobs) -> dict[str, object]:
    return {"maxNumSeqs": k.max_num_seqs, "maxNumBatchedTokens": k.max_num_batched_tokens, "memoryFraction": k.memory_fraction,
            "blockSize": k.block_size_tokens, "enablePrefixCaching": k.enable_prefix_caching}


def layout_to_dict(layout: Layout) -> dict[str, object]:
    """The layout in the spec's `layout` block shape (camelCase), so a plan can be pinned as it is."""
    if layout.kind is LayoutKind.REPLICAS:
        r = layout.roles[Role.AGGREGATED]
        p = r.parallelism
        return {"kind": layout.kind.value, "replicas": r.count, "tp": p.tp, "pp": p.pp, "dp": p.dp, "ep": p.ep,
                "engineArgs": _knobs_dict(r.knobs)}
    pars = [layout.roles[role].parallelism for role in (Role.PREFILL, Role.DECODE)]
    per_role = pars[0].ep != pars[1].ep or any(p.ep_size for p in pars)   # each role's own ep (its EP size) where they differ
    out: dict[str, object] = {"kind": layout.kind.value, "ep": False if per_role else pars[1].ep,
                              "engineArgs": _knobs_dict(layout.roles[Role.DECODE].knobs)}
    for role in (Role.PREFILL, Role.DECODE):
        r = layout.roles[role]
        p = r.parallelism
        out[role.value] = {"count": r.count, "tp": p.tp, "pp": p.pp, "dp": p.dp, "engineArgs": _knobs_dict(r.knobs),
                           **({"ep": p.moe_ep} if per_role else {}), **({"gpu": r.gpu} if r.gpu else {})}
    return out
