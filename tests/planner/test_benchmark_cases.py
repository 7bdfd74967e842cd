"""Silicon rows become calibration cases; predictions and fidelity scores behave."""

from collections import Counter

import pytest

from servingtopology.planner.fidelity.benchmark_cases import INFERENCEX, UNSTATED, Prediction, Skip, fill_from_twins, harness_of, parse_row, predict_all
from servingtopology.planner.fidelity.scores import ape_stats, ranking_score, summarize, tokens_per_gpu_s
from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.model.catalog import resolve_model

AGG = {
    "id": "a", "silicon_data_source": "x; silicon_concurrency=32; y", "backend": "vllm", "model_path": "meta-llama/Llama-3.1-70B",
    "system": "h200_sxm", "precision": "fp8", "mode": "agg", "isl": "1024", "osl": "1024", "gemm_quant_mode": "fp8",
    "moe_quant_mode": "fp8", "batch_size": "32", "tp_size": "4", "pp_size": "1", "attention_dp_size": "1", "moe_tp_size": "4",
    "moe_ep_size": "1", "silicon_ttft_ms": "180.0", "silicon_tpot_ms": "14.0",
}
DISAGG = {
    "id": "d", "silicon_data_source": "db-dump", "backend": "sglang", "model_path": "deepseek-ai/DeepSeek-V3", "system": "b200_sxm",
    "precision": "fp8", "mode": "disagg", "isl": "8192", "osl": "1024", "gemm_quant_mode": "fp8_block", "moe_quant_mode": "fp8_block",
    "batch_size": "", "tp_size": "", "decode_batch_size": "16", "prefill_num_workers": "2", "prefill_tp_size": "1",
    "prefill_pp_size": "1", "prefill_attention_dp_size": "8", "prefill_moe_tp_size": "1", "prefill_moe_ep_size": "8",
    "decode_num_workers": "1", "decode_tp_size": "1", "decode_pp_size": "1", "decode_attention_dp_size": "8",
    "decode_moe_tp_size": "1", "decode_moe_ep_size": "8", "silicon_ttft_ms": "900", "silicon_tpot_ms": "20",
}


def test_agg_row_takes_concurrency_from_the_data_source():
    c = parse_row(AGG)
    assert (c.concurrency, c.agg.tp, c.agg.dp, c.gpus) == (32, 4, 1, 4)


def test_blank_attention_dp_comes_back_from_the_expert_grid():
    c = parse_row({**AGG, "tp_size": "1", "attention_dp_size": "", "moe_tp_size": "2", "moe_ep_size": "1"})
    assert (c.agg.tp, c.agg.dp, c.gpus) == (1, 2, 2)


def test_tp_recorded_as_tp_times_ep_is_read_as_expert_parallel():
    c = parse_row({**AGG, "backend": "sglang", "tp_size": "64", "moe_tp_size": "8", "moe_ep_size": "8"})
    assert (c.agg.tp, c.agg.moe_ep, c.gpus) == (8, 8, 8)


@pytest.mark.parametrize(("n", "ep"), [
    (4, 16),  # MiniMax-M2.5's "TP4 · DP4 · EP16" rows: InferenceX's `tp: 4, ep: 4, dp-attn: true`
    (2, 4),   # its "TP2 · DP2 · EP4" rows
])
def test_attention_dp_over_all_of_tp_exported_in_launch_terms_is_tp_gpus(n, ep):
    c = parse_row({**AGG, "tp_size": str(n), "attention_dp_size": str(n), "moe_tp_size": "1", "moe_ep_size": str(ep)})
    assert (c.agg.tp, c.agg.dp, c.agg.moe_ep, c.gpus) == (1, n, n, n)


def test_attention_dp_with_attention_tp_and_a_consistent_expert_grid_is_read_literally():
    # tp 2 · attention DP 2 with EP 4 = tp × dp is a 4-GPU layout in the schema's own terms (dp ≠ tp or moe_ep ≠ tp × dp
    # never matches the launch-terms reading).
    c = parse_row({**AGG, "tp_size": "2", "attention_dp_size": "4", "moe_tp_size": "1", "moe_ep_size": "8"})
    assert (c.agg.tp, c.agg.dp, c.agg.moe_ep, c.gpus) == (2, 4, 8, 8)


def test_disagg_row_counts_workers_and_falls_back_to_decode_batch():
    c = parse_row(DISAGG)
    assert c.prefill.workers == 2 and c.decode.workers == 1
    assert c.gpus == 2 * 8 + 8
    assert c.concurrency == 16


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        ({"silicon_tpot_ms": ""}, "bad measurement"),          # nothing measured
        ({"silicon_ttft_ms": "-3"}, "bad measurement"),        # nonsense
        ({"tp_size": ""}, "missing topology"),                 # agg without TP
        ({"gemm_quant_mode": "int2"}, "unsupported precision"),
        ({"mode": "spec"}, "unsupported mode"),
        ({"backend": "1e300"}, "unsupported backend"),        # no engine's defaults apply (fuzzed validate: exit 3)
        ({"backend": ""}, "unsupported backend"),             # none recorded
    ],
)
def test_unusable_rows_are_skipped_with_a_reason(change, kind):
    with pytest.raises(Skip) as err:
        parse_row({**AGG, **change})
    assert err.value.kind == kind


def test_unknown_gpu_and_model_are_skipped_not_guessed():
    cases = [parse_row(AGG), parse_row({**AGG, "system": "tpu_v5"}), parse_row({**AGG, "model_path": "acme/unknown"})]
    models = {"meta-llama/Llama-3.1-70B": resolve_model("llama-3.1-70b"), "acme/unknown": Skip("unknown model", "acme/unknown")}
    gpus = {"h200_sxm": resolve_gpu("h200_sxm"), "tpu_v5": Skip("unknown GPU", "tpu_v5")}
    out = predict_all(cases, models, gpus)
    assert isinstance(out[0], Prediction) and out[0].tpot_ms > 0
    assert [o.kind for o in out[1:]] == ["unknown GPU", "unknown model"]


def test_prediction_is_in_the_measured_ballpark_for_a_plain_dense_row():
    (p,) = predict_all([parse_row(AGG)], {"meta-llama/Llama-3.1-70B": resolve_model("llama-3.1-70b")},
                       {"h200_sxm": resolve_gpu("h200_sxm")})
    assert 0.5 < p.tpot_ms / 14.0 < 2.0
    assert 0.25 < p.ttft_ms / 180.0 < 4.0


def test_ape_stats_reports_median_mean_and_share_within_20_percent():
    s = ape_stats([110.0, 150.0, 90.0], [100.0, 100.0, 100.0])
    assert s == {"median_ape": 10.0, "mape": pytest.approx(23.33, abs=0.01), "within_20pct": pytest.approx(0.6667, abs=1e-4)}


def _group(tpots_meas, tpots_pred):
    cases = [parse_row({**AGG, "tp_size": str(tp), "moe_tp_size": str(tp), "silicon_tpot_ms": str(m)})
             for tp, m in zip((1, 2, 4), tpots_meas, strict=True)]
    return cases, [Prediction(ttft_ms=c.ttft_ms, tpot_ms=p, throughput_rps=1.0) for c, p in zip(cases, tpots_pred, strict=True)]


def test_ranking_agrees_when_the_predicted_best_is_the_measured_best():
    cases, preds = _group([30.0, 20.0, 10.0], [33.0, 21.0, 12.0])
    assert ranking_score(cases, preds)["top1_tpot"] == 1.0


def test_ranking_reports_the_trivial_baseline_and_pairwise_ordering():
    # TP1, TP2, TP4: the most GPUs has the lowest TPOT (baseline right); fewest GPUs the most tokens/s per GPU.
    cases, preds = _group([30.0, 20.0, 10.0], [33.0, 9.0, 12.0])
    r = ranking_score(cases, preds)
    assert r["baseline_top1"] == 1.0 and r["baseline_top1_first_listed"] == 1.0
    # TPOT pairs: (1,2) right, (1,4) right, (2,4) wrong; tokens/GPU pairs (TTFT equal, so the TPOT order per GPU).
    assert r["pairs"] == 6
    assert 0.0 < r["pairwise_ordering"] < 1.0


def test_the_baseline_breaks_ties_of_equal_gpu_counts_at_random():
    cases = [parse_row({**AGG, "tp_size": "4", "pp_size": "1", "moe_tp_size": "4", "silicon_tpot_ms": "12"}),
             parse_row({**AGG, "tp_size": "2", "pp_size": "2", "moe_tp_size": "2", "silicon_tpot_ms": "10"})]
    preds = [Prediction(ttft_ms=c.ttft_ms, tpot_ms=c.tpot_ms, throughput_rps=1.0) for c in cases]
    r = ranking_score(cases, preds)
    assert r["top1_tpot"] == 1.0 and r["pairwise_ordering"] == 1.0
    # TP4 and TP2·PP2 tie on GPUs: the rule picks either with chance 1/2; first-listed always takes TP4 (wrong here).
    assert r["baseline_top1"] == 0.5 and r["baseline_top1_first_listed"] == 0.0


def test_ranking_disagrees_when_the_order_flips():
    cases, preds = _group([30.0, 20.0, 10.0], [10.0, 20.0, 30.0])
    r = ranking_score(cases, preds)
    assert r["groups"] == 1 and r["top1_tpot"] == 0.0


def test_tokens_per_gpu_counts_every_gpu_of_the_topology():
    c = parse_row(AGG)
    assert tokens_per_gpu_s(c, 180.0, 14.0) == pytest.approx(32 * 1024 / ((180 + 1023 * 14) / 1e3) / 4)


def test_summary_counts_parse_skips_and_groups_by_backend_mode_system():
    cases, preds = _group([30.0, 20.0, 10.0], [33.0, 21.0, 12.0])
    s = summarize(cases, preds, skipped_at_parse=Counter({"bad measurement": 1}))
    assert s["rows"] == 4 and s["skipped"]["count"] == 1
    assert list(s["groups"]) == ["vllm/agg/h200_sxm"]


_CSV_SOURCE = "source_file=2026-03-25.csv; model=DeepSeek-V3; silicon_concurrency=48; measured=2026-03-23T13:00:07Z; image=lmsysorg/sglang:v0.5.9"
_DUMP_SOURCE = "db-dump/2026-04-27; config_id=7; silicon_concurrency=48; measured=2026-03-23T00:00:00.000Z; lmsysorg/sglang:v0.5.9"


def _lossy_and_full():
    full = {**DISAGG, "id": "full", "silicon_data_source": _DUMP_SOURCE, "prefill_num_workers": "2", "decode_num_workers": "3"}
    lossy = {**DISAGG, "id": "lossy", "silicon_data_source": _CSV_SOURCE, "prefill_num_workers": "", "decode_num_workers": "",
             "prefill_tp_size": "8", "prefill_attention_dp_size": "1", "decode_tp_size": "8", "decode_attention_dp_size": "1"}
    return lossy, full


def test_lossy_disagg_copies_take_the_topology_of_the_row_with_the_same_inputs():
    lossy, full = _lossy_and_full()
    other = {**lossy, "id": "other", "silicon_data_source": _CSV_SOURCE.replace("=48", "=64")}  # another concurrency: no twin
    filled = {r["id"]: r for r in fill_from_twins([lossy, full, other])}
    assert parse_row(filled["lossy"]).decode == parse_row(full).decode
    with pytest.raises(Skip, match="num_workers is empty") as skip:  # no twin: its worker counts stay unknown
        parse_row(filled["other"])
    assert skip.value.kind == "worker counts not recorded"


def test_twins_are_matched_on_inputs_never_on_measured_figures():
    lossy, full = _lossy_and_full()
    # Different measured figures, same inputs: still the twin (a measurement is never a key).
    differs = {**full, "silicon_ttft_ms": "1234", "silicon_tpot_ms": "55"}
    assert parse_row(fill_from_twins([lossy, differs])[0]).decode == parse_row(full).decode
    # Same measured figures, another engine image: not a twin.
    other_image = {**full, "silicon_data_source": _DUMP_SOURCE.replace("v0.5.9", "v0.5.8"), "silicon_ttft_ms": lossy["silicon_ttft_ms"]}
    assert not fill_from_twins([lossy, other_image])[0]["decode_num_workers"]


def test_a_lossy_copy_with_two_candidate_topologies_is_left_as_recorded():
    lossy, full = _lossy_and_full()
    rival = {**full, "id": "rival", "decode_num_workers": "5"}
    assert not fill_from_twins([lossy, full, rival])[0]["decode_num_workers"]


def test_a_topology_whose_weights_cannot_fit_is_skipped_with_that_reason():
    row = {**AGG, "model_path": "deepseek-ai/DeepSeek-V3", "tp_size": "1", "moe_tp_size": "1"}  # 671 B weights on one H200
    (out,) = predict_all([parse_row(row)], {"deepseek-ai/DeepSeek-V3": resolve_model("deepseek-v3")}, {"h200_sxm": resolve_gpu("h200_sxm")})
    assert isinstance(out, Skip) and out.kind == "weights do not fit the recorded topology"


def test_a_near_tie_counts_within_tolerance_but_not_as_strict_agreement():
    cases, preds = _group([30.0, 10.2, 10.0], [33.0, 9.0, 12.0])  # picks 10.2 ms; the best measured 10.0 ms
    r = ranking_score(cases, preds)
    assert r["top1_tpot"] == 0.0
    assert r["top1_within_5pct"] >= 0.5


def test_rows_of_different_weight_precision_are_not_ranked_against_each_other():
    # The user picks the precision; the planner ranks topologies. An FP4 TP4 row and an FP8 TP2 row of one
    # checkpoint are two groups of one topology each, so there is nothing to rank.
    fp8 = parse_row({**AGG, "tp_size": "2", "moe_tp_size": "2"})
    fp4 = parse_row({**AGG, "gemm_quant_mode": "nvfp4", "moe_quant_mode": "nvfp4", "silicon_tpot_ms": "9.0"})
    preds = [Prediction(ttft_ms=c.ttft_ms, tpot_ms=c.tpot_ms, throughput_rps=1.0) for c in (fp8, fp4)]
    assert ranking_score([fp8, fp4], preds)["groups"] == 0


def test_a_tp_degree_that_cannot_divide_the_heads_is_skipped_as_not_what_ran():
    # Lossy disagg exports put a role's total GPU count (e.g. 72 GB200s) in tp_size; no engine runs TP72 over 64 heads.
    row = {**AGG, "tp_size": "72", "moe_tp_size": "72"}
    (out,) = predict_all([parse_row(row)], {AGG["model_path"]: resolve_model("llama-3.1-70b")}, {"h200_sxm": resolve_gpu("h200_sxm")})
    assert isinstance(out, Skip) and out.kind == "recorded TP does not divide the attention heads"


@pytest.mark.parametrize(("source", "name"), [
    ("source_file=2026-04-06.csv; model=Llama-3.1-70B; silicon_concurrency=8; measured=2025-10-29T00:00:00.000Z; wip=False", "inferencex"),
    ("db-dump/2026-04-27; config_id=99; silicon_concurrency=4; measured=2025-11-10T00:00:00.000Z; workflow_run_id=122", "inferencex"),
    ("source_file=/Users/x/aic-auto-gap-analysis/data/h200_sxm/vllm/0.12.0/Qwen_Qwen3-235B-A22B-FP8.csv; silicon_concurrency=4", "unstated"),
    ("", "unstated"),
])
def test_the_harness_is_read_from_the_data_source(source, name):
    assert harness_of(source).name == name
    assert parse_row({**AGG, "silicon_data_source": source}).harness.name == name


def test_inferencex_rows_are_predicted_at_the_mean_of_the_lengths_its_client_drew():
    # uniform integers in [int(0.8 L), L]: 1024 → [819, 1024], mean 921.5
    assert float(INFERENCEX.mean_length(1024)) == pytest.approx(921.5)
    assert float(UNSTATED.mean_length(1024)) == 1024.0
    model, gpu = resolve_model("meta-llama/Llama-3.1-70B"), resolve_gpu("h200_sxm")
    fixed = parse_row({**AGG, "silicon_data_source": "sweep; silicon_concurrency=4", "isl": "8192"})
    drawn = parse_row({**AGG, "silicon_data_source": "source_file=2026-04-06.csv; model=x; silicon_concurrency=4", "isl": "8192"})
    (p_fixed, p_drawn), = [predict_all([fixed, drawn], {AGG["model_path"]: model}, {"h200_sxm": gpu})]
    assert isinstance(p_fixed, Prediction) and isinstance(p_drawn, Prediction)
    assert p_drawn.ttft_ms < p_fixed.ttft_ms  # shorter prompts on average, and a start-up wave weighed as 10 requests per client


def test_inferencex_sglang_blackwell_rows_wait_for_the_scheduler_recv_interval():
    model, gpu = resolve_model("deepseek-ai/DeepSeek-V3"), resolve_gpu("b200_sxm")
    row = {**AGG, "backend": "sglang", "model_path": "deepseek-ai/DeepSeek-V3", "system": "b200_sxm", "tp_size": "8", "moe_tp_size": "8",
           "silicon_data_source": "db-dump/2026-04-27; silicon_concurrency=64"}
    imax, other = parse_row(row), parse_row({**row, "silicon_data_source": "sweep; silicon_concurrency=64"})
    both = predict_all([imax, other], {row["model_path"]: model}, {"b200_sxm": gpu})
    # 30-step receive interval at 64 clients: about 15 decode steps more before the first token
    assert both[0].ttft_ms - both[1].ttft_ms > 10 * both[0].tpot_ms


def test_the_engine_release_is_the_rows_backend_version():
    assert parse_row({**AGG, "backend_version": " 0.5.9 "}).engine_release == "0.5.9"
    assert parse_row(AGG).engine_release == ""  # not recorded


def test_topologies_measured_on_different_engine_releases_are_ranked_only_within_a_release():
    # At 32 clients a sweep ran TP4 on an older release and TP2 on a newer one: TP2 measured faster, TP4 predicted
    # faster. That comparison is a miss of the benchmark group, but no release ran both, so it is no same-release group.
    # At 64 clients the newer release ran both topologies: one group of each kind, ranked as predicted.
    def row(tp, tpot, release, clients):
        return parse_row({**AGG, "tp_size": str(tp), "moe_tp_size": str(tp), "silicon_tpot_ms": str(tpot), "backend_version": release,
                          "silicon_data_source": f"x; silicon_concurrency={clients}"})
    cases = [row(4, 30.0, "0.5.5", 32), row(2, 20.0, "0.5.9", 32), row(4, 12.0, "0.5.9", 64), row(2, 18.0, "0.5.9", 64)]
    preds = [Prediction(ttft_ms=c.ttft_ms, tpot_ms=t, throughput_rps=1.0) for c, t in zip(cases, (15.0, 22.0, 13.0, 19.0), strict=True)]
    r = ranking_score(cases, preds)
    assert (r["groups"], r["cross_release_groups"], r["top1_tpot"]) == (2, 1, 0.5)
    same = r["same_release"]
    assert (same["groups"], same["top1_tpot"], same["pairs"]) == (1, 1.0, 2)


def test_a_vllm_row_on_an_a100_runs_at_most_vllms_256_sequence_default():
    # vLLM leaves the A100-80GB out of its large defaults by name (planner.engines.defaults): 256 running sequences, so 512
    # and 1024 clients carry the same throughput; the benchmark cases once restated 1024 for every GPU.
    def throughput(system, clients):
        row = {**AGG, "model_path": "meta-llama/Llama-3.1-8B", "system": system, "precision": "bf16", "gemm_quant_mode": "bf16",
               "moe_quant_mode": "bf16", "isl": "128", "osl": "128", "tp_size": "1", "moe_tp_size": "1",
               "silicon_data_source": f"x; silicon_concurrency={clients}; y", "batch_size": str(clients)}
        c = parse_row(row)
        (p,) = predict_all([c], {c.model_path: resolve_model(c.model_path)}, {system: resolve_gpu(system)})
        return p.throughput_rps
    assert throughput("a100_sxm", 512) == pytest.approx(throughput("a100_sxm", 1024), rel=1e-9)
    assert throughput("h100_sxm", 1024) > throughput("h100_sxm", 512) * 1.02   # 1024 sequences there: more clients run


def _minimax_row(system: str, release: str, source: str, *, isl: int = 8192, clients: int = 16) -> dict[str, str]:
    return {**AGG, "model_path": "MiniMaxAI/MiniMax-M2.5", "system": system, "backend_version": release, "isl": str(isl),
            "osl": "1024", "tp_size": "1", "moe_tp_size": "1", "silicon_data_source": f"{source}; silicon_concurrency={clients}"}


def test_inferencex_minimax_rows_run_the_flags_of_their_launch_script():
    from servingtopology.planner.fidelity.benchmark_cases import _recipe
    from servingtopology.planner.layout import KvDtype

    inferencex = "db-dump/2026-04-27; config_id=730"
    new = _recipe(parse_row(_minimax_row("b300_sxm", "0.19.0", inferencex)))
    assert new is not None and (new.kv_dtype, new.memory_fraction, new.budget_per_isl) == (KvDtype.FP8, 0.90, 2.0)
    nightly = _recipe(parse_row(_minimax_row("b200_sxm", "nightly-5b8c30d62b754b57", inferencex)))
    assert nightly == new
    old = _recipe(parse_row(_minimax_row("b200_sxm", "0.17.0", inferencex)))   # before the v0.19.0 script: BF16 KV, 0.95
    assert old is not None and (old.kv_dtype, old.memory_fraction, old.budget_per_isl) == (None, 0.95, None)
    h100 = _recipe(parse_row(_minimax_row("h100_sxm", "0.18.0", inferencex)))
    assert h100 is not None and (h100.memory_fraction, h100.max_num_seqs) == (0.90, 256)
    assert _recipe(parse_row(_minimax_row("b300_sxm", "0.19.0", "sweep"))) is None             # another harness: the defaults
    assert _recipe(parse_row({**AGG, "silicon_data_source": inferencex})) is None               # another model's script
    assert _recipe(parse_row(_minimax_row("b300_sxm", "", inferencex))) is None                 # release not recorded


def test_an_fp8_kv_cache_admits_the_clients_a_bf16_one_queues():
    # MiniMax-M2.5 FP8 (230 GB) on one B300 leaves ~29 GB of a 0.90 pool: ~114k BF16 KV tokens, 13 sequences of 8,704
    # tokens, so 16 clients queue; the InferenceX script's FP8 KV cache halves a token's bytes and admits all 16.
    # The row of another source also draws fixed lengths (UNSTATED), a ~10 % difference against the queue's ~13x.
    from tests.planner.test_kernel_terms import _minimax

    model, gpu = _minimax(), resolve_gpu("b300_sxm")
    script = parse_row(_minimax_row("b300_sxm", "0.19.0", "db-dump/2026-04-27; config_id=730"))
    default = parse_row(_minimax_row("b300_sxm", "0.19.0", "sweep"))
    with_script, with_defaults = predict_all([script, default], {script.model_path: model}, {"b300_sxm": gpu})
    assert isinstance(with_script, Prediction) and isinstance(with_defaults, Prediction)
    assert with_defaults.ttft_ms > 3 * with_script.ttft_ms


def test_the_simulator_takes_a_rows_launch_flags_as_the_estimator_prices_them():
    from servingtopology.planner.fidelity.benchmark_cases import simulator_knobs
    from servingtopology.planner.layout import KvDtype

    plain = simulator_knobs(parse_row(AGG), resolve_gpu("h200_sxm"))
    assert plain.kv_dtype is KvDtype.AUTO and not plain.enable_prefix_caching
    # InferenceX's MiniMax-M2.5 script from vLLM 0.19.0 on B200: FP8 KV, 0.90 of memory, a budget of twice the input length
    row = dict(AGG, model_path="MiniMaxAI/MiniMax-M2.5", system="b200_sxm", backend_version="0.19.0",
               silicon_data_source="source_file=2026-04-10.csv; model=minimax; silicon_concurrency=64")
    case = parse_row(row)
    assert case.harness is INFERENCEX and case.engine_release == "0.19.0"
    knobs = simulator_knobs(case, resolve_gpu("b200_sxm"))
    assert (knobs.kv_dtype, knobs.memory_fraction, knobs.max_num_batched_tokens) == (KvDtype.FP8, 0.90, 2 * 1024)
    # and its H100 script caps the running sequences at 256
    h100 = simulator_knobs(parse_row(dict(row, system="h100_sxm", backend_version="0.18.0")), resolve_gpu("h100_sxm"))
    assert h100.max_num_seqs == 256
    with pytest.raises(ValueError, match="aggregated vLLM"):
        simulator_knobs(parse_row(DISAGG), resolve_gpu("b200_sxm"))
