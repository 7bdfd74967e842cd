"""A spec that pins prefill on one GPU kind and decode on another: both roles named, predicted and simulated with each
role on its own kind (planner.perf.mixed_pd), refused with the rule's name where the link or memory forbids it."""

from __future__ import annotations

from typing import Any

import pytest

from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.layout import Role, layout_to_dict
from servingtopology.planner.perf.mixed_pd import mixed_kinds
from servingtopology.planner.search.decide import decide, predict_layout
from servingtopology.planner.sim.stage import simulate_problem, stage6_figures
from servingtopology.spec import parse_spec, to_layout, to_problem


def _spec(decode_gpu: str | None = "a100_sxm", *, nic_gbps: float | None = None, prompt: int = 1024) -> dict[str, Any]:
    decode: dict[str, Any] = {"count": 2, "tp": 1}
    if decode_gpu is not None:
        decode["gpu"] = decode_gpu
    hw: dict[str, Any] = {"gpu": "H100", "maxGPUs": 8}
    if nic_gbps is not None:
        hw["nicGbps"] = nic_gbps
    return {"model": "meta-llama/Llama-3.1-8B-Instruct", "hardware": hw,
            "workload": {"arrivalRate": 4, "inputTokens": prompt, "outputTokens": 256},
            "slo": {"ttftMs": {"p95": 2000}, "tpotMs": {"p95": 80}},
            "layout": {"kind": "pd", "prefill": {"count": 1, "tp": 1}, "decode": decode}}


def test_naming_one_roles_kind_names_both_so_the_layout_round_trips() -> None:
    spec = parse_spec(_spec("A100"))
    layout = to_layout(spec)
    assert layout.role_gpus("") == {Role.PREFILL: "h100_sxm", Role.DECODE: "a100_sxm"}   # the alias resolved, hardware.gpu named
    again = to_layout(parse_spec({**_spec(), "layout": layout_to_dict(layout)}))
    assert again == layout
    assert not to_layout(parse_spec(_spec(None))).kinds_named


def test_an_unknown_role_kind_names_the_field_and_the_allowed_ids() -> None:
    with pytest.raises(InvalidSpec) as err:
        to_layout(parse_spec(_spec("t4")))
    assert err.value.field == "layout.decode.gpu" and "a100_sxm" in err.value.message


def test_a_mixed_pin_is_predicted_with_each_role_on_its_kind() -> None:
    problem = to_problem(parse_spec(_spec()))
    assert problem.pinned is not None
    kinds = mixed_kinds(problem, problem.pinned)
    assert kinds is not None and (kinds.prefill_gpu.id, kinds.decode_gpu.id, kinds.link_gbit) == ("h100_sxm", "a100_sxm", 200.0)
    mixed = predict_layout(problem, problem.pinned)
    one_kind = predict_layout(problem, to_layout(parse_spec(_spec(None))))
    # decode on A100 (2.0 TB/s HBM) streams the weights slower than on H100 (3.35 TB/s): a longer TPOT
    assert mixed.prediction.tpot_ms > one_kind.prediction.tpot_ms * 1.2
    assert mixed.prediction.meets_slo


def test_the_simulator_runs_a_mixed_pin_with_decode_on_its_own_kind() -> None:
    problem = to_problem(parse_spec(_spec()))
    assert problem.pinned is not None
    result = simulate_problem(problem, problem.pinned, num_requests=200)
    assert result.summary(problem.slo).finished == 200
    mixed = stage6_figures(problem, problem.pinned, num_requests=200)
    one_kind = stage6_figures(problem, to_layout(parse_spec(_spec(None))), num_requests=200)
    assert mixed.tpot_s > one_kind.tpot_s * 1.2


def test_decide_keeps_the_mixed_pin_and_names_its_kinds() -> None:
    d = decide(to_problem(parse_spec(_spec())), simulate=lambda p, lay: stage6_figures(p, lay, num_requests=200))
    assert d.best.layout.label == "1P(TP1)·2D(TP1)@h100_sxm→a100_sxm"
    assert d.best.prediction.source == "simulated"
    assert d.pd_ratio is None   # choose_pd_ratio prices one kind: a mixed pin keeps its counts


def test_a_ten_gigabit_link_is_refused_by_the_transfer_floor_with_its_figures() -> None:
    # hardware.nicGbps sets the H100 side's NIC; the A100 side has 200 Gb/s: the link is the slower, 10 Gb/s
    with pytest.raises(InvalidSpec) as err:
        decide(to_problem(parse_spec(_spec(nic_gbps=10, prompt=16_000))))
    assert err.value.field == "layout.decode.gpu"
    assert "(transfer-floor)" in err.value.message and "10 Gb/s" in err.value.message


def test_a_mixed_pin_the_release_refuses_names_the_engine_rule() -> None:
    # vLLM 0.11's NixlConnector refuses a decode TP below the prefill TP (found by the e2e scenario on the 0.11 image)
    spec = _spec()
    spec["engine"] = {"name": "vllm", "version": "0.11.0"}
    spec["layout"]["prefill"]["tp"] = 2
    with pytest.raises(InvalidSpec) as err:
        decide(to_problem(parse_spec(spec)))
    assert "(engine:decode_tp_below_prefill_tp)" in err.value.message and "nixl_connector.py" in err.value.message
