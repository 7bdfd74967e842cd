"""spec.calibration in the reconcile (operator/calibration_source.py): a ConfigMap holding the CAL.yaml `servingtopology
calibrate` wrote from the real `vllm bench serve` files of tests/data/calibration, applied to the plan with its provenance
and the uncalibrated figures beside; refused calibrations name their reason and field and change nothing. The planner is
the real `decide` (no simulator), so the calibrated and uncalibrated figures are the model's own."""

from __future__ import annotations

import copy
import hashlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_cluster import FakeCluster

from servingtopology.cli.main import main
from servingtopology.operator.cluster.cluster import ObjectRef
from servingtopology.operator.cluster.plan_worker import PlanPending
from servingtopology.operator.reconcile import Outcome, reconcile
from servingtopology.planner.problem import Decision, Problem
from servingtopology.planner.search.decide import decide

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "calibration"
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
CAL_REF = ObjectRef("v1", "ConfigMap", "default", "tiny-cal")


@pytest.fixture(scope="module")
def cal_text(tmp_path_factory: pytest.TempPathFactory) -> str:
    """`servingtopology calibrate` of the two real vllm bench files, for the tiny Llama on an H100, vLLM 0.32.0."""
    tmp = tmp_path_factory.mktemp("cal")
    spec = tmp / "tiny.yaml"
    spec.write_text(f"modelConfig: {DATA / 'tiny-llama-config.json'}\nservedModelName: tiny-llama\nmodelSource: /models/tiny-llama\n"
                    "engine: {name: vllm, version: '0.32.0'}\nhardware: {gpu: h100_sxm, maxGPUs: 1}\n"
                    "workload: {arrivalRate: 2, inputTokens: 16, outputTokens: 8}\nslo: {ttftMs: {p95: 500}, tpotMs: {p95: 50}}\n"
                    "layout: {kind: replicas, replicas: 1, tp: 1}\nsimulation: {requests: 200}\n")
    out = tmp / "cal.yaml"
    bench = [str(DATA / "vllm-bench-rate2.json"), str(DATA / "vllm-bench-rate8.json")]
    assert main(["calibrate", *bench, "--spec", str(spec), "--out", str(out)]) == 0
    return out.read_text()


class Planner:
    """The real planner, keeping every Problem it was given."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def __call__(self, problem: Problem) -> Decision:
        self.problems.append(problem)
        return decide(problem)


def tiny(mode: str = "DryRun", *, calibration: dict[str, str] | None = None) -> dict[str, Any]:
    obj = yaml.safe_load((ROOT / "examples" / "servingtopology.yaml").read_text())
    obj["metadata"] |= {"uid": "uid-1", "generation": 1}
    spec = obj["spec"]
    del spec["model"], spec["metrics"]
    spec |= {"modelConfigMap": {"name": "tiny-config"}, "modelSource": "/models/tiny-llama", "servedModelName": "tiny-llama",
             "engine": {"name": "vllm", "image": "vllm/vllm-openai:v0.32.0"},
             "workload": {"arrivalRate": 2, "inputTokens": 16, "outputTokens": 8}, "slo": {"ttftMs": {"p95": 500}, "tpotMs": {"p95": 50}}}
    spec["hardware"]["maxGPUs"] = 1
    spec["policy"]["mode"] = mode
    if calibration is not None:
        spec["calibration"] = calibration
    return obj


def cluster_with(cal: str | None, *, namespace: str = "default", key: str = "calibration.yaml") -> FakeCluster:
    cluster = FakeCluster()
    cluster.config_maps[("default", "tiny-config")] = {"config.json": (DATA / "tiny-llama-config.json").read_text()}
    if cal is not None:
        cluster.objects[ObjectRef("v1", "ConfigMap", namespace, "tiny-cal")] = {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "tiny-cal", "namespace": namespace, "resourceVersion": "42"},
            "data": {key: cal}}
    return cluster


def run(obj: dict[str, Any], cluster: FakeCluster, planner: Planner, *, minutes: int = 0) -> Outcome:
    out = reconcile(copy.deepcopy(obj), cluster=cluster, planner=planner, now=T0 + timedelta(minutes=minutes))
    obj["status"] = {k: v for k, v in out.status.items() if v is not None}
    return out


def cond(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in obj["status"].get("conditions", []) if c["type"] == kind), None)


def test_a_named_calibration_plans_with_its_factors_and_shows_its_provenance_and_the_uncalibrated_figures(cal_text: str) -> None:
    obj, cluster, planner = tiny(calibration={"name": "tiny-cal"}), cluster_with(cal_text), Planner()
    run(obj, cluster, planner)
    cal = yaml.safe_load(cal_text)
    moved = {t: f for t, f in cal["factors"].items() if f != 1.0}
    assert moved and dict(planner.problems[0].factors) == pytest.approx(moved)
    source = obj["status"]["calibrationSource"]
    assert source["applied"] is True and source["reason"] == "CalibrationApplied"
    assert (source["configMap"], source["key"], source["resourceVersion"]) == ("tiny-cal", "calibration.yaml", "42")
    assert source["sha256"] == hashlib.sha256(cal_text.encode()).hexdigest()
    assert source["deployment"]["model"] == "tiny-llama" and source["pointsUsed"] == 2
    # the result files it was fitted on: the tool (vllm bench serve records no version of itself) and each file's sha256
    shas = {s["sha256"][:12] for s in cal["sources"]}
    assert sorted(s.rsplit(" ", 1)[1] for s in source["sources"]) == sorted(shas)
    assert all(s.startswith("vllm bench serve sha256 ") for s in source["sources"])
    applied = cond(obj, "Calibrated")
    assert applied is not None and applied["status"] == "True" and "resourceVersion 42" in applied["message"]
    proposal = obj["status"]["proposal"]
    assert proposal["calibrationSha256"] == source["sha256"]
    # The calibration of a CPU engine slows every term it moves: the calibrated TTFT is above the uncalibrated one.
    assert proposal["predicted"]["ttftMs"] > proposal["uncalibrated"]["ttftMs"] > 0
    # The uncalibrated figures are what the same resource is planned at without spec.calibration.
    plain = tiny()
    run(plain, cluster_with(None), Planner())
    assert plain["status"]["proposal"]["layout"] == proposal["layout"]
    assert plain["status"]["proposal"]["predicted"] == proposal["uncalibrated"]
    assert "uncalibrated" not in plain["status"]["proposal"] and "calibrationSource" not in plain["status"]
    assert [e.reason for e in cluster.events].count("CalibrationApplied") == 1


def _edit(cal_text: str, path: str, value: Any) -> str:
    doc = yaml.safe_load(cal_text)
    node = doc
    *head, last = path.split(".")
    for k in head:
        node = node[k]
    node[last] = value
    return yaml.safe_dump(doc)


@pytest.mark.parametrize("edit, reason, field", [
    # a calibration of another model, GPU, engine or engine release than the resource's
    (lambda t: _edit(t, "deployment.model", "Qwen/Qwen3-32B"), "OtherModel", "deployment"),
    (lambda t: _edit(t, "deployment.gpu", "a100_80g"), "OtherGpu", "deployment"),
    (lambda t: _edit(t, "deployment.engine", "sglang"), "OtherEngine", "deployment"),
    (lambda t: _edit(t, "deployment.release", "0.11.0"), "OtherRelease", "deployment"),
    # fitted on fewer points than its own minimum
    (lambda t: _edit(t, "fit.points_used", 1), "TooFewPoints", "fit.points_used"),
    # a factor that is not a finite number
    (lambda t: _edit(t, "factors.gemm", float("nan")), "NonFinite", "factors.gemm"),
    # not a calibration file at all
    (lambda t: "kind: Deployment\n", "InvalidCalibration", "spec.calibration"),
    (lambda t: "factors: [unclosed\n", "InvalidCalibration", "not UTF-8 YAML"),
])
def test_a_refused_calibration_names_its_reason_and_field_and_nothing_is_planned(cal_text: str, edit: Any, reason: str,
                                                                                  field: str) -> None:
    obj, cluster, planner = tiny(calibration={"name": "tiny-cal"}), cluster_with(edit(cal_text)), Planner()
    out = run(obj, cluster, planner)
    run(obj, cluster, planner, minutes=1)
    calibrated = cond(obj, "Calibrated")
    assert calibrated is not None and (calibrated["status"], calibrated["reason"]) == ("False", reason)
    assert "spec.calibration" in calibrated["message"] and field in calibrated["message"]
    planned = cond(obj, "Planned")
    assert planned is not None and (planned["status"], planned["reason"]) == ("False", "CalibrationRejected")
    assert out.error == "CalibrationRejected" and planner.problems == [] and "proposal" not in obj["status"]
    assert obj["status"]["calibrationSource"]["applied"] is False and obj["status"]["calibrationSource"]["reason"] == reason
    assert [e.reason for e in cluster.events] == ["CalibrationRejected"]   # one Warning, not one per pass


@pytest.mark.parametrize("namespace, key, what", [
    ("other", "calibration.yaml", "does not exist"),      # the same name in another namespace is never read
    ("default", "cal.yaml", "has no key 'calibration.yaml'"),
])
def test_a_missing_configmap_or_key_is_calibration_not_found(cal_text: str, namespace: str, key: str, what: str) -> None:
    obj, cluster, planner = tiny(calibration={"name": "tiny-cal"}), cluster_with(cal_text, namespace=namespace, key=key), Planner()
    run(obj, cluster, planner)
    calibrated = cond(obj, "Calibrated")
    assert calibrated is not None and calibrated["reason"] == "CalibrationNotFound" and what in calibrated["message"]
    assert {r.namespace for r in cluster.reads if r.kind == "ConfigMap"} == {"default"} and planner.problems == []


def test_switching_to_another_models_calibration_changes_nothing_running(cal_text: str) -> None:
    obj, cluster, planner = tiny("Auto", calibration={"name": "tiny-cal"}), cluster_with(cal_text), Planner()
    run(obj, cluster, planner)
    plan, objects = copy.deepcopy(obj["status"]["plan"]), copy.deepcopy(cluster.objects)
    assert plan["uncalibrated"] and plan["calibrationSha256"]
    cluster.objects[ObjectRef("v1", "ConfigMap", "default", "qwen-cal")] = {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "qwen-cal", "namespace": "default", "resourceVersion": "43"},
        "data": {"calibration.yaml": _edit(cal_text, "deployment.model", "Qwen/Qwen3-32B")}}
    obj["spec"]["calibration"] = {"name": "qwen-cal"}
    obj["metadata"]["generation"] = 2
    run(obj, cluster, planner, minutes=1)
    calibrated = cond(obj, "Calibrated")
    assert calibrated is not None and calibrated["reason"] == "OtherModel" and "Qwen3-32B" in calibrated["message"]
    assert obj["status"]["plan"] == plan and len(planner.problems) == 1
    other = cluster.objects[ObjectRef("v1", "ConfigMap", "default", "qwen-cal")]["data"]["calibration.yaml"]
    source = obj["status"]["calibrationSource"]   # what was read of the refused file, not the applied one's
    assert (source["applied"], source["resourceVersion"], source["sha256"]) == (False, "43", hashlib.sha256(other.encode()).hexdigest())
    # The ConfigMap gone: nothing of a file remains in status (explicit nulls: the status is written as a merge patch).
    del cluster.objects[ObjectRef("v1", "ConfigMap", "default", "qwen-cal")]
    run(obj, cluster, planner, minutes=2)
    source = obj["status"]["calibrationSource"]
    assert source["reason"] == "CalibrationNotFound" and source["sha256"] is None and source["pointsUsed"] is None
    assert all(v is None for v in source["factors"].values()) and obj["status"]["plan"] == plan
    assert {r: o for r, o in cluster.objects.items() if r.kind != "ConfigMap"} == {r: o for r, o in objects.items() if r.kind != "ConfigMap"}


def test_dropping_spec_calibration_drops_its_condition_and_source(cal_text: str) -> None:
    obj, cluster, planner = tiny(calibration={"name": "tiny-cal"}), cluster_with(cal_text), Planner()
    run(obj, cluster, planner)
    assert cond(obj, "Calibrated") is not None
    del obj["spec"]["calibration"]
    obj["metadata"]["generation"] = 2
    run(obj, cluster, planner, minutes=1)
    assert cond(obj, "Calibrated") is None and "calibrationSource" not in obj["status"]
    # written as explicit nulls: the status is a merge patch, which would keep the first proposal's figures otherwise
    assert planner.problems[-1].factors == () and obj["status"]["proposal"]["uncalibrated"] is None
    assert obj["status"]["proposal"]["calibrationSha256"] is None


def test_a_pass_that_waits_for_its_plan_posts_calibration_applied_once(cal_text: str) -> None:
    class PendingOnce(Planner):
        """The worker's first answer: the plan still runs (the pass stops, writes no status, and runs again)."""

        def __call__(self, problem: Problem) -> Decision:
            if not self.problems:
                self.problems.append(problem)
                raise PlanPending(running_s=0.0, queued_ahead=-1, retry_after_s=1.0)
            return super().__call__(problem)

    obj, cluster, planner = tiny(calibration={"name": "tiny-cal"}), cluster_with(cal_text), PendingOnce()
    with pytest.raises(PlanPending):
        run(obj, cluster, planner)
    run(obj, cluster, planner, minutes=1)
    assert [e.reason for e in cluster.events].count("CalibrationApplied") == 1 and obj["status"]["proposal"]["uncalibrated"]
