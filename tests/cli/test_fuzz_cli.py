"""A seeded fuzzer of the CLI's inputs (issues #17, #25): `plan` specs, `simulate` specs and traces, `simulate --replay`
run folders (meta.json, config.json, requests.jsonl: 520 of them), `validate` CSVs (their counts too).

Each case starts from a valid input and applies one to three mutations drawn from a seeded generator: a
field set to a hostile value (negative, zero, huge, NaN, inf, wrong type, a 131,072-character string, deep
nesting), removed, or joined by an unknown key; some cases only vary valid values so that the planner and
the simulator run too. Checked on every case: no traceback and no internal error (exit 3); an exit 2 names
a field the case touched (its camelCase dotted path, a parent of it, or that path in the message).

Budget (2 loaded cores): `plan` runs with the narrow preset, at most 16 GPUs and --no-simulate; `simulate`
with at most 60 requests. The figures (cases, CPU seconds, rejections by field) are printed with `-s`.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import random
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from servingtopology.cli.main import main

from .test_cli_hardening import FIELDS, GOOD

SEED = 17
PLAN_CASES = 520
SIMULATE_CASES = 48
VALIDATE_CASES = 72

BASE: dict[str, Any] = {
    "model": "meta-llama/Llama-2-7b-hf", "precision": "bf16", "kvCacheDtype": "auto", "objective": "goodput-per-gpu",
    "engine": {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "extraArgs": ["--disable-log-requests"]},
    "hardware": {"gpu": "a100_sxm", "gpusPerNode": 8, "maxGPUs": 8, "nvlinkGBps": 300, "nicGbps": 200, "allowCrossNodeTP": False},
    "workload": {"arrivalRate": 4, "inputTokens": 512, "outputTokens": 128, "prefixShare": 0.1, "arrivalCV": 1.0},
    "slo": {"ttftMs": {"p95": 500}, "tpotMs": {"p95": 50}},
    "search": {"preset": "narrow", "layouts": ["replicas"], "tp": [1, 2], "pp": [1], "dp": [1], "maxNumSeqs": [128, 256],
               "maxNumBatchedTokens": [4096], "memoryFraction": [0.9], "kvCacheDtypes": ["auto"], "topK": 4},
    "simulation": {"requests": 40, "seed": 1, "warmupRequests": 5},
}
LAYOUT: dict[str, Any] = {"kind": "replicas", "replicas": 1, "tp": 1, "pp": 1, "dp": 1, "ep": False,
                          "engineArgs": {"maxNumSeqs": 64, "maxNumBatchedTokens": 2048, "memoryFraction": 0.9, "blockSize": 16,
                                         "enablePrefixCaching": True}}
PD_LAYOUT: dict[str, Any] = {"kind": "pd", "prefill": {"count": 1, "tp": 1, "pp": 1, "dp": 1},
                             "decode": {"count": 1, "tp": 2, "engineArgs": {"maxNumSeqs": 128}}}
DIST = {"distribution": "lognormal", "mean": 400, "sigma": 0.6}
EMPIRICAL = {"distribution": "empirical", "values": [100, 200, 400]}

# Valid variations (the planner runs on them) per field path.
VALID: dict[str, list[Any]] = {
    "hardware.maxGPUs": [1, 2, 4, 8, 16], "hardware.gpu": ["a100_sxm", "h100_sxm", "H100", "h200_sxm"],
    "workload.arrivalRate": [0.5, 2, 8, 30], "workload.inputTokens": [64, 2048, DIST, EMPIRICAL], "workload.outputTokens": [16, 512],
    "slo.ttftMs": [{"p90": 300}, {"p99": 2000}, {"p99.9": 5000}], "slo.tpotMs": [{"p50": 20}, {"p95": 80}],
    "model": ["meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-30B-A3B", "meta-llama/Llama-2-7b-hf"],
    "search.tp": [[1], [1, 2, 4]], "search.maxNumSeqs": [[64], [32, 512]], "precision": ["bf16", "fp8"],
    "simulation.seed": [0, 7, 2**32 - 1], "simulation.requests": [10, 60], "objective": ["goodput-per-gpu", "goodput"],
}
HOSTILE: list[Any] = [-1, 0, 1, 3, 17, 2**31, 10**30, -1e308, 1e308, math.nan, math.inf, -math.inf, 0.5, -0.0, "", "abc", "p95",
                      "∞", None, [], {}, [1] * 40, True, "x" * 5000, {"a": {"b": {"c": [1, [2, [3]]]}}}, "x" * 131_072,
                      [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]


def _leaves(node: Any, prefix: str = "") -> list[str]:
    if not isinstance(node, dict):
        return [prefix]
    out = [prefix] if prefix else []
    for k, v in node.items():
        out += _leaves(v, f"{prefix}.{k}" if prefix else k)
    return out


def _set(spec: dict[str, Any], path: str, value: Any, *, delete: bool = False) -> None:
    node = spec
    keys = path.split(".")
    for k in keys[:-1]:
        if not isinstance(node.get(k), dict):
            node[k] = {}
        node = node[k]
    if delete:
        node.pop(keys[-1], None)
    else:
        node[keys[-1]] = value


def _touches(path: str, field: str, message: str) -> bool:
    """Whether an error on `field` with `message` names the mutated `path`."""
    return (field == path or path.startswith(field + ".") or field.startswith((path + ".", path + " ")) or path in message
            or path.rsplit(".", 1)[-1] in message)


def _get(spec: Any, path: str) -> Any:
    for k in path.split("."):
        if not isinstance(spec, dict) or k not in spec:
            return _MISSING
        spec = spec[k]
    return spec


_MISSING = object()


def must_refuse(spec: dict[str, Any], touched: list[str]) -> list[str]:
    """Mutated paths that still hold a value no field admits: a non-finite number, a number of magnitude >= 1e12
    (every number has a maximum below it), a string over 4,096 characters (every string has a shorter length)."""
    out = []
    for path in touched:
        v = _get(spec, path)
        number = isinstance(v, int | float) and not isinstance(v, bool)
        if (number and (not math.isfinite(v) or abs(v) >= 1e12)) or (isinstance(v, str) and len(v) > 4096):
            out.append(path)
    return out


def gen_spec(rng: random.Random, *, simulate: bool = False) -> tuple[dict[str, Any], list[str]]:
    spec = json.loads(json.dumps(BASE))
    if simulate or rng.random() < 0.4:
        spec["layout"] = json.loads(json.dumps(PD_LAYOUT if rng.random() < 0.25 else LAYOUT))
    touched: list[str] = []
    if rng.random() < 0.2:  # valid variations only: the planner and simulator run
        for path in rng.sample(sorted(VALID), 2):
            _set(spec, path, rng.choice(VALID[path]))
        return spec, touched
    for _ in range(rng.choice((1, 1, 2, 3))):
        path = rng.choice(_leaves(spec))
        roll = rng.random()
        if roll < 0.1:
            _set(spec, path, None, delete=True)
        elif roll < 0.18:
            path = f"{path.rsplit('.', 1)[0]}.bogusField" if "." in path else "bogusField"
            _set(spec, path, 1)
        else:
            _set(spec, path, rng.choice(HOSTILE))
        touched.append(path)
    return spec, touched


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _check(code: int, out: str, err: str, touched: list[str], rejections: Counter[str], what: str) -> None:
    assert "Traceback" not in out + err and code != 3, f"{what}: exit {code}\n{err[-2000:]}"
    assert code in (0, 1, 2), f"{what}: exit {code}"
    if code != 2:
        return
    body = json.loads(out.splitlines()[0]) if out.startswith("{") else None
    fields = [(f["field"], f["message"]) for f in body["fields"]] if body else []
    assert fields, f"{what}: exit 2 without the JSON error naming fields\n{err}"
    for f, _ in fields:
        rejections[f] += 1
    if touched:  # a mutation of these paths: some error names one of them
        assert any(_touches(p, f, m) for p in touched for f, m in fields), f"{what}: {touched} not named in {fields}"
    else:
        assert all(f for f, _ in fields)


def _figures(name: str, cases: int, cpu_s: float, codes: Counter[int], rejections: Counter[str]) -> None:
    top = ", ".join(f"{f} {n}" for f, n in rejections.most_common(12))
    print(f"\n[fuzz {name}] {cases} cases, {cpu_s:.1f} CPU s, exits {dict(sorted(codes.items()))}, "
          f"{sum(rejections.values())} rejected fields over {len(rejections)} paths; top: {top}")


def test_fuzz_plan_specs(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    rejections: Counter[str] = Counter()
    codes: Counter[int] = Counter()
    refused_must = 0
    t0 = time.process_time()
    for i in range(PLAN_CASES):
        spec, touched = gen_spec(rng)
        if not touched:
            spec["hardware"]["maxGPUs"] = min(spec["hardware"]["maxGPUs"], 16)
        path = tmp_path / f"plan{i}.yaml"
        text = yaml.safe_dump(spec, allow_unicode=True).encode()
        if i % 40 == 7:  # the file itself: not UTF-8, or nested 5,000 deep
            text, touched = (text.replace(b"model:", b"model: \xff\xfe #", 1), ["spec"]) if i % 80 == 7 else (
                text + b"deep: " + b"[" * 5000 + b"]" * 5000 + b"\n", ["deep"])
        path.write_bytes(text)
        code, out, err = _cli("plan", str(path), "--no-simulate", "--json")
        codes[code] += 1
        _check(code, out, err, touched, rejections, f"plan case {i} {touched}")
        bad = must_refuse(spec, touched) if touched not in (["spec"], ["deep"]) else touched
        assert code == 2 or not bad, f"plan case {i}: {bad} admitted (exit {code})"
        refused_must += bool(bad)
    cpu = time.process_time() - t0
    _figures("plan", PLAN_CASES, cpu, codes, rejections)
    print(f"[fuzz plan] {refused_must} cases held a value no field admits (non-finite, >= 1e12, a string over 4,096): all exited 2")
    assert codes[0] >= 50 and codes[2] >= PLAN_CASES // 2  # both paths exercised


def _trace(rng: random.Random, tmp_path: Path, i: int) -> Path:
    rows = [{"arrival_s": t * 0.1, "input_tokens": 200, "output_tokens": 20} for t in range(rng.randint(1, 30))]
    field = rng.choice(["arrival_s", "input_tokens", "output_tokens"])
    if rng.random() < 0.8:
        rows[rng.randrange(len(rows))][field] = rng.choice([-1, 0, 10**12, 1e400, "nan", "abc", None, [1], {"a": 1}])
    if rng.random() < 0.5:
        path = tmp_path / f"trace{i}.csv"
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, ["arrival_s", "input_tokens", "output_tokens"])
            w.writeheader()
            w.writerows(rows)
    else:
        path = tmp_path / f"trace{i}.jsonl"
        path.write_text("\n".join(json.dumps(r) if not isinstance(r.get(field), float) else json.dumps(r).replace("Infinity", "1e400")
                                  for r in rows))
    if rng.random() < 0.15:
        path.write_bytes(path.read_bytes().replace(b"200", b"2\xff0", 1))
    if rng.random() < 0.1:
        path.write_text(path.read_text(errors="replace") + "\n[1, 2]\n")
    return path


def test_fuzz_simulate(tmp_path: Path) -> None:
    rng = random.Random(SEED + 1)
    rejections: Counter[str] = Counter()
    codes: Counter[int] = Counter()
    t0 = time.process_time()
    for i in range(SIMULATE_CASES):
        spec, touched = gen_spec(rng, simulate=True)
        sim = spec.setdefault("simulation", {})
        if isinstance(sim, dict) and isinstance(sim.get("requests"), int) and sim["requests"] > 60:
            sim["requests"] = 60  # the bound is tested elsewhere; here the simulator runs briefly
        if isinstance(spec.get("hardware"), dict) and not touched:
            spec["hardware"]["maxGPUs"] = 16
        path = tmp_path / f"sim{i}.yaml"
        path.write_text(yaml.safe_dump(spec, allow_unicode=True))
        argv = ["simulate", str(path), "--json"]
        if i % 3 == 0:
            argv += ["--trace", str(_trace(rng, tmp_path, i))]
            touched = [*touched, "trace"]
        if i % 8 == 5 and isinstance(sim, dict):
            sim["seed"] = -1
            touched = [*touched, "simulation.seed"]
            path.write_text(yaml.safe_dump(spec, allow_unicode=True))
        code, out, err = _cli(*argv)
        codes[code] += 1
        _check(code, out, err, touched, rejections, f"simulate case {i} {touched}")
        bad = must_refuse(spec, touched) + (["simulation.seed"] if _get(spec, "simulation.seed") == -1 else [])
        assert code == 2 or not bad, f"simulate case {i}: {bad} admitted (exit {code})"
    _figures("simulate", SIMULATE_CASES, time.process_time() - t0, codes, rejections)
    assert codes[0] >= 3 and codes[2] >= 10  # the simulator ran on the valid ones


# The calibration CSV's columns and one good row: the same as the hardening tests'.
VFIELDS, VROW = FIELDS, GOOD
VHOSTILE = ["inf", "-inf", "nan", "1e400", "1e300", "-1", "0", "", "abc", "x" * 131_072, "x" * 131_073, "4.5", "disagg", "2\xff"]


def test_fuzz_validate(tmp_path: Path) -> None:
    rng = random.Random(SEED + 2)
    codes: Counter[int] = Counter()
    reasons: Counter[str] = Counter()
    t0 = time.process_time()
    for i in range(VALIDATE_CASES):
        rows = [dict(VROW, id=f"r{j}") for j in range(rng.randint(0, 4))]
        for _ in range(rng.randint(0, 3)) if rows else ():
            rows[rng.randrange(len(rows))][rng.choice(VFIELDS)] = rng.choice(VHOSTILE)
        path = tmp_path / f"rows{i}.csv"
        buf = io.StringIO()
        w = csv.DictWriter(buf, VFIELDS)
        w.writeheader()
        w.writerows(rows)
        raw = buf.getvalue().encode("utf-8", errors="surrogateescape").replace("\xff".encode(), b"\xff")
        if rng.random() < 0.1:
            raw += b"a,b\n"  # a short row
        path.write_bytes(raw)
        code, out, err = _cli("validate", "--measurements", str(path), "--json")
        codes[code] += 1
        assert "Traceback" not in out + err and code in (0, 2), f"validate case {i}: exit {code}\n{err[-2000:]}"
        if code == 2:
            assert "--measurements: no row" in err
        else:
            summary = json.loads(out)
            assert summary["rows"] >= 1
            reasons.update(summary["skipped"]["by_reason"])
    _figures("validate", VALIDATE_CASES, time.process_time() - t0, codes, reasons)
    assert codes[0] >= 10 and codes[2] >= 10


@pytest.mark.parametrize("i", range(3))
def test_the_generator_is_seeded(i: int) -> None:
    a, b = random.Random(SEED + i), random.Random(SEED + i)
    assert [gen_spec(a) for _ in range(20)] == [gen_spec(b) for _ in range(20)]


# ---- simulate --replay DIR: generated run folders (meta.json, config.json, requests.jsonl) ----
REPLAY_CASES = 520
REPLAY_FILES = ("meta.json", "config.json", "requests.jsonl")
# The counts load_replay reads and their bounds: a mutated value outside them must be exit 2.
REPLAY_COUNTS = {"engine_kwargs.max_num_seqs": (1, 65_536), "engine_kwargs.max_num_batched_tokens": (1, 2_097_152),
                 "engine_kwargs.tensor_parallel_size": (1, 64), "engine_kwargs.pipeline_parallel_size": (1, 64),
                 "engine_kwargs.data_parallel_size": (1, 64), "kv_cache.block_size": (1, 256), "kv_cache.num_gpu_blocks": (1, 2**24)}
REPLAY_EXTRA = {"engine_kwargs.pipeline_parallel_size": 1, "engine_kwargs.data_parallel_size": 1, "engine_kwargs.enable_expert_parallel": False,
                "engine_kwargs.quantization": "", "engine_kwargs.block_size": 16, "engine_kwargs.gpu_memory_utilization": 0.9}


def _replay_case(rng: random.Random, root: Path, i: int) -> tuple[Path, list[str], dict[str, Any]]:
    """A run folder with one to three mutations, and the touched paths as `<file> <dotted path>`."""
    from .test_replay_input import CLUSTER, META, request_rows

    meta, cluster, rows = json.loads(json.dumps(META)), json.loads(json.dumps(CLUSTER)), request_rows(rng.randint(1, 10))
    for path, value in REPLAY_EXTRA.items():
        if rng.random() < 0.3:
            _set(meta, path, value)
    touched: list[str] = []
    for _ in range(rng.choice((0, 1, 1, 2, 3))):
        which = rng.choice(REPLAY_FILES)
        roll = rng.random()
        if which == "meta.json":
            path = rng.choice([*_leaves(meta), *REPLAY_COUNTS])
            _set(meta, path, None, delete=True) if roll < 0.1 else _set(meta, path, rng.choice(HOSTILE))
        elif which == "config.json":
            path = rng.choice(["nodes", "nodes.0", "nodes.0.instances", "nodes.0.instances.0", "nodes.0.instances.0.hardware"])
            value = rng.choice(HOSTILE)
            node: Any = cluster
            keys = path.split(".")
            for k in keys[:-1]:
                node = node[int(k)] if isinstance(node, list) and k.isdigit() and int(k) < len(node) else None
                if node is None:
                    break
            if isinstance(node, list) and keys[-1].isdigit() and int(keys[-1]) < len(node):
                node[int(keys[-1])] = value
            elif isinstance(node, dict):
                node[keys[-1]] = value
        else:
            path = rng.choice(["input_toks", "output_toks", "queued_ts", "first_token_ts", "last_token_ts"])
            row = rng.randrange(len(rows))
            rows[row] = {**rows[row], path: rng.choice(HOSTILE)} if roll > 0.1 else {k: v for k, v in rows[row].items() if k != path}
        touched.append(f"{which} {path}")
    folder = root / f"run{i}"
    folder.mkdir()
    texts = {"meta.json": json.dumps(meta).encode(), "config.json": json.dumps(cluster).encode(),
             "requests.jsonl": "\n".join(json.dumps(r) for r in rows).encode()}
    if i % 25 == 3:   # the files themselves: missing, not UTF-8, truncated, nested 5,000 deep, not an object
        which = REPLAY_FILES[(i // 25) % 3]
        texts[which] = [b"", b"\xff\xfe{", texts[which][: len(texts[which]) // 2], b"[" * 5000 + b"]" * 5000, b"42"][(i // 75) % 5]
        touched.append(f"{which} file")
        if i % 150 == 3:
            del texts[which]
    for name, data in texts.items():
        (folder / name).write_bytes(data)
    return folder, touched, meta


def _out_of_bounds(meta: dict[str, Any], touched: list[str]) -> list[str]:
    out = []
    for t in touched:
        which, _, path = t.partition(" ")
        if which != "meta.json" or path not in REPLAY_COUNTS:
            continue
        v, (low, high) = _get(meta, path), REPLAY_COUNTS[path]
        if v is _MISSING or v is None:
            continue
        whole = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and float(v).is_integer()
        if not whole or not low <= v <= high:
            out.append(path)
    return out


def test_fuzz_replay(tmp_path: Path) -> None:
    rng = random.Random(SEED + 3)
    codes: Counter[int] = Counter()
    rejections: Counter[str] = Counter()
    t0 = time.process_time()
    for i in range(REPLAY_CASES):
        folder, touched, meta = _replay_case(rng, tmp_path, i)
        code, out, err = _cli("simulate", "--replay", str(folder), "--json")
        codes[code] += 1
        what = f"replay case {i} {touched}"
        assert "Traceback" not in out + err and code in (0, 2), f"{what}: exit {code}\n{err[-2000:]}"
        bad = _out_of_bounds(meta, touched)
        assert code == 2 or not bad, f"{what}: {bad} admitted"
        if code == 2:
            fields = [f["field"] for f in json.loads(out.splitlines()[0])["fields"]]
            rejections.update(fields)
            # the file is named: in the field, or (a model or GPU that cannot be told) the folder-wide field
            assert all(f.startswith((*REPLAY_FILES, "replay")) for f in fields), f"{what}: {fields}"
            if bad:   # the first error met names one of the mutations (a file read earlier may fail first)
                assert any(f.startswith(t) or t.startswith(f) for t in touched for f in fields), f"{what}: {touched} not named in {fields}"
    _figures("replay", REPLAY_CASES, time.process_time() - t0, codes, rejections)
    assert codes[0] >= 50 and codes[2] >= 150   # both paths exercised


def test_fuzz_validate_counts(tmp_path: Path) -> None:
    """validate's CSVs with the counts it reads mutated (silicon_concurrency, sizes, lengths): exit 0 or 2, never 3,
    and a count outside its bound is never predicted."""
    rng = random.Random(SEED + 4)
    codes: Counter[int] = Counter()
    counts = ["silicon_concurrency=0", "silicon_concurrency=100001", "silicon_concurrency=" + "9" * 60, "silicon_concurrency=-3",
              "silicon_concurrency=64", "silicon_concurrency=1e8", "silicon_concurrency=", "x"]
    for i in range(120):
        row = dict(VROW, id=f"r{i}")
        row["silicon_data_source"] = rng.choice(counts)
        for _ in range(rng.randint(0, 2)):
            row[rng.choice(["batch_size", "tp_size", "pp_size", "isl", "osl", "attention_dp_size"])] = rng.choice(
                ["0", "-1", "1e8", "10000001", "3", "abc", ""])
        path = tmp_path / f"counts{i}.csv"
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, VFIELDS)
            w.writeheader()
            w.writerow(row)
        code, out, err = _cli("validate", "--measurements", str(path), "--json")
        codes[code] += 1
        assert "Traceback" not in out + err and code in (0, 2), f"validate counts case {i}: exit {code}\n{err[-2000:]}"
        m = re.search(r"silicon_concurrency=(\d+)", row["silicon_data_source"])
        if m and not 1 <= int(m.group(1)) <= 100_000:
            assert code == 2 and "malformed row" in err, f"validate counts case {i}: {row['silicon_data_source']} admitted"
    assert codes[0] >= 10 and codes[2] >= 10
