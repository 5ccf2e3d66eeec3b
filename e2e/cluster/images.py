"""The images the e2e node runs, and getting them into its containerd.

- The product's images: `make images` (scripts/build-images.py) builds docker/'s Dockerfiles
  into OCI archives, `.tools/images/<name>.tar`, tagged `voxfleet-<name>:e2e`.
- The node's own: the pod sandbox (`pause`, tools/pause) and cluster DNS (`coredns`, built
  from its Go module), each one static binary that `make setup` puts in .tools/bin. They are
  written here as single-layer OCI archives, keyed by the binary's digest.

`import_images()` imports an archive into containerd's `k8s.io` namespace (where the CRI
plugin, and so the kubelet, finds images) unless containerd already holds that exact
manifest, so a second run imports nothing.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGE_DIR = ROOT / ".tools" / "images"
BIN_DIR = ROOT / ".tools" / "bin"
TAG = "e2e"
# The product's images, by `make images`' name.
PRODUCT_IMAGES = ("operator", "speech-api", "triton-cpu")
PAUSE_IMAGE = f"localhost/voxfleet-pause:{TAG}"
COREDNS_IMAGE = f"localhost/voxfleet-coredns:{TAG}"


@dataclass(frozen=True)
class Archive:
    name: str  # as a pod names it: voxfleet-operator:e2e, localhost/voxfleet-pause:e2e
    path: Path

    @property
    def reference(self) -> str:
        """containerd's name for it (Docker Hub's library for a bare name, as the CRI's)."""
        first = self.name.split("/", 1)[0]
        if "/" in self.name and ("." in first or ":" in first or first == "localhost"):
            return self.name
        return f"docker.io/library/{self.name}"

    def manifest_digest(self) -> str:
        with tarfile.open(self.path) as tar:
            member = tar.extractfile("index.json")
            assert member is not None, f"{self.path} has no index.json: not an OCI archive"
            index = json.load(member)
        return str(index["manifests"][0]["digest"])


def missing_product_images(image_dir: Path = IMAGE_DIR) -> list[str]:
    return [name for name in PRODUCT_IMAGES if not (image_dir / f"{name}.tar").is_file()]


def product_archives(image_dir: Path = IMAGE_DIR) -> list[Archive]:
    return [Archive(f"voxfleet-{n}:{TAG}", image_dir / f"{n}.tar") for n in PRODUCT_IMAGES]


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def binary_image(binary: Path, name: str, out: Path, user: str = "65532:65532") -> Archive:
    """A single-layer OCI archive holding `binary` as /<its name>, its entrypoint."""
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()[:16]
    path = out / f"{binary.name}-{digest}.tar"
    archive = Archive(name, path)
    if path.is_file():
        return archive
    layer_buffer = io.BytesIO()
    with tarfile.open(fileobj=layer_buffer, mode="w", format=tarfile.PAX_FORMAT) as layer:
        info = layer.gettarinfo(str(binary), arcname=binary.name)
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        with binary.open("rb") as stream:
            layer.addfile(info, stream)
    layer_bytes = layer_buffer.getvalue()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": [f"/{binary.name}"], "User": user},
            "rootfs": {"type": "layers", "diff_ids": [_sha256(layer_bytes)]},
        }
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": _sha256(config),
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": _sha256(layer_bytes),
                    "size": len(layer_bytes),
                }
            ],
        }
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": _sha256(manifest),
                    "size": len(manifest),
                    "annotations": {"org.opencontainers.image.ref.name": archive.reference},
                }
            ],
        }
    ).encode()
    out.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    with tarfile.open(partial, "w") as tar:
        for member_name, data in (
            ("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
            ("index.json", index),
            *(
                (f"blobs/sha256/{_sha256(blob)[7:]}", blob)
                for blob in (layer_bytes, config, manifest)
            ),
        ):
            info = tarfile.TarInfo(member_name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    partial.replace(path)
    return archive


def node_archives(bin_dir: Path = BIN_DIR, image_dir: Path = IMAGE_DIR) -> list[Archive]:
    return [
        binary_image(bin_dir / "pause", PAUSE_IMAGE, image_dir / "node"),
        binary_image(bin_dir / "coredns", COREDNS_IMAGE, image_dir / "node"),
    ]


def held_images(ctr: list[str]) -> dict[str, str]:
    """containerd's images in `k8s.io`: reference -> manifest (or index) digest."""
    listing = subprocess.run(
        [*ctr, "-n", "k8s.io", "images", "ls"], capture_output=True, text=True, check=True
    ).stdout
    held = {}
    for line in listing.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 3:
            held[fields[0]] = fields[2]
    return held


def import_images(ctr: list[str], archives: list[Archive]) -> list[str]:
    """Import each archive whose manifest containerd does not hold under its name; return
    the names imported."""
    held = held_images(ctr)
    imported = []
    for archive in archives:
        if held.get(archive.reference) == archive.manifest_digest():
            continue
        result = subprocess.run(
            [
                *ctr,
                "-n",
                "k8s.io",
                "images",
                "import",
                str(archive.path),
            ],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"ctr images import {archive.path} failed: {result.stderr.strip()[-800:]}"
            )
        imported.append(archive.name)
    return imported
