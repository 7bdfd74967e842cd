"""Generates planner/data/kernels/*.npz: measured kernel times per GPU and engine release, as compact
interpolation grids the step model reads through planner/engines/kernels.py. Run by a developer (`make kernel-tables`);
the output is committed, and the generator never runs in `make test` (it needs the network).

Source: the `aiconfigurator-core` 0.12.0 wheel on PyPI (NVIDIA, Apache-2.0), which ships times measured per GPU
and per engine release under `aiconfigurator_core/systems/data/<gpu>/<op>/<engine>/<version>/*_perf.parquet`.
The generator `pip download --no-deps`s the wheel into the cache (never the repository), records its sha256,
and opens it as a zip. It reads only the members `perf_members` admits - the `*_perf.parquet` files under
`systems/data/` - and never `systems/silicon_sample.csv` (end-to-end benchmark rows of held-out models) or any
other member. Each output file records the wheel's version and sha256 and every parquet's path and sha256.

What is kept (latencies in the parquet are milliseconds; the grids hold seconds):
- gemm: time by (dtype; m, n, k), the fastest kernel the release measured at each shape;
- context_attention / generation_attention: by (kv-cache dtype; head dim, KV heads, query heads, batch,
  prompt length or KV length), full attention only (window 0), the fastest kernel;
- mla_context / mla_generation: by (kv-cache dtype, GEMM dtype; query heads per GPU, batch, length); vLLM
  records the whole MLA module of DeepSeek-V3 (projections included), SGLang the attention core;
- mla_bmm: the absorbed MLA batched GEMMs by (pre/post; heads, tokens);
- moe: one curve over tokens per measured configuration (dtype; hidden, intermediate, top-k, experts, MoE TP,
  MoE EP), balanced routing (a dtype measured only under skewed routing keeps its mildest skew), and the kernels
  that timed each configuration;
- allreduce: the engine's custom all-reduce by (CUDA graph or eager; GPUs, message bytes);
- nccl: NCCL collectives by (op; GPUs, message bytes), half precision;
- deepep_ll / deepep_normal: SGLang's DeepEP expert all-to-all, one MoE layer's dispatch plus combine, by (top-k,
  experts; hidden size, tokens a rank sends), low-latency kernels (decode) and normal kernels (prefill) at DeepEP's
  default 20 SMs (`Buffer.num_sms`, deepseek-ai/DeepEP deep_ep/buffer.py); measured on one node (NVLink only).
Values are stored as uint16 codes of ln(seconds) (step 1/2048: 0.05 % relative), 65535 where not measured.

    python tools/gen_kernel_tables.py            # the Makefile's kernel-tables target runs it in its own venv
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import re
import subprocess
import sys
import zipfile
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "planner" / "data" / "kernels"
DIST, VERSION = "aiconfigurator-core", "0.12.0"

# The wheel's GPU folders covered, and the planner's GPU id for each (planner/data/gpus.toml).
# GB200 and GB300 (NVL72 racks) came with the DeepEP tables: wide expert parallelism runs there; B300 with them (its own
# GEMM, attention, MoE and collectives in place of B200's). L40S and RTX PRO 6000 are in the wheel too (~0.5 MB each
# here): add them when a plan needs them.
GPUS: dict[str, str] = {"h100_sxm": "h100_sxm", "h200_sxm": "h200_sxm", "b200_sxm": "b200_sxm", "a100_sxm": "a100_sxm",
                        "gb200": "gb200", "gb300": "gb300", "b300_sxm": "b300_sxm"}
ENGINES = ("vllm", "sglang", "nccl")
# (op folder, file stem) -> the table kind it feeds.
FILES: dict[tuple[str, str], str] = {
    ("gemm", "gemm"): "gemm",
    ("attention", "context_attention"): "context_attention",
    ("attention", "generation_attention"): "generation_attention",
    ("mla", "context_mla"): "mla_context",
    ("mla", "mla_context_module"): "mla_context",
    ("mla", "generation_mla"): "mla_generation",
    ("mla", "mla_generation_module"): "mla_generation",
    ("mla_bmm", "mla_bmm"): "mla_bmm",
    ("moe", "moe"): "moe",
    ("comm", "custom_allreduce"): "allreduce",
    ("comm", "nccl"): "nccl",
    ("comm", "wideep_deepep_ll"): "deepep_ll",
    ("comm", "wideep_deepep_normal"): "deepep_normal",
}
DEEPEP_SMS = 20  # DeepEP's default SMs for the normal kernels (deep_ep/buffer.py, Buffer.num_sms)
MEMBER = re.compile(r"^aiconfigurator_core/systems/data/(?P<gpu>[^/]+)/(?P<op>[^/]+)/(?P<engine>[^/]+)/(?P<version>[^/]+)/"
                    r"(?P<stem>[^/]+)_perf\.parquet$")
# GEMM rows per (dtype, n, k) run over 74 m values (each power step and the step after it); these are kept.
GEMM_M = (1, 2, 3, 4, 6, 8, 12, 16, 32, 48, 64, 96, 128, 160, 192, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 8192, 16384, 32768)
LN_OFFSET, LN_STEP, MISSING = 20.0, 2048.0, 65535
DTYPE_BYTES = {"bfloat16": 2, "half": 2, "float16": 2, "fp8": 1, "int8": 1, "float32": 4}


def perf_members(names: Iterable[str]) -> list[str]:
    """The wheel members the generator may read: `*_perf.parquet` files under `systems/data/`, nothing else."""
    return sorted(n for n in names if MEMBER.match(n))


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch(cache: Path) -> Path:
    """The wheel, downloaded once into the cache."""
    wheels = cache / "wheels"
    wheel = next(iter(sorted(wheels.glob("*.whl"))), None) if wheels.exists() else None
    if wheel is None:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", f"{DIST}=={VERSION}", "-d", str(wheels)],
                       check=True)
        wheel = next(iter(sorted(wheels.glob("*.whl"))))
    return wheel


def encode(seconds: Any) -> Any:
    """uint16 codes of ln(seconds); MISSING where NaN."""
    import numpy as np

    s = np.asarray(seconds, dtype=float)
    code = np.round((np.log(np.where(s > 0, s, np.nan)) + LN_OFFSET) * LN_STEP)
    if np.nanmax(code, initial=0) >= MISSING or np.nanmin(code, initial=0) < 0:
        raise ValueError("a latency outside the encodable range")
    return np.where(np.isfinite(code), code, MISSING).astype(np.uint16)


def grid(df: Any, axes: list[str]) -> tuple[list[Any], Any]:
    """The fastest latency (seconds) at each point of the full product of `axes`' values; NaN where not measured."""
    import numpy as np

    best = df.groupby(axes, sort=True)["latency"].min() / 1e3
    values = [np.array(sorted(df[a].unique()), dtype=float) for a in axes]
    full = np.full(tuple(len(v) for v in values), np.nan)
    idx = tuple(np.searchsorted(values[i], best.index.get_level_values(i).to_numpy(dtype=float)) for i in range(len(axes)))
    full[idx] = best.to_numpy()
    return values, full


class Writer:
    """Collects the tables of one (gpu, engine, release) file."""

    def __init__(self) -> None:
        self.arrays: dict[str, Any] = {}
        self.tables: list[dict[str, Any]] = []

    def add(self, kind: str, variant: dict[str, Any], axes: list[tuple[str, str]], values: list[Any], seconds: Any,
            *, source: str, kernels: list[str], note: str = "") -> None:
        import numpy as np

        key = f"t{len(self.tables)}"
        for i, v in enumerate(values):
            self.arrays[f"{key}.ax{i}"] = np.asarray(v, dtype=np.float64)
        self.arrays[f"{key}.code"] = encode(seconds)
        entry = {"key": key, "kind": kind, "variant": variant, "axes": [{"name": n, "mode": m} for n, m in axes],
                 "points": int(np.isfinite(seconds).sum()), "source": source, "kernels": sorted(kernels)}
        if note:
            entry["note"] = note
        self.tables.append(entry)


def _col(df: Any, name: str, default: Any) -> Any:
    return df[name] if name in df.columns else default


def build_tables(kind: str, df: Any, w: Writer, *, source: str) -> None:
    """Turn one parquet's rows into grids of `kind`."""
    import numpy as np

    if kind == "gemm":
        df = df[df["m"].isin(GEMM_M)]
        for dtype, part in df.groupby("gemm_dtype"):
            values, sec = grid(part, ["m", "n", "k"])
            w.add("gemm", {"dtype": str(dtype)}, [("m", "log"), ("n", "log"), ("k", "log")], values, sec,
                  source=source, kernels=part["kernel_source"].unique().tolist())
    elif kind in ("context_attention", "generation_attention"):
        df = df[(_col(df, "window_size", 0) == 0) & (_col(df, "beam_width", 1) == 1) & (df["attn_dtype"] == "bfloat16")].copy()
        if kind == "generation_attention":  # KV length the step reads: the prompt plus the tokens generated so far
            df["kv_len"] = df["isl"] + df["step"]
            seq = "kv_len"
        else:
            df = df[df["step"] == 0]
            seq = "isl"
        for kv_dtype, part in df.groupby("kv_cache_dtype"):
            axes = [("head_dim", "exact"), ("kv_heads", "exact"), ("heads", "log"), ("batch", "log"), (seq, "log")]
            part = part.rename(columns={"num_key_value_heads": "kv_heads", "num_heads": "heads", "batch_size": "batch"})
            values, sec = grid(part, [a for a, _ in axes])
            w.add(kind, {"kv_dtype": str(kv_dtype)}, axes, values, sec, source=source, kernels=part["kernel_source"].unique().tolist())
    elif kind in ("mla_context", "mla_generation"):
        df = df.copy()
        module = "gemm_type" in df.columns
        if kind == "mla_generation":
            df["kv_len"] = df["isl"] + df["step"]
            seq = "kv_len"
        else:
            seq = "isl"
        df["gemm_type"] = _col(df, "gemm_type", "")
        note = ("the whole MLA attention module of " + ", ".join(df["model"].unique()) + " (projections included)") if module \
            else "the attention core; heads are per GPU"
        for (kv_dtype, gemm), part in df.groupby(["kv_cache_dtype", "gemm_type"]):
            part = part.rename(columns={"num_heads": "heads", "batch_size": "batch"})
            axes = [("heads", "log"), ("batch", "log"), (seq, "log")]
            values, sec = grid(part, [a for a, _ in axes])
            variant = {"kv_dtype": str(kv_dtype), "scope": "module" if module else "core"} | ({"gemm_dtype": str(gemm)} if module else {})
            w.add(kind, variant, axes, values, sec,
                  source=source, kernels=part["kernel_source"].unique().tolist(), note=note)
    elif kind == "mla_bmm":
        for (op, dtype), part in df.groupby(["op_name", "bmm_dtype"]):
            part = part.rename(columns={"num_heads": "heads", "num_tokens": "tokens"})
            values, sec = grid(part, ["heads", "tokens"])
            w.add(kind, {"op": str(op), "dtype": str(dtype)}, [("heads", "log"), ("tokens", "log")], values, sec,
                  source=source, kernels=part["kernel_source"].unique().tolist())
    elif kind == "moe":
        cfg = ["hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size"]
        # Balanced routing only (the step model's expectation); a dtype measured only under skewed routing keeps its
        # mildest skew, named in the variant.
        mild = {d: min(g["distribution"].unique(), key=lambda x: (x != "balanced", x)) for d, g in df.groupby("moe_dtype")}
        df = df[df["distribution"] == df["moe_dtype"].map(mild)]
        for (dtype, dist), part in df.groupby(["moe_dtype", "distribution"]):
            configs = part[cfg].drop_duplicates().sort_values(cfg).to_numpy(dtype=np.int64)
            part = part.copy()
            lookup = {tuple(int(x) for x in row): i for i, row in enumerate(configs)}
            part["config"] = [lookup[tuple(int(x) for x in r)] for r in part[cfg].to_numpy()]
            values, sec = grid(part, ["config", "num_tokens"])
            w.add(kind, {"dtype": str(dtype), "distribution": str(dist)}, [("config", "exact"), ("tokens", "log")], values, sec,
                  source=source, kernels=part["kernel_source"].unique().tolist(),
                  note="rows of the table's .configs array: " + ", ".join(cfg))
            w.arrays[f"{w.tables[-1]['key']}.configs"] = configs
            # The kernels that timed each configuration (a dtype's rows can mix backends: vLLM 0.24's w4a16_mxfp4 holds
            # gpt-oss's own MXFP4 experts and compressed-tensors' Marlin ones), so a lookup can ask for the one an
            # engine runs.
            by_config = part.groupby("config")["kernel_source"].agg(lambda s: ",".join(sorted(set(s))))
            w.arrays[f"{w.tables[-1]['key']}.config_kernels"] = np.array([by_config[i] for i in range(len(configs))], dtype=str)
    elif kind == "allreduce":
        df = df.copy()
        df["message_bytes"] = df["message_size"] * df["allreduce_dtype"].map(DTYPE_BYTES)
        df["graph"] = df["kernel_source"].str.lower().str.contains("graph")
        for (graph, dtype), part in df.groupby(["graph", "allreduce_dtype"]):
            values, sec = grid(part, ["num_gpus", "message_bytes"])
            w.add(kind, {"backend": "graph" if graph else "eager", "dtype": str(dtype)}, [("gpus", "exact"), ("message_bytes", "log")],
                  values, sec, source=source, kernels=part["kernel_source"].unique().tolist())
    elif kind in ("deepep_ll", "deepep_normal"):
        _deepep(kind, df, w, source=source)
    elif kind == "nccl":
        df = df[df["nccl_dtype"] == "half"].copy()
        df["message_bytes"] = df["message_size"] * 2
        for op, part in df.groupby("op_name"):
            # Rows repeat; the median of the repeats is less noisy than the fastest.
            med = part.groupby(["num_gpus", "message_bytes"], as_index=False)["latency"].median()
            values, sec = grid(med, ["num_gpus", "message_bytes"])
            w.add(kind, {"op": str(op), "dtype": "half"}, [("gpus", "exact"), ("message_bytes", "log")], values, sec,
                  source=source, kernels=part["kernel_source"].unique().tolist())


def _deepep(kind: str, df: Any, w: Writer, *, source: str) -> None:
    """One MoE layer's DeepEP dispatch plus combine (µs in the parquet) on a (top-k, experts; hidden, tokens) grid."""
    df = df.copy()
    if kind == "deepep_ll":
        df["latency"] = (df["dispatch_avg_t_us"] + df["combine_avg_t_us"]) / 1e3
    else:
        df = df[(df["dispatch_sms"] == DEEPEP_SMS) & (df["combine_sms"] == DEEPEP_SMS)]
        df["latency"] = (df["dispatch_transmit_us"] + df["dispatch_notify_us"] + df["combine_transmit_us"] + df["combine_notify_us"]) / 1e3
    df = df.rename(columns={"num_topk": "topk", "num_experts": "experts", "hidden_size": "hidden", "num_token": "tokens"})
    axes = [("topk", "exact"), ("experts", "exact"), ("hidden", "log"), ("tokens", "log")]
    values, sec = grid(df, [a for a, _ in axes])
    w.add(kind, {"mode": "low_latency" if kind == "deepep_ll" else "normal"}, axes, values, sec, source=source,
          kernels=df["kernel_source"].unique().tolist(),
          note="one node; dispatch + combine of one MoE layer" + ("" if kind == "deepep_ll" else f", {DEEPEP_SMS} SMs"))


def generate(wheel: Path, out: Path) -> list[dict[str, Any]]:
    import numpy as np
    import pandas as pd

    wheel_sha = sha256_bytes(wheel.read_bytes())
    written: list[dict[str, Any]] = []
    with zipfile.ZipFile(wheel) as zf:
        groups: dict[tuple[str, str, str], list[tuple[str, str]]] = defaultdict(list)
        for name in perf_members(zf.namelist()):
            m = MEMBER.match(name)
            assert m is not None
            kind = FILES.get((m["op"], m["stem"]))
            if kind is None or m["gpu"] not in GPUS or m["engine"] not in ENGINES:
                continue
            if (kind == "nccl") != (m["engine"] == "nccl"):
                continue
            groups[(GPUS[m["gpu"]], m["engine"], m["version"])].append((name, kind))
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("*.npz"):
            old.unlink()
        for (gpu, engine, version), members in sorted(groups.items()):
            w = Writer()
            sources: dict[str, str] = {}
            for name, kind in sorted(members):
                data = zf.read(name)
                rel = name.removeprefix("aiconfigurator_core/")
                sources[rel] = sha256_bytes(data)
                df = pd.read_parquet(io.BytesIO(data))
                build_tables(kind, df, w, source=rel)
            if not w.tables:
                continue
            meta = {"gpu": gpu, "engine": engine, "version": version, "generated_by": "tools/gen_kernel_tables.py",
                    "source": {"distribution": DIST, "version": VERSION, "wheel": wheel.name, "wheel_sha256": wheel_sha,
                               "license": "Apache-2.0", "files_sha256": dict(sorted(sources.items()))},
                    "encoding": {"code": "uint16 round((ln(seconds) + offset) * step)", "offset": LN_OFFSET, "step": LN_STEP,
                                 "missing": MISSING},
                    "tables": w.tables}
            path = out / f"{gpu}-{engine}-{version}.npz"
            np.savez_compressed(path, meta=np.array(json.dumps(meta, sort_keys=True)), **w.arrays)
            written.append({"file": path.name, "gpu": gpu, "engine": engine, "version": version,
                            "kinds": sorted({t["kind"] for t in w.tables}), "bytes": path.stat().st_size})
            print(f"{path.relative_to(ROOT)}: {len(w.tables)} tables, {path.stat().st_size // 1024} KiB")
    index = {"generated_by": "tools/gen_kernel_tables.py", "source": {"distribution": DIST, "version": VERSION, "wheel": wheel.name,
             "wheel_sha256": wheel_sha, "license": "Apache-2.0"}, "files": written}
    (out / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "servingtopology" / "kernel-tables"))
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    written = generate(fetch(Path(args.cache)), Path(args.out))
    print(f"{len(written)} files, {sum(f['bytes'] for f in written) // 1024} KiB")


if __name__ == "__main__":
    main()
