"""What the plan worker's forkserver does once, before it forks any plan (operator/cluster/plan_worker.py PRELOAD).

Every plan runs in a child forked from the forkserver, so whatever a plan loads lazily is loaded again in each child
unless the forkserver has it already: numpy's random and masked-array modules (imported on first use), the engine
releases' capability tables and the fitted performance parameters (JSON read once per process), the importlib
resource readers. A small plan of both engines (analytical, plus a short simulation of its best layout) loads all of
it here; ~0.06 CPU s a plan less (issue 17, planning CPU).

Then `gc.freeze()`: the forkserver's objects move to the collector's permanent generation, so a child's full
collections no longer walk (and copy on write) the hundreds of thousands of objects it inherited (the Python docs'
advice for fork without exec, gc.freeze).
"""

from __future__ import annotations

import gc
import logging

LOG = logging.getLogger(__name__)


def warm() -> None:
    """Plan a small Problem of each engine once (never raises: a failed warm-up only costs the children time)."""
    try:
        from servingtopology.planner.hardware import Precision, resolve_gpu
        from servingtopology.planner.layout import Engine
        from servingtopology.planner.model.catalog import resolve_model
        from servingtopology.planner.problem import Problem, SearchSpace
        from servingtopology.planner.search.decide import decide
        from servingtopology.planner.sim.stage import stage6_figures
        from servingtopology.planner.workload import LengthDist, Slo, Workload

        for engine in Engine:
            problem = Problem(model=resolve_model("llama-3.1-8b"), gpu=resolve_gpu("h100_sxm"), engine=engine, precision=Precision.BF16,
                              max_gpus=2, workload=Workload(LengthDist.fixed(512), LengthDist.fixed(64), arrival_rate_rps=1.0),
                              slo=Slo(ttft_ms=1000.0, tpot_ms=50.0), search=SearchSpace(top_k=1))
            decision = decide(problem)
            stage6_figures(problem, decision.best.layout, num_requests=16)
    except Exception:  # the warm-up is an optimisation; the plans report their own errors
        LOG.debug("plan worker warm-up failed", exc_info=True)


warm()
gc.freeze()
