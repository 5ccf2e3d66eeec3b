"""`make e2e-kind` stops at once, with a clear message, where Docker or kind are missing."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "e2e-kind.sh"


def _run_with_tools(
    tmp_path: Path, tools: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run the script with PATH holding only bash's basics and the given fake tools."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("bash", "mktemp", "rm", "dirname", "cat"):
        target = subprocess.run(["which", name], capture_output=True, text=True).stdout.strip()
        (bin_dir / name).symlink_to(target)
    log = tmp_path / "calls.log"
    for name, body in tools.items():
        tool = bin_dir / name
        tool.write_text(f'#!{bin_dir}/bash\necho {name} "$@" >> {log}\n{body}\n')
        tool.chmod(0o755)
    started = time.monotonic()
    result = subprocess.run(
        [str(bin_dir / "bash"), str(SCRIPT)],
        env={"PATH": str(bin_dir), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    return result, time.monotonic() - started


def test_without_docker_and_kind_it_stops_before_creating_anything(tmp_path: Path) -> None:
    result, seconds = _run_with_tools(tmp_path, {"helm": "exit 0", "kubectl": "exit 0"})
    assert result.returncode == 2
    assert "docker kind not found" in result.stderr
    assert "make e2e" in result.stderr  # what to run instead
    assert seconds < 5
    assert not (tmp_path / "calls.log").exists()  # no tool was run at all


def test_without_kind_it_names_kind(tmp_path: Path) -> None:
    result, _ = _run_with_tools(
        tmp_path, {"docker": "exit 0", "helm": "exit 0", "kubectl": "exit 0"}
    )
    assert result.returncode == 2
    assert result.stderr.startswith("e2e-kind: kind not found on PATH")


def test_with_a_stopped_docker_engine_it_creates_no_cluster(tmp_path: Path) -> None:
    result, _ = _run_with_tools(
        tmp_path,
        {"docker": "exit 1", "kind": "exit 0", "helm": "exit 0", "kubectl": "exit 0"},
    )
    assert result.returncode == 2
    assert "Docker engine is not reachable" in result.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert calls == ["docker info"]  # kind was never asked to create a cluster


def test_the_script_is_what_make_e2e_kind_runs() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert (
        'e2e-kind: setup images\n\tPATH="$(CURDIR)/.tools/bin:$$PATH" bash scripts/e2e-kind.sh'
        in makefile
    )
    assert os.access(SCRIPT, os.X_OK)
