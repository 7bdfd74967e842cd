"""Named plans for the operator tests: blueprints of every engine × layout shape, and hand-made Decisions.

Shared by the builder golden tests, the validation tests and the reconcile tests, so that each shape is
spelled once. Decisions are built by hand here so the operator can be tested without the planner's search.
"""

from __future__ import annotations

from servingtopology.operator.render.manifests import Blueprint
from servingtopology.operator.render.network import NetworkKnobs
from servingtopology.planner.engines.caps import resolve_version
from servingtopology.planner.hardware import Precision
from servingtopology.planner.layout import Engine, EngineKnobs, KvDtype, Layout, Parallelism, RoleLayout
from servingtopology.planner.problem import Candidate, Decision, Prediction

VLLM_IMAGE = "vllm/vllm-openai:v0.11.0"
SGLANG_IMAGE = "lmsysorg/sglang:v0.5.23"
UID = "0d9c1e4e-5b7a-4c1e-9a57-000000000001"


def knobs(**kw: object) -> EngineKnobs:
    return EngineKnobs(**kw)  # type: ignore[arg-type]


def blueprint(engine: Engine, layout: Layout, *, gpus_per_node: int = 8, model: str = "meta-llama/Llama-3.1-8B-Instruct",
              **kw: object) -> Blueprint:
    image = str(kw.pop("image", VLLM_IMAGE if engine is Engine.VLLM else SGLANG_IMAGE))
    return Blueprint(name="llama", namespace="serving", uid=UID, engine=engine, image=image, model=model,
                     served_model_name=model, layout=layout, gpus_per_node=gpus_per_node,
                     engine_version=resolve_version(engine, image=image), **kw)  # type: ignore[arg-type]


# name -> blueprint; each row is one shape the golden files pin down.
BLUEPRINTS: dict[str, Blueprint] = {
    # plain replicas, default knobs
    "vllm-replicas-4xtp2": blueprint(Engine.VLLM, Layout.replicas(4, Parallelism(tp=2))),
    # FP8 weights and KV, tuned knobs, placement constraints, user extra args
    "vllm-replicas-fp8-placement": blueprint(
        Engine.VLLM,
        Layout.replicas(2, Parallelism(tp=4), knobs(max_num_seqs=128, max_num_batched_tokens=4096, memory_fraction=0.92,
                                                    kv_dtype=KvDtype.FP8), precision=Precision.FP8),
        node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        tolerations=({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},),
        extra_args=("--max-model-len", "16384")),
    # TP and PP inside one node
    "vllm-tp4pp2": blueprint(Engine.VLLM, Layout.replicas(2, Parallelism(tp=4, pp=2)), gpus_per_node=8,
                             model="meta-llama/Llama-3.1-70B"),
    # PD with the same parallelism on both sides, the vLLM router
    "vllm-pd-2p3d-tp4": blueprint(Engine.VLLM, Layout.pd(RoleLayout(2, Parallelism(tp=4)), RoleLayout(3, Parallelism(tp=4)))),
    # one instance over two nodes on vLLM 0.11 (no --nnodes): LeaderWorkerSet started through Ray
    "vllm-multinode-tp8pp2": blueprint(Engine.VLLM, Layout.replicas(1, Parallelism(tp=8, pp=2)), model="meta-llama/Llama-3.1-405B"),
    # the same on vLLM 0.33: the mp executor's rendezvous flags (--nnodes, --node-rank, --master-addr, --headless)
    "vllm-0.33-multinode-tp8pp2": blueprint(Engine.VLLM, Layout.replicas(1, Parallelism(tp=8, pp=2)), model="meta-llama/Llama-3.1-405B",
                                            image="vllm/vllm-openai:v0.33.0"),
    # SGLang replicas with DP attention and expert parallelism (an MoE model)
    "sglang-replicas-tp2dp4-ep": blueprint(Engine.SGLANG, Layout.replicas(2, Parallelism(tp=2, dp=4, ep=True)),
                                           model="Qwen/Qwen3-30B-A3B"),
    # SGLang with pipeline parallel, prefix caching off
    "sglang-tp2pp2": blueprint(Engine.SGLANG, Layout.replicas(3, Parallelism(tp=2, pp=2), knobs(enable_prefix_caching=False))),
    # SGLang PD with different parallelism per role and the SGLang router
    "sglang-pd-1p2d-mixed": blueprint(Engine.SGLANG, Layout.pd(RoleLayout(1, Parallelism(tp=4)),
                                                               RoleLayout(2, Parallelism(tp=2), knobs(max_num_seqs=512)))),
    # PD across GPU kinds: prefill on H100 nodes, decode on A100 nodes (each role selects its kind's product label), the KV
    # priced over the slower NIC (annotated), vLLM's NIXL flags as on one kind
    "vllm-pd-h100-a100": blueprint(Engine.VLLM, Layout.pd(RoleLayout(1, Parallelism(tp=2), gpu="h100_sxm"),
                                                          RoleLayout(2, Parallelism(tp=1), gpu="a100_sxm")), gpu_id="h100_sxm"),
    # the same on SGLang with mooncake over named HCAs, the spec's NIC override on its own kind (100 Gb/s: the link)
    "sglang-pd-h100-l40s-mooncake": blueprint(Engine.SGLANG, Layout.pd(RoleLayout(1, Parallelism(tp=4), gpu="h100_sxm"),
                                                                       RoleLayout(2, Parallelism(tp=2), gpu="l40s")),
                                              gpu_id="h100_sxm", nic_gbit={"h100_sxm": 100.0}, transfer_backend="mooncake",
                                              network=NetworkKnobs(ib_devices=("mlx5_0",))),
}


def planned(spec: dict[str, object]) -> Layout:
    """The layout the planner decides for a spec (its pin checked by the planner's own rules, predicted analytically):
    a golden built through the planner cannot hold a shape the planner refuses."""
    from servingtopology.planner.search.decide import decide
    from servingtopology.spec import parse_spec, to_problem

    return decide(to_problem(parse_spec(spec))).best.layout


def _deepseek_v3_on_two_h200_nodes(engine: Engine, *, tp: int, dp: int) -> dict[str, object]:
    """DeepSeek-V3 FP8 on two 8-GPU H200 nodes, one instance of TP `tp` × attention DP `dp` (cross-node groups allowed)."""
    return {"model": "deepseek-ai/DeepSeek-V3", "engine": engine.value,
            "hardware": {"gpu": "h200_sxm", "gpusPerNode": 8, "maxGPUs": 16, "allowCrossNodeTP": True},
            "workload": {"arrivalRate": 1, "inputTokens": 2000, "outputTokens": 300}, "slo": {"ttftMs": {"p95": 5000}, "tpotMs": {"p95": 200}},
            "search": {"layouts": ["replicas"], "tp": [tp], "pp": [1], "dp": [dp]},
            "layout": {"kind": "replicas", "replicas": 1, "tp": tp, "dp": dp, "ep": dp > 1}}


# Multi-node instances come from the planner (its shape rules admit TP×DP groups over whole nodes), not by hand.
BLUEPRINTS |= {
    # SGLang TP16 over two 8-GPU nodes
    "sglang-multinode-tp16": blueprint(Engine.SGLANG, planned(_deepseek_v3_on_two_h200_nodes(Engine.SGLANG, tp=16, dp=1)),
                                       model="deepseek-ai/DeepSeek-V3"),
    # SGLang TP2 × attention DP8 with expert parallelism over the same two nodes
    "sglang-multinode-tp2dp8-ep": blueprint(Engine.SGLANG, planned(_deepseek_v3_on_two_h200_nodes(Engine.SGLANG, tp=2, dp=8)),
                                            model="deepseek-ai/DeepSeek-V3"),
    # vLLM 0.11 (no --nnodes): the same over Ray, with Ray's data-parallel backend
    "vllm-multinode-tp2dp8-ep": blueprint(Engine.VLLM, planned(_deepseek_v3_on_two_h200_nodes(Engine.VLLM, tp=2, dp=8)),
                                          model="deepseek-ai/DeepSeek-V3"),
    # vLLM 0.33: DP8 × TP2 with expert parallelism over two nodes, started with --nnodes (vLLM infers the local DP ranks)
    "vllm-0.33-multinode-tp2dp8-ep": blueprint(Engine.VLLM, planned(_deepseek_v3_on_two_h200_nodes(Engine.VLLM, tp=2, dp=8)),
                                               model="deepseek-ai/DeepSeek-V3", image="vllm/vllm-openai:v0.33.0"),
}


def prediction(ttft_ms: float, tpot_ms: float, *, meets_slo: bool = True) -> Prediction:
    return Prediction(ttft_ms=ttft_ms, tpot_ms=tpot_ms, throughput_tok_s=5000.0, capacity_rps=20.0, goodput_rps=18.0,
                      goodput_per_gpu=2.25, tokens_per_s_per_user=1000 / tpot_ms, kv_pool_tokens=400_000,
                      max_request_tokens=32_768, meets_slo=meets_slo)


def decision(layout: Layout, *, ttft_ms: float = 180.0, tpot_ms: float = 25.0, reasons: tuple[str, ...] = ("prefill-heavy traffic",),
             current: Candidate | None = None) -> Decision:
    best = Candidate(layout, prediction(ttft_ms, tpot_ms), score=1.0, why="ranked first")
    return Decision(best=best, alternatives=(), funnel=(), candidates_total=1, kv_bytes_per_token=131072,
                    weight_bytes=16e9, reasons=reasons, current=current)
