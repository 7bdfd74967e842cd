"""Stage 6 sized to the work: a pin simulates the pin and the replica baseline, not the searched candidates it makes
moot (PinSimulatesThePin)."""

from servingtopology.planner.layout import LayoutKind, Role
from servingtopology.planner.search.decide import PIN_MAKES_SEARCH_MOOT, SimFigures, decide
from servingtopology.spec import parse_spec, to_problem


def _spec(**over):
    # 40 req/s on up to 32 H100s: stage 5 hands four structures to stage 6 (replicas and three P:D ratios)
    spec = {"model": "llama-3.1-8b", "engine": "vllm", "hardware": {"gpu": "h100_sxm", "gpusPerNode": 8, "maxGPUs": 32},
            "workload": {"arrivalRate": 40, "inputTokens": 1000, "outputTokens": 200},
            "slo": {"ttftMs": {"p95": 1000}, "tpotMs": {"p95": 60}}}
    spec.update(over)
    return spec


def _recording():
    seen = []

    def simulate(problem, layout):
        seen.append(layout)
        return SimFigures(ttft_s=0.2, tpot_s=0.02, tpot_mean_s=0.02)
    return seen, simulate


def _one_gpu_replica(layout):
    return layout.kind is LayoutKind.REPLICAS and layout.roles[Role.AGGREGATED].parallelism.gpus == 1


def test_a_pinned_layout_simulates_the_pin_and_the_one_gpu_replica_baseline_only():
    seen, simulate = _recording()
    problem = to_problem(parse_spec(_spec(layout={"kind": "replicas", "replicas": 2, "tp": 4})))
    d = decide(problem, simulate=simulate)
    assert problem.pinned in seen and len(seen) == 2
    baseline = next(lay for lay in seen if lay != problem.pinned)
    assert _one_gpu_replica(baseline)
    stage6 = next(s for s in d.funnel if s.stage.startswith("6"))
    assert stage6.reasons[PIN_MAKES_SEARCH_MOOT] == len(d.evaluated) - 1
    simulated = [c for c in d.evaluated if c.prediction.source == "simulated"]
    assert [c.layout for c in simulated] == [baseline]


def test_the_same_search_unpinned_simulates_its_top_k_structures():
    seen, simulate = _recording()
    problem = to_problem(parse_spec(_spec()))
    d = decide(problem, simulate=simulate)
    structures = {c.layout.structure for c in d.evaluated}
    assert len(seen) == min(problem.search.top_k, len(structures)) > 2
    assert len({lay.structure for lay in seen}) == len(seen)
