"""Drives vLLM's own V1 scheduler (`vllm.v1.core.sched.scheduler.Scheduler` with its real KVCacheManager) through
scripted scenarios with no model: each step it schedules, then answers as a model runner would, one sampled token
for every request whose scheduled tokens reach the end of its sequence (a finished prefill or a decode).

Run by tests/conformance/test_scheduler_decisions.py with the python of the vLLM environment (`make engine-env`);
not part of the servingtopology package. One scenario per JSON line on stdin, one JSON result per line on stdout:

    {"num_blocks": 40, "block_size": 16, "max_num_seqs": 8, "max_num_batched_tokens": 256, "prefix_caching": true,
     "requests": [{"arrival_step": 0, "prompt": 300, "output": 20, "key": 0, "shared": 64}, ...]}
 -> {"ok": true, "steps": [{"r0": 256}, ...], "requests": [{"first_token_step": 1, "finish_step": 20,
     "preemptions": 0, "hit_tokens": 0}, ...]}

`hit_tokens` is what the request found cached when first scheduled (its computed tokens before its first chunk).

Steps are numbered from 0; a request arriving at step k is added before step k is scheduled. A request's prompt
is its own token ids (distinct from every other request's), except that a request with `"key": K, "shared": S`
begins with the first S tokens of key K's token run (the same ids for every request with that key), so vLLM's
block hashes (vllm/v1/core/kv_cache_utils.py, each block's hash chained on its parent's) match on the whole
blocks two such requests have in common and prefix caching can hit them across requests.

Multi-turn sessions: a request with `"after": J` is the next turn of request J's conversation, sent by a closed-loop
client with no think time once J's last token reaches it: the driver adds it before the step after J's last token if
the engine then has nothing to do (nothing unfinished, nothing sent to it during that step), else one step later (an
engine core with work starts its next step before the client's reply can arrive; an idle one schedules it at once);
next turns due together are added in the order their predecessors finished. It gives the turn J's whole token sequence
(J's prompt ids and the output ids the driver sampled for J) followed by new ids of its own up to `prompt` tokens.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
import traceback
from typing import Any

VOCAB = 1_000_000
MAX_STEPS = 20_000
KEY_BASE = 900_000  # shared runs use ids from here on (10,000 per key); own tokens stay below
OUT_BASE = 800_000  # sampled tokens


def _tiny_model_dir() -> str:
    """A llama-style config.json in a temporary directory: ModelConfig reads it and needs no network or weights."""
    path = tempfile.mkdtemp(prefix="stopo-sched-")
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1, "vocab_size": VOCAB,
           "max_position_embeddings": 16384, "torch_dtype": "float32"}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    return path


class Driver:
    def __init__(self) -> None:
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        with contextlib.redirect_stdout(io.StringIO()):
            import torch
            from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
            from vllm.sampling_params import SamplingParams
            from vllm.utils.hashing import sha256
            from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
            from vllm.v1.core.sched.scheduler import Scheduler
            from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
            from vllm.v1.outputs import ModelRunnerOutput
            from vllm.v1.request import Request
            from vllm.v1.structured_output import StructuredOutputManager
        self.torch = torch
        self.CacheConfig, self.ModelConfig, self.SchedulerConfig, self.VllmConfig = CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
        self.SamplingParams, self.Scheduler, self.ModelRunnerOutput, self.Request = SamplingParams, Scheduler, ModelRunnerOutput, Request
        self.FullAttentionSpec, self.KVCacheConfig, self.KVCacheGroupSpec = FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        self.StructuredOutputManager = StructuredOutputManager
        self.sha256, self.get_request_block_hasher = sha256, get_request_block_hasher
        init_none_hash(sha256)
        self.model_dir = _tiny_model_dir()
        self.model_config = ModelConfig(model=self.model_dir, skip_tokenizer_init=True, max_model_len=16384, dtype="float32")

    def scheduler(self, sc: dict[str, Any]) -> Any:
        block = int(sc.get("block_size", 16))
        sched = self.SchedulerConfig(max_num_seqs=int(sc["max_num_seqs"]), max_num_batched_tokens=int(sc["max_num_batched_tokens"]),
                                     max_model_len=16384, enable_chunked_prefill=True, async_scheduling=False,
                                     is_encoder_decoder=False)
        cache = self.CacheConfig(block_size=block, enable_prefix_caching=bool(sc["prefix_caching"]))
        cache.num_gpu_blocks = int(sc["num_blocks"])  # what the engine core sets after profiling
        vc = self.VllmConfig(model_config=self.model_config, scheduler_config=sched, cache_config=cache)
        assert vc.scheduler_config.scheduler_reserve_full_isl, "expected vLLM's default --scheduler-reserve-full-isl"
        assert not vc.scheduler_config.async_scheduling
        kv = self.KVCacheConfig(num_blocks=int(sc["num_blocks"]), kv_cache_tensors=[], kv_cache_groups=[
            self.KVCacheGroupSpec(["layer0"], self.FullAttentionSpec(block_size=block, num_kv_heads=1, head_size=1,
                                                                     dtype=self.torch.float32))])
        return self.Scheduler(vllm_config=vc, kv_cache_config=kv, structured_output_manager=self.StructuredOutputManager(vc),
                              block_size=block)

    def run(self, sc: dict[str, Any]) -> dict[str, Any]:
        s = self.scheduler(sc)
        block = int(sc.get("block_size", 16))
        hasher = self.get_request_block_hasher(block, self.sha256) if sc["prefix_caching"] else None
        specs = sc["requests"]
        n = len(specs)
        # sessions: request i with "after": j is the next turn of request j's conversation; it is built (and added)
        # only once j has finished, its prompt being j's whole token sequence (prompt ids and the ids this driver
        # sampled as j's outputs) followed by new ids of its own
        reqs: list[Any] = [None] * n

        def build(i: int, step: int) -> Any:
            r = specs[i]
            if r.get("after") is not None:
                prev = reqs[int(r["after"])]
                prompt = list(prev.prompt_token_ids) + list(prev.output_token_ids)
                if len(prompt) > int(r["prompt"]):
                    raise ValueError(f"r{i}: prompt {r['prompt']} shorter than its conversation ({len(prompt)} tokens)")
            else:
                shared = min(int(r.get("shared", 0)), int(r["prompt"])) if r.get("key") is not None else 0
                prompt = [KEY_BASE + int(r["key"]) * 10_000 + j for j in range(shared)]
            prompt += [(i * 50_000 + j) % KEY_BASE for j in range(len(prompt), int(r["prompt"]))]
            return self.Request(request_id=f"r{i}", prompt_token_ids=prompt, pooling_params=None, block_hasher=hasher,
                                sampling_params=self.SamplingParams(max_tokens=int(r["output"]), ignore_eos=True),
                                arrival_time=float(step))

        added = [False] * n
        first: list[int | None] = [None] * n
        finish: list[int | None] = [None] * n
        hit: list[int | None] = [None] * n
        issue: list[int | None] = [None] * n  # the step from which a finished request's next turn is queued
        done_seq = [0] * n  # the order in which requests finished
        steps: list[dict[str, int]] = []
        for step in range(MAX_STEPS):
            # next turns due together go out in the order their predecessors' last tokens left the engine (the
            # order of the step's outputs, the running queue's), ahead of nothing else
            for i in sorted(range(n), key=lambda i: (-1 if specs[i].get("after") is None else done_seq[int(specs[i]["after"])], i)):
                r = specs[i]
                after = r.get("after")
                # a next turn goes out at the step after its predecessor's last token (closed loop, no think time)
                ready = int(r.get("arrival_step", 0)) <= step and (after is None or (issue[int(after)] is not None
                                                                                   and issue[int(after)] <= step))
                if not added[i] and ready:
                    reqs[i] = build(i, step)
                    s.add_request(reqs[i])
                    added[i] = True
            if all(added) and all(f is not None for f in finish):
                break
            out = s.schedule()
            scheduled = dict(out.num_scheduled_tokens)
            steps.append(scheduled)
            ids = list(scheduled)
            by_id = {f"r{i}": reqs[i] for i in range(n) if added[i]}
            for rid in ids:  # tokens computed before its first chunk: its prefix-cache hit at admission
                if hit[int(rid[1:])] is None:
                    hit[int(rid[1:])] = by_id[rid].num_computed_tokens - scheduled[rid]
            # after schedule() a request's num_computed_tokens counts this step's tokens: it samples when they
            # reach its whole sequence (a partial prefill's sample is discarded by the model runner)
            # each request samples a token of its own (OUT_BASE + its index): two requests with the same prompt
            # must not share output blocks, as the simulator's requests share prompt prefixes only
            sampled = [[OUT_BASE + int(rid[1:])] if by_id[rid].num_computed_tokens >= by_id[rid].num_tokens else [] for rid in ids]
            mro = self.ModelRunnerOutput(req_ids=ids, req_id_to_index={rid: k for k, rid in enumerate(ids)},
                                         sampled_token_ids=sampled)
            s.update_from_output(out, mro)
            just_done: list[int] = []
            for rid, tok in zip(ids, sampled, strict=True):
                i = int(rid[1:])
                if tok and first[i] is None:
                    first[i] = step
                if tok and reqs[i].is_finished() and finish[i] is None:
                    finish[i] = step
                    done_seq[i] = sum(f is not None for f in finish)
                    just_done.append(i)
            # the client sees the last token only after the step's outputs leave the engine core; an engine with
            # work for the next step has started it by then (EngineCoreProc.run_busy_loop, vllm/v1/engine/core.py,
            # drains its input queue, where requests sent during this step wait, and steps again at once), so the
            # next turn is scheduled a step later; an idle engine waits for it and schedules it in the next step
            busy = s.has_unfinished_requests() or any(
                not added[j] and int(r.get("arrival_step", 0)) <= step + 1
                and (r.get("after") is None or (issue[int(r["after"])] is not None and issue[int(r["after"])] <= step + 1))
                for j, r in enumerate(specs))
            for i in just_done:
                issue[i] = step + (2 if busy else 1)
        else:
            raise RuntimeError(f"not finished after {MAX_STEPS} steps")
        return {"ok": True, "steps": steps, "requests": [
            {"first_token_step": first[i], "finish_step": finish[i], "preemptions": reqs[i].num_preemptions,
             "hit_tokens": hit[i], "prompt_ids": len(reqs[i].prompt_token_ids)} for i in range(n)]}


def main() -> None:
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # vLLM's logging and prints stay off the result stream
    driver = Driver()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            result = driver.run(json.loads(line))
        except Exception as exc:  # reported per scenario, so the test shows vLLM's own error
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        real_stdout.write(json.dumps(result) + "\n")
        real_stdout.flush()


if __name__ == "__main__":
    main()
