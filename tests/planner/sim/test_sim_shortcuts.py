"""The simulator's shortcuts (issue 17, planning CPU) change no figure: a replay with the step times remembered
(`RememberedSteps`) and every request's KV transfer time computed at once is, bit for bit, the replay that asks the
step-time model afresh at every step and prices each transfer when it starts; an instance with nothing admitted,
queued or arriving plans nothing. The planner's own before/after check (repr of `decide` on 91 problems: the
examples, the funnel's golden cases and the load scenario's 50 workloads) is in the commit that brought them."""

from __future__ import annotations

import numpy as np
import pytest

from servingtopology.planner.hardware import Precision, resolve_gpu
from servingtopology.planner.layout import Engine, Layout, Parallelism, Role, RoleLayout
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.perf.step import InstancePerf, kv_transfer_s
from servingtopology.planner.sim import RememberedSteps, simulate
from servingtopology.planner.workload import LengthDist, LengthKind, Workload

MODEL = resolve_model("llama-3.1-8b")
GPU = resolve_gpu("h100_sxm")
FIELDS = ("arrival_s", "scheduled_s", "first_token_s", "finish_s", "cached_tokens", "preemptions", "itl_s", "itl_weight", "timeline")


def _workload(kind: LengthKind, rate: float) -> Workload:
    prompts = LengthDist.fixed(2048) if kind is LengthKind.FIXED else LengthDist(LengthKind.LOGNORMAL, 1500.0, sigma=0.7)
    return Workload(prompts, LengthDist.fixed(256), arrival_rate_rps=rate, prefix_share=0.2)


LAYOUTS = {
    "replicas": Layout.replicas(2, Parallelism()),
    "pd": Layout.pd(RoleLayout(count=3, parallelism=Parallelism()), RoleLayout(count=1, parallelism=Parallelism(tp=2))),
}


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG])
@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize("kind", [LengthKind.FIXED, LengthKind.LOGNORMAL])
def test_remembered_step_times_and_batched_transfers_replay_bit_for_bit(engine: Engine, name: str, kind: LengthKind) -> None:
    layout = LAYOUTS[name]
    workload = _workload(kind, 6.0)
    asked: list[int] = []

    def fresh(role: Role, rl: RoleLayout) -> InstancePerf:
        asked.append(1)
        return InstancePerf(MODEL, GPU, Precision.BF16, rl.knobs.kv_dtype, engine, rl.parallelism)

    near = layout.gpus <= GPU.gpus_per_node

    def one_transfer_s(tokens: int) -> float:
        return float(kv_transfer_s(MODEL, GPU, kv_dtype=layout.roles[next(iter(layout.roles))].knobs.kv_dtype, tokens=float(tokens),
                                   same_node=near))

    fast = simulate(layout, model=MODEL, gpu=GPU, engine=engine, workload=workload, num_requests=240, seed=5)
    slow = simulate(layout, model=MODEL, gpu=GPU, engine=engine, workload=workload, num_requests=240, seed=5, step_model=fresh,
                    transfer_s=one_transfer_s if name == "pd" else None)
    assert asked
    assert fast.end_s == slow.end_s
    for f in FIELDS:
        a, b = getattr(fast, f), getattr(slow, f)
        if isinstance(a, dict):
            assert a.keys() == b.keys(), f
            for k in a:
                np.testing.assert_array_equal(a[k], b[k], err_msg=f"{f}.{k}")
        else:
            np.testing.assert_array_equal(a, b, err_msg=f)


def test_remembered_steps_answer_what_the_model_answers_and_ask_it_once_per_batch() -> None:
    calls: list[tuple[float, float, float, float]] = []

    class Counting:
        def step_time_s(self, *, prefill_tokens: float, prefill_pairs: float, decode_tokens: float, decode_context_tokens: float) -> float:
            calls.append((prefill_tokens, prefill_pairs, decode_tokens, decode_context_tokens))
            return 0.001 * decode_tokens + 1e-6 * decode_context_tokens + 2e-5 * prefill_tokens

    memo = RememberedSteps(Counting())
    batches = [(0.0, 0.0, 3.0, 900.0), (512.0, 70000.0, 2.0, 400.0), (0.0, 0.0, 3.0, 900.0), (0.0, 0.0, 3.0, 903.0)]
    got = [memo.step_time_s(prefill_tokens=a, prefill_pairs=b, decode_tokens=c, decode_context_tokens=d) for a, b, c, d in batches]
    assert got == [Counting().step_time_s(prefill_tokens=a, prefill_pairs=b, decode_tokens=c, decode_context_tokens=d)
                   for a, b, c, d in batches]
    assert calls[:3] == [batches[0], batches[1], batches[3]] and len(calls) == 3 + 4   # 3 distinct batches, then the reference


@pytest.mark.parametrize(("model", "gpu", "par"), [
    ("llama-3.1-8b", "h100_sxm", Parallelism()),
    ("llama-3.1-70b", "h100_sxm", Parallelism(tp=4, pp=2)),
    ("mixtral-8x7b", "h100_sxm", Parallelism(tp=2)),
    ("gpt-oss-20b", "h100_sxm", Parallelism()),
    ("qwen3-30b-a3b", "h100_sxm", Parallelism(tp=2, dp=2, ep=True)),
])
def test_decode_probe_is_the_step_models_own_float(model: str, gpu: str, par: Parallelism) -> None:
    """`InstancePerf.decode_s` (the decode bursts' probe, its zeroed terms folded once) gives `step_time_s`'s floats bit for bit."""
    arch = resolve_model(model)
    for engine in (Engine.VLLM, Engine.SGLANG):
        probe = InstancePerf(arch, resolve_gpu(gpu), Precision.BF16, Layout.replicas(1, par).roles[Role.AGGREGATED].knobs.kv_dtype,
                             engine, par)
        reference = InstancePerf(arch, resolve_gpu(gpu), Precision.BF16, probe.kv_dtype, engine, par)
        rng = np.random.default_rng(3)
        for d in [1, 2, 3, 34, 255, 256, 1024, *rng.integers(1, 4096, 40).tolist()]:
            for ctx in [d, d * 17, d * 4000 + 3, int(rng.integers(d, d * 131072))]:
                for _ in range(2):  # the token terms asked afresh, then remembered
                    got = probe.decode_s(float(d), float(ctx))
                    want = reference.step_time_s(prefill_tokens=0.0, prefill_pairs=0.0, decode_tokens=float(d), decode_context_tokens=float(ctx))
                    assert got == want and np.float64(got).tobytes() == np.float64(want).tobytes(), (model, engine, d, ctx)
