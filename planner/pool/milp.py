"""A small mixed-integer linear program and its solution through HiGHS (`highspy`), deterministic.

Called by planner.pool.plan (the pool planner's exact solver and its LP bound). Owns the translation from dense numpy rows
to HiGHS' column-wise model and back; knows nothing about pools. Must not read the clock: the work is bounded by a
node limit (deterministic), never by a time limit. HiGHS runs single-threaded with a fixed seed, so one input gives
one answer.

Why HiGHS through `highspy` rather than `scipy.optimize.milp` (which wraps the same HiGHS): the `highspy` 1.15.1 wheel
is 5.0 MB and needs only numpy; scipy's is 35 MB for one function, and `scipy.optimize.milp` does not expose the
MIP's dual bound when it stops at its node limit, which the pool planner reports as its optimality gap.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import highspy
import numpy as np
import numpy.typing as npt

__all__ = ["MilpStatus", "MilpResult", "SparseRows", "solve_milp"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class SparseRows:
    """The constraint rows by their non-zeros, row after row (CSR): row r holds `value[start[r]:start[r + 1]]` at the
    columns `column[…]`, ascending. A dense matrix of the pool's size (6,000 options at ten times the load: 6,500 rows
    of 6,300 columns) held 330 MB a copy, a gigabyte in all."""

    n_cols: int
    start: IntArray
    column: IntArray
    value: FloatArray

    @property
    def n_rows(self) -> int:
        return len(self.start) - 1

    @staticmethod
    def of(rows: list[tuple[IntArray, FloatArray]], n_cols: int) -> SparseRows:
        """From (columns, values) per row, the values non-zero."""
        lengths = np.array([len(c) for c, _ in rows], dtype=np.int64)
        start = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        column = np.concatenate([c for c, _ in rows]).astype(np.int64) if rows else np.zeros(0, dtype=np.int64)
        value = np.concatenate([v for _, v in rows]).astype(np.float64) if rows else np.zeros(0)
        return SparseRows(n_cols, start, column, value)


class MilpStatus(enum.StrEnum):
    OPTIMAL = "optimal"            # proved optimal (gap 0 within the solver's tolerances)
    NODE_LIMIT = "node-limit"      # stopped at the node limit with a solution: `bound` says how far it may be
    INFEASIBLE = "infeasible"
    NO_SOLUTION = "no-solution"    # stopped without any feasible solution


@dataclass(frozen=True, slots=True)
class MilpResult:
    status: MilpStatus
    x: FloatArray            # empty unless a solution was found
    objective: float         # in the caller's sense (maximised objectives are returned as maxima)
    bound: float             # the best bound proved: ≥ objective when maximising, ≤ when minimising
    nodes: int


class _QuietHighs(highspy.Highs):
    """highspy's solver with its log off before its first call (QuietSolver). The wrapper's constructor enables its
    callbacks, a HiGHS call that prints the banner ("Running HiGHS …") on stdout while output_flag still has its default
    (highspy 1.16): on `plan --pool --json` that banner came before the JSON. Setting the option is the one call that
    logs nothing, so it goes first."""

    def enableCallbacks(self) -> None:
        self.setOptionValue("output_flag", False)
        super().enableCallbacks()  # type: ignore[no-untyped-call]


def solve_milp(cost: FloatArray, rows: SparseRows, row_lower: FloatArray, row_upper: FloatArray, *, col_lower: FloatArray,
               col_upper: FloatArray, integer: npt.NDArray[np.bool_], maximize: bool, node_limit: int = 20_000,
               relax: bool = False) -> MilpResult:
    """Optimise cost·x subject to row_lower ≤ rows·x ≤ row_upper and the column bounds; `integer` marks integer columns.

    `relax` solves the LP relaxation (every column continuous): its optimum bounds the MILP's. Infinite bounds are
    ±inf. The pool planner's models have a few thousand columns and rows, a few non-zeros in each.
    """
    n_rows, n_cols = rows.n_rows, rows.n_cols
    h = _QuietHighs()  # type: ignore[no-untyped-call]
    for key, value in (("output_flag", False), ("threads", 1), ("random_seed", 0), ("mip_rel_gap", 0.0), ("mip_abs_gap", 1e-9),
                       ("mip_max_nodes", int(node_limit))):
        h.setOptionValue(key, value)
    lp = highspy.HighsLp()
    lp.num_col_ = n_cols
    lp.num_row_ = n_rows
    lp.col_cost_ = np.asarray(-cost if maximize else cost, dtype=np.float64)
    inf = highspy.kHighsInf
    lp.col_lower_ = np.where(np.isfinite(col_lower), col_lower, -inf)
    lp.col_upper_ = np.where(np.isfinite(col_upper), col_upper, inf)
    lp.row_lower_ = np.where(np.isfinite(row_lower), row_lower, -inf)
    lp.row_upper_ = np.where(np.isfinite(row_upper), row_upper, inf)
    row_of = np.repeat(np.arange(n_rows, dtype=np.int64), np.diff(rows.start))
    order = np.lexsort((row_of, rows.column))   # column-major order of the non-zeros, rows ascending in each column
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.concatenate([[0], np.cumsum(np.bincount(rows.column, minlength=n_cols))]).astype(np.int32)
    lp.a_matrix_.index_ = row_of[order].astype(np.int32)
    lp.a_matrix_.value_ = rows.value[order].astype(np.float64)
    if not relax and integer.any():
        lp.integrality_ = [highspy.HighsVarType.kInteger if b else highspy.HighsVarType.kContinuous for b in integer]
    h.passModel(lp)
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    sign = -1.0 if maximize else 1.0
    solved = status == highspy.HighsModelStatus.kOptimal
    if status == highspy.HighsModelStatus.kInfeasible:
        return MilpResult(MilpStatus.INFEASIBLE, np.zeros(0), math.nan, math.nan, int(info.mip_node_count))
    has_x = solved or int(info.primal_solution_status) == 2   # 2: kSolutionStatusFeasible
    if not has_x:
        return MilpResult(MilpStatus.NO_SOLUTION, np.zeros(0), math.nan, math.nan, int(info.mip_node_count))
    x = np.asarray(h.getSolution().col_value, dtype=np.float64)
    objective = float(np.dot(cost, x))
    if relax or not integer.any():
        bound = objective
    else:
        bound = sign * float(info.mip_dual_bound) if solved or math.isfinite(info.mip_dual_bound) else math.inf * (1 if maximize else -1)
    return MilpResult(MilpStatus.OPTIMAL if solved else MilpStatus.NODE_LIMIT, x, objective, bound if not solved else objective,
                      max(int(info.mip_node_count), 0))
