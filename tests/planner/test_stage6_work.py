"""Stage 6 sized to the work: a pin simulates the pin and the replica baseline, not the searched candidates it makes
moot (PinSimulatesThePin); long requests are simulated fewer at a time (Stage6SizedToTheWork), and the operator simulates
what its spec's simulation.requests asks for."""

from dataclasses import replace

import pytest

from servingtopology.operator.api.resource import parse_topology_spec
from servingtopology.operator.cluster.plan_worker import plan_with_simulator
from servingtopology.operator.pass_context import problem_from_spec
from servingtopology.planner.layout import LayoutKind, Role
from servingtopology.planner.problem import SimulationBudget
from servingtopology.planner.search.decide import PIN_MAKES_SEARCH_MOOT, SimFigures, decide
from servingtopology.planner.search.stage6_size import STAGE6_REQUESTS, stage6_requests
from servingtopology.planner.sim import stage
from servingtopology.planner.workload import LengthDist, Workload
from servingtopology.spec import parse_spec, to_problem


def _spec(**over):
    # 40 req/s on up to 32 H100s at p95 TPOT 25 ms: stage 5 hands stage 6 more structures than a pin simulates (eleven
    # under the measured-terms fit, eight of them simulated). How many depends on the fit: at 40 ms the measured GEMMs
    # leave 2×TP1 alone on its fewest GPUs (its decode step is faster than the roofline's), and so did 60 ms under
    # benchmarks/ablation/perf_params_seq_serial_continued.json.
    spec = {"model": "llama-3.1-8b", "engine": "vllm", "hardware": {"gpu": "h100_sxm", "gpusPerNode": 8, "maxGPUs": 32},
            "workload": {"arrivalRate": 40, "inputTokens": 1000, "outputTokens": 200},
            "slo": {"ttftMs": {"p95": 1000}, "tpotMs": {"p95": 25}}}
    spec.update(over)
    return spec


def _problem(**over):
    return to_problem(parse_spec(_spec(**over)))


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


@pytest.mark.parametrize(("input_tokens", "output_tokens", "requests", "expected"), [
    (2_048, 256, 2_000, 600),          # the operator's load scenario: 600 requests, as before
    (2_048, 256, 200, 200),            # fewer asked: fewer simulated (the operator's budget-miss advice)
    (32_768, 1_024, 2_000, 600),       # 20 M tokens: under the cap
    (65_536, 1_024, 2_000, 504),       # 2^25 / 66,560 tokens a request
    (510_012, 8_192, 2_000, 100),      # seed 000: 64 by the cap, held at the floor of 100
    (510_012, 8_192, 40, 40),          # the floor never raises what the spec asks for
])
def test_stage_6_simulates_fewer_requests_as_they_grow_long(input_tokens, output_tokens, requests, expected):
    lengths = Workload(LengthDist.fixed(input_tokens), LengthDist.fixed(output_tokens), arrival_rate_rps=0.02)
    problem = replace(_problem(), workload=lengths, simulation=SimulationBudget(requests=requests))
    sized = stage6_requests(problem)
    assert sized.requests == expected
    assert bool(sized.reason) == (expected < min(requests, STAGE6_REQUESTS))


def test_the_operator_simulates_the_requests_its_spec_asks_for(monkeypatch):
    spec = parse_topology_spec({**_spec(), "engine": {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0"},
                                "simulation": {"requests": 120, "seed": 7}})
    asked = []

    def recording(problem, layout, *, num_requests, seed):
        asked.append((num_requests, seed))
        return real(problem, layout, num_requests=num_requests, seed=seed)
    real = stage.simulate_problem
    monkeypatch.setattr(stage, "simulate_problem", recording)
    plan_with_simulator(problem_from_spec(spec, None))
    assert asked and set(asked) == {(120, 7)}


def test_a_long_prompt_plan_says_how_many_requests_it_simulated():
    problem = _problem(workload={"arrivalRate": 0.2, "inputTokens": 118_000, "outputTokens": 1_000},
                       slo={"ttftMs": {"p95": 60_000}, "tpotMs": {"p95": 100}})
    d = decide(problem, simulate=lambda p, lay: SimFigures(ttft_s=0.2, tpot_s=0.02, tpot_mean_s=0.02))
    assert any(r.startswith("Simulation: 281 requests simulated per layout, not 600") for r in d.reasons)
    stage6 = next(s for s in d.funnel if s.stage.startswith("6"))
    assert any(k.startswith("281 requests") for k in stage6.reasons)
