"""The emulator's simulator and metrics: requests are conserved, KV stays inside the pool, metrics are well formed."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from servingtopology.emulator.command_parser import parse_engine_command
from servingtopology.emulator.engine import BatchingEngine, SimulatorKind, build_simulator, gpu_for_label
from servingtopology.emulator.exposition import EngineMetrics, Histogram
from servingtopology.emulator.instance import EmulatedInstance, Share
from servingtopology.emulator.traffic import Phase, TrafficProfile, TrafficProfileError, arrival_gap_s
from servingtopology.planner.layout import Role


class _FlatStep:
    """A step costs 1 ms plus 10 µs per prefill token: easy to reason about."""

    def step_time_s(self, *, prefill_tokens: float, prefill_pairs: float, decode_tokens: float,
                    decode_context_tokens: float) -> float:
        return 1e-3 + 1e-5 * prefill_tokens


def test_every_submitted_request_finishes_once_with_ordered_times() -> None:
    engine = BatchingEngine(step_model=_FlatStep(), role=Role.AGGREGATED, max_running=4, token_budget=256,
                            kv_capacity_tokens=10_000)
    for i in range(20):
        engine.submit(arrival_s=i * 0.01, input_tokens=300, output_tokens=5, cached_tokens=0)
    done = engine.advance(60.0).completions
    assert len(done) == 20
    assert all(0 <= c.queue_s <= c.ttft_s <= c.e2e_s for c in done)
    assert engine.gauges().running == 0 and engine.gauges().waiting == 0


def test_the_running_cap_and_kv_pool_hold_requests_back() -> None:
    engine = BatchingEngine(step_model=_FlatStep(), role=Role.AGGREGATED, max_running=2, token_budget=4096,
                            kv_capacity_tokens=1000)
    for _ in range(6):
        engine.submit(arrival_s=0.0, input_tokens=400, output_tokens=50, cached_tokens=0)
    engine.advance(0.002)
    gauges = engine.gauges()
    assert gauges.running == 2 and gauges.waiting == 4
    assert gauges.kv_used_tokens <= gauges.kv_capacity_tokens


def test_a_prefill_instance_stops_after_the_first_token_and_a_decode_instance_skips_the_prompt() -> None:
    prefill = BatchingEngine(step_model=_FlatStep(), role=Role.PREFILL, max_running=8, token_budget=8192,
                             kv_capacity_tokens=100_000)
    decode = BatchingEngine(step_model=_FlatStep(), role=Role.DECODE, max_running=8, token_budget=8192,
                            kv_capacity_tokens=100_000)
    for engine in (prefill, decode):
        engine.submit(arrival_s=0.0, input_tokens=2000, output_tokens=100, cached_tokens=0)
    p, d = prefill.advance(10.0), decode.advance(10.0)
    assert p.completions[0].output_tokens == 1 and p.prompt_tokens == 2000
    assert d.prompt_tokens == 0 and d.generation_tokens == 100


def test_more_load_never_shortens_time_to_first_token() -> None:
    def mean_ttft(rate_rps: float) -> float:
        engine = BatchingEngine(step_model=_FlatStep(), role=Role.AGGREGATED, max_running=16, token_budget=2048,
                                kv_capacity_tokens=200_000)
        for i in range(int(rate_rps * 10)):
            engine.submit(arrival_s=i / rate_rps, input_tokens=1000, output_tokens=20, cached_tokens=0)
        done = engine.advance(1000.0).completions
        return sum(c.ttft_s for c in done) / len(done)

    assert mean_ttft(5.0) <= mean_ttft(50.0) <= mean_ttft(200.0)


def test_an_instance_serves_its_share_of_the_scripted_rate() -> None:
    clock = [0.0]
    config = parse_engine_command(["vllm", "serve", "llama-3.1-8b"])
    instance = EmulatedInstance(name="t", config=config, simulator=build_simulator(config, gpu=gpu_for_label("H100")),
                                share=lambda _t: Share(Phase(10.0, 200, 20), 0.5), monotonic=lambda: clock[0])
    try:
        for _ in range(240):  # 60 simulated seconds in 0.25 s ticks
            clock[0] += 0.25
            instance.tick()
        text = instance.metrics.render()
    finally:
        instance.stop()
    finished = float(next(line.split()[-1] for line in text.splitlines() if line.startswith("vllm:e2e_request_latency_seconds_count")))
    assert 240 <= finished <= 360  # 5 rps for 60 s, Poisson


def test_rendered_metrics_pass_promtool_and_carry_the_engine_names() -> None:
    for argv, names in (
        (["vllm", "serve", "llama-3.1-8b"], ["vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                                             "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_sum"]),
        (["python3", "-m", "sglang.launch_server", "--model-path", "llama-3.1-8b"],
         ["sglang:num_queue_reqs", "sglang:token_usage", "sglang:time_to_first_token_seconds_count"]),
    ):
        metrics = EngineMetrics(parse_engine_command(argv))
        text = metrics.render()
        for name in names:
            assert name in text
        promtool = shutil.which("promtool")
        if promtool:
            done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
            assert "error" not in (done.stdout + done.stderr).lower(), done.stdout + done.stderr


def test_histogram_buckets_are_cumulative() -> None:
    histogram = Histogram((0.1, 1.0))
    histogram.observe(0.05)
    histogram.observe(0.5, times=3)
    histogram.observe(5.0)
    lines = histogram.lines("x", 'a="b"')
    assert lines[:3] == ['x_bucket{a="b",le="0.1"} 1', 'x_bucket{a="b",le="1.0"} 4', 'x_bucket{a="b",le="+Inf"} 5']


def test_profile_phases_follow_each_other_then_hold_the_last() -> None:
    profile = TrafficProfile.from_mapping({"phases": [
        {"rate_rps": 1, "input_tokens": 100, "output_tokens": 10, "duration_s": 30},
        {"rate_rps": 5, "input_tokens": 4000, "output_tokens": 10},
    ]})
    assert profile.phase_at(29.9).rate_rps == 1 and profile.phase_at(30.0).rate_rps == 5
    assert profile.phase_at(1e6).input_tokens == 4000


@pytest.mark.parametrize(("raw", "message"), [
    ({}, "phases"),  # nothing at all
    ({"phases": [{"rate_rps": 1, "input_tokens": 0, "output_tokens": 1}]}, r"phases\[0\]\.input_tokens"),
    ({"phases": [{"rate_rps": 1, "input_tokens": 1, "output_tokens": 1, "rps": 2}]}, "unknown field"),
    # EngineSlowdown: only slower than the model, only in its step terms.
    ({"phases": [{"rate_rps": 1, "input_tokens": 1, "output_tokens": 1, "slowdown": {"weights": 0.5}}]},
     r"phases\[0\]\.slowdown\.weights: must be at least 1"),
    ({"phases": [{"rate_rps": 1, "input_tokens": 1, "output_tokens": 1, "slowdown": {"nic": 2}}]}, r"unknown step term\(s\) nic"),
    ({"phases": [{"rate_rps": 1, "input_tokens": 1, "output_tokens": 1, "slowdown": 2}]}, r"phases\[0\]\.slowdown: must be a mapping"),
    ({"phases": [{"rate_rps": 1, "input_tokens": 1, "output_tokens": 1, "burstiness": 0}]}, r"phases\[0\]\.burstiness: must be at least"),
    ({"phases": [{"rate_rps": 1, "input_tokens": 1, "output_tokens": 1, "burstiness": 1e6}]}, r"phases\[0\]\.burstiness: must be at most 1000"),
])
def test_bad_profiles_name_the_field(raw: dict, message: str) -> None:
    with pytest.raises(TrafficProfileError, match=message):
        TrafficProfile.from_mapping(raw)


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 16.0])
def test_arrival_gaps_keep_the_rate_and_spread_as_vllm_bench_serves_burstiness(burstiness: float) -> None:
    # Gamma gaps of shape b and mean 1/rate (vllm bench serve --burstiness): coefficient of variation 1/√b.
    assert TrafficProfile.from_mapping({"phases": [{"rate_rps": 4, "input_tokens": 1, "output_tokens": 1,
                                                    "burstiness": burstiness}]}).phases[0].burstiness == burstiness
    rng = np.random.default_rng(7)
    gaps = np.array([arrival_gap_s(rng, 4.0, burstiness) for _ in range(40_000)])
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0 / np.sqrt(burstiness), rel=0.05)
    # Burstiness 1 draws the same exponential gaps as the emulator always did, so seeded runs are unchanged.
    assert arrival_gap_s(np.random.default_rng(3), 2.0) == float(np.random.default_rng(3).exponential(0.5))


def test_the_project_simulator_and_the_builtin_stepper_agree_on_an_unloaded_engine() -> None:
    config = parse_engine_command(["vllm", "serve", "llama-3.1-8b"])
    gpu = gpu_for_label("H100")
    means = {}
    for kind in (SimulatorKind.PROJECT, SimulatorKind.BUILTIN):
        simulator = build_simulator(config, gpu=gpu, kind=kind)
        for i in range(40):
            simulator.submit(arrival_s=i * 0.5, input_tokens=1000, output_tokens=100, cached_tokens=0)
        done = simulator.advance(60.0).completions
        assert len(done) == 40, kind
        means[kind] = (sum(c.ttft_s for c in done) / 40, sum(c.mean_itl_s for c in done) / 40)
    (ttft_p, itl_p), (ttft_b, itl_b) = means[SimulatorKind.PROJECT], means[SimulatorKind.BUILTIN]
    assert 0.5 < ttft_p / ttft_b < 2.0 and 0.5 < itl_p / itl_b < 2.0, means


@pytest.mark.parametrize("kind", list(SimulatorKind))
def test_a_slowdown_in_the_profile_makes_the_engine_slower_never_faster(kind: SimulatorKind) -> None:
    profile = TrafficProfile.from_mapping({"phases": [{"rate_rps": 2, "input_tokens": 1000, "output_tokens": 100,
                                                       "slowdown": {"weights": 2.0, "overhead": 2.0}}]})
    assert dict(profile.phases[0].slowdown) == {"overhead": 2.0, "weights": 2.0}
    config = parse_engine_command(["vllm", "serve", "llama-3.1-8b"])
    itl = {}
    for slowdown in ({}, dict(profile.phases[0].slowdown)):
        simulator = build_simulator(config, gpu=gpu_for_label("H100"), kind=kind)
        simulator.slowdown = slowdown
        for i in range(20):
            simulator.submit(arrival_s=i * 0.5, input_tokens=1000, output_tokens=100, cached_tokens=0)
        done = simulator.advance(60.0).completions
        assert len(done) == 20
        itl[bool(slowdown)] = sum(c.mean_itl_s for c in done) / len(done)
    # A decode step of an 8B model on an H100 is mostly weight streaming and step overhead: about twice as long (a bit
    # more: slower steps overlap more requests, so each step carries more of them).
    assert 1.6 < itl[True] / itl[False] < 2.5, itl


def test_the_chunked_replay_reports_gauges_while_requests_run() -> None:
    config = parse_engine_command(["vllm", "serve", "llama-3.1-8b"])
    simulator = build_simulator(config, gpu=gpu_for_label("H100"), kind=SimulatorKind.PROJECT)
    for i in range(200):
        simulator.submit(arrival_s=i * 0.05, input_tokens=2000, output_tokens=500, cached_tokens=0)
    simulator.advance(5.0)
    gauges = simulator.gauges()
    assert gauges.running > 0 and 0 < gauges.kv_used_tokens <= gauges.kv_capacity_tokens


@pytest.mark.parametrize("kind", list(SimulatorKind))
def test_the_reported_ttft_counts_the_front_end_as_the_planner_predicts_it(kind: SimulatorKind) -> None:
    # The engine's TTFT histogram runs from the request's arrival at its front end, so an idle SGLang engine
    # reports at least perf.request_overhead_s (about 0.15 s), the latency the planner adds to its predictions.
    from servingtopology.planner.layout import Engine
    from servingtopology.planner.perf.step import request_overhead_s

    config = parse_engine_command(["python3", "-m", "sglang.launch_server", "--model-path", "meta-llama/Llama-3.1-8B-Instruct"])
    simulator = build_simulator(config, gpu=gpu_for_label("H100"), kind=kind)
    simulator.submit(arrival_s=0.0, input_tokens=1000, output_tokens=10, cached_tokens=0)
    (done,) = simulator.advance(60.0).completions
    front = float(request_overhead_s(Engine.SGLANG, 1000))
    assert front > 0.1 and front < done.ttft_s < front + 0.1 and done.e2e_s > done.ttft_s


def _families(text: str) -> dict[str, tuple[str, set[str]]]:
    """name -> (type, label names) of an exposition."""
    import re as _re

    out: dict[str, tuple[str, set[str]]] = {}
    kinds = dict(_re.findall(r"^# TYPE (\S+) (\S+)$", text, _re.M))
    for name, labels in _re.findall(r"^([a-z_:]+)\{([^}]*)\}", text, _re.M):
        family = next((f for f in kinds if name == f or name.startswith(f + "_")), name)
        out.setdefault(family, (kinds.get(family, ""), set()))[1].update(_re.findall(r'([a-z_]+)="', labels))
    return out


@pytest.mark.parametrize("argv", [
    ["vllm", "serve", "llama-3.1-8b", "--tensor-parallel-size", "1"],
    ["python3", "-m", "sglang.launch_server", "--model-path", "qwen3-30b-a3b", "--tp-size", "8", "--attn-dp-size", "4"],
])
def test_emulated_metrics_carry_the_names_types_and_labels_of_the_release(argv: list[str]) -> None:
    from servingtopology.planner.engines.caps import load_caps

    config = parse_engine_command(argv)
    caps = load_caps(config.engine.value, config.version)
    for family, (kind, labels) in _families(EngineMetrics(config).render()).items():
        declared = caps.metric(family) or caps.metric(family.removesuffix("_total"))
        assert declared is not None, f"{family} is not a {caps.label} metric"
        assert declared.type == kind, (family, declared.type, kind)
        for extra in ("cache_source", "is_streaming"):
            assert (extra in labels) == (extra in declared.labels_expr), (family, extra)


def test_sglang_gauges_come_from_the_first_attention_dp_rank_unless_every_scheduler_reports() -> None:
    base = ["python3", "-m", "sglang.launch_server", "--model-path", "qwen3-30b-a3b", "--tp-size", "8", "--attn-dp-size", "4"]
    first_only = EngineMetrics(parse_engine_command(base)).render()
    every = EngineMetrics(parse_engine_command([*base, "--enable-metrics-for-all-schedulers"])).render()
    assert [ln for ln in first_only.splitlines() if ln.startswith("sglang:num_running_reqs{")] == [
        ln for ln in first_only.splitlines() if ln.startswith("sglang:num_running_reqs{") and 'dp_rank="0"' in ln]
    assert len([ln for ln in every.splitlines() if ln.startswith("sglang:num_running_reqs{")]) == 4


def test_an_sglang_decode_ttft_counts_the_prefill_and_a_vllm_decode_ttft_does_not() -> None:
    ttft = {}
    for engine, argv in (("sglang", ["python3", "-m", "sglang.launch_server", "--model-path", "llama-3.1-8b", "--disaggregation-mode", "decode"]),
                         ("vllm", ["vllm", "serve", "llama-3.1-8b", "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}'])):
        config = parse_engine_command(argv)
        sim = build_simulator(config, gpu=gpu_for_label("NVIDIA-H100-80GB-HBM3"), kind=SimulatorKind.BUILTIN)
        sim.submit(arrival_s=0.0, input_tokens=8000, output_tokens=4, cached_tokens=0)
        ttft[engine] = sim.advance(30.0).completions[0].ttft_s
    # An 8k-token prefill of an 8B model on an H100 takes hundreds of ms; a decode step a few ms.
    assert ttft["sglang"] > 0.1 > ttft["vllm"]


@pytest.mark.parametrize(("product", "gid"), [
    ("NVIDIA-A100-SXM4-40GB", "a100_40gb"),     # the planner's one product-label rule (planner.hardware.gpu_for_product)
    ("NVIDIA-H100-PCIe", "h100_pcie"),
    ("NVIDIA-Tesla-T4", "h100_sxm"),            # unknown: the emulator still runs something, an H100
    (None, "h100_sxm"),
])
def test_the_emulated_gpu_is_the_one_the_planner_maps_the_label_to_else_an_h100(product: str | None, gid: str) -> None:
    assert gpu_for_label(product).id == gid


@pytest.mark.parametrize("argv", [
    ["vllm", "serve", "llama-3.1-8b", "--tensor-parallel-size", "1"],
    ["python3", "-m", "sglang.launch_server", "--model-path", "qwen3-30b-a3b", "--tp-size", "8", "--attn-dp-size", "4"],
])
def test_emulated_metrics_are_current_names_of_the_shared_vocabulary(argv: list[str]) -> None:
    """The exposition spells no metric name of its own: every family it renders is a current (not LEGACY) name of
    planner/engines/metric_names.py, the vocabulary the operator's PromQL reads."""
    from servingtopology.planner.engines.metric_names import LEGACY, vocabulary

    config = parse_engine_command(argv)
    names = set(vocabulary(config.engine)) - LEGACY
    families = _families(EngineMetrics(config).render())
    assert families
    assert set(families) <= names, sorted(set(families) - names)


@pytest.mark.parametrize("product,engine,argv", [
    ("H100", "sglang", ["python3", "-m", "sglang.launch_server", "--model-path", "llama-3.1-8b"]),
    ("L40S", "sglang", ["python3", "-m", "sglang.launch_server", "--model-path", "llama-3.1-8b"]),
    ("H100", "vllm", ["vllm", "serve", "llama-3.1-8b"]),
    ("L40S", "vllm", ["vllm", "serve", "llama-3.1-8b"]),
])
def test_flags_left_out_get_the_engines_own_defaults_from_the_one_rule(product: str, engine: str, argv: list[str]) -> None:
    # The emulator must not give an engine more room than the engine gives itself: SGLang's computed
    # --mem-fraction-static (0.835 on an H100 at TP1, not a flat 0.88) and its chunk by GPU memory (8192 on an L40S).
    from servingtopology.planner.engines.defaults import max_running, memory_fraction, token_budget
    from servingtopology.planner.hardware import Precision
    from servingtopology.planner.layout import Engine as PlannerEngine
    from servingtopology.planner.layout import EngineKnobs, Parallelism
    from servingtopology.planner.model.catalog import resolve_model
    from servingtopology.planner.perf.memory import kv_pool_tokens

    config = parse_engine_command(argv)
    gpu = gpu_for_label(product)
    kind = PlannerEngine(engine)
    fraction = memory_fraction(kind, gpu, release=config.version)
    if kind is PlannerEngine.SGLANG and product == "H100":
        assert fraction < 0.85
    simulator = build_simulator(config, gpu=gpu, kind=SimulatorKind.BUILTIN)
    assert simulator.token_budget == int(token_budget(kind, gpu))
    assert simulator.max_running == max_running(kind, gpu)
    knobs = EngineKnobs(max_num_seqs=max_running(kind, gpu), max_num_batched_tokens=int(token_budget(kind, gpu)),
                        memory_fraction=fraction)
    expected = kv_pool_tokens(resolve_model("llama-3.1-8b"), gpu, engine=kind, precision=Precision.BF16,
                              parallelism=Parallelism(tp=1, pp=1, dp=1), knobs=knobs)
    assert simulator.kv_capacity_tokens == expected
