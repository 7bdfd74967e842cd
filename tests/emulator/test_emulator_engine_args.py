"""The emulator reads the engine command lines the operator writes, and refuses the ones a real engine would."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from servingtopology.emulator.engine_args import EngineArgsError, parse_engine_command
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


@pytest.mark.parametrize(("argv", "message"), [
    (["vllm", "serve", "m", "--tensor-parallel-size", "two"], "invalid int value"),  # not a number
    (["vllm", "serve", "m", "-tp", "0"], "at least 1"),  # a size of zero
    (["vllm", "serve", "m", "--gpu-memory-utilization", "1.5"], "(0, 1]"),  # a fraction above one
    (["vllm", "serve", "m", "--kv-cache-dtype", "fp7"], "invalid choice"),  # an unknown KV dtype
    (["vllm", "serve", "m", "--kv-transfer-config", "{nope"], "not valid JSON"),  # broken PD config
    (["python3", "-m", "sglang.launch_server", "--model-path", "m", "--disaggregation-mode", "both"], "invalid choice"),
    (["python3", "-m", "sglang.launch_server", "--tp-size", "2"], "no model"),  # no model at all
    (["vllm", "serve", "m", "--max-num-seqs"], "expected one argument"),  # a flag without its value
])
def test_arguments_a_real_engine_rejects_are_rejected_with_the_flag_named(argv: list[str], message: str) -> None:
    with pytest.raises(EngineArgsError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        parse_engine_command(argv)


def test_routers_and_sidecars_are_not_engines() -> None:
    pod = {"metadata": {"name": "r", "namespace": "n"},
           "spec": {"containers": [{"name": "router", "command": ["python3", "-m", "sglang_router.launch_router"]}]}}
    assert pod_view(pod) is None
