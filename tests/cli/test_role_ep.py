"""Per-role expert parallelism (EpOnExperts): a PD layout's `prefill.ep` / `decode.ep` is the GPUs of a stage the role's
experts are spread over. SGLang renders it as `--ep-size N`; vLLM spreads them over every GPU of a stage or none
(`--enable-expert-parallel`), so it takes N = TP·DP only. EP on a dense model, an EP size not dividing the stage's GPUs
and a vLLM EP size below the stage are refused naming the field; the plan, its status and `compare --layout` name it
(`EP` over the stage, `EP2` over two of its GPUs), and the step model runs each role's experts at its own EP size."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from servingtopology.cli.main import main
from servingtopology.emulator.command_parser import parse_engine_command
from servingtopology.operator.api.resource import PlanStatus
from servingtopology.operator.plan_status import layout_from_plan
from servingtopology.operator.reconcile import reconcile
from servingtopology.planner.engines.command import engine_command
from servingtopology.planner.hardware import Precision, resolve_gpu
from servingtopology.planner.layout import Engine, EngineKnobs, KvDtype, Layout, Parallelism, Role, RoleLayout
from servingtopology.planner.live.transition import layout_from_state, layout_to_state, set_name
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.perf.step import InstancePerf
from servingtopology.planner.search.decide import decide
from servingtopology.spec import parse_spec, to_layout
from tests.operator.fake_cluster import FakeCluster

MOE = "Qwen/Qwen3-30B-A3B"
SGLANG = {"name": "sglang", "image": "lmsysorg/sglang:v0.5.23"}
VLLM = {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0"}
# SGLang's "TP4/DP4 attention" prefill with its experts over 2 of its 4 GPUs, a TP8 decoder with them over all 8.
PD_EP = {"kind": "pd", "dpAttention": True, "prefill": {"count": 1, "tp": 4, "dp": 4, "ep": 2}, "decode": {"count": 1, "tp": 8, "ep": 8}}


def _spec(layout: dict[str, Any], *, engine: dict[str, str] = SGLANG, model: str = MOE) -> dict[str, Any]:
    return {"model": model, "engine": engine, "hardware": {"gpu": "h100_sxm", "gpusPerNode": 8, "maxGPUs": 16},
            "workload": {"arrivalRate": 10, "inputTokens": 2000, "outputTokens": 200},
            "slo": {"ttftMs": {"p95": 1000}, "tpotMs": {"p95": 50}}, "layout": layout}


def _plan(tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: dict[str, Any]) -> tuple[int, str]:
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(spec))
    code = main(["plan", str(path), "--no-simulate", "--no-progress", "--json"])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_each_role_of_a_pd_layout_takes_its_own_ep_size() -> None:
    layout = to_layout(parse_spec(_spec(PD_EP)))
    prefill, decode = layout.roles[Role.PREFILL].parallelism, layout.roles[Role.DECODE].parallelism
    assert (prefill.tp, prefill.dp, prefill.moe_ep, prefill.ep_size) == (1, 4, 2, 2)
    assert (decode.tp, decode.moe_ep, decode.ep, decode.ep_size) == (8, 8, True, 0)   # the whole stage: canonical `ep`
    assert layout.label_for(Engine.SGLANG) == "1P(TP4·DP4-attn·EP2)·1D(TP8·EP)"
    one = to_layout(parse_spec(_spec({**PD_EP, "decode": {"count": 1, "tp": 8, "ep": 1}})))
    assert not one.roles[Role.DECODE].parallelism.ep   # ep 1: none


@pytest.mark.parametrize(("engine", "layout", "model", "field", "words"), [
    # 3 does not divide the prefill's 4 GPUs (tp under dpAttention)
    (SGLANG, {**PD_EP, "prefill": {"count": 1, "tp": 4, "dp": 4, "ep": 3}}, MOE, "layout.prefill.ep", "must divide its 4 GPUs"),
    # a dense model has no experts to spread
    (SGLANG, {"kind": "pd", "prefill": {"count": 1, "tp": 4}, "decode": {"count": 1, "tp": 4, "ep": 2}}, "meta-llama/Llama-3.1-8B-Instruct",
     "layout.decode.ep", "needs an MoE model"),
    # vLLM spreads them over the whole stage (TP·DP) or not at all
    (VLLM, PD_EP, MOE, "layout.prefill.ep", "--enable-expert-parallel"),
    # a role's ep belongs to kind pd
    (SGLANG, {"kind": "replicas", "replicas": 1, "tp": 8, "decode": {"count": 1, "ep": 8}}, MOE, "decode.ep", "kind pd"),
])
def test_an_ep_that_cannot_run_is_refused_naming_its_field(tmp_path: Path, capsys: pytest.CaptureFixture[str], engine: dict[str, str],
                                                           layout: dict[str, Any], model: str, field: str, words: str) -> None:
    code, text = _plan(tmp_path, capsys, _spec(layout, engine=engine, model=model))
    assert code == 2 and field in text and words in text, text


def test_vllm_takes_a_roles_ep_over_its_whole_stage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec({"kind": "pd", "prefill": {"count": 1, "tp": 2, "dp": 4, "ep": 8}, "decode": {"count": 1, "tp": 8}}, engine=VLLM)
    code, text = _plan(tmp_path, capsys, spec)
    assert code == 0, text
    assert json.loads(text)["best"]["label"] == "1P(TP2·DP4·EP)·1D(TP8)"


def _args(engine: Engine, par: Parallelism, role: Role, version: str) -> tuple[str, ...]:
    cmd = engine_command(engine=engine, model=MOE, served_name="m", role=role, par=par, knobs=EngineKnobs(), precision=Precision.BF16,
                         version=version)
    return cmd.command + cmd.args


def test_sglang_renders_each_roles_ep_size_and_vllm_its_switch_and_the_engines_parsers_read_them_back() -> None:
    layout = to_layout(parse_spec(_spec(PD_EP)))
    pre = _args(Engine.SGLANG, layout.roles[Role.PREFILL].parallelism, Role.PREFILL, "0.5.23")
    dec = _args(Engine.SGLANG, layout.roles[Role.DECODE].parallelism, Role.DECODE, "0.5.23")
    assert pre[pre.index("--tp-size") + 1] == "4" and pre[pre.index("--ep-size") + 1] == "2"
    assert dec[dec.index("--tp-size") + 1] == "8" and dec[dec.index("--ep-size") + 1] == "8"
    for argv in (pre, dec):   # the emulator's parser: the release's own flags and argparse rules (tests/conformance: the real one)
        parse_engine_command(argv, version="0.5.23")
    vllm = to_layout(parse_spec(_spec({"kind": "pd", "prefill": {"count": 1, "tp": 2, "dp": 4, "ep": 8}, "decode": {"count": 1, "tp": 8}},
                                      engine=VLLM)))
    pre = _args(Engine.VLLM, vllm.roles[Role.PREFILL].parallelism, Role.PREFILL, "0.11.0")
    dec = _args(Engine.VLLM, vllm.roles[Role.DECODE].parallelism, Role.DECODE, "0.11.0")
    assert "--enable-expert-parallel" in pre and "--enable-expert-parallel" not in dec
    for argv in (pre, dec):
        parse_engine_command(argv, version="0.11.0")


def test_the_step_model_runs_a_roles_experts_at_its_own_ep_size() -> None:
    model, gpu = resolve_model(MOE), resolve_gpu("h100_sxm")

    def decode_step_s(par: Parallelism) -> float:
        return InstancePerf(model, gpu, Precision.BF16, KvDtype.AUTO, Engine.SGLANG, par).decode_s(16.0, 16.0 * 2000.0)
    sharded, half, whole = (decode_step_s(Parallelism(tp=8)), decode_step_s(Parallelism.with_ep(tp=8, ep=2)),
                            decode_step_s(Parallelism.with_ep(tp=8, ep=8)))
    assert len({sharded, half, whole}) == 3, (sharded, half, whole)


def test_a_roles_ep_size_survives_status_and_transitions_and_names_its_own_set() -> None:
    layout = to_layout(parse_spec(_spec(PD_EP)))
    assert layout_from_state(json.loads(json.dumps(layout_to_state(layout)))) == layout
    whole = Layout.pd(RoleLayout(1, Parallelism(tp=1, dp=4, ep=True)), layout.roles[Role.DECODE])
    assert set_name(layout) != set_name(whole)
    # a layout without an EP size keeps the set name it had before EP sizes existed
    assert set_name(Layout.pd(RoleLayout(2, Parallelism(tp=2)), RoleLayout(3, Parallelism(tp=4)))) == \
        set_name(Layout.pd(RoleLayout(2, Parallelism(tp=2, ep_size=0)), RoleLayout(3, Parallelism(tp=4))))


def test_the_operator_renders_and_keeps_a_pinned_roles_ep_size() -> None:
    spec = {k: v for k, v in _spec(PD_EP).items() if k != "layout"}
    obj = {"apiVersion": "servingtopology.io/v1alpha1", "kind": "ServingTopology",
           "metadata": {"name": "moe", "namespace": "default", "uid": "uid-1", "generation": 1},
           "spec": {**spec, "policy": {"mode": "Pinned"}, "pinned": PD_EP}}
    cluster = FakeCluster()
    out = reconcile(copy.deepcopy(obj), cluster=cluster, planner=decide, now=datetime(2026, 1, 1, tzinfo=UTC))
    assert out.error is None, out.status.get("conditions")
    plan = out.status["plan"]
    assert plan["layout"] == "1P(TP4·DP4-attn·EP2)·1D(TP8·EP)"
    assert {r["role"]: r.get("epSize") for r in plan["roles"]} == {"prefill": 2, "decode": None}
    assert layout_from_plan(PlanStatus.model_validate(plan)) == to_layout(parse_spec(_spec(PD_EP)))   # no move on the next pass
    args = [a for o in cluster.objects.values() if o["kind"] == "Deployment" for c in o["spec"]["template"]["spec"]["containers"]
            if c["name"] == "engine" for a in [" ".join(c.get("args", []))]]
    assert any("--ep-size 2" in a for a in args) and any("--ep-size 8" in a for a in args), args


def test_compare_reads_the_ep_labels_the_plan_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps({k: v for k, v in _spec(PD_EP).items() if k != "layout"}))
    labels = ["1P(TP4·DP4-attn·EP2)·1D(TP8·EP)", "1P1D@TP8·EP", "2×TP4·EP"]
    assert main(["compare", str(path), *[a for label in labels for a in ("--layout", label)], "--json"]) == 0
    shown = [row["label"] for row in json.loads(capsys.readouterr().out)["layouts"]]
    assert shown == labels
    # replicas spread the experts over the whole stage or not at all: an EP size below it is a pd role's
    assert main(["compare", str(path), "--layout", "2×TP4·EP2", "--json"]) == 2
    assert "--layout" in capsys.readouterr().out


@pytest.mark.parametrize("value", [True, False])
def test_a_roles_ep_written_true_or_false_is_refused_naming_it_never_read_as_size_1(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                                      value: bool) -> None:
    # `decode: {tp: 4, ep: true}` was read as EP size 1 (YAML's true as the integer 1): no EP in the plan or the command.
    layout = {"kind": "pd", "prefill": {"count": 1, "tp": 4}, "decode": {"count": 1, "tp": 4, "ep": value}}
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps(_spec(layout)))
    assert main(["plan", str(spec), "--no-simulate", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "layout.decode.ep" in err and "EP size" in err and "ep: 4" in err, err
