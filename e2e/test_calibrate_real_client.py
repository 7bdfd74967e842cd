"""A real benchmark client calibrates a ServingTopology (issue #27, the real parts): `vllm bench serve` (vLLM's CPU build,
the cached engine environment) drives the real vLLM engine serving the tiny Llama behind a Pinned resource's rendered pod
at two request rates and writes its own --save-result files; `servingtopology calibrate` reads them and writes CAL.yaml; a
ConfigMap holds it; a DryRun ServingTopology of the same deployment naming it (spec.calibration) is planned with it:
status shows the calibration applied, its provenance (ConfigMap, resourceVersion, the file's sha256, the bench files' own
sha256) and the calibrated figures beside the uncalibrated ones. A calibration `calibrate` made for another model (the
same bench files, the spec's model Llama-3.1-8B served as tiny-llama) is refused: Calibrated=False OtherModel, one
CalibrationRejected Event, and the proposal stays exactly as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from .cluster import LocalCluster
from .conftest import Kube
from .objects import topology
from .processes import wait_until
from .real_engine import ENGINE_ENV, MODEL_IN_IMAGE, SERVED_NAME, serve_tiny_llama, tiny_llama_spec
from .stack import Emulator, Operator

# The real vLLM engine (3.2 GB, CPU-bound while it starts): one worker runs both real-engine modules (e2e/conftest.py).
pytestmark = pytest.mark.xdist_group("vllm")

RATES_RPS = (2, 8)
PROMPTS = 24   # per rate: 12 s at 2 req/s, 3 s at 8 req/s


def _bench(engine_python: Path, address: str, tokenizer: Path, out: Path, rate: int) -> Path:
    """One `vllm bench serve` run at `rate`, its result saved by the client itself."""
    name = f"vllm-bench-rate{rate}.json"
    done = subprocess.run(
        [str(engine_python.with_name("vllm")), "bench", "serve", "--backend", "vllm", "--base-url", f"http://{address}",
         "--model", SERVED_NAME, "--tokenizer", str(tokenizer), "--dataset-name", "random", "--random-input-len", "16",
         "--random-output-len", "8", "--ignore-eos", "--num-prompts", str(PROMPTS), "--request-rate", str(rate), "--seed", "7",
         "--save-result", "--result-dir", str(out), "--result-filename", name, "--percentile-metrics", "ttft,tpot,itl,e2el",
         "--metric-percentiles", "50,90,99"],
        capture_output=True, text=True, timeout=300, check=False, cwd=out, env={**os.environ, **ENGINE_ENV})
    assert done.returncode == 0, f"vllm bench serve at {rate} req/s failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return out / name


def _calibrate(spec: str, results: list[Path], out: Path, work: Path) -> dict[str, Any]:
    spec_file = work / f"{out.stem}-spec.yaml"
    spec_file.write_text(spec)
    done = subprocess.run([sys.executable, "-m", "servingtopology", "calibrate", *map(str, results), "--spec", str(spec_file),
                           "--out", str(out), "--json"], capture_output=True, text=True, timeout=300, check=False, cwd=work)
    assert done.returncode == 0, f"calibrate failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return dict(json.loads(done.stdout))


def _deployment_spec(model: str) -> str:
    """The deployment the bench files measured, as `calibrate --spec` takes it: `model` lines, the pinned 1×TP1."""
    return (f"{model}servedModelName: {SERVED_NAME}\nmodelSource: {MODEL_IN_IMAGE}\n"
            "engine: {name: vllm, version: '0.32.0'}\nhardware: {gpu: h100_sxm, maxGPUs: 1}\n"
            "workload: {arrivalRate: 2, inputTokens: 16, outputTokens: 8}\nslo: {ttftMs: {p95: 1000}, tpotMs: {p95: 50}}\n"
            "layout: {kind: replicas, replicas: 1, tp: 1}\nsimulation: {requests: 200}\n")


@pytest.mark.e2e_seconds(112)
def test_vllm_bench_results_calibrate_a_serving_topology_and_another_models_calibration_changes_nothing(
        cluster: LocalCluster, operator: Operator, emulator: Emulator, kube: Kube, namespace: str,
        engine_python: Path, tiny_model: Path, tmp_path: Path) -> None:
    t0 = time.monotonic()
    engine = serve_tiny_llama(cluster, operator, emulator, kube, namespace, engine_python=engine_python, tiny_model=tiny_model,
                              name="tiny")
    t_engine = time.monotonic()

    # 1. The real client at two rates, writing its own result files.
    results = [_bench(engine_python, engine.address, tiny_model, tmp_path, rate) for rate in RATES_RPS]
    t_bench = time.monotonic()
    for path, rate in zip(results, RATES_RPS, strict=True):
        saved = json.loads(path.read_text())
        assert saved["completed"] == PROMPTS and saved["request_rate"] == rate and saved["model_id"] == SERVED_NAME, saved
        assert saved["mean_ttft_ms"] > 0 and saved["mean_tpot_ms"] > 0

    # 2. calibrate reads them (the deployment: the tiny Llama's config.json, served as tiny-llama, on an H100 by vLLM 0.32).
    cal_path = tmp_path / "cal.yaml"
    fitted = _calibrate(_deployment_spec(f"modelConfig: {tiny_model / 'config.json'}\n"), results, cal_path, tmp_path)
    assert fitted["fit"]["points_used"] == 2 and fitted["deployment"]["model"] == SERVED_NAME
    assert sorted(s["sha256"] for s in fitted["sources"]) == sorted(hashlib.sha256(p.read_bytes()).hexdigest() for p in results)
    assert {s["tool"] for s in fitted["sources"]} == {"vllm bench serve"}
    cal_bytes = cal_path.read_bytes()
    # the same files, for another model (Llama-3.1-8B served under the tiny model's name): what calibrate writes for it
    other_path = tmp_path / "other-cal.yaml"
    other = _calibrate(_deployment_spec("model: meta-llama/Llama-3.1-8B-Instruct\n"), results, other_path, tmp_path)
    assert other["deployment"]["model"] != SERVED_NAME
    t_cal = time.monotonic()

    # 3. ConfigMaps hold them; 4. a DryRun ServingTopology of the same deployment names the first.
    for cm, path in (("tiny-cal", cal_path), ("other-cal", other_path)):
        cluster.kubectl("create", "configmap", cm, "-n", namespace, f"--from-file=calibration.yaml={path}")
    version = kube.get("configmaps", namespace, "tiny-cal")["metadata"]["resourceVersion"]
    name = "tiny-plan"
    obj = topology(name, namespace, prometheus_url=None, mode="DryRun", max_gpus=1, arrival_rate=2, input_tokens=16, output_tokens=8)
    tiny_llama_spec(obj["spec"])["calibration"] = {"name": "tiny-cal"}
    obj["spec"]["slo"] = {"ttftMs": {"p95": 1000}, "tpotMs": {"p95": 50}}
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(obj))
    applied = kube.wait_condition(namespace, name, "Calibrated", "True", timeout_s=120, log=operator.log_tail)

    def proposal() -> dict[str, Any]:
        return dict(kube.topology(namespace, name).get("status", {}).get("proposal") or {})

    wait_until(lambda: bool(proposal().get("uncalibrated")), timeout_s=120, what="the calibrated proposal",
               on_timeout=lambda: json.dumps(kube.topology(namespace, name).get("status", {}), indent=1)[-3000:] + operator.log_tail())
    status = kube.topology(namespace, name)["status"]
    first = status["proposal"]
    source = status["calibrationSource"]
    sha = hashlib.sha256(cal_bytes).hexdigest()
    assert source["applied"] is True and source["reason"] == "CalibrationApplied", source
    assert (source["configMap"], source["key"], source["resourceVersion"], source["sha256"]) == ("tiny-cal", "calibration.yaml", version, sha)
    assert sorted(s.rsplit(" ", 1)[1] for s in source["sources"]) == sorted(s["sha256"][:12] for s in fitted["sources"])
    assert first["calibrationSha256"] == sha and f"resourceVersion {version}" in applied["message"]
    cal, uncal = first["predicted"], first["uncalibrated"]
    # A CPU engine measured against an H100 model: the fitted factors slow the prediction (bounded at ×2 per term).
    assert cal["ttftMs"] > uncal["ttftMs"] > 0 and cal["tpotMs"] > uncal["tpotMs"] > 0, (cal, uncal)
    print(f"\ncalibrated vs uncalibrated {first['layout']}: p95 TTFT {cal['ttftMs']} vs {uncal['ttftMs']} ms, TPOT {cal['tpotMs']} vs "
          f"{uncal['tpotMs']} ms; factors {source['factors']}; measured mean TTFT "
          f"{[round(p['ttft_ms'], 2) for p in fitted['points']]} ms, TPOT {[round(p['tpot_ms'], 2) for p in fitted['points']]} ms")

    # 5. The other model's calibration: refused by name, and nothing changes.
    proposals_before = kube.events(namespace, reason="PlanProposed")
    cluster.kubectl("patch", "stopo", name, "-n", namespace, "--type=merge", "-p", json.dumps({"spec": {"calibration": {"name": "other-cal"}}}))
    refused = kube.wait_condition(namespace, name, "Calibrated", "False", timeout_s=120, log=operator.log_tail)
    assert refused["reason"] == "OtherModel" and "spec.calibration" in refused["message"], refused
    status = kube.topology(namespace, name)["status"]
    planned = next(c for c in status["conditions"] if c["type"] == "Planned")
    assert planned["status"] == "False" and planned["reason"] == "CalibrationRejected", planned
    assert status["proposal"] == first, (status["proposal"], first)
    assert status["calibrationSource"]["applied"] is False and status["calibrationSource"]["sha256"] == hashlib.sha256(
        other_path.read_bytes()).hexdigest()
    wait_until(lambda: len(kube.events(namespace, reason="CalibrationRejected")) == 1, timeout_s=30, what="one CalibrationRejected Event")
    assert len(kube.events(namespace, reason="PlanProposed")) == len(proposals_before)
    done = time.monotonic()
    print(f"wall: engine {t_engine - t0:.0f} s, two vllm bench runs {t_bench - t_engine:.0f} s, two calibrate runs "
          f"{t_cal - t_bench:.0f} s, operator plan and refusal {done - t_cal:.0f} s; total {done - t0:.0f} s")
