"""Pods a real-engine rule selects run their own command line (mapped onto this machine) instead of an emulated engine."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from servingtopology.emulator.fleet import Fleet, PodView
from servingtopology.emulator.real_engine import RealEngineRule, RealEngineRulesError, local_argv, parse_rules
from servingtopology.emulator.traffic import TrafficProfile

ARGV = ("vllm", "serve", "/models/tiny", "--host", "0.0.0.0", "--port", "8000", "--served-model-name", "tiny",
        "--tensor-parallel-size", "1", "--enforce-eager")


def _rule(tmp_path: Path, script: str) -> RealEngineRule:
    exe = tmp_path / "fake-vllm"
    exe.write_text(f"#!{sys.executable}\n{script}\n")
    exe.chmod(0o755)
    return RealEngineRule(namespace="real-*", commands={"vllm": str(exe)}, paths={"/models/tiny": "/tmp/here/tiny"},
                          env={"MARK": "set"}, log_dir=str(tmp_path))


def test_the_pod_command_line_is_kept_but_for_executable_model_path_host_and_port(tmp_path: Path) -> None:
    rule = _rule(tmp_path, "")
    argv = local_argv((*ARGV, "--download-dir=/models/tiny/cache"), rule, port=4321)
    assert argv == [rule.commands["vllm"], "serve", "/tmp/here/tiny", "--host", "127.0.0.1", "--port", "4321",
                    "--served-model-name", "tiny", "--tensor-parallel-size", "1", "--enforce-eager",
                    "--download-dir=/tmp/here/tiny/cache"]
    with pytest.raises(RealEngineRulesError, match="no local executable for the container command 'python3'"):
        local_argv(("python3", "-m", "sglang.launch_server"), rule, port=1)


def test_bad_rules_name_the_field() -> None:
    with pytest.raises(RealEngineRulesError, match=r"rules\[0\]\.commands"):
        parse_rules({"rules": [{"namespace": "x"}]})
    with pytest.raises(RealEngineRulesError, match=r"unknown fields \['image'\]"):
        parse_rules({"rules": [{"namespace": "x", "commands": {"vllm": "v"}, "image": "y"}]})
    rules = parse_rules({"rules": [{"namespace": "e2e-*", "commands": {"vllm": "/v/bin/vllm"}, "env": {"A": 1}}]})
    assert rules.for_namespace("e2e-abc") is not None and rules.for_namespace("other") is None
    assert rules.rules[0].env == {"A": "1"}


def _pod(namespace: str, name: str, argv: tuple[str, ...] = ARGV, ip: str = "10.0.0.1") -> PodView:
    return PodView(namespace=namespace, name=name, uid=f"uid-{name}", node="gpu-node-0", ip=ip,
                   labels={"app.kubernetes.io/instance": "tiny", "servingtopology.io/role": "aggregated"},
                   argv=argv, container="engine", gpus=1, ready=True)


def _fleet(tmp_path: Path, rule: RealEngineRule, *, at_pod_address: bool = False) -> Fleet:
    from servingtopology.emulator.real_engine import RealEngineRules

    return Fleet(profile=lambda: TrafficProfile.constant(rate_rps=1, input_tokens=100, output_tokens=10),
                 group_label="app.kubernetes.io/instance", role_label="servingtopology.io/role",
                 status_path=tmp_path / "status.json", at_pod_address=at_pod_address,
                 real_engines=lambda: RealEngineRules((rule,)))


def test_a_selected_pod_runs_the_real_process_as_a_scrape_target_and_others_stay_emulated(tmp_path: Path) -> None:
    script = "import os, sys, time\nprint(' '.join(sys.argv[1:]), os.environ['MARK'], flush=True)\ntime.sleep(60)"
    fleet = _fleet(tmp_path, _rule(tmp_path, script))
    try:
        fleet.sync([_pod("real-ns", "a"), _pod("plain", "b", ("vllm", "serve", "llama-3.1-8b"))], {})
        status = json.loads((tmp_path / "status.json").read_text())
        real, emulated = status["instances"]["real-ns/a/uid-a"], status["instances"]["plain/b/uid-b"]
        assert real["backend"] == "real" and emulated["backend"] == "emulated"
        port = real["address"].rsplit(":", 1)[1]
        log = tmp_path / "engine-a.log"
        deadline = time.monotonic() + 20
        while "set" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert f"--host 127.0.0.1 --port {port}" in log.read_text() and "/tmp/here/tiny" in log.read_text()
        (_, instance), = [v for k, v in fleet.instances.items() if k.startswith("real-ns/")]
        pid = instance.pid
    finally:
        fleet.stop()
    assert pid is not None and not Path(f"/proc/{pid}").exists()  # stopped and reaped


def test_a_real_engine_that_exits_is_reported_with_its_status_and_message_and_loses_its_target(tmp_path: Path) -> None:
    script = "import sys\nprint('vllm: error: unrecognized arguments: --tensor-paralel-size', file=sys.stderr)\nsys.exit(2)"
    fleet = _fleet(tmp_path, _rule(tmp_path, script))
    try:
        fleet.sync([_pod("real-ns", "a")], {})
        deadline = time.monotonic() + 20
        while not json.loads((tmp_path / "status.json").read_text())["errors"] and time.monotonic() < deadline:
            time.sleep(0.2)
            fleet.sync([_pod("real-ns", "a")], {})
        status = json.loads((tmp_path / "status.json").read_text())
        message = status["errors"]["real-ns/a/uid-a"]
        assert "exited with status 2" in message and "unrecognized arguments: --tensor-paralel-size" in message
        assert not status["instances"]
        fleet.sync([_pod("real-ns", "a")], {})  # not restarted: the pod keeps its error
        assert not fleet.instances
    finally:
        fleet.stop()


def test_at_the_pods_address_the_real_engine_listens_on_the_pod_ip_and_its_own_port(tmp_path: Path) -> None:
    # As in the e2e cluster: kwok's pod IPs are loopback addresses, and Prometheus scrapes <pod IP>:<engine port>.
    script = "import sys, time\nprint(' '.join(sys.argv[1:]), flush=True)\ntime.sleep(60)"
    fleet = _fleet(tmp_path, _rule(tmp_path, script), at_pod_address=True)
    try:
        fleet.sync([_pod("real-ns", "a", ip="127.64.9.1")], {})
        real = json.loads((tmp_path / "status.json").read_text())["instances"]["real-ns/a/uid-a"]
        assert real["address"] == "127.64.9.1:8000"
        log = tmp_path / "engine-a.log"
        deadline = time.monotonic() + 20
        while "--port" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "--host 127.64.9.1 --port 8000" in log.read_text()
    finally:
        fleet.stop()
