"""benchmarks/fit_perf.py leave-one-model-out: each family's rows are predicted by a fit that never saw them."""

import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from servingtopology.cli.validate import Measurements
from servingtopology.planner.fidelity.benchmark_cases import parse_row
from servingtopology.planner.hardware import resolve_gpu
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.perf.step import PerfParams

from ..planner.test_benchmark_cases import AGG

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fit_perf


def _measurements():
    llama = resolve_model("llama-3.1-70b")
    rows = [{**AGG, "id": f"l{tp}", "tp_size": str(tp), "moe_tp_size": str(tp)} for tp in (4, 8)]
    rows += [{**AGG, "id": "fp8copy", "model_path": "nvidia/Llama-3.1-70B-FP8"}]
    rows += [{**AGG, "id": f"d{tp}", "model_path": "deepseek-ai/DeepSeek-V3", "tp_size": str(tp), "moe_tp_size": str(tp)} for tp in (8,)]
    cases = [parse_row(r) for r in rows]
    models = {"meta-llama/Llama-3.1-70B": llama, "nvidia/Llama-3.1-70B-FP8": replace(llama, name="other"),
              "deepseek-ai/DeepSeek-V3": resolve_model("deepseek-v3")}
    return Measurements(cases, models, {"h200_sxm": resolve_gpu("h200_sxm")}, Counter())


def test_a_family_is_its_shapes_whatever_its_name():
    m = _measurements()
    fams = {p: fit_perf.family(a) for p, a in m.models.items()}
    assert fams["meta-llama/Llama-3.1-70B"] == fams["nvidia/Llama-3.1-70B-FP8"] != fams["deepseek-ai/DeepSeek-V3"]


def test_each_fold_fits_without_the_held_out_family_and_predicts_only_it(monkeypatch):
    m = _measurements()
    seen: list[set[str]] = []
    real_loss = fit_perf._loss

    def spy(train, targets, params, **kw):
        seen.append({c.model_path for c in train.cases})
        return real_loss(train, targets, params, **kw)

    monkeypatch.setattr(fit_perf, "_loss", spy)
    names = ["step_overhead_s"]
    out = fit_perf.leave_one_model_out(m, PerfParams(), names, np.log([1.5e-3]), evals=3, ticks=[], step=0.3,
                                       loss_args={"rank_weight": 0.5, "step_weight": 0.0, "ttft_weight": 1.5})
    assert [f["models"] for f in out["folds"]] == [["deepseek-ai/DeepSeek-V3"], ["meta-llama/Llama-3.1-70B", "nvidia/Llama-3.1-70B-FP8"]]
    assert [f["rows"] for f in out["folds"]] == [1, 3]
    # The DeepSeek fold trained on the Llama rows only, and the Llama fold on DeepSeek's only.
    assert seen[0] == {"meta-llama/Llama-3.1-70B", "nvidia/Llama-3.1-70B-FP8"}
    assert seen[-1] == {"deepseek-ai/DeepSeek-V3"}
    assert out["vllm_sglang"]["predicted"] == 4


def test_a_resumed_fold_starts_from_its_own_parameters_and_the_longest_fold_is_recorded(monkeypatch):
    m = _measurements()
    starts: list[float] = []
    real_loss = fit_perf._loss

    def spy(train, targets, params, **kw):
        starts.append(params.step_overhead_s)
        return real_loss(train, targets, params, **kw)

    monkeypatch.setattr(fit_perf, "_loss", spy)
    names = ["step_overhead_s"]
    args = {"ticks": [], "step": 0.3, "loss_args": {"rank_weight": 0.5, "step_weight": 0.0, "ttft_weight": 1.5}}
    first = fit_perf.leave_one_model_out(m, PerfParams(), names, np.log([1.5e-3]), evals=3, **args)
    llama = next(f for f in first["folds"] if "meta-llama/Llama-3.1-70B" in f["models"])
    llama["params"]["step_overhead_s"] = 2.5e-3  # as if that fold had moved there
    starts.clear()
    more = fit_perf.leave_one_model_out(m, PerfParams(), names, np.log([1.5e-3]), evals=3, only=["Llama"], resume=[first], **args)
    assert starts[0] == pytest.approx(2.5e-3, rel=1e-9)  # the Llama fold's own recorded point, not the common start
    assert [f["models"] for f in more["folds"]] == [llama["models"]] and more["folds"][0]["evals"] == 6
    monkeypatch.setattr(fit_perf, "_loss", real_loss)
    pooled = fit_perf.assemble_folds(m, PerfParams(), [dict(first, command="a"), dict(more, command="b")])
    assert {f["evals"] for f in pooled["folds"]} == {3, 6} and pooled["vllm_sglang"]["predicted"] == 4
    with pytest.raises(SystemExit, match="no fold recorded"):
        fit_perf.assemble_folds(m, PerfParams(), [dict(more, command="b")])
    # Assembled again from the assembled record (to score it anew), the commands that ran the folds stay recorded.
    again = fit_perf.assemble_folds(m, PerfParams(), [dict(pooled, command="c")])
    assert again["commands"] == ["a", "b"] and again["folds"] == pooled["folds"]
    # The search that ran the folds is recorded too: one name when every record agrees, each name when they differ.
    assert pooled["search"] == again["search"] == "pattern"
    mixed = fit_perf.assemble_folds(m, PerfParams(), [dict(first, command="a"), dict(more, command="b", search="hooke-jeeves")])
    assert mixed["search"] == ["hooke-jeeves", "pattern"]


def test_a_fold_never_fits_the_fp8_share_or_prompt_collisions_it_cannot_pin(monkeypatch):
    # MoE families pin only the product fp8_eff_scale × moe_eff_scale; with the one dense FP8 family left out a fold
    # drifted fp8 to 0.44 (Llama-3.1-70B's TTFT 69 % high). Both are declared now, and a fold resumed from a record
    # that holds drifted values trains and predicts at the declared ones.
    assert "fp8_eff_scale" not in fit_perf.BOUNDS and "arrival_burst" not in fit_perf.BOUNDS
    declared = PerfParams()
    assert declared.fp8_eff_scale == pytest.approx(1350.0 / 1979.0 / 0.8, rel=0.01)  # DeepGEMM on Hopper over the BF16 MAMF share
    assert declared.arrival_burst == 0.0
    m = _measurements()
    seen: list[tuple[float, float]] = []
    real_loss = fit_perf._loss

    def spy(train, targets, params, **kw):
        seen.append((params.fp8_eff_scale, params.arrival_burst))
        return real_loss(train, targets, params, **kw)

    monkeypatch.setattr(fit_perf, "_loss", spy)
    base = replace(PerfParams(fp8_eff_scale=0.44, arrival_burst=0.2), **fit_perf.DECLARED)
    drifted = {"evals_per_fold": 3, "folds": [{"models": ["meta-llama/Llama-3.1-70B", "nvidia/Llama-3.1-70B-FP8"], "evals": 3, "cpu_s": 1.0,
                                               "params": {"step_overhead_s": 1.5e-3, "fp8_eff_scale": 0.44, "arrival_burst": 0.2}}]}
    out = fit_perf.leave_one_model_out(m, base, ["step_overhead_s"], np.log([1.5e-3]), evals=3, ticks=[], step=0.3, only=["Llama"],
                                       resume=[drifted], loss_args={"rank_weight": 0.5, "step_weight": 0.0, "ttft_weight": 1.5})
    assert seen and set(seen) == {(declared.fp8_eff_scale, 0.0)}
    assert set(out["folds"][0]["params"]) == {"step_overhead_s"}


def test_several_files_pool_their_rows_and_a_record_names_every_file_it_saw():
    """`fit_perf.py --csv A B` fits the rows of both (Measurements.merged), and lomo_decisions counts every family of every
    file the record names as seen by the shipped fit (so each needs its own fold)."""
    import lomo_decisions

    m = _measurements()
    a = Measurements(m.cases[:2], {k: v for k, v in m.models.items() if "Llama-3.1-70B" in k}, m.gpus, Counter({"bad row": 1}),
                     {"vllm": Counter({"bad row": 1})})
    b = Measurements(m.cases[2:], {"deepseek-ai/DeepSeek-V3": m.models["deepseek-ai/DeepSeek-V3"]}, m.gpus, Counter({"bad row": 2}),
                     {"vllm": Counter({"bad row": 2}), "sglang": Counter({"other": 1})})
    both = Measurements.merged([a, b])
    assert [c.row_id for c in both.cases] == [c.row_id for c in m.cases]
    assert set(both.models) == set(m.models)
    assert both.skipped_at_parse == Counter({"bad row": 3})
    assert both.skipped_by_backend == {"vllm": Counter({"bad row": 3}), "sglang": Counter({"other": 1})}
    assert lomo_decisions.fitted_files({"data_file": "x.csv"}) == {"x.csv"}
    assert lomo_decisions.fitted_files({"data_file": ["x.csv", "y.csv"]}) == {"x.csv", "y.csv"}
    assert lomo_decisions.fitted_files({}) == set()
