"""Runs an engine release's own defaulting code for knobs a command line leaves out, on GPUs described to it, and
prints what it chose as JSON: vLLM's API-server max_num_batched_tokens and max_num_seqs.

Run by tests/conformance/test_engine_defaults.py with the python of the engine environment
(tools/engine_caps/conformance_env.sh). It imports the release's EngineArgs and calls the code that chooses the batch
defaults (`get_batch_defaults` since it was split out, `_set_default_args` in 0.11); nothing here restates a rule.
Only the device is stood in for: a platform that reports the GPU's total memory and driver name. Not part of the
servingtopology package.

    python dump_defaults.py vllm [SRC] < gpus.jsonl   # {"memory_bytes": int, "name": str} per line; one result per line

SRC is an unpacked wheel to put first on sys.path (vLLM releases other than the installed one).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from types import SimpleNamespace
from typing import Any


def _platform(memory_bytes: int, name: str) -> Any:
    """A CUDA-like platform for one GPU, built on vLLM's CPU platform (the only one that loads without a GPU):
    not a CPU or TPU, with the given total memory and driver name, and no compute capability (no catalog GPU is a
    GB10, the one capability 0.33's rule checks)."""
    from vllm.platforms.cpu import CpuPlatform

    class OneGpu(CpuPlatform):  # type: ignore[misc,valid-type]
        def is_cpu(self) -> bool:
            return False

        def is_tpu(self) -> bool:
            return False

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return memory_bytes

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return name

        @classmethod
        def is_device_capability(cls, capability: Any, device_id: int = 0) -> bool:
            return False

    return OneGpu()


def vllm_defaults(memory_bytes: int, name: str) -> dict[str, int]:
    """The API server's batch defaults the imported vLLM release chooses on this GPU (TP1, chunked prefill on)."""
    import vllm.engine.arg_utils as arg_utils
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    arg_utils.current_platform = _platform(memory_bytes, name)  # type: ignore[attr-defined]
    server = UsageContext.OPENAI_API_SERVER
    if hasattr(EngineArgs, "get_batch_defaults"):
        tokens, seqs = EngineArgs.get_batch_defaults(1)
        return {"max_num_batched_tokens": tokens[server], "max_num_seqs": seqs[server]}
    # 0.11: the rule sits in _set_default_args, which also reads the model config's runner type (a generative model:
    # chunked prefill on) and, with chunked prefill off, its max_model_len.
    args = EngineArgs(model="m")
    with contextlib.redirect_stdout(io.StringIO()):
        args._set_default_args(server, SimpleNamespace(runner_type="generate", max_model_len=131072))
    return {"max_num_batched_tokens": args.max_num_batched_tokens, "max_num_seqs": args.max_num_seqs}


def main() -> None:
    kind = sys.argv[1]
    if len(sys.argv) > 2:
        sys.path.insert(0, sys.argv[2])
    assert kind == "vllm", f"no defaults dump for {kind}"
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    for line in sys.stdin:
        gpu = json.loads(line)
        print(json.dumps(vllm_defaults(int(gpu["memory_bytes"]), str(gpu["name"]))), flush=True)


if __name__ == "__main__":
    main()
