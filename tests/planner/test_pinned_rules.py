"""A pinned layout is held to the search's own rules (stage 1 shapes, stage 2 budget), in the CLI as in the operator."""

import pytest

from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.layout import Layout, Parallelism, RoleLayout
from servingtopology.planner.search.decide import decide
from servingtopology.planner.search.funnel import shape_rejection
from servingtopology.planner.search.tables import layout_rejection
from servingtopology.spec import parse_spec, to_problem


def _spec(**over):
    spec = {"model": "llama-3.1-8b", "engine": "vllm", "hardware": {"gpu": "h100_sxm", "gpusPerNode": 8, "maxGPUs": 8},
            "workload": {"arrivalRate": 10, "inputTokens": 1000, "outputTokens": 200},
            "slo": {"ttftMs": {"p95": 1000}, "tpotMs": {"p95": 60}}}
    spec.update(over)
    return spec


def _problem(**over):
    return to_problem(parse_spec(_spec(**over)))


@pytest.mark.parametrize(("layout", "field", "words"), [
    # four TP8 instances are 32 GPUs: the budget is 8
    (Layout.replicas(4, Parallelism(tp=8)), "layout", "over the budget of 8 (hardware.maxGPUs)"),
    # TP1000 divides nothing of a 32-head model
    (Layout.replicas(1, Parallelism(tp=1000)), "layout", "TP does not divide the attention heads"),
    # 64 pipeline stages of a 32-layer model
    (Layout.replicas(1, Parallelism(pp=64)), "layout", "PP exceeds the layers"),
    # a PD pin names the role whose shape is wrong
    (Layout.pd(RoleLayout(1, Parallelism(tp=2)), RoleLayout(1, Parallelism(tp=3))), "layout.decode", "attention heads"),
])
def test_a_pin_the_search_would_never_offer_is_refused_naming_its_field(layout, field, words):
    where, why = layout_rejection(_problem(), layout)
    assert where == field and words in why


def test_five_pipeline_stages_on_three_gpu_nodes_do_not_split_into_equal_pods():
    # 5 GPUs over 2 nodes of 3: a LeaderWorkerSet's pods would hold 3 and 2 (the operator could not render it).
    p = _problem(hardware={"gpu": "h100_sxm", "gpusPerNode": 3, "maxGPUs": 12})
    assert "equal pods" in (shape_rejection(p, 1, 5, 1) or "")
    assert shape_rejection(p, 1, 6, 1) is None     # 6 over 2 nodes of 3: equal pods
    assert shape_rejection(p, 1, 3, 1) is None     # one node


def test_decide_refuses_an_over_budget_pin_with_invalid_spec_not_a_plan():
    # The CLI's spec already refuses `layout` over maxGPUs; a pin handed to to_problem (the operator's) did not.
    with pytest.raises(InvalidSpec) as err:
        decide(to_problem(parse_spec(_spec()), pinned=Layout.replicas(4, Parallelism(tp=8))))
    assert err.value.field == "layout" and "32 GPUs" in err.value.message and "hardware.maxGPUs" in err.value.message


def test_a_pin_within_the_budget_and_the_shape_rules_is_kept():
    d = decide(to_problem(parse_spec(_spec(layout={"kind": "replicas", "replicas": 2, "tp": 4}))))
    assert d.best.layout.label == "2×TP4" and d.best.why == "pinned by the spec"
