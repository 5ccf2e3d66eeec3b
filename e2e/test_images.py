"""Each image installs only its deployable's extra (pyproject.toml, docker/): the gateway and
operator images hold none of the data plane's libraries, and their processes import no
module of the data plane's folders.

Each image runs as a pod of the cluster, as it runs in production: the pod imports what its
process imports (the `voxfleet` command line, then the gateway's server or the operator's
handlers), and prints what it loaded; `kubectl logs` reads it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from e2e_support import eventually
from installation import Installation

DATA_PLANE = ("pod", "runtimes", "streaming", "artifacts", "build", "text")
DATA_PLANE_LIBRARIES = ("onnxruntime", "onnx", "pytriton", "piper", "torch", "tensorrt")
ENTRY_MODULES = {
    "speech-api": ("engines.commands.api", "engines.gateway.server", "engines.gateway.app"),
    "operator": ("voxfleet_operator.cli", "voxfleet_operator.runner", "voxfleet_operator.handlers"),
}
CHECK = f"""
import importlib, importlib.util, json, sys
from engines.cli import build_parser
build_parser()
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps({{
    "data_plane_modules": sorted(
        m for m in sys.modules if m.split(".")[0] == "engines" and len(m.split(".")) > 1
        and m.split(".")[1] in {DATA_PLANE!r}
    ),
    "installed_libraries": sorted(
        n for n in {DATA_PLANE_LIBRARIES!r} if importlib.util.find_spec(n) is not None
    ),
}}))
"""


def run_in_image(installation: Installation, image: str, modules: tuple[str, ...]) -> Any:
    kubectl = installation.kubectl
    name = f"imports-{image}"
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "check",
                        "image": f"voxfleet-{image}:e2e",
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["python3", "-c", CHECK, *modules],
                        "env": [{"name": "HOME", "value": "/tmp"}],
                    }
                ],
            },
        }
    )
    try:
        phase = eventually(
            lambda: (
                (kubectl.get("pod", name) or {}).get("status", {}).get("phase")
                in ("Succeeded", "Failed")
                and kubectl.get("pod", name)["status"]["phase"]
            ),
            timeout=120,
            what=f"{name} ran",
        )
        logs = kubectl.run("logs", name).stdout
    finally:
        kubectl.run("delete", "pod", name, "--wait=false")
    assert phase == "Succeeded", logs[-2000:]
    return json.loads(logs.strip().splitlines()[-1])


@pytest.mark.parametrize("image", sorted(ENTRY_MODULES))
def test_the_gateway_and_operator_images_hold_no_data_plane(
    installation: Installation, image: str
) -> None:
    found = run_in_image(installation, image, ENTRY_MODULES[image])
    assert found["data_plane_modules"] == [], found
    assert found["installed_libraries"] == [], found
