"""Runs an engine release's own defaulting code for knobs a command line leaves out, on GPUs described to it, and
prints what it chose as JSON: vLLM's API-server max_num_batched_tokens and max_num_seqs; SGLang's chunked_prefill_size.

Run by tests/conformance/test_engine_defaults.py with the python of the engine environment
(tools/engine_caps/conformance_env.sh). It imports the release's EngineArgs and calls the code that chooses the batch
defaults (`get_batch_defaults` since it was split out, `_set_default_args` in 0.11), or SGLang's ServerArgs and its
`handle_gpu_memory_settings`; nothing here restates a rule. Only the device is stood in for: a platform that reports
the GPU's total memory and driver name (SGLang: its memory capacity). Not part of the servingtopology package.

    python dump_defaults.py vllm [SRC] < gpus.jsonl   # {"memory_bytes": int, "name": str} per line; one result per line
    python dump_defaults.py sglang < gpus.jsonl

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


def sglang_defaults(memory_bytes: int) -> dict[str, int]:
    """The --chunked-prefill-size SGLang's server chooses on a GPU of this memory (TP1), by its own
    handle_gpu_memory_settings. The memory fraction and the prefill CUDA-graph size are given, so that the step reads no
    model config (whose import needs torchvision, which the environment leaves out); neither feeds the chunk's rule."""
    import sglang.srt.arg_groups.memory_hook as memory_hook
    from sglang.srt.arg_groups.cuda_graph_hook import parse_cuda_graph_config
    from sglang.srt.arg_groups.overrides import resolution_result
    from sglang.srt.server_args import ServerArgs

    memory_hook.get_device_memory_capacity = lambda device=None: memory_bytes / 2**20  # MiB, as SGLang's helper reports it
    args = ServerArgs(model_path="m", tp_size=1, skip_tokenizer_init=True, device="cuda", mem_fraction_static=0.8,
                      cuda_graph_max_bs_prefill=4096)
    parse_cuda_graph_config(args)
    memory_hook.handle_gpu_memory_settings(args)
    return {"chunked_prefill_size": int(resolution_result(args, "chunked_prefill_size"))}


def main() -> None:
    kind = sys.argv[1]
    if len(sys.argv) > 2:
        sys.path.insert(0, sys.argv[2])
    assert kind in ("vllm", "sglang"), f"no defaults dump for {kind}"
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    for line in sys.stdin:
        gpu = json.loads(line)
        with contextlib.redirect_stdout(io.StringIO()):
            result = (vllm_defaults(int(gpu["memory_bytes"]), str(gpu["name"])) if kind == "vllm"
                      else sglang_defaults(int(gpu["memory_bytes"])))
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
