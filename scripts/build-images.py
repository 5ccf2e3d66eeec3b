#!/usr/bin/env python3
"""`make images`: the images of docker/ built without Docker, as OCI archives.

    python3 scripts/build-images.py [--out .tools/images] [NAME ...]

Each image is built by buildah (Debian's package) from the same Dockerfile a user builds with
`docker build`, with `--build-arg BASE=` pointing at a local Debian bookworm base: no image
registry can be reached here, so the base is made with mmdebstrap from Debian's archive (the
mirror of this machine's apt sources), with python3, its shared library and venv, and
committed to buildah's storage as `localhost/voxfleet-base:<key>`. The CA certificates this
machine trusts (/usr/local/share/ca-certificates) go into the base, so that pip inside a build
reaches PyPI through the same proxy the machine does.

Every image is cached by the content of what goes into it: its Dockerfile, its
`.dockerignore`, the files of the build context that the ignore file lets through, the base's
recipe and the build arguments. A second run with nothing changed builds nothing. The archive
of image NAME is OUT/NAME.tar (`voxfleet-NAME:e2e`), its key OUT/NAME.key, and OUT/images.json
records each image's size and build time.

docker/triton.Dockerfile (the GPU image) is not built: its base, NVIDIA's
`nvcr.io/nvidia/tritonserver` image, cannot be pulled without a registry.

Needs root (buildah's storage, chroot isolation) and Debian's apt for buildah and mmdebstrap
(installed when missing). Stops at once, naming what is missing.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TAG = "e2e"
# name -> Dockerfile; the images `make images` builds.
IMAGES = {
    "operator": "docker/operator.Dockerfile",
    "speech-api": "docker/speech-api.Dockerfile",
    "triton-cpu": "docker/triton-cpu.Dockerfile",
}
NOT_BUILT = {
    "triton": "its base, nvcr.io/nvidia/tritonserver, cannot be pulled here (no image registry)"
}
SUITE = "bookworm"
# What python:3.11-slim-bookworm has: Python with its shared library (Triton's Python backend
# stub links against libpython3.11), venv, and CA certificates.
BASE_PACKAGES = (
    "python3",
    "libpython3.11",
    "python3-venv",
    "python-is-python3",
    "ca-certificates",
)
DPKG_OPTIONS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
)
LOCAL_CAS = Path("/usr/local/share/ca-certificates")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def say(message: str) -> None:
    print(f"build-images: {message}", file=sys.stderr, flush=True)


def fail(message: str) -> None:
    say(message)
    raise SystemExit(2)


def run(*argv: str, quiet: bool = False) -> str:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-25:])
        fail(f"`{' '.join(argv[:3])} ...` failed ({result.returncode}):\n{tail}")
    return result.stdout


def ensure_tools() -> None:
    if os.geteuid() != 0:
        fail("needs root: buildah's storage and its chroot isolation are root's")
    missing = [tool for tool in ("buildah", "mmdebstrap") if shutil.which(tool) is None]
    if not missing:
        return
    if shutil.which("apt-get") is None:
        fail(f"{', '.join(missing)} not found and no apt-get to install them (Debian packages)")
    say(f"installing {', '.join(missing)} (Debian packages)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
    ):
        if subprocess.run(argv, env=env, capture_output=True).returncode != 0:
            fail(f"`{' '.join(argv)}` failed: install {', '.join(missing)} from Debian")


def debian_mirror() -> str:
    """The first Debian mirror of this machine's apt sources (deb822 or one-line form)."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        for match in re.finditer(r"^(?:URIs:\s*|deb\s+(?:\[[^]]*\]\s+)?)(\S+)", text, re.M):
            uri = match.group(1)
            if "security" not in uri:
                return uri
    return "http://deb.debian.org/debian"


# -- what goes into an image


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go's filepath.Match plus `**`) as a regex of a path."""
    parts = []
    for segment in pattern.strip("/").split("/"):
        if segment == "**":
            parts.append("(?:.*/)?")
        else:
            parts.append(fnmatch.translate(segment).replace(".*", "[^/]*")[4:-3] + "/")
    return re.compile("^" + "".join(parts).rstrip("/").replace("(?:.*/)?$", ".*") + "$")


def ignore_rules(path: Path) -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        rules.append((negated, _pattern_regex(line.lstrip("!").strip())))
    return rules


def ignored(relative: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its parents decides."""
    parts = relative.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = False
    for negated, regex in rules:
        if any(regex.match(candidate) for candidate in candidates):
            verdict = not negated
    return verdict


def context_files(rules: list[tuple[bool, re.Pattern[str]]]) -> list[str]:
    found = []
    for directory, dirs, files in os.walk(ROOT):
        rel_dir = os.path.relpath(directory, ROOT)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirs[:] = sorted(d for d in dirs if d not in (".git", ".venv", ".tools", "build"))
        for name in sorted(files):
            relative = rel_dir + name
            if not ignored(relative, rules):
                found.append(relative)
    return sorted(found)


def base_recipe() -> str:
    cas = sorted(p.name + ":" + _sha(p.read_bytes()) for p in LOCAL_CAS.glob("*.crt"))
    return json.dumps(
        {
            "suite": SUITE,
            "variant": "apt",
            "packages": BASE_PACKAGES,
            "dpkg": DPKG_OPTIONS,
            "cas": cas,
            "env": {"PATH": PATH, "LANG": "C.UTF-8"},
        },
        sort_keys=True,
    )


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def image_key(dockerfile: str, base: str) -> str:
    digest = hashlib.sha256()
    ignore = ROOT / f"{dockerfile}.dockerignore"
    for part in (dockerfile, (ROOT / dockerfile).read_text(), ignore.read_text(), base, TAG):
        digest.update(part.encode() + b"\0")
    for relative in context_files(ignore_rules(ignore)):
        digest.update(relative.encode() + b"\0" + (ROOT / relative).read_bytes() + b"\0")
    return digest.hexdigest()


# -- building


def has_image(reference: str) -> bool:
    result = subprocess.run(
        ["buildah", "inspect", "--type", "image", reference], capture_output=True
    )
    return result.returncode == 0


def build_base() -> str:
    key = _sha(base_recipe().encode())[:16]
    reference = f"localhost/voxfleet-base:{SUITE}-{key}"
    if has_image(reference):
        return reference
    mirror = debian_mirror()
    say(f"base: mmdebstrap {SUITE} from {mirror} ({', '.join(BASE_PACKAGES)})")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="voxfleet-base-") as work:
        rootfs = Path(work) / "rootfs.tar"
        run(
            "mmdebstrap",
            "--quiet",
            "--variant=apt",
            f"--include={','.join(BASE_PACKAGES)}",
            *(f"--dpkgopt={option}" for option in DPKG_OPTIONS),
            '--aptopt=Acquire::Languages "none"',
            SUITE,
            str(rootfs),
            mirror,
        )
        container = run("buildah", "from", "scratch").strip()
        try:
            run("buildah", "add", container, str(rootfs), "/")
            if any(LOCAL_CAS.glob("*.crt")):
                run("buildah", "copy", container, f"{LOCAL_CAS}/", f"{LOCAL_CAS}/")
                run("buildah", "run", "--isolation", "chroot", container, "update-ca-certificates")
            run(
                "buildah",
                "config",
                "--env",
                f"PATH={PATH}",
                "--env",
                "LANG=C.UTF-8",
                "--cmd",
                "/bin/bash",
                container,
            )
            run("buildah", "commit", "--quiet", container, reference)
        finally:
            subprocess.run(["buildah", "rm", container], capture_output=True)
    say(f"base: {reference} in {time.monotonic() - started:.0f} s")
    return reference


def build_image(name: str, dockerfile: str, base: str, out: Path) -> dict[str, object] | None:
    """Build `name` unless its archive is current; returns what was measured, or None."""
    archive, key_file = out / f"{name}.tar", out / f"{name}.key"
    key = image_key(dockerfile, base_recipe())
    if archive.is_file() and key_file.is_file() and key_file.read_text().strip() == key:
        say(f"{name}: up to date ({archive})")
        return None
    reference = f"localhost/voxfleet-{name}:{TAG}"
    say(f"{name}: buildah bud -f {dockerfile} --build-arg BASE={base}")
    started = time.monotonic()
    run(
        "buildah",
        "bud",
        "--quiet",
        "--isolation",
        "chroot",
        "--ignorefile",
        str(ROOT / f"{dockerfile}.dockerignore"),
        "--build-arg",
        f"BASE={base}",
        "-f",
        str(ROOT / dockerfile),
        "-t",
        reference,
        str(ROOT),
    )
    built_s = time.monotonic() - started
    partial = archive.with_suffix(".tar.partial")
    partial.unlink(missing_ok=True)
    # The archive names the image as containerd and Docker do (`voxfleet-NAME:e2e` in full).
    run(
        "buildah",
        "push",
        "--quiet",
        reference,
        f"oci-archive:{partial}:docker.io/library/voxfleet-{name}:{TAG}",
    )
    partial.replace(archive)
    key_file.write_text(key + "\n")
    # Intermediate stages and the previous build of the tag are not needed any more.
    subprocess.run(["buildah", "rmi", "--prune"], capture_output=True)
    measured = {
        "image": f"voxfleet-{name}:{TAG}",
        "dockerfile": dockerfile,
        "build_s": round(built_s, 1),
        "archive_s": round(time.monotonic() - started - built_s, 1),
        "archive_bytes": archive.stat().st_size,
        "key": key,
    }
    say(f"{name}: built in {built_s:.0f} s, {archive.stat().st_size / 2**20:.0f} MiB")
    return measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".tools" / "images")
    parser.add_argument("names", nargs="*", default=list(IMAGES))
    args = parser.parse_args(argv)
    for name in args.names:
        if name in NOT_BUILT:
            fail(f"{name}: not built here: {NOT_BUILT[name]}")
        if name not in IMAGES:
            fail(f"unknown image {name!r}: one of {', '.join(IMAGES)}")
    out = args.out.absolute()
    out.mkdir(parents=True, exist_ok=True)
    ensure_tools()
    report_path = out / "images.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    keys = {name: image_key(IMAGES[name], base_recipe()) for name in args.names}
    current = all(
        (out / f"{n}.key").is_file() and (out / f"{n}.key").read_text().strip() == k
        for n, k in keys.items()
    )
    if current and all((out / f"{n}.tar").is_file() for n in args.names):
        # Nothing changed: no buildah call at all, not even for the base.
        say(f"{', '.join(args.names)}: up to date in {out}")
        return 0
    base = build_base()
    for name in args.names:
        measured = build_image(name, IMAGES[name], base, out)
        if measured is not None:
            report[name] = measured
            report_path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    for name, reason in NOT_BUILT.items():
        say(f"{name}: not built ({IMAGES.get(name, f'docker/{name}.Dockerfile')}): {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
