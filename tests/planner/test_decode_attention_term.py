"""The step model's decode attention from the engines' measured decode-attention tables (issue #35 item 1,
`measured_decode_attention`): per full-attention layer a fixed cost at the step's decode batch plus a cost per cached token,
the roofline where no table covers the layer kind, GPU or head counts."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from servingtopology.planner.engines import kernels
from servingtopology.planner.hardware import Precision, resolve_gpu
from servingtopology.planner.layout import Engine, KvDtype, Parallelism
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.perf.step import InstancePerf, PerfParams, evaluate_step_s, measured_terms, step_coefficients

LLAMA70 = resolve_model("meta-llama/Llama-3.1-70B")
ON = replace(PerfParams(), measured_decode_attention=1.0)
OFF = PerfParams()
H200 = resolve_gpu("h200_sxm")


def _decode_step(params: PerfParams, model=LLAMA70, gpu=H200, *, seqs: float, context: float, prefill: float = 0.0) -> float:
    c = step_coefficients(model, gpu, precision=Precision.FP8, kv_dtype=KvDtype.FP8, engine=Engine.VLLM, tp=8.0, pp=1.0, dp=1.0,
                          params=params, release="0.18.0")
    return float(evaluate_step_s(c, prefill_tokens=prefill, prefill_pairs=prefill * prefill / 2, decode_tokens=seqs,
                                 decode_context_tokens=context))


def _table(seqs: float, kv_len: float) -> float:
    """The table's time of the 80 layers' decode attention (Llama-3.1-70B on TP8: 8 query heads and 1 KV head a GPU)."""
    got = kernels.generation_attention_s("h200_sxm", "vllm", "0.18.0", kv_dtype="fp8", head_dim=128, kv_heads=1, heads=8.0,
                                         batch=np.array([seqs]), kv_len=np.array([kv_len]))
    return LLAMA70.num_full_attention_layers * float(got.time_s[0])


def _roofline_attention(seqs: float, context: float) -> float:
    c = step_coefficients(LLAMA70, H200, precision=Precision.FP8, kv_dtype=KvDtype.FP8, engine=Engine.VLLM, tp=8.0, pp=1.0, dp=1.0,
                          params=OFF, release="0.18.0")
    return float(c.attn_ctx_s) * context + float(c.attn_seq_s) * seqs


@pytest.mark.parametrize("seqs", [1.0, 16.0, 256.0])
def test_a_decode_step_pays_the_tables_time_in_place_of_the_roofline_read(seqs):
    # At the shortest cache the tables measured (2 tokens a sequence) the term is the table's own time.
    kv_len = 2.0
    delta = _decode_step(ON, seqs=seqs, context=seqs * kv_len) - _decode_step(OFF, seqs=seqs, context=seqs * kv_len)
    assert delta == pytest.approx(_table(seqs, kv_len) - float(_roofline_attention(seqs, seqs * kv_len)) + _seq_term(seqs), rel=1e-6)
    # At the longest cache measured at that batch (the chord's other end) the table's time too; half as long, within 12 %.
    for kv_len, rel in ((4096.0, 1e-6), (2048.0, 0.12)):
        delta = _decode_step(ON, seqs=seqs, context=seqs * kv_len) - _decode_step(OFF, seqs=seqs, context=seqs * kv_len)
        assert delta + _roofline_attention(seqs, seqs * kv_len) - _seq_term(seqs) == pytest.approx(_table(seqs, kv_len), rel=rel)


def _seq_term(seqs: float) -> float:
    """The roofline's per-sequence state read, which the measured term leaves in place (0 for a model without fixed state)."""
    c = step_coefficients(LLAMA70, H200, precision=Precision.FP8, kv_dtype=KvDtype.FP8, engine=Engine.VLLM, tp=8.0, pp=1.0, dp=1.0,
                          params=OFF, release="0.18.0")
    return float(c.attn_seq_s) * seqs


def test_the_simulators_scalar_step_is_the_vectorised_formulas_float():
    perf = InstancePerf(LLAMA70, H200, Precision.FP8, KvDtype.FP8, Engine.VLLM, Parallelism(tp=8), params=ON)
    c = step_coefficients(LLAMA70, H200, precision=Precision.FP8, kv_dtype=KvDtype.FP8, engine=Engine.VLLM, tp=8, pp=1, dp=1, params=ON)
    for prefill, seqs, context in ((0.0, 24.0, 30_000.0), (512.0, 8.0, 9_000.0), (0.0, 3000.0, 1e6)):
        want = float(evaluate_step_s(c, prefill_tokens=prefill, prefill_pairs=prefill * prefill / 2, decode_tokens=seqs,
                                     decode_context_tokens=context))
        assert perf.step_time_s(prefill_tokens=prefill, prefill_pairs=prefill * prefill / 2, decode_tokens=seqs,
                                decode_context_tokens=context) == want
        if prefill == 0.0:
            assert perf.decode_s(seqs, context) == want


def test_a_prefill_only_step_reads_no_cache_and_more_sequences_cost_more():
    assert _decode_step(ON, seqs=0.0, context=0.0, prefill=1024.0) == _decode_step(OFF, seqs=0.0, context=0.0, prefill=1024.0)
    times = [_decode_step(ON, seqs=s, context=s * 1000.0) for s in (1.0, 8.0, 64.0, 512.0, 4096.0)]
    assert times == sorted(set(times))  # strictly increasing


def test_layers_without_a_table_keep_the_roofline_and_say_why():
    ds = resolve_model("deepseek-ai/DeepSeek-R1")  # MLA
    assert _decode_step(ON, ds, seqs=8.0, context=8000.0) == _decode_step(OFF, ds, seqs=8.0, context=8000.0)
    assert measured_terms(H200, Engine.VLLM, "0.18.0", 8, ds.hidden_size, ON, model=ds)["decode_attention"].startswith("roofline: ")
    mi300x = resolve_gpu("mi300x")  # no tables for this GPU
    assert _decode_step(ON, gpu=mi300x, seqs=8.0, context=8000.0) == _decode_step(OFF, gpu=mi300x, seqs=8.0, context=8000.0)
    terms = measured_terms(H200, Engine.VLLM, "0.18.0", 8, LLAMA70.hidden_size, ON, model=LLAMA70, kv_dtype=KvDtype.FP8)
    assert terms["decode_attention"].startswith("vllm 0.24.0 on h200_sxm (nearest measured release to 0.18.0) decode attention, fp8")
    assert "decode_attention" not in measured_terms(H200, Engine.VLLM, "0.18.0", 8, LLAMA70.hidden_size, OFF, model=LLAMA70)
