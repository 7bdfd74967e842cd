"""`servingtopology compare [SPEC] --layout A=8xTP1 --layout B=4xTP2 --layout C=2P6D`: named layouts side by side.

Each layout is held to the spec's own validation (it is set as the spec's `layout:` and parsed, so the GPU budget and
shape rules are the ones `plan` applies to a pin) and predicted exactly as `plan` predicts a pinned layout on the
same work: the spec's load, request lengths and simulation seed, the step-level simulator where the layout carries
the load (planner.search.decide.predict_layout with the stage-6 simulator). One table (or `--json`) and, with `--plot`, one
figure: each layout at its SLO capacity on the serving-envelope axes, coloured by layout kind. Exit 0 done, 2 invalid
input (naming `--layout[i]`), 1 a layout that cannot run (a role's rank pool short of the longest request).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from typing import Any

from servingtopology.cli.output_paths import PLOT_SUFFIXES, check_output
from servingtopology.cli.spec_input import emit_spec_error, plan_problem, read_spec, simulator_for
from servingtopology.cli.whatif import add_whatif_flags, flagged, whatif_overrides
from servingtopology.planner.errors import InvalidSpec, PinRefused
from servingtopology.planner.figure_text import finite_json, json_number, ms_text, per_gpu_text, ratio_text, rps_text
from servingtopology.planner.layout import layout_to_dict
from servingtopology.planner.perf.memory import kv_pool_tokens
from servingtopology.planner.problem import Candidate, Problem
from servingtopology.planner.search.decide import predict_layout, refuse_pin
from servingtopology.planner.search.pd_ratio import RANK_TOLERANCE
from servingtopology.planner.search.verdict import basis_text, verdict_text
from servingtopology.spec import SpecError, load_yaml, to_problem

__all__ = ["add_parser", "run", "parse_layout", "Compared", "compare_layouts", "MAX_LAYOUTS"]

MAX_LAYOUTS = 16
# `-attn`: SGLang's spelling, dp splits the TP GPUs' attention; `EP`: experts over all of a stage's GPUs, `EP2` over 2 of them
_PAR = r"TP(\d+)(?:[·.*]PP(\d+))?(?:[·.*]DP(\d+)(-attn)?)?(?:[·.*](EP)(\d+)?)?"
_REPLICAS = re.compile(rf"^(?:(\d+)\s*[x×*]\s*)?{_PAR}$", re.I)
_PD_SHAPED = re.compile(rf"^(\d+)P\({_PAR}\)\s*[·.*,]?\s*(\d+)D\({_PAR}\)$", re.I)
_PD_SAME = re.compile(rf"^(\d+)P\s*[·.*,]?\s*(\d+)D(?:@{_PAR})?$", re.I)
_NAME = re.compile(r"^([A-Za-z0-9_.-]{1,32})=(.+)$")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("compare", help="named layouts side by side on the same work: one table, one plot",
                       description="Predict each --layout as plan predicts a pinned layout (same load, lengths and simulation "
                                   "seed), side by side.")
    p.add_argument("spec", nargs="?", help="planning spec (YAML); omit for the embedded default scenario")
    p.add_argument("--layout", action="append", default=[], metavar="[NAME=]LAYOUT",
                   help="a layout: 8xTP1, 4xTP2, 2xTP2·PP2, 1xTP4·DP4-attn (SGLang's TP4 with DP attention), 1xTP8·EP "
                        "(expert parallel), 2P6D (TP1 roles), 2P6D@TP2, 1P(TP2)·3D(TP1), 1P(TP4·DP4-attn·EP2)·1D(TP8·EP) "
                        "(each role's EP: EP over the stage, EP2 over 2 of its GPUs), or a spec layout "
                        "mapping such as '{kind: pd, prefill: {count: 2}, decode: {count: 6}}'; NAME= names it (A=8xTP1). Repeat.")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="draw the layouts at their SLO capacity (the axes of plan --plot)")
    add_whatif_flags(p)


def _ep_of(tp: str | None, dp: str | None, attn: str | None, ep: str | None, ep_n: str | None) -> int | None:
    """A role's EP size from its label: EP is the stage's GPUs (tp under -attn, else tp × dp), EPn is n; None: no EP."""
    if not ep:
        return None
    return int(ep_n) if ep_n else int(tp or 1) * (1 if attn else int(dp or 1))


def _role(count: str, tp: str | None, pp: str | None, dp: str | None, attn: str | None = None, ep: str | None = None,
          ep_n: str | None = None) -> dict[str, Any]:
    size = _ep_of(tp, dp, attn, ep, ep_n)
    return {"count": int(count), "tp": int(tp or 1), "pp": int(pp or 1), "dp": int(dp or 1), **({"dpAttention": True} if attn else {}),
            **({"ep": size} if size is not None else {})}


def parse_layout(text: str, *, field: str) -> tuple[str | None, dict[str, Any]]:
    """(its name or None, the spec's `layout:` mapping) from one --layout value; InvalidSpec naming `field` otherwise."""
    name = None
    m = _NAME.match(text.strip())
    if m and not text.strip().startswith("{"):
        name, text = m.group(1), m.group(2)
    text = text.strip()
    if text.startswith("{"):
        try:
            data = load_yaml(text)
        except Exception as exc:  # yaml.YAMLError and DuplicateKey: the value, not the program, is wrong
            raise InvalidSpec(field, f"not a YAML mapping: {str(exc)[:200]}") from None
        if not isinstance(data, dict):
            raise InvalidSpec(field, "expected a layout mapping such as {kind: replicas, replicas: 4, tp: 2}")
        return name, data
    if r := _REPLICAS.match(text):
        count, tp, pp, dp, attn, ep, ep_n = r.groups()
        size = _ep_of(tp, dp, attn, ep, ep_n)
        stage = int(tp) * (1 if attn else int(dp or 1))
        if size is not None and size != stage:
            raise InvalidSpec(field, f"{text[:80]!r}: replicas spread the experts over all {stage} GPUs of a stage (EP) or none; "
                                     "an EP size below it is a pd role's (1P(TP8·EP2)·1D(TP8·EP))")
        return name, {"kind": "replicas", "replicas": int(count or 1), "tp": int(tp), "pp": int(pp or 1), "dp": int(dp or 1),
                      **({"dpAttention": True} if attn else {}), **({"ep": True} if size else {})}
    if r := _PD_SHAPED.match(text):
        g = r.groups()
        return name, {"kind": "pd", "prefill": _role(*g[0:7]), "decode": _role(*g[7:14])}
    if r := _PD_SAME.match(text):
        p, d, *shape = r.groups()
        if shape[0] is None:
            return name, {"kind": "pd", "prefill": _role(p, None, None, None), "decode": _role(d, None, None, None)}
        return name, {"kind": "pd", "prefill": _role(p, *shape), "decode": _role(d, *shape)}
    raise InvalidSpec(field, f"{text[:80]!r} is not a layout; allowed: NxTPt[·PPp][·DPd[-attn]][·EP] (8xTP1, 4xTP2, 1xTP4·DP4-attn), "
                             "mPnD[@TPt...] (2P6D), mP(TPa[·EPe])·nD(TPb[·EP]) (each role's EP size), "
                             "mP(TPa)·nD(TPb), or a spec layout mapping in braces")


@dataclass(frozen=True, slots=True)
class Compared:
    """One compared layout: its name, its prediction as `plan` makes it for a pin, and its KV pool per role."""

    name: str
    candidate: Candidate
    pools: dict[str, int]


def compare_layouts(spec_path: str | None, layouts: list[str], overrides: dict[str, Any]) -> tuple[Problem, list[Compared]]:
    """Parse, validate and predict every layout on the spec's work (InvalidSpec / SpecError naming `--layout[i]`)."""
    if not layouts:
        raise InvalidSpec("--layout", "give at least one layout, e.g. --layout A=8xTP1 --layout B=4xTP2 --layout C=2P6D")
    if len(layouts) > MAX_LAYOUTS:
        raise InvalidSpec("--layout", f"at most {MAX_LAYOUTS} layouts")
    out: list[Compared] = []
    problem: Problem | None = None
    names: set[str] = set()
    # A ServingTopology resource (the README's examples, what `plan` and `simulate` read) pins a layout as the operator
    # does, under spec.pinned with policy.mode Pinned; its `layout` field is refused, so each layout goes there.
    from servingtopology.operator.api.resource import TopologySpec  # as spec_input reads a resource: only when asked

    resource = isinstance(read_spec(spec_path, overrides), TopologySpec)
    for i, text in enumerate(layouts):
        field = f"--layout[{i}]"
        name, mapping = parse_layout(text, field=field)
        pin = {"pinned": mapping, "policy.mode": "Pinned"} if resource else {"layout": mapping}
        try:
            spec = read_spec(spec_path, {**overrides, **pin})
            problem = plan_problem(spec) if resource else to_problem(spec)
        except SpecError as exc:
            raise SpecError([(f"{field} ({f})" if f.startswith(("layout", "pinned")) else f, m) for f, m in exc.errors]) from None
        except InvalidSpec as exc:
            if not exc.field.startswith(("layout", "spec.pinned")):
                raise
            raise InvalidSpec(f"{field} ({exc.field})", exc.message) from None
        assert problem.pinned is not None
        try:   # held to every check the search applies, as `plan` holds a pin
            refuse_pin(problem, problem.pinned)
        except InvalidSpec as exc:
            raise InvalidSpec(f"{field} ({exc.field})", exc.message) from None
        except PinRefused as exc:
            raise PinRefused(exc.stage, f"{field} ({exc.field})", exc.message) from None
        label = name or problem.pinned.label_for(problem.engine)
        if label in names:
            raise InvalidSpec(field, f"the name {label!r} is given twice; name each layout once (NAME=LAYOUT)")
        names.add(label)
        cand = predict_layout(problem, problem.pinned, simulate=simulator_for(spec))
        pools = {role.value: kv_pool_tokens(problem.model, problem.gpu, engine=problem.engine, precision=problem.precision,
                                            parallelism=r.parallelism, knobs=r.knobs) for role, r in problem.pinned.roles.items()}
        out.append(Compared(label, cand, pools))
    assert problem is not None
    return problem, out


def _verdicts(rows: list[Compared]) -> dict[str, str]:
    """Per layout, how it stands against the best of the others on goodput per GPU within the SLOs (the plan's objective
    and its 3 % tie band)."""
    meeting = [r for r in rows if r.candidate.prediction.meets_slo]
    if not meeting:
        return {r.name: "misses an SLO at the load" for r in rows}
    top = max(meeting, key=lambda r: r.candidate.prediction.goodput_per_gpu)
    best = top.candidate.prediction.goodput_per_gpu
    out = {}
    for r in rows:
        p = r.candidate.prediction
        if not p.meets_slo:
            out[r.name] = "misses an SLO at the load"
        elif r is top:
            out[r.name] = "most req/s per GPU within the SLOs"
        elif p.goodput_per_gpu >= best * (1.0 - RANK_TOLERANCE):
            out[r.name] = (f"within {RANK_TOLERANCE:.0%} of {top.name} ({per_gpu_text(p.goodput_per_gpu)} against {per_gpu_text(best)} "
                           "req/s per GPU): a tie")
        else:
            ratio = ratio_text(best, p.goodput_per_gpu)
            out[r.name] = (f"{per_gpu_text(p.goodput_per_gpu)} req/s per GPU against {top.name}'s {per_gpu_text(best)} "
                           + (f"({top.name} carries {ratio} as much per GPU)" if ratio else "(it carries next to nothing within the SLOs)"))
    return out


def _tok_s_per_gpu(problem: Problem, c: Candidate) -> float:
    return round(c.prediction.capacity_rps * problem.workload.output_tokens.expected_tokens / max(c.layout.gpus, 1), 1)


def rows_json(problem: Problem, rows: list[Compared]) -> list[dict[str, Any]]:
    verdicts = _verdicts(rows)
    out = []
    for r in rows:
        c, p = r.candidate, r.candidate.prediction
        out.append({
            "name": r.name, "label": c.layout.label_for(problem.engine), "kind": c.layout.kind.value, "gpus": c.layout.gpus,
            "ttft_ms": json_number(p.ttft_ms, 3), "tpot_ms": json_number(p.tpot_ms, 3), "tokens_per_s_per_user": round(p.tokens_per_s_per_user, 2),
            "slo_capacity_rps": round(p.capacity_rps, 3), "goodput_per_gpu": round(p.goodput_per_gpu, 4),
            "slo_capacity_tok_s_per_gpu": _tok_s_per_gpu(problem, c), "throughput_tok_s": round(p.throughput_tok_s, 1),
            "meets_slo": p.meets_slo, "source": p.source, "kv_pool_tokens": r.pools,
            "max_request_tokens": p.max_request_tokens, "verdict": verdicts[r.name],
            # The SLO capacity is the analytical bisection's; where the simulated verdict at the load disagrees with it,
            # the basis says which one the verdict rests on (planner.search.verdict, as plan and the record say it).
            "slo_capacity_source": "analytical", "verdict_basis": basis_text(problem, p) or None,
            # The met/short verdict at the load in the sentence plan's summary and the record state (one formatter).
            "slo_verdict": verdict_text(problem, c.layout, p),
            # The layout as plan --json's best.layout_spec states it, engine args included: one label may run other args.
            "layout_spec": layout_to_dict(c.layout),
        })
    return out


def _print(problem: Problem, rows: list[dict[str, Any]]) -> None:
    slo, w = problem.slo, problem.workload
    print(f"{problem.model.name} on {problem.gpu.id} ({problem.engine.value}) at {w.arrival_rate_rps:g} req/s, prompts of "
          f"{w.input_tokens.expected_tokens:,.0f} and outputs of {w.output_tokens.expected_tokens:,.0f} tokens: the same work for each layout")
    print(f"{'name':<10} {'layout':<24} {'GPUs':>4} {f'p{slo.ttft_percentile:g} TTFT ms':>13} {f'p{slo.tpot_percentile:g} TPOT ms':>13} "
          f"{'tok/s/user':>10} {'SLO cap. req/s':>14} {'req/s/GPU':>9} {'tok/s/GPU':>9} {'SLOs':>5} {'source':>10}")
    for r in rows:
        print(f"{r['name']:<10} {r['label']:<24} {r['gpus']:>4} {ms_text(r['ttft_ms']):>13} {ms_text(r['tpot_ms']):>13} "
              f"{r['tokens_per_s_per_user']:>10.1f} {rps_text(r['slo_capacity_rps']):>14} {per_gpu_text(r['goodput_per_gpu']):>9} "
              f"{r['slo_capacity_tok_s_per_gpu']:>9.0f} "
              f"{'met' if r['meets_slo'] else 'MISS':>5} {r['source']:>10}")
    print(f"   SLOs: p{slo.ttft_percentile:g} TTFT ≤ {slo.ttft_ms:g} ms, p{slo.tpot_percentile:g} TPOT ≤ {slo.tpot_ms:g} ms; SLO cap. = the "
          "highest load within both SLOs by the analytical model, as plan states it for a pinned layout (without the search's 10 % "
          "planning margin); SLOs = the verdict at the load, on the source's figures;\n"
          "   per GPU counts every GPU of the layout (prefill and decode alike); a layout given by its label (2xTP1) runs the spec's "
          "engine args, plan's chosen one those its search tuned:\n   to compare plan's choice like with like, give its --json "
          "best.layout_spec as the --layout")
    for r in rows:
        pools = ", ".join(f"{role} {n:,}" for role, n in r["kv_pool_tokens"].items())
        # The SLO verdict (with its basis) as plan and the record state it, then how the layout ranks among these.
        said = r["slo_verdict"] if r["slo_verdict"].startswith(f"{r['name']} ") else f"{r['name']}: {r['slo_verdict']}"
        rank = f"; {r['verdict']}" if r["meets_slo"] else ""
        print(f"{said}{rank}; KV pool per rank: {pools} tokens; engine args: {_args_text(r['layout_spec'])}")


def _args_text(spec: dict[str, Any]) -> str:
    """The engine args that move a prediction, per role as the spec names them: `maxNumSeqs 256, maxNumBatchedTokens 8192,
    memoryFraction 0.9` (a PD layout: `prefill …; decode …`)."""
    def one(args: dict[str, Any]) -> str:
        return ", ".join(f"{k} {args[k]:g}" for k in ("maxNumSeqs", "maxNumBatchedTokens", "memoryFraction") if k in args)
    if spec["kind"] == "replicas":
        return one(spec["engineArgs"])
    return "; ".join(f"{role} {one(spec[role]['engineArgs'])}" for role in ("prefill", "decode"))


def run(args: argparse.Namespace) -> int:
    try:
        check_output("--plot", args.plot, suffixes=PLOT_SUFFIXES)
        problem, compared = compare_layouts(args.spec, list(args.layout), whatif_overrides(args))
    except (SpecError, InvalidSpec) as exc:
        return emit_spec_error(flagged(exc, whatif_overrides(args, strict=False)), as_json=args.json)
    except PinRefused as exc:
        if args.json:
            print(json.dumps({"error": "infeasible", "stage": exc.stage, "field": exc.field, "message": exc.message}))
        print(f"{exc.field}: cannot run (the search's stage '{exc.stage}' would refuse it): {exc.message}", file=sys.stderr)
        return 1
    rows = rows_json(problem, compared)
    if args.plot:
        from servingtopology.cli.plots import compare_figure, save

        try:
            save(compare_figure(problem, [(r.name, r.candidate) for r in compared]), args.plot)
        except InvalidSpec as exc:
            return emit_spec_error(exc, as_json=args.json)
    if args.json:
        print(json.dumps(finite_json({"load_rps": problem.workload.arrival_rate_rps, "layouts": rows, **({"plot": args.plot} if args.plot else {})}),
                         indent=1))
        return 0
    _print(problem, rows)
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0

