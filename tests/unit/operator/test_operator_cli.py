"""`voxfleet render` and `voxfleet operator` as a user runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

VOICES = """\
apiVersion: voxfleet.io/v1alpha1
kind: TTSVoice
metadata: {name: joe, namespace: tts}
spec:
  source: {url: "https://voices.example.com/joe.onnx", sha256: "%s"}
---
apiVersion: voxfleet.io/v1alpha1
kind: TTSVoice
metadata: {name: amy}
spec:
  source: {pvc: {claimName: voices, path: en/amy.onnx}}
  pool: l4
""" % ("ab" * 32)
POOLS = "defaultPool: t4\npools: [{name: t4}, {name: l4, gpuProduct: NVIDIA-L4}]\n"


def voxfleet(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engines.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_render_prints_every_child_offline(tmp_path: Path) -> None:
    (tmp_path / "voices.yaml").write_text(VOICES)
    (tmp_path / "pools.yaml").write_text(POOLS)
    (tmp_path / "key").write_text("s3cret\n")
    result = voxfleet(
        "render",
        "-f",
        str(tmp_path / "voices.yaml"),
        "--pools",
        str(tmp_path / "pools.yaml"),
        "--repository-key-file",
        str(tmp_path / "key"),
    )
    assert result.returncode == 0, result.stderr
    objects = list(yaml.safe_load_all(result.stdout))
    found = {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]) for o in objects}
    for namespace, voice, pool in (("tts", "joe", "t4"), ("default", "amy", "l4")):
        assert ("Service", namespace, f"{voice}-tts") in found
        assert ("Deployment", namespace, f"voxfleet-triton-{pool}") in found
        assert ("HorizontalPodAutoscaler", namespace, f"voxfleet-triton-{pool}") in found
        assert ("PodDisruptionBudget", namespace, f"voxfleet-triton-{pool}") in found
        assert ("ServiceMonitor", namespace, f"voxfleet-triton-{pool}") in found
        assert ("Secret", namespace, "voxfleet-repository-key") in found
    jobs = [o for o in objects if o["kind"] == "Job"]
    products = {
        j["metadata"]["labels"]["voxfleet.io/voice"]: j["spec"]["template"]["spec"]["nodeSelector"][
            "nvidia.com/gpu.product"
        ]
        for j in jobs
    }
    assert products == {"joe": "Tesla-T4", "amy": "NVIDIA-L4"}
    assert "&id" not in result.stdout  # no YAML anchors for reviewers to chase


def test_render_rejects_an_invalid_voice_with_its_reason(tmp_path: Path) -> None:
    bad = VOICES.replace("pool: l4", "pool: l4\n  autoscaling: {minReplicas: 3, maxReplicas: 1}")
    (tmp_path / "voices.yaml").write_text(bad)
    (tmp_path / "pools.yaml").write_text(POOLS)
    result = voxfleet(
        "render", "-f", str(tmp_path / "voices.yaml"), "--pools", str(tmp_path / "pools.yaml")
    )
    assert result.returncode == 1
    assert "document 2: InvalidSpec" in result.stderr
    assert "minReplicas must not exceed autoscaling.maxReplicas (3 > 1)" in result.stderr
    assert result.stdout == ""

    (tmp_path / "voices.yaml").write_text(VOICES)
    result = voxfleet("render", "-f", str(tmp_path / "voices.yaml"))  # built-in pools: t4 only
    assert result.returncode == 1
    assert "UnknownPool: pool 'l4' is not configured; known pools: t4" in result.stderr


def test_operator_refuses_to_start_with_a_wrong_pools_file(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "VOXFLEET_POOLS_FILE": str(tmp_path / "absent.yaml")}
    result = voxfleet("operator", env=env)
    assert result.returncode == 2
    assert "cannot read pools file" in result.stderr


REPO = Path(__file__).resolve().parents[3]
CHART_VALUES = REPO / "charts" / "voxfleet" / "values.yaml"
EXAMPLE = REPO / "manifests" / "examples" / "custom-autoscaling.yaml"


def _hpa_max(stdout: str) -> int:
    (hpa,) = [o for o in yaml.safe_load_all(stdout) if o["kind"] == "HorizontalPodAutoscaler"]
    return int(hpa["spec"]["maxReplicas"])


def test_render_says_which_pools_it_used_and_renders_as_the_chart_would(tmp_path: Path) -> None:
    # The example asks for 8 replicas; the chart's default pool allows 4 pods.
    builtin = voxfleet("render", "-f", str(EXAMPLE), env={"PATH": "/usr/bin:/bin"})
    assert builtin.returncode == 0, builtin.stderr
    assert "using the built-in pool t4 (no --values, --pools or $VOXFLEET_POOLS_FILE)" in (
        builtin.stderr
    )
    assert _hpa_max(builtin.stdout) == 8

    chart = voxfleet("render", "-f", str(EXAMPLE), "--values", str(CHART_VALUES))
    assert chart.returncode == 0, chart.stderr
    assert f"using pools from the chart values {CHART_VALUES}" in chart.stderr
    assert _hpa_max(chart.stdout) == 4
    objects = list(yaml.safe_load_all(chart.stdout))
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "voxfleet-triton:0.1.0"  # the chart's Triton image at its appVersion

    (tmp_path / "pools.yaml").write_text(POOLS)
    env = {"PATH": "/usr/bin:/bin", "VOXFLEET_POOLS_FILE": str(tmp_path / "pools.yaml")}
    from_env = voxfleet("render", "-f", str(EXAMPLE), env=env)
    assert f"using pools file {tmp_path / 'pools.yaml'} ($VOXFLEET_POOLS_FILE)" in from_env.stderr

    both = voxfleet(
        "render", "-f", str(EXAMPLE), "--values", str(CHART_VALUES), "--pools", "x.yaml"
    )
    assert both.returncode == 2
    assert "give either --values or --pools, not both" in both.stderr
    (tmp_path / "partial.yaml").write_text("tritonImage: {repository: x}\n")
    partial = voxfleet("render", "-f", str(EXAMPLE), "--values", str(tmp_path / "partial.yaml"))
    assert partial.returncode == 2
    assert "helm get values --all RELEASE" in partial.stderr
