"""Conformance: the engine command lines `servingtopology plan` prints, split as a shell would (shlex), are accepted by
each engine release's own parser (vLLM make_arg_parser + EngineArgs.from_cli_args, SGLang ServerArgs), as the pods'
lines are in test_engine_parsers.py. Marked `conformance`; `make conformance` runs it."""

from __future__ import annotations

import shlex

import pytest

from servingtopology.cli.commands import role_commands
from servingtopology.emulator.command_parser import engine_argv
from servingtopology.planner.engines.caps import available_versions
from servingtopology.planner.search.decide import predict_layout
from servingtopology.spec import parse_spec, to_layout, to_problem

from .test_engine_parsers import Line, run_real_parsers

pytestmark = pytest.mark.conformance

LAYOUTS = {
    "replicas 2×TP4": {"kind": "replicas", "replicas": 2, "tp": 4},
    "PD 1P(TP2)·2D(TP2)": {"kind": "pd", "prefill": {"count": 1, "tp": 2}, "decode": {"count": 2, "tp": 2}},
    "multi-node TP8·PP2": {"kind": "replicas", "replicas": 1, "tp": 8, "pp": 2},
}


def printed_lines() -> list[Line]:
    out = []
    for engine in ("vllm", "sglang"):
        for version in available_versions(engine):
            for name, layout in LAYOUTS.items():
                spec = parse_spec({"model": "meta-llama/Llama-3.1-70B-Instruct", "engine": {"name": engine, "version": version},
                                   "hardware": {"gpu": "h100_sxm", "gpusPerNode": 8, "maxGPUs": 16}, "layout": layout,
                                   "workload": {"arrivalRate": 1, "inputTokens": 1000, "outputTokens": 100},
                                   "slo": {"ttftMs": {"p95": 100000}, "tpotMs": {"p95": 10000}}})
                problem = to_problem(spec)
                chosen = predict_layout(problem, to_layout(spec, precision=problem.precision)).layout
                for rc in role_commands(spec, problem, chosen):
                    for line in (rc.leader, *rc.workers):
                        found = engine_argv(shlex.split(line))
                        if found is None:   # vLLM 0.11's Ray worker only joins the Ray cluster
                            assert "multi-node-serving.sh worker" in line, line
                            continue
                        out.append(Line(engine, version, tuple(found[1]), f"plan {engine} {version} {name} {rc.role.value}"))
    return out


def test_every_printed_command_line_is_accepted_by_the_engines_own_parsers() -> None:
    lines = printed_lines()
    assert {ln.kind for ln in lines} == {"vllm", "sglang"} and len(lines) >= 2 * 3 * 3
    results = run_real_parsers(lines)
    refused = [f"{ln.origin}: {r['error']}" for ln, r in results.items() if not r["ok"]]
    assert not refused, "\n".join(refused)
