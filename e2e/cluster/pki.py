"""The control plane's certificates and keys, made with the `openssl` command for one run.

As kubeadm lays them out: a cluster CA that signs every serving certificate and every client
identity (the API server's, the controller manager's, the scheduler's, the kubelet's and
kube-proxy's, the suite's administrator), an etcd CA of its own, a front-proxy CA for the
API aggregation layer (requests the API server forwards to an aggregated API such as the
custom metrics adapter), and the service-account key pair that signs and checks tokens.
Keys are EC P-256, certificates valid for a week. Nothing here is used outside one run.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

# The names a pod uses for the API server (its certificate must carry them).
API_NAMES = (
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
    "localhost",
)
_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
DAYS = "7"


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {result.stderr.strip()[-500:]}")


@dataclasses.dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path

    def pem(self) -> tuple[bytes, bytes]:
        return self.cert.read_bytes(), self.key.read_bytes()


class Authority:
    """A CA in `directory/<name>.crt|.key` that signs serving and client certificates."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.name = name
        self.cert = directory / f"{name}.crt"
        self.key = directory / f"{name}.key"
        directory.mkdir(parents=True, exist_ok=True)
        _openssl(
            "req",
            "-x509",
            *_KEY,
            "-keyout",
            str(self.key),
            "-out",
            str(self.cert),
            "-days",
            DAYS,
            "-subj",
            f"/CN={name}",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        )

    def issue(
        self,
        name: str,
        common_name: str,
        organizations: tuple[str, ...] = (),
        *,
        server_names: tuple[str, ...] = (),
        client: bool = True,
    ) -> KeyPair:
        """A certificate for `common_name` (groups: `organizations`); with `server_names`
        (DNS names and IP addresses) it also serves TLS under those names."""
        cert, key = self.directory / f"{name}.crt", self.directory / f"{name}.key"
        csr, extensions = self.directory / f"{name}.csr", self.directory / f"{name}.ext"
        subject = "".join(f"/O={o}" for o in organizations) + f"/CN={common_name}"
        _openssl("req", *_KEY, "-keyout", str(key), "-out", str(csr), "-subj", subject)
        usages = (["serverAuth"] if server_names else []) + (["clientAuth"] if client else [])
        lines = [
            "basicConstraints=CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            f"extendedKeyUsage={','.join(usages)}",
            "authorityKeyIdentifier=keyid,issuer",
            "subjectKeyIdentifier=hash",
        ]
        if server_names:
            alt = [f"IP:{n}" if n.replace(".", "").isdigit() else f"DNS:{n}" for n in server_names]
            lines.append(f"subjectAltName={','.join(alt)}")
        extensions.write_text("\n".join(lines) + "\n")
        _openssl(
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(self.cert),
            "-CAkey",
            str(self.key),
            "-CAcreateserial",
            "-out",
            str(cert),
            "-days",
            DAYS,
            "-extfile",
            str(extensions),
        )
        csr.unlink()
        extensions.unlink()
        return KeyPair(cert, key)


@dataclasses.dataclass
class ClusterPki:
    """Every certificate of one control plane, under `directory`."""

    directory: Path
    cluster: Authority
    etcd: Authority
    front_proxy: Authority
    service_account_key: Path
    service_account_pub: Path

    @classmethod
    def create(cls, directory: Path) -> ClusterPki:
        directory.mkdir(parents=True, exist_ok=True)
        key, pub = directory / "sa.key", directory / "sa.pub"
        _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(key))
        _openssl("ec", "-in", str(key), "-pubout", "-out", str(pub))
        return cls(
            directory,
            Authority(directory, "ca"),
            Authority(directory / "etcd", "etcd-ca"),
            Authority(directory, "front-proxy-ca"),
            key,
            pub,
        )
