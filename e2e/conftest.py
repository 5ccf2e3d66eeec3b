"""The e2e suite's one installation, shared by every scenario, and its reported timings."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster.processes import stop_on_sigterm
from e2e_support import REAL_CLUSTER, ROOT
from installation import Installation, kind_installation, local_installation

TIMINGS: dict[str, float] = {}
TIMINGS_FILE = ROOT / "build" / "e2e-timings.json"


def _local_cluster_missing() -> str | None:
    """What this machine lacks to run the local cluster, in one line that says how to get it."""
    from cluster.controlplane import missing_binaries
    from cluster.images import product_archives
    from cluster.node import missing_image, node_missing

    for tool in ("kubectl", "helm", "openssl"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH (kubectl and helm come with `make setup`)"
    missing = missing_binaries()
    if missing:
        return (
            f"{', '.join(missing)} not built: run `make setup` (it builds the control "
            "plane from its Go modules)"
        )
    return node_missing() or missing_image(product_archives())


def pytest_configure(config: pytest.Config) -> None:
    # A terminated run (a CI's timeout, `kill`) tears its installation down as Ctrl-C does:
    # the node's containers are not the suite's children and would go on running.
    stop_on_sigterm()
    config.addinivalue_line(
        "markers", "uninstalls: takes the installation away; run after every other scenario"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Scenarios of every file share one installation: the one that uninstalls it runs last,
    whichever file it is in and whatever files are added."""
    items.sort(key=lambda item: item.get_closest_marker("uninstalls") is not None)


@pytest.fixture(scope="session")
def installation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installation]:
    if REAL_CLUSTER:
        with kind_installation() as installed:
            yield installed
    else:
        missing = _local_cluster_missing()
        if missing:
            pytest.fail(f"cannot run the local cluster: {missing}")
        with local_installation(Path(tmp_path_factory.mktemp("e2e"))) as installed:
            TIMINGS.update(installed.timings)
            installed.timings = TIMINGS
            yield installed


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TIMINGS:
        return
    terminalreporter.section("voxfleet e2e timings")
    for name, value in TIMINGS.items():
        unit = " ms" if name.endswith("_ms") else " s" if name.endswith("_s") else ""
        text = f"{value:.2f}" if unit else f"{value:g}"
        terminalreporter.write_line(f"{name}: {text}{unit}")
    TIMINGS_FILE.parent.mkdir(parents=True, exist_ok=True)
    TIMINGS_FILE.write_text(json.dumps(TIMINGS, indent=2) + "\n")
    terminalreporter.write_line(f"(also in {TIMINGS_FILE.relative_to(ROOT)})")
