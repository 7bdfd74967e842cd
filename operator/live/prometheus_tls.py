"""The TLS of the operator's Prometheus client: one verifying `ssl.SSLContext` from spec.metrics.tls's PEM text.

Called by operator/live/metrics.py (`PrometheusMetrics`, once per read) with the `TlsMaterial` operator/live_replan.py
read from the resource's Secret or ConfigMap; the context goes to operator/live/prometheus_http.py, whose urllib3
connection to the checked address verifies with it. Must not read the cluster, and never turns verification off.

VerifiedAlways: CERT_REQUIRED, the URL's host checked against the certificate's names (an IP address against its IP
names), TLS 1.2 at least; `ca` replaces the system's CAs (a private CA's Prometheus is trusted for that CA only).
ConfigNamed: PEM text that cannot be loaded is `TlsConfigInvalid` naming the field (spec.metrics.tls.ca, .cert, .key)
and what is wrong with it (no certificate, an encrypted key, a key that is not the certificate's), never ssl's text.
A client key is handed to OpenSSL through a file in a private temporary folder (0700, the file 0600), removed at once:
`SSLContext.load_cert_chain` reads files only.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TlsMaterial", "TlsConfigInvalid", "client_context", "MAX_PEM_BYTES", "CA_FIELD", "CERT_FIELD", "KEY_FIELD"]

MAX_PEM_BYTES = 256 << 10      # one PEM item: a CA bundle of a few hundred certificates
CA_FIELD = "spec.metrics.tls.ca"
CERT_FIELD = "spec.metrics.tls.cert"
KEY_FIELD = "spec.metrics.tls.key"


class TlsConfigInvalid(ValueError):
    """spec.metrics.tls's PEM text cannot be used; `field` names which (ConfigNamed)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True, slots=True)
class TlsMaterial:
    """The PEM text of spec.metrics.tls, as read from the cluster: the CA bundle, and the client certificate and key."""

    ca_pem: str
    cert_pem: str | None = None
    key_pem: str | None = None

    def __repr__(self) -> str:      # never the key in a log line
        return f"TlsMaterial(ca={len(self.ca_pem)} chars, client certificate={'yes' if self.cert_pem else 'no'})"


def _checked(field: str, text: str, marker: str) -> str:
    if len(text.encode("utf-8", "replace")) > MAX_PEM_BYTES:
        raise TlsConfigInvalid(field, f"over {MAX_PEM_BYTES >> 10} KiB of PEM text")
    if f"-----BEGIN {marker}" not in text and not (marker == "PRIVATE KEY" and "PRIVATE KEY-----" in text):
        raise TlsConfigInvalid(field, f"holds no PEM {marker.lower()} (-----BEGIN {marker}...)")
    return text


def client_context(material: TlsMaterial) -> ssl.SSLContext:
    """A client context that trusts `material.ca_pem` only and shows the client certificate when one is given
    (VerifiedAlways); TlsConfigInvalid naming the field otherwise (ConfigNamed)."""
    ca = _checked(CA_FIELD, material.ca_pem, "CERTIFICATE")
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca)
    except (ssl.SSLError, ValueError):
        raise TlsConfigInvalid(CA_FIELD, "is not a PEM CA certificate bundle that can be loaded") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    if material.cert_pem is None and material.key_pem is None:
        return context
    if material.cert_pem is None or material.key_pem is None:
        missing = CERT_FIELD if material.cert_pem is None else KEY_FIELD
        raise TlsConfigInvalid(missing, "a client certificate needs both cert and key")
    cert = _checked(CERT_FIELD, material.cert_pem, "CERTIFICATE")
    key = _checked(KEY_FIELD, material.key_pem, "PRIVATE KEY")
    if "ENCRYPTED" in key:
        raise TlsConfigInvalid(KEY_FIELD, "is an encrypted private key; give it unencrypted (the Secret protects it)")
    with tempfile.TemporaryDirectory(prefix="stopo-tls-") as folder:
        cert_path, key_path = Path(folder) / "cert.pem", Path(folder) / "key.pem"
        for path, text in ((cert_path, cert), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
        try:
            context.load_cert_chain(cert_path, key_path, password=lambda: b"")
        except ssl.SSLError as exc:
            why = str(exc.reason or "")
            if "KEY_VALUES_MISMATCH" in why:
                raise TlsConfigInvalid(KEY_FIELD, "is not the private key of spec.metrics.tls.cert's certificate") from None
            field = CERT_FIELD if "PEM" in why and "CERT" in why.upper() and "KEY" not in why.upper() else KEY_FIELD
            raise TlsConfigInvalid(field, f"cannot be loaded with the other ({why or 'not PEM'})") from None
    return context
