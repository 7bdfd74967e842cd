"""Conformance: the one home of the engines' defaults (planner.engines.defaults) chooses what each covered release's own
code chooses, on every catalog GPU.

vLLM: the API server's max_num_batched_tokens and max_num_seqs for a command line that leaves them out, computed by the
release's EngineArgs (`get_batch_defaults`, in 0.11 `_set_default_args`) on a platform that reports the GPU's memory
and driver name, run by tools/engine_caps/dump_defaults.py in the environment tools/engine_caps/conformance_env.sh
caches (one process per release, about 6 CPU s each). The emulator, `simulate --replay` and the benchmark cases read
the home, so a rule a release changes (0.28's tier at 160 GiB, the A100 left out by name) fails here first.
SGLang: the server's --chunked-prefill-size for each catalog GPU, by its own handle_gpu_memory_settings on a ServerArgs
(the memory capacity stood in), one process, about 5 CPU s.
Marked `conformance`; `make conformance` (part of `make test`) runs it.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from servingtopology.planner.engines.caps import available_versions
from servingtopology.planner.engines.defaults import max_running, token_budget
from servingtopology.planner.hardware import GIB, gpu_catalog
from servingtopology.planner.layout import Engine
from tests.conformance.test_engine_parsers import CACHE, ENGINE_PY, ROOT, _installed_vllm

pytestmark = pytest.mark.conformance

DUMPER = ROOT / "tools" / "engine_caps" / "dump_defaults.py"


def own_defaults(kind: str, version: str) -> dict[str, dict[str, int]]:
    """Catalog GPU id -> the knobs release `version` of `kind` chooses by its own code."""
    if not ENGINE_PY.exists() or not (CACHE / ".stopo-stamp").exists():
        pytest.fail("the conformance environment is missing: run `make conformance-env` (tools/engine_caps/conformance_env.sh)")
    gpus = list(gpu_catalog().values())
    cmd = [str(ENGINE_PY), str(DUMPER), kind]
    if kind == "vllm" and version != _installed_vllm():
        cmd.append(str(CACHE / "src" / f"vllm-{version}"))
    lines = "".join(json.dumps({"memory_bytes": int(g.memory_gib * GIB), "name": g.name}) + "\n" for g in gpus)
    proc = subprocess.run(cmd, input=lines, capture_output=True, text=True, cwd="/", timeout=600,
                          env={**os.environ, "PYTHONPATH": str(CACHE / "site")})
    results = [json.loads(r) for r in proc.stdout.splitlines() if r.startswith("{")]
    assert len(results) == len(gpus), f"{kind} {version}: the defaults dump died: {proc.stderr[-2000:]}"
    return {g.id: r for g, r in zip(gpus, results, strict=True)}


@pytest.mark.parametrize("version", available_versions("vllm"))
def test_vllm_batch_defaults_equal_each_covered_releases_own_choice_on_every_catalog_gpu(version: str) -> None:
    real = {gid: (r["max_num_batched_tokens"], r["max_num_seqs"]) for gid, r in own_defaults("vllm", version).items()}
    ours = {g.id: (int(token_budget(Engine.VLLM, g, release=version)), max_running(Engine.VLLM, g, release=version))
            for g in gpu_catalog().values()}
    wrong = {gid: f"vLLM {version} chooses {real[gid]}, the home says {ours[gid]}" for gid in real if real[gid] != ours[gid]}
    assert not wrong, wrong
    # The comparison can fail: the catalog spans every tier of the rule (an A100-80GB, a 70-160 GiB GPU, one above).
    assert {real["a100_sxm"], real["h100_sxm"], real["b200_sxm"]} >= {(2048, 256), (8192, 1024)}


@pytest.mark.parametrize("version", available_versions("sglang"))
def test_sglang_chunked_prefill_default_equals_the_releases_own_choice_on_every_catalog_gpu(version: str) -> None:
    # The conformance environment holds one SGLang, the newest covered release (pyproject's `conformance` extra).
    assert version == available_versions("sglang")[-1]
    real = {gid: r["chunked_prefill_size"] for gid, r in own_defaults("sglang", version).items()}
    ours = {g.id: int(token_budget(Engine.SGLANG, g)) for g in gpu_catalog().values()}
    wrong = {gid: f"SGLang {version} chooses {real[gid]}, the home says {ours[gid]}" for gid in real if real[gid] != ours[gid]}
    assert not wrong, wrong
    assert {real["rtx_4090"], real["l40s"], real["h100_sxm"], real["b200_sxm"]} == {4096, 8192, 16384}
