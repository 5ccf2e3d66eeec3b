"""A throw-away CA and a serving certificate for the `kubernetes` Service, made with the
`openssl` command: pods verify the API as in a real cluster, against the service account's
`ca.crt`, at https://kubernetes.default.svc."""

from __future__ import annotations

import subprocess
from pathlib import Path

NAMES = (
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_api_certificates(directory: Path, address: str) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) for the API at `address`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_crt, ca_key = directory / "ca.crt", directory / "ca.key"
    crt, key, csr = directory / "apiserver.crt", directory / "apiserver.key", directory / "csr"
    _openssl("req", "-x509", *_KEY, "-keyout", str(ca_key), "-out", str(ca_crt), "-days", "7",
             "-subj", "/CN=local-cluster-ca",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    _openssl("req", *_KEY, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=kube-apiserver")
    extensions = directory / "apiserver.ext"
    names = ",".join([*(f"DNS:{n}" for n in NAMES), f"IP:{address}"])
    extensions.write_text(
        f"subjectAltName={names}\n"
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "authorityKeyIdentifier=keyid,issuer\n"
        "subjectKeyIdentifier=hash\n"
    )
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key),
             "-CAcreateserial", "-out", str(crt), "-days", "7", "-extfile", str(extensions))
    return ca_crt, crt, key
