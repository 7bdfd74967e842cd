"""One truth for a pool, over generated pools: `plan --pool --json` states for each member the capacity of the objects the
operator renders for it. Each part's layout is rendered by the operator's own builder (operator/render/manifests.py
`build_set`); the pods that take client traffic (ENTRY_LABEL) behind the member's one plain Service split it per pod, so
the member carries per_pod_capacity_rps over the rendered entry pods. The member's capacity, its met verdict and the
shortages must follow from that figure, and the JSON must state the decision's own figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servingtopology.cli.main import main
from servingtopology.cli.pool import decision_json
from servingtopology.operator.render.manifests import ENTRY_LABEL, Blueprint, build_set
from servingtopology.planner.layout import Engine
from servingtopology.planner.pool.options import MemberRequest, build_pool
from servingtopology.planner.pool.plan import plan_pool
from servingtopology.planner.pool.service_split import per_pod_capacity_rps
from servingtopology.pool_spec import load_pool, to_pool_inputs

KINDS = {"h100": ("h100_sxm", 3.0), "a100": ("a100_sxm", 1.6), "l40s": ("l40s", 1.0)}
MODELS = ["meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-8B"]


@st.composite
def pools(draw: Any) -> dict[str, Any]:
    """A pool of one to three members on one or two GPU kinds of 2-8 GPUs each."""
    kinds = draw(st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=2, unique=True))
    inventory = [{"kind": k, "gpu": KINDS[k][0], "count": draw(st.integers(2, 8)), "pricePerHour": KINDS[k][1]} for k in kinds]
    members = []
    for i in range(draw(st.integers(1, 3))):
        spec = {"model": draw(st.sampled_from(MODELS)), "engine": draw(st.sampled_from(["vllm", "sglang"])),
                "workload": {"arrivalRate": draw(st.sampled_from([2, 8, 25, 60])), "inputTokens": draw(st.sampled_from([512, 2000])),
                             "outputTokens": draw(st.sampled_from([64, 256]))},
                "slo": {"ttftMs": {"p95": draw(st.sampled_from([500, 2000]))}, "tpotMs": {"p95": draw(st.sampled_from([30, 80]))}}}
        members.append({"name": f"m{i}", "priority": draw(st.integers(0, 3)), "spec": spec})
    pool: dict[str, Any] = {"objective": draw(st.sampled_from(["min-cost", "max-goodput"])), "inventory": inventory, "members": members}
    if pool["objective"] == "max-goodput":
        pool["budgetPerHour"] = draw(st.sampled_from([5.0, 20.0]))
    return pool


def _rendered_entry_pods(option: Any, kinds: dict[str, str], engine: Engine) -> int:
    """Pods with the entry label among the objects the operator renders for one part (Deployment or LWS replicas)."""
    layout = option.layout
    gpu_id = kinds[next(iter(option.role_kinds.values()))]
    bp = Blueprint(name="member", namespace="ns", uid="u", engine=engine, image="engine:1", model="m", served_model_name="m",
                   layout=layout, gpus_per_node=8, gpu_id=gpu_id)
    pods = 0
    for obj in build_set(bp):
        if obj["kind"] == "Deployment":
            labels = obj["spec"]["template"]["metadata"]["labels"]
        elif obj["kind"] == "LeaderWorkerSet":
            labels = obj["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["labels"]
        else:
            continue
        if labels.get(ENTRY_LABEL) == "true":
            pods += int(obj["spec"]["replicas"])
    return pods


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(pool=pools())
def test_the_pools_verdict_is_the_capacity_of_the_objects_it_renders(pool: dict[str, Any], tmp_path_factory: Any) -> None:
    path = Path(tmp_path_factory.mktemp("pool")) / "pool.yaml"
    path.write_text(yaml.safe_dump(pool))
    inputs = to_pool_inputs(load_pool(path), base=path.parent)
    requests = [MemberRequest(m.name, m.problem, m.cap_gpus, m.priority, m.min_rps) for m in inputs.members]
    problem, _ = build_pool(inputs.kinds, requests, objective=inputs.objective, budget_per_hour=inputs.budget_per_hour,
                            mixed=inputs.mixed, max_kinds_per_member=inputs.max_kinds_per_member)
    decision = plan_pool(problem)
    stated = decision_json(problem, decision)   # what `plan --pool --json` prints of this decision
    kinds = {k.name: k.gpu.id for k in problem.kinds}
    engines = {m["name"]: Engine(m["spec"]["engine"]) for m in pool["members"]}
    unmet = set()
    for a, shown in zip(decision.members, stated["members"], strict=True):
        rendered = [_rendered_entry_pods(p.option, kinds, engines[a.name]) for p in a.parts if p.option.layout is not None]
        if len(rendered) == len(a.parts) and a.parts:
            capacity = per_pod_capacity_rps(entry_pods=rendered, capacity_rps=[p.option.capacity_rps for p in a.parts])
            assert a.capacity_rps == capacity, (a.name, a.capacity_rps, capacity, rendered)
            assert [p["entry_pods"] for p in shown["parts"]] == rendered
        elif not a.parts:
            assert a.capacity_rps == 0
        assert shown["capacity_rps"] == round(a.capacity_rps, 4)
        assert a.met is (a.capacity_rps >= a.load_rps - 1e-6), (a.name, a.capacity_rps, a.load_rps)
        assert shown["met"] is a.met
        if not a.met:
            unmet.add(a.name)
    assert {s["member"] for s in stated["shortages"]} == unmet


def test_plan_pool_json_states_the_decision_the_planner_makes(tmp_path: Path, capsys: Any) -> None:
    pool = {"objective": "min-cost", "inventory": [{"kind": "h100", "gpu": "h100_sxm", "count": 3, "pricePerHour": 3.0},
                                                   {"kind": "l40s", "gpu": "l40s", "count": 4, "pricePerHour": 1.0}],
            "members": [{"name": "chat", "spec": {"model": MODELS[0], "workload": {"arrivalRate": 30, "inputTokens": 512, "outputTokens": 64},
                                                  "slo": {"ttftMs": {"p95": 2000}, "tpotMs": {"p95": 80}}}}]}
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(pool))
    assert main(["plan", "--pool", str(path), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    inputs = to_pool_inputs(load_pool(path), base=tmp_path)
    requests = [MemberRequest(m.name, m.problem, m.cap_gpus, m.priority, m.min_rps) for m in inputs.members]
    problem, _ = build_pool(inputs.kinds, requests, objective=inputs.objective, budget_per_hour=inputs.budget_per_hour,
                            mixed=inputs.mixed, max_kinds_per_member=inputs.max_kinds_per_member)
    assert {k: v for k, v in printed.items() if k not in ("cpu_s", "record")} == decision_json(problem, plan_pool(problem))
