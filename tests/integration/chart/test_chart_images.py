"""What the images are checked for without building them (`make images` builds them and the
e2e suite runs them, docs/images.md): the operator's extra installs every third-party package
the control plane imports, and the images run as the chart expects."""

from __future__ import annotations

import ast
import re
import sys

from chart_support import ROOT, helm_template, one

OPERATOR_DOCKERFILE = ROOT / "docker" / "operator.Dockerfile"
TRITON_DOCKERFILE = ROOT / "docker" / "triton.Dockerfile"
# Import name → the requirement that provides it in the operator image.
PROVIDERS = {
    "kopf": "kopf",
    "pydantic": "pydantic",
    "yaml": "pyyaml",
    "aiohttp": "aiohttp",
    "kubernetes": "kubernetes",
    "tritonclient": "tritonclient[grpc]",
    "google": "tritonclient[grpc]",  # protobuf, a dependency of tritonclient[grpc]
    "numpy": "numpy",
    "prometheus_api_client": "prometheus-api-client",
    "urllib3": "prometheus-api-client",  # its retries; a dependency of its `requests`
}
OWN_PACKAGES = {"voxfleet_operator", "engines"}


def imported_top_level_modules(package_dir: str) -> set[str]:
    found: set[str] = set()
    for path in (ROOT / package_dir).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - OWN_PACKAGES - {"__future__"}


def operator_requirements() -> set[str]:
    """What `pip install '.[operator]'` (docker/operator.Dockerfile) asks for: the project's
    own dependencies and its `operator` extra, as lower-case requirement names."""
    text = (ROOT / "pyproject.toml").read_text()
    wanted: list[str] = []
    for name in ("dependencies", "operator"):
        block = re.search(rf"^{name} = \[(.*?)^\]", text, re.M | re.S)
        assert block, f"pyproject.toml has no `{name} = [...]`"
        wanted += re.findall(r'^\s*"([^"]+)"', block.group(1), re.M)
    return {re.split(r"[<>=!~ ]", requirement)[0].lower() for requirement in wanted}


def test_operator_image_installs_what_the_operator_imports() -> None:
    assert re.search(r"pip install .*\"\.\[operator\]\"", OPERATOR_DOCKERFILE.read_text())
    installed = operator_requirements()
    for module in sorted(imported_top_level_modules("operator/voxfleet_operator")):
        assert module in PROVIDERS, (
            f"voxfleet_operator imports {module!r}: add its package to pyproject.toml's "
            "`operator` extra and to PROVIDERS here"
        )
        assert PROVIDERS[module].lower() in installed, (
            f"the `operator` extra does not install {PROVIDERS[module]} (for {module})"
        )


def test_operator_image_default_command_matches_the_chart() -> None:
    container = one(helm_template("helm"), "Deployment")["spec"]["template"]["spec"]["containers"][
        0
    ]
    entrypoint = re.search(r"^ENTRYPOINT (\[.*\])$", OPERATOR_DOCKERFILE.read_text(), re.M)
    cmd = re.search(r"^CMD (\[.*\])$", OPERATOR_DOCKERFILE.read_text(), re.M)
    assert entrypoint and cmd
    assert ast.literal_eval(entrypoint.group(1)) == container["command"]
    assert ast.literal_eval(cmd.group(1)) == container["args"]


def test_triton_image_runs_as_the_user_the_pool_pods_expect() -> None:
    from voxfleet_operator.render.common import RUN_AS_USER

    text = TRITON_DOCKERFILE.read_text()
    assert re.search(r"^FROM nvcr\.io/nvidia/tritonserver:", text, re.M)
    # `triton-server` is uid 1000 in the official images.
    assert re.search(r"^USER triton-server$", text, re.M) and RUN_AS_USER == 1000
