"""scripts/build-control-plane.sh (`make setup`) stops at once, saying why, without Go or
without the module proxy, and rebuilds nothing that is already in place."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "build-control-plane.sh"
BUILT = ROOT / ".tools" / "bin"


def run(
    tmp_path: Path, env: dict[str, str], tools: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), str(tools or tmp_path / "tools")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_without_go_it_says_so_at_once(tmp_path: Path) -> None:
    env = dict(os.environ, PATH="/usr/sbin:/usr/bin:/sbin:/bin")
    assert shutil.which("go", path=env["PATH"]) is None
    started = time.monotonic()
    result = run(tmp_path, env)
    assert result.returncode == 2
    assert "no Go toolchain" in result.stderr and "Go >= 1.26" in result.stderr
    assert time.monotonic() - started < 10
    assert not list((tmp_path / "tools" / "bin").iterdir())


@pytest.mark.skipif(shutil.which("go") is None, reason="needs Go (make setup's prerequisite)")
def test_an_unreachable_module_proxy_is_named(tmp_path: Path) -> None:
    # Empty module and build caches of its own, and a proxy where nothing listens.
    env = dict(
        os.environ,
        GOPROXY="http://127.0.0.1:9",
        GOMODCACHE=str(tmp_path / "mod"),
        GOCACHE=str(tmp_path / "cache"),
        GOFLAGS="",
    )
    started = time.monotonic()
    result = run(tmp_path, env)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "from the Go module proxy (http://127.0.0.1:9)" in result.stderr
    assert "make the proxy reachable" in result.stderr
    assert time.monotonic() - started < 60
    assert not (tmp_path / "tools" / "bin" / "kube-apiserver").exists()


@pytest.mark.skipif(not (BUILT / "kube-apiserver").exists(), reason="needs `make setup`")
def test_a_second_run_builds_nothing_and_versions_are_real(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run(tmp_path, dict(os.environ), tools=ROOT / ".tools")
    assert result.returncode == 0, result.stderr
    assert "built" not in result.stderr, result.stderr
    assert time.monotonic() - started < 10
    version = subprocess.run(
        [str(BUILT / "kube-apiserver"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert version.strip() == "Kubernetes v1.35.4"
    etcd = subprocess.run(
        [str(BUILT / "etcd"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert "etcd Version: 3.6.16" in etcd
