"""The funnel's typed tables: structural rows (instance shape × count), the knob axes, and candidate tables
per layout kind (named arrays: `ttft_s`, `tpot_s`, `capacity_rps`, `gpus`; for PD `prefill_count`,
`decode_count` and the ratio), each able to name the layout of any of its rows.

Built by planner.search.funnel and planner.search.pd_space; read by `decide` through the survivors. Frozen dataclasses of
numpy arrays, no stage logic. Knob values are stored per axis once; rows hold indices into the axes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from servingtopology.planner.engines.caps import knob_rejection, problem_caps
from servingtopology.planner.engines.role_knobs import decode_knobs, prefill_knobs
from servingtopology.planner.layout import Engine, EngineKnobs, KvDtype, Layout, LayoutKind, Parallelism, RoleLayout
from servingtopology.planner.problem import Problem

__all__ = ["IntArray", "FloatArray", "BoolArray", "UnitTable", "KnobAxes", "ReplicaCandidates", "PdCandidates",
           "RoleParts", "shape_rejection", "layout_rejection", "unit_table", "knob_axes", "add_reason"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def add_reason(reasons: dict[str, int], key: str, n: float) -> None:
    """Add `n` rejections to `reasons[key]` (nothing when n is 0)."""
    if n > 0:
        reasons[key] = reasons.get(key, 0) + int(n)


def shape_rejection(problem: Problem, tp: int, pp: int, dp: int) -> str | None:
    """Why an instance shape is impossible for this model and node, or None."""
    m, gpu, s = problem.model, problem.gpu, problem.search
    if m.num_heads % tp:
        return "TP does not divide the attention heads"
    if m.hidden_size % tp:
        return "TP does not divide the hidden size"
    if not m.is_mla and m.num_kv_heads % tp and tp % m.num_kv_heads:
        return "TP and the KV heads do not divide one another"
    if m.num_state_layers and m.state_heads % tp:  # vLLM shards Gated DeltaNet / Mamba heads and refuses a remainder
        return "TP does not divide the state-space heads"
    if pp > m.num_layers:
        return "PP exceeds the layers"
    if dp > 1 and not (m.is_moe or m.is_mla):
        return "attention DP needs an MoE or MLA model"
    group, per_node = tp * dp, gpu.gpus_per_node
    if group > per_node:
        # A TP×DP group over several nodes (DeepSeek-V3 as TP16 on two 8-GPU nodes, or TP2·DP8·EP over 16 GPUs): only
        # when the spec allows it, and only over whole nodes (one pod per node, each a whole share of the group).
        # The step model prices the group's collectives over the NIC past one node (perf._link_bps).
        if not s.allow_cross_node_tp:
            return "TP×DP group spans nodes"
        if group % per_node:
            return "a TP×DP group over several nodes does not fill whole nodes"
        return None
    if group * pp > per_node and per_node % group:
        return "pipeline stages do not tile whole nodes"
    nodes = -(-group * pp // per_node)
    if nodes > 1 and (group * pp % nodes or group * pp // nodes % group):
        # One pod per node (a LeaderWorkerSet group): each must hold the same whole number of TP×DP groups.
        return "the instance does not split into equal pods of whole TP×DP groups over its nodes"
    return None


def layout_rejection(problem: Problem, layout: Layout) -> tuple[str, str] | None:
    """Why a given layout (a pin, not a search row) is impossible: (its field, the reason), or None.

    The search's own rules, so a pin and a searched candidate are held to the same: each role's instance
    shape (`shape_rejection`, stage 1), the GPU budget (stage 2, named `hardware.maxGPUs` in the reason) and the
    engine release's start-up rules of the knobs (engine_caps.knob_rejection: vLLM's max_num_batched_tokens >=
    max_num_seqs and block sizes, which the search never offers otherwise). Fields are the spec's: `layout`,
    `layout.prefill`, `layout.decode`, `layout[.role].engineArgs.<knob>`.
    """
    for role, rl in layout.roles.items():
        par = rl.parallelism
        why = shape_rejection(problem, par.tp, par.pp, par.dp)
        if why is not None:
            where = "layout" if layout.kind is LayoutKind.REPLICAS else f"layout.{role.value}"
            m, gpus_per_node = problem.model, problem.gpu.gpus_per_node
            return where, (f"{par.label_for(problem.engine)} (TP {par.tp}, PP {par.pp}, DP {par.dp}): {why} (the model has {m.num_heads} attention "
                           f"and {m.num_kv_heads} KV heads, {m.num_layers} layers; {gpus_per_node} GPUs per node)")
    for role, rl in layout.roles.items():
        why = ep_rejection(problem, rl.parallelism)
        if why is not None:
            return ("layout.ep" if layout.kind is LayoutKind.REPLICAS else f"layout.{role.value}.ep"), why
    if layout.gpus > problem.max_gpus:
        return "layout", f"{layout.label_for(problem.engine)} needs {layout.gpus} GPUs, over the budget of {problem.max_gpus} (hardware.maxGPUs)"
    caps = problem_caps(problem)
    for role, rl in layout.roles.items():
        knob = knob_rejection(caps, rl.knobs)
        if knob is not None:
            where = "layout" if layout.kind is LayoutKind.REPLICAS else f"layout.{role.value}"
            return f"{where}.engineArgs.{knob[0]}", knob[1]
    return None


def ep_rejection(problem: Problem, par: Parallelism) -> str | None:
    """Why an instance's expert parallelism cannot run (EpOnExperts), or None: a dense model has no experts to spread;
    vLLM spreads them over every GPU of a stage or none (--enable-expert-parallel: EP size = TP × DP), so an EP size
    between is SGLang's alone (--ep-size); an EP size must divide the stage's GPUs (the spec checks it first)."""
    if not par.ep:
        return None
    stage = par.tp * par.dp
    words = par.label_for(problem.engine)
    if not problem.model.is_moe:
        return f"{words}: expert parallelism needs an MoE model; {problem.model.name} is dense (give ep 1, or leave it out)"
    if stage % par.moe_ep:
        return f"{words}: ep {par.moe_ep} does not divide the stage's {stage} GPUs"
    if problem.engine is Engine.VLLM and par.moe_ep != stage:
        return (f"{words}: vLLM spreads the experts over all {stage} GPUs of a stage or none (--enable-expert-parallel, EP size "
                f"= TP × DP); ep {par.moe_ep} is SGLang's --ep-size: give ep {stage} or 1")
    return None


@dataclass(frozen=True, slots=True)
class UnitTable:
    """Structural rows: one instance shape (tp, pp, dp) at one instance count.

    Units of one shape are contiguous and ordered by count 1, 2, …: unit `shape_start[s] + c - 1` is shape
    `s` at count `c`, so its GPUs are `shape_gpus[s] × c`.
    """

    shape: IntArray
    count: IntArray
    shape_tp: IntArray
    shape_pp: IntArray
    shape_dp: IntArray
    shape_start: IntArray          # one more entry than shapes: the end of the last shape
    shape_reason: tuple[str | None, ...]

    @property
    def shape_gpus(self) -> IntArray:
        return self.shape_tp * self.shape_pp * self.shape_dp

    @property
    def shape_valid(self) -> BoolArray:
        return np.array([r is None for r in self.shape_reason], dtype=bool)

    @property
    def tp(self) -> IntArray:
        return self.shape_tp[self.shape]

    @property
    def pp(self) -> IntArray:
        return self.shape_pp[self.shape]

    @property
    def dp(self) -> IntArray:
        return self.shape_dp[self.shape]

    @property
    def gpus(self) -> IntArray:
        return self.shape_gpus[self.shape] * self.count

    @property
    def valid(self) -> BoolArray:
        return self.shape_valid[self.shape]

    def parallelism(self, unit: int, *, moe: bool) -> Parallelism:
        s = int(self.shape[unit])
        dp = int(self.shape_dp[s])
        return Parallelism(tp=int(self.shape_tp[s]), pp=int(self.shape_pp[s]), dp=dp, ep=bool(dp > 1 and moe))


def unit_table(problem: Problem) -> UnitTable:
    """Every instance shape of the search at every count from 1 to the budget's worth (at least 1)."""
    s = problem.search
    shapes = list(itertools.product(s.tp, s.pp, s.dp))
    per_shape = [max(1, problem.max_gpus // (tp * pp * dp)) for tp, pp, dp in shapes]
    start = np.concatenate([[0], np.cumsum(per_shape)]).astype(np.int64)
    shape = np.repeat(np.arange(len(shapes), dtype=np.int64), per_shape)
    count = (np.arange(int(start[-1]), dtype=np.int64) - start[shape] + 1).astype(np.int64)
    return UnitTable(shape=shape, count=count, shape_tp=np.array([x[0] for x in shapes], dtype=np.int64),
                     shape_pp=np.array([x[1] for x in shapes], dtype=np.int64), shape_dp=np.array([x[2] for x in shapes], dtype=np.int64),
                     shape_start=start, shape_reason=tuple(shape_rejection(problem, *x) for x in shapes))


@dataclass(frozen=True, slots=True)
class KnobAxes:
    """The knob values the search offers, one axis each; rows refer to them by index."""

    max_num_batched_tokens: FloatArray
    max_num_seqs: FloatArray
    memory_fraction: FloatArray
    kv_dtypes: tuple[KvDtype, ...]

    @property
    def combinations(self) -> int:
        """Knob combinations per structure (the same count for replicas and for PD role pairs)."""
        return len(self.max_num_batched_tokens) * len(self.max_num_seqs) * len(self.memory_fraction) * len(self.kv_dtypes)

    def distinct(self) -> tuple[IntArray, IntArray, IntArray]:
        """Per axis, the index of each value among the distinct values (two equal values are one knob)."""
        b = np.unique(self.max_num_batched_tokens, return_inverse=True)[1].ravel()
        q = np.unique(self.max_num_seqs, return_inverse=True)[1].ravel()
        f = np.unique(np.round(self.memory_fraction * 1000), return_inverse=True)[1].ravel()
        return b.astype(np.int64), q.astype(np.int64), f.astype(np.int64)


def knob_axes(problem: Problem) -> KnobAxes:
    s = problem.search
    return KnobAxes(np.asarray(s.max_num_batched_tokens, dtype=np.float64), np.asarray(s.max_num_seqs, dtype=np.float64),
                    np.asarray(s.memory_fraction, dtype=np.float64), s.kv_dtypes)


@dataclass(frozen=True, slots=True)
class ReplicaCandidates:
    """Replica layouts, counted without being listed: one group per (instance shape, token budget, max seqs, memory
    fraction, KV dtype), standing for every instance count from 1 to `n_max` (the budget's worth).

    A candidate row is (unit, b, q, f, k) in that order, row `row(g, c)` for group `g` at count `c`. The stages keep
    a suffix of counts per group: `first` is the fewest instances still standing (`n_max + 1`: none), which holds
    because the estimate is monotone in the count (more instances of one shape never raise latency or lower
    capacity). Stage 4 also finds where each stage-5 test first passes (`first_ttft`, `first_tpot`, `first_pass`)
    and the figures at `first_pass`; NaN until then.
    """

    shape: IntArray
    b: IntArray
    q: IntArray
    f: IntArray
    k: IntArray
    n_max: IntArray
    estimated: BoolArray          # kept by stages 1–3: stage 4 estimates every count of these groups
    first: IntArray
    first_ttft: IntArray
    first_tpot: IntArray
    first_pass: IntArray
    pool_tokens: FloatArray       # per attention-DP rank, per group (the pool never depends on the count)
    ttft_s: FloatArray            # at `first_pass`
    tpot_s: FloatArray
    tpot_mean_s: FloatArray
    capacity_rps: FloatArray

    def __len__(self) -> int:
        return len(self.shape)

    @staticmethod
    def standing_of(n_max: IntArray, first: IntArray) -> int:
        """Candidates standing when each group keeps the counts from `first` to `n_max`."""
        return int(np.maximum(n_max - first + 1, 0).sum())

    @property
    def standing(self) -> int:
        return self.standing_of(self.n_max, self.first)

    def knob_index(self, knobs: KnobAxes) -> IntArray:
        """Each group's (b, q, f, k) as one index in row order, below knobs.combinations."""
        nq, nf, nk = len(knobs.max_num_seqs), len(knobs.memory_fraction), len(knobs.kv_dtypes)
        return ((self.b * nq + self.q) * nf + self.f) * nk + self.k

    def row(self, g: IntArray, count: IntArray, *, units: UnitTable, knobs: KnobAxes) -> IntArray:
        """The row index of group `g` at `count` instances, as if every row were listed (the tie order)."""
        unit = units.shape_start[self.shape[g]] + count - 1
        return np.asarray(unit * knobs.combinations + self.knob_index(knobs)[g], dtype=np.int64)

    def layout(self, row: int, *, units: UnitTable, knobs: KnobAxes, problem: Problem, parts: RoleParts | None = None) -> Layout:
        """The layout row `row` stands for; `parts` (one per table) shares the roles' pieces between the rows built."""
        u, rest = divmod(int(row), knobs.combinations)
        share = RoleParts() if parts is None else parts
        key = ("replicas", rest)
        kn = share.knobs.get(key)
        if kn is None:
            rest, k = divmod(rest, len(knobs.kv_dtypes))
            rest, f = divmod(rest, len(knobs.memory_fraction))
            b, q = divmod(rest, len(knobs.max_num_seqs))
            kn = share.knobs[key] = EngineKnobs(max_num_seqs=int(knobs.max_num_seqs[q]), max_num_batched_tokens=int(knobs.max_num_batched_tokens[b]),
                                                memory_fraction=float(knobs.memory_fraction[f]), kv_dtype=knobs.kv_dtypes[k])
        return Layout.replicas(int(units.count[u]), share.parallelism(units, u, moe=problem.model.is_moe), kn, problem.precision)


@dataclass(frozen=True, slots=True)
class RoleParts:
    """The pieces of layouts built from one table (instance shapes, knobs, PD roles), each made once and shared by every
    layout that has it: the funnel builds a few thousand survivors' layouts a run from a few hundred pieces. Frozen
    values, so sharing them changes nothing a layout says."""

    shapes: dict[int, Parallelism] = field(default_factory=dict)
    knobs: dict[tuple[str, int], EngineKnobs] = field(default_factory=dict)
    roles: dict[tuple[str | int, ...], RoleLayout] = field(default_factory=dict)

    def parallelism(self, units: UnitTable, unit: int, *, moe: bool) -> Parallelism:
        shape = int(units.shape[unit])
        par = self.shapes.get(shape)
        if par is None:
            par = self.shapes[shape] = units.parallelism(unit, moe=moe)
        return par


@dataclass(frozen=True, slots=True)
class PdCandidates:
    """PD layouts: one row per (prefill unit, decode unit, token budget, max seqs, memory fraction, KV dtype).

    Only the rows a stage needs in full are ever built (PD pairs grow as the budget squared); the counts
    of the others come from planner.search.pd_space without building them.
    """

    prefill_unit: IntArray
    decode_unit: IntArray
    b: IntArray
    q: IntArray
    f: IntArray
    k: IntArray
    prefill_count: IntArray
    decode_count: IntArray
    gpus: IntArray
    pool_tokens: FloatArray       # per decode attention-DP rank
    ttft_s: FloatArray            # client-side: prefill + KV transfer + first decode step + front end
    tpot_s: FloatArray
    tpot_mean_s: FloatArray
    capacity_rps: FloatArray      # the smaller of the two roles' capacities

    def __len__(self) -> int:
        return len(self.prefill_unit)

    @property
    def ratio(self) -> FloatArray:
        """Prefill instances per decode instance."""
        return self.prefill_count / np.maximum(self.decode_count, 1)

    def reduced_ratio(self) -> tuple[IntArray, IntArray]:
        """The P:D ratio in lowest terms (3:1 for 6 prefill and 2 decode instances)."""
        g = np.gcd(self.prefill_count, self.decode_count)
        return self.prefill_count // g, self.decode_count // g

    def layout(self, i: int, *, units: UnitTable, knobs: KnobAxes, problem: Problem, parts: RoleParts | None = None) -> Layout:
        """The layout row `i` stands for (role knobs from planner.engines.role_knobs); `parts` (one per table) shares the
        roles between the rows built."""
        share = RoleParts() if parts is None else parts
        k, b, q, f = int(self.k[i]), int(self.b[i]), int(self.q[i]), int(self.f[i])
        up, ud = int(self.prefill_unit[i]), int(self.decode_unit[i])
        p_key, d_key = ("prefill", up, b, k), ("decode", ud, q, f, k)
        p_role, d_role = share.roles.get(p_key), share.roles.get(d_key)
        kv = knobs.kv_dtypes[k]
        moe = problem.model.is_moe
        if p_role is None:
            p_role = share.roles[p_key] = RoleLayout(int(units.count[up]), share.parallelism(units, up, moe=moe),
                                                     prefill_knobs(max_num_batched_tokens=int(knobs.max_num_batched_tokens[b]),
                                                                   memory_fraction=float(knobs.memory_fraction.max()), kv_dtype=kv))
        if d_role is None:
            d_role = share.roles[d_key] = RoleLayout(int(units.count[ud]), share.parallelism(units, ud, moe=moe),
                                                     decode_knobs(max_num_seqs=int(knobs.max_num_seqs[q]),
                                                                  memory_fraction=float(knobs.memory_fraction[f]), kv_dtype=kv))
        return Layout.pd(p_role, d_role, problem.precision)


def ratio_label(prefill_count: int, decode_count: int) -> str:
    """`3:1` for 6 prefill and 2 decode instances."""
    g = math.gcd(prefill_count, decode_count) or 1
    return f"{prefill_count // g}:{decode_count // g}"


def empty_ints() -> IntArray:
    return np.zeros(0, dtype=np.int64)


def as_float(x: Any) -> FloatArray:
    return np.asarray(x, dtype=np.float64)
