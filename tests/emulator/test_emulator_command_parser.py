"""The emulator reads the engine command lines the operator writes, and refuses the ones a real engine would."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from servingtopology.emulator.command_parser import EngineArgsError, parse_engine_command
from servingtopology.emulator.fleet import pod_view
from servingtopology.planner.layout import Engine, Role

GOLDEN = Path(__file__).resolve().parents[1] / "operator" / "golden"


def _engine_pods() -> list[tuple[str, dict]]:
    pods = []
    for path in sorted(GOLDEN.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "Deployment":
                template = doc["spec"]["template"]
                pods.append((f"{path.name}:{doc['metadata']['name']}", template))
    return pods


@pytest.mark.parametrize(("name", "template"), _engine_pods() or [pytest.param("none", {}, marks=pytest.mark.skip)])
def test_every_operator_engine_deployment_parses_with_its_gpu_count(name: str, template: dict) -> None:
    view = pod_view({"metadata": {**template["metadata"], "name": "p", "namespace": "n"}, "spec": template["spec"]})
    if view is None:  # the router
        return
    role_label = view.labels.get("servingtopology.io/role")
    config = parse_engine_command(view.argv, role_hint=Role(role_label) if role_label in set(Role) else None)
    assert config.gpus_per_node == view.gpus, name
    if role_label in ("prefill", "decode"):
        assert config.role == Role(role_label), name


def test_vllm_flags_become_parallelism_and_caps() -> None:
    config = parse_engine_command(["vllm", "serve", "llama-3.1-8b", "--tensor-parallel-size", "2", "-pp", "2",
                                   "--max-num-seqs=64", "--max-num-batched-tokens", "4096", "--gpu-memory-utilization", "0.8"])
    assert (config.engine, config.tp, config.pp, config.dp, config.gpus) == (Engine.VLLM, 2, 2, 1, 4)
    assert (config.max_running, config.token_budget, config.memory_fraction) == (64, 4096, 0.8)
    assert config.served_model_name == "llama-3.1-8b"


def test_sglang_dp_attention_counts_gpus_once() -> None:
    config = parse_engine_command(["python3", "-m", "sglang.launch_server", "--model-path", "qwen3-30b-a3b", "--tp-size", "8",
                                   "--dp-size", "4", "--enable-dp-attention"])
    assert (config.engine, config.tp, config.dp, config.dp_attention, config.gpus) == (Engine.SGLANG, 8, 4, True, 8)


def test_vllm_kv_transfer_roles_decide_the_pd_role() -> None:
    base = ["vllm", "serve", "m", "--kv-transfer-config"]
    assert parse_engine_command([*base, '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}']).role is Role.PREFILL
    assert parse_engine_command([*base, '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}']).role is Role.DECODE
    both = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
    assert parse_engine_command([*base, both], role_hint=Role.DECODE).role is Role.DECODE


# The newest covered releases (vLLM 0.33.0, SGLang 0.5.23); each message is the engine's own.
@pytest.mark.parametrize(("argv", "message"), [
    (["vllm", "serve", "m", "--tensor-parallel-size", "two"], "argument --tensor-parallel-size/-tp: invalid int value: 'two'"),
    (["vllm", "serve", "m", "-tp", "0"], "ParallelConfig: tensor_parallel_size: Input should be greater than or equal to 1"),
    (["vllm", "serve", "m", "--gpu-memory-utilization", "1.5"], "gpu_memory_utilization: Input should be less than or equal to 1"),
    (["vllm", "serve", "m", "--kv-transfer-config", "{nope"], "Invalid JSON"),  # broken PD config
    (["python3", "-m", "sglang.launch_server", "--model-path", "m", "--disaggregation-mode", "both"],
     "sglang serve: error: argument --disaggregation-mode: invalid choice: 'both'"),
    (["python3", "-m", "sglang.launch_server", "--tp-size", "2"], "the following arguments are required: --model-path/--model"),
    (["vllm", "serve", "m", "--max-num-seqs"], "argument --max-num-seqs: expected one argument"),  # a flag without its value
    (["vllm", "serve", "m", "--tensor-paralel-size", "2"], "vllm serve: error: unrecognized arguments: --tensor-paralel-size 2"),
    (["python3", "-m", "sglang.launch_server", "--model-path", "m", "--max-num-seqs", "8"],  # vLLM's flag on SGLang
     "sglang serve: error: unrecognized arguments: --max-num-seqs 8"),
    (["vllm", "serve", "m", "--max-running-requests", "8"], "unrecognized arguments: --max-running-requests 8"),  # and back
    (["vllm", "serve", "m", "--quantization", "foo"], "Unknown quantization method: foo"),
    (["vllm", "serve", "m", "--kv-transfer-config", '{"kv_connector":"foo","kv_role":"kv_producer"}'], "Unsupported connector type: foo"),
    (["python3", "-m", "sglang.launch_server", "--model-path", "m", "--disaggregation-transfer-backend", "foo"],
     "invalid choice: 'foo' (choose from 'mooncake', 'nixl'"),
    (["vllm", "serve", "m", "-pp", "2", "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}'],
     "consumer (decode) does not support pipeline_parallel_size > 1"),
])
def test_arguments_a_real_engine_rejects_are_rejected_with_the_engines_message(argv: list[str], message: str) -> None:
    with pytest.raises(EngineArgsError, match=re.escape(message)):
        parse_engine_command(argv)


def test_routers_and_sidecars_are_not_engines() -> None:
    pod = {"metadata": {"name": "r", "namespace": "n"},
           "spec": {"containers": [{"name": "router", "command": ["python3", "-m", "sglang_router.launch_router"]}]}}
    assert pod_view(pod) is None


@pytest.mark.parametrize(("argv", "message"), [
    (["vllm", "serve", "m", "--nnodes", "2"], "vllm serve: error: unrecognized arguments: --nnodes 2"),  # 0.11 has no multi-node mp
    (["vllm", "serve", "m", "--block-size", "7"], "argument --block-size: invalid choice: 7 (choose from 1, 8, 16, 32, 64, 128)"),
    (["vllm", "serve", "m", "--kv-cache-dtype", "fp7"], "argument --kv-cache-dtype: invalid choice: 'fp7'"),
    (["vllm", "serve", "m", "-pp", "2", "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}'],
     "NixlConnector addresses workers by TP rank only"),  # PP in any PD role
])
def test_vllm_0_11_rejects_what_it_does_not_run(argv: list[str], message: str) -> None:
    with pytest.raises(EngineArgsError, match=re.escape(message)):
        parse_engine_command(argv, image="vllm/vllm-openai:v0.11.0")
    assert parse_engine_command(["vllm", "serve", "m", "--block-size", "16"], version="0.11.0").version == "0.11.0"


def test_the_release_comes_from_the_image_tag_and_a_release_without_data_is_refused() -> None:
    with pytest.raises(EngineArgsError, match="not covered"):
        parse_engine_command(["vllm", "serve", "m"], image="vllm/vllm-openai:v0.9.2")
    assert parse_engine_command(["vllm", "serve", "m", "--nnodes", "2"], image="vllm/vllm-openai:v0.33.0").nodes == 2
