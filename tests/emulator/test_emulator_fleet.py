"""The fleet keeps one emulated engine per Ready engine pod and the Prometheus file-SD in step with them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from servingtopology.emulator.fleet import Fleet, PodView
from servingtopology.emulator.traffic import TrafficProfile

VLLM = ("vllm", "serve", "llama-3.1-8b", "--tensor-parallel-size", "2")


def _pod(name: str, *, argv: tuple[str, ...] = VLLM, gpus: int = 2, ready: bool = True, role: str = "aggregated") -> PodView:
    return PodView(namespace="ns", name=name, uid=f"uid-{name}", node="gpu-node-0", ip="10.244.0.9",
                   labels={"app.kubernetes.io/instance": "llama", "servingtopology.io/role": role},
                   argv=argv, container="engine", gpus=gpus, ready=ready)


def _fleet(tmp_path: Path) -> Fleet:
    return Fleet(profile=lambda: TrafficProfile.constant(rate_rps=1, input_tokens=100, output_tokens=10),
                 group_label="app.kubernetes.io/instance", role_label="servingtopology.io/role",
                 file_sd_path=tmp_path / "sd.json", status_path=tmp_path / "status.json")


def test_ready_engine_pods_become_labelled_scrape_targets_and_leave_with_their_pod(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path)
    try:
        fleet.sync([_pod("a"), _pod("b"), _pod("c", ready=False)], {"gpu-node-0": "NVIDIA-H100-80GB-HBM3"})
        targets = json.loads((tmp_path / "sd.json").read_text())
        assert [t["labels"]["pod"] for t in targets] == ["a", "b"]
        labels = targets[0]["labels"]
        assert labels["namespace"] == "ns" and labels["node"] == "gpu-node-0"
        assert labels["app_kubernetes_io_instance"] == "llama" and labels["servingtopology_io_role"] == "aggregated"
        assert "engine" not in labels  # would clash with vLLM's own `engine` label
        fleet.sync([_pod("b")], {})
        assert [t["labels"]["pod"] for t in json.loads((tmp_path / "sd.json").read_text())] == ["b"]
    finally:
        fleet.stop()
    assert json.loads((tmp_path / "sd.json").read_text()) == []


def test_a_pod_whose_arguments_the_engine_would_refuse_gets_an_error_and_no_target(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path)
    try:
        fleet.sync([_pod("bad", argv=(*VLLM, "--max-num-seqs", "0")), _pod("short", gpus=4)], {})
        status = json.loads((tmp_path / "status.json").read_text())
        assert not status["instances"]
        errors = status["errors"]
        assert "max_num_seqs: Input should be greater than or equal to 1" in errors["ns/bad/uid-bad"]  # vLLM 0.33's SchedulerConfig bound
        assert "4 nvidia.com/gpu" in errors["ns/short/uid-short"]  # TP2 on a 4-GPU pod: the GPU counts disagree
        assert json.loads((tmp_path / "sd.json").read_text()) == []
    finally:
        fleet.stop()


def test_a_refused_engine_gets_the_status_a_kubelet_writes_for_a_container_that_exited() -> None:
    from servingtopology.emulator.fleet import refused_status

    pod = {"spec": {"containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.11.0"}]}, "status": {"phase": "Running"}}
    message = "vllm serve: error: unrecognized arguments: --tensor-paralel-size 2"
    body = refused_status(pod, "engine", message, now="2026-12-01T00:00:00Z")
    assert body is not None
    cs = body["status"]["containerStatuses"][0]
    assert cs["lastState"]["terminated"]["exitCode"] == 2 and cs["lastState"]["terminated"]["message"] == message
    assert cs["state"]["waiting"]["reason"] == "CrashLoopBackOff" and not cs["ready"]
    assert refused_status({**pod, "status": body["status"]}, "engine", message, now="later") is None  # already written
    assert refused_status(pod, "engine", "ValueError: Unsupported connector type: foo", now="t")["status"][  # type: ignore[index]
        "containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 1


def test_a_vllm_0_11_decode_engine_paired_with_a_wider_prefill_engine_fails_with_the_nixl_assertion(tmp_path: Path) -> None:
    def pd(tp: int, role: str) -> tuple[str, ...]:
        kv = '{"kv_connector":"NixlConnector","kv_role":"kv_%s"}' % ("producer" if role == "prefill" else "consumer")
        return ("vllm", "serve", "llama-3.1-8b", "--tensor-parallel-size", str(tp), "--kv-transfer-config", kv)
    fleet = _fleet(tmp_path)
    try:
        pods = [PodView(namespace="ns", name=n, uid=f"uid-{n}", node="gpu-node-0", ip="10.244.0.9",
                        labels={"app.kubernetes.io/instance": "llama", "servingtopology.io/role": role},
                        argv=pd(tp, role), container="engine", gpus=tp, ready=True, image="vllm/vllm-openai:v0.11.0")
                for n, tp, role in (("p", 4, "prefill"), ("d", 2, "decode"))]
        fleet.sync(pods, {})
        errors = json.loads((tmp_path / "status.json").read_text())["errors"]
        assert list(errors) == ["ns/d/uid-d"]
        assert "Decode TP cannot be smaller than prefill TP" in errors["ns/d/uid-d"] and "nixl_connector.py:968" in errors["ns/d/uid-d"]
    finally:
        fleet.stop()
    # vLLM 0.33 pairs heterogeneous TP both ways: nothing fails.
    fleet = _fleet(tmp_path)
    try:
        fleet.sync([dataclasses.replace(p, image="vllm/vllm-openai:v0.33.0") for p in pods], {})
        assert not json.loads((tmp_path / "status.json").read_text())["errors"]
    finally:
        fleet.stop()


def test_pod_arguments_are_expanded_from_the_container_env_as_the_kubelet_does() -> None:
    from servingtopology.emulator.fleet import pod_view

    pod = {"metadata": {"name": "w", "namespace": "ns"}, "status": {}, "spec": {"containers": [{
        "name": "engine", "command": ["vllm", "serve"],
        "args": ["m", "--nnodes", "2", "--node-rank", "$(LWS_WORKER_INDEX)", "--master-addr", "$(LWS_LEADER_ADDRESS)", "--headless"],
        "env": [{"name": "LWS_WORKER_INDEX", "value": "1"}, {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}]}}
    view = pod_view(pod)
    assert view is not None and view.argv[6:9] == ("1", "--master-addr", "$(LWS_LEADER_ADDRESS)")  # unresolvable: as written
