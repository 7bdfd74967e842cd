"""Certificates and kubeconfigs for the local control plane, made with the `openssl` command.

Owns a throwaway CA, the API server's serving certificate (for 127.0.0.1), an admin client certificate in
`system:masters`, the service-account signing key pair, and kubeconfig files (e2e/cluster.py); and a private CA with
a serving and a client certificate for a TLS Prometheus (`make_serving_pki`: e2e and the operator's TLS tests).
Must not be used for anything but a loopback test cluster: keys are unencrypted and short-lived.
"""

from __future__ import annotations

import base64
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

_DAYS = "3"


@dataclass(frozen=True, slots=True)
class Pki:
    """Paths of every file the control plane needs."""

    ca_crt: Path
    ca_key: Path
    server_crt: Path
    server_key: Path
    admin_crt: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _signed(cwd: Path, name: str, subject: str, extensions: str) -> None:
    """Makes `name.key` and `name.crt`, signed by the CA in `cwd`, with the given v3 extensions."""
    _openssl("genrsa", "-out", f"{name}.key", "2048", cwd=cwd)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=cwd)
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", _DAYS, "-sha256", "-extfile", f"{name}.ext", "-out", f"{name}.crt",
        cwd=cwd,
    )


def make_pki(folder: Path) -> Pki:
    """Creates a CA, a serving certificate for 127.0.0.1, an admin client certificate and the SA key pair."""
    folder.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", _DAYS, "-subj", "/CN=servingtopology-e2e-ca", cwd=folder)
    _signed(
        folder, "server", "/CN=kube-apiserver",
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n",
    )
    _signed(
        folder, "admin", "/O=system:masters/CN=servingtopology-e2e-admin",
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n",
    )
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=folder)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=folder)
    return Pki(
        ca_crt=folder / "ca.crt", ca_key=folder / "ca.key",
        server_crt=folder / "server.crt", server_key=folder / "server.key",
        admin_crt=folder / "admin.crt", admin_key=folder / "admin.key",
        sa_key=folder / "sa.key", sa_pub=folder / "sa.pub",
    )


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, *, server_url: str, ca_crt: Path, user: dict[str, str], user_name: str) -> Path:
    """Writes a one-context kubeconfig; `user` is the kubeconfig user block (client cert data or a token)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": server_url, "certificate-authority-data": _b64(ca_crt)}}],
        "users": [{"name": user_name, "user": user}],
        "contexts": [{"name": user_name, "context": {"cluster": "e2e", "user": user_name, "namespace": "default"}}],
        "current-context": user_name,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


def admin_kubeconfig(path: Path, *, server_url: str, pki: Pki) -> Path:
    """Writes the kubeconfig of the `system:masters` admin."""
    user = {"client-certificate-data": _b64(pki.admin_crt), "client-key-data": _b64(pki.admin_key)}
    return write_kubeconfig(path, server_url=server_url, ca_crt=pki.ca_crt, user=user, user_name="admin")


def token_kubeconfig(path: Path, *, server_url: str, ca_crt: Path, token: str, user_name: str) -> Path:
    """Writes a kubeconfig that authenticates with a bearer token (a ServiceAccount's, for RBAC checks)."""
    return write_kubeconfig(path, server_url=server_url, ca_crt=ca_crt, user={"token": token}, user_name=user_name)


@dataclass(frozen=True, slots=True)
class ServingPki:
    """A private CA and what a TLS server and its client need (PEM files): the server's certificate for 127.0.0.1 and
    localhost, a client certificate, and a second CA that signed neither (the wrong-CA case)."""

    ca_crt: Path
    server_crt: Path
    server_key: Path
    client_crt: Path
    client_key: Path
    other_ca_crt: Path


def make_serving_pki(folder: Path, *, common_name: str = "prometheus") -> ServingPki:
    """Creates the files of `ServingPki` in `folder` (EC P-256 keys: fast to make)."""
    folder.mkdir(parents=True, exist_ok=True)
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{ca}.key",
                 "-out", f"{ca}.crt", "-days", _DAYS, "-subj", f"/CN=servingtopology-test-{ca}", cwd=folder)
    for name, subject, extensions in (
        ("server", f"/CN={common_name}", "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
                                         "subjectAltName=IP:127.0.0.1,DNS:localhost\n"),
        ("client", "/CN=servingtopology-operator", "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n"
                                                  "extendedKeyUsage=clientAuth\n"),
    ):
        _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", f"{name}.key", cwd=folder)
        _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=folder)
        (folder / f"{name}.ext").write_text(extensions)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", _DAYS,
                 "-sha256", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=folder)
    return ServingPki(ca_crt=folder / "ca.crt", server_crt=folder / "server.crt", server_key=folder / "server.key",
                      client_crt=folder / "client.crt", client_key=folder / "client.key", other_ca_crt=folder / "other-ca.crt")
