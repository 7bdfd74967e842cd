"""The fleet keeps one emulated engine per Ready engine pod, serving at the pod's own address and engine port."""

from __future__ import annotations

import dataclasses
import json
import urllib.request
from pathlib import Path

from servingtopology.emulator.fleet import Fleet, PodView
from servingtopology.emulator.traffic import TrafficProfile

VLLM = ("vllm", "serve", "llama-3.1-8b", "--tensor-parallel-size", "2")


def _pod(name: str, *, argv: tuple[str, ...] = VLLM, gpus: int = 2, ready: bool = True, role: str = "aggregated",
         ip: str = "10.244.0.9") -> PodView:
    return PodView(namespace="ns", name=name, uid=f"uid-{name}", node="gpu-node-0", ip=ip,
                   labels={"app.kubernetes.io/instance": "llama", "servingtopology.io/role": role},
                   argv=argv, container="engine", gpus=gpus, ready=ready)


def _fleet(tmp_path: Path, *, at_pod_address: bool = False) -> Fleet:
    return Fleet(profile=lambda: TrafficProfile.constant(rate_rps=1, input_tokens=100, output_tokens=10),
                 group_label="app.kubernetes.io/instance", role_label="servingtopology.io/role",
                 status_path=tmp_path / "status.json", at_pod_address=at_pod_address)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def test_ready_engine_pods_are_served_at_their_own_address_and_stop_with_their_pod(tmp_path: Path) -> None:
    # Loopback addresses stand for pod IPs, as kwok gives them in the e2e cluster (pod CIDR 127.64.0.0/16).
    fleet = _fleet(tmp_path, at_pod_address=True)
    try:
        fleet.sync([_pod("a", ip="127.64.3.1"), _pod("b", ip="127.64.3.2", argv=(*VLLM, "--port", "8123")),
                    _pod("c", ip="127.64.3.3", ready=False)], {"gpu-node-0": "NVIDIA-H100-80GB-HBM3"})
        status = json.loads((tmp_path / "status.json").read_text())
        addresses = {key.split("/")[1]: inst["address"] for key, inst in status["instances"].items()}
        assert addresses == {"a": "127.64.3.1:8000", "b": "127.64.3.2:8123"}  # vLLM's default port, or --port
        assert "vllm:num_requests_running" in _get("http://127.64.3.1:8000/metrics")
        fleet.sync([_pod("b", ip="127.64.3.2", argv=(*VLLM, "--port", "8123"))], {})
        assert list(json.loads((tmp_path / "status.json").read_text())["instances"]) == ["ns/b/uid-b"]
        # The address is free again: a new pod that gets the same IP can be served there.
        fleet.sync([_pod("b", ip="127.64.3.2", argv=(*VLLM, "--port", "8123")), _pod("d", ip="127.64.3.1")], {})
        assert "ns/d/uid-d" in json.loads((tmp_path / "status.json").read_text())["instances"]
    finally:
        fleet.stop()
    assert json.loads((tmp_path / "status.json").read_text())["instances"] == {}


def test_a_pod_whose_address_is_not_on_this_host_gets_an_error_not_a_server(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, at_pod_address=True)
    try:
        fleet.sync([_pod("far", ip="192.0.2.7")], {})  # TEST-NET-1: never a local address
        errors = json.loads((tmp_path / "status.json").read_text())["errors"]
        assert "cannot listen on 192.0.2.7:8000" in errors["ns/far/uid-far"]
    finally:
        fleet.stop()


def test_a_pod_whose_arguments_the_engine_would_refuse_gets_an_error_and_no_server(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path)
    try:
        fleet.sync([_pod("bad", argv=(*VLLM, "--max-num-seqs", "0")), _pod("short", gpus=4)], {})
        status = json.loads((tmp_path / "status.json").read_text())
        assert not status["instances"]
        errors = status["errors"]
        assert "max_num_seqs: Input should be greater than or equal to 1" in errors["ns/bad/uid-bad"]  # vLLM 0.33's SchedulerConfig bound
        assert "4 nvidia.com/gpu" in errors["ns/short/uid-short"]  # TP2 on a 4-GPU pod: the GPU counts disagree
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


def test_an_address_still_taken_is_retried_and_never_reported_as_an_engine_refusal(tmp_path: Path) -> None:
    import socket

    taken = socket.socket()
    taken.bind(("127.64.3.9", 8000))   # another pod's engine (or another session's) still holds the pod's address
    taken.listen()
    fleet = _fleet(tmp_path, at_pod_address=True)
    try:
        fleet.sync([_pod("late", ip="127.64.3.9")], {})
        assert "cannot listen on 127.64.3.9:8000" in fleet.errors["ns/late/uid-late"]
        assert fleet.refusal("ns/late/uid-late") is None   # the pod stays Ready (no CrashLoopBackOff written)
        taken.close()
        fleet.sync([_pod("late", ip="127.64.3.9")], {})
        assert "ns/late/uid-late" in json.loads((tmp_path / "status.json").read_text())["instances"]
        bad = _pod("bad", ip="127.64.3.10", argv=("vllm", "serve", "llama-3.1-8b", "--no-such-flag"))
        fleet.sync([_pod("late", ip="127.64.3.9"), bad], {})
        assert fleet.refusal("ns/bad/uid-bad")   # a refused command line is still reported
    finally:
        taken.close()
        fleet.stop()
