"""`voxfleet operator` as the chart runs it: a process, configured by the environment."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest
import yaml
from operator_harness import POOLS, REAL_CLUSTER, Api, eventually

pytestmark = pytest.mark.kube


@pytest.mark.skipif(REAL_CLUSTER, reason="the in-process tests cover a real cluster")
async def test_voxfleet_operator_process_reconciles_and_stops_cleanly(
    api: Api, tmp_path: Path
) -> None:
    (tmp_path / "pools.yaml").write_text(yaml.safe_dump(POOLS))
    env = {
        **os.environ,
        "VOXFLEET_POOLS_FILE": str(tmp_path / "pools.yaml"),
        "VOXFLEET_ENGINE_CACHE_PVC": "shared-engines",
        # Drift passes run all the time, so that the stop meets one in flight.
        "VOXFLEET_RESYNC_SECONDS": "0.1",
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "engines.cli",
        "operator",
        "--liveness",
        "http://127.0.0.1:0/healthz",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        source = {"url": "https://voices.example.com/joe.onnx", "sha256": "ab" * 32}
        await api.create(
            "voxfleet.io/v1alpha1",
            "ttsvoices",
            {
                "apiVersion": "voxfleet.io/v1alpha1",
                "kind": "TTSVoice",
                "metadata": {"name": "joe"},
                "spec": {"source": source},
            },
        )

        async def job_created() -> bool:
            jobs = await api.list("batch/v1", "jobs")
            return bool(jobs)

        await eventually(job_created, timeout=30)
        await asyncio.sleep(1.0)
        (job,) = await api.list("batch/v1", "jobs")
        volumes = job["spec"]["template"]["spec"]["volumes"]
        assert {"name": "engines", "persistentVolumeClaim": {"claimName": "shared-engines"}} in (
            volumes
        )
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(process.communicate(), 30)
    log = output.decode()
    assert process.returncode == 0, log[-2000:]
    # A clean stop is not an error: nothing at ERROR level (such as "Connector is closed").
    errors = [line for line in log.splitlines() if " ERROR " in line or "Traceback" in line]
    assert errors == [], "\n".join(errors)


@pytest.mark.skipif(REAL_CLUSTER, reason="needs the fault proxy")
async def test_client_reads_a_rotated_token_after_401(api: Api) -> None:
    from voxfleet_operator.context import TTSVOICES
    from voxfleet_operator.kube import KubeClient

    assert api.faults is not None
    client = await KubeClient.connect()
    try:
        kubeconfig = Path(os.environ["KUBECONFIG"])
        config = yaml.safe_load(kubeconfig.read_text())
        config["users"][0]["user"]["token"] = "rotated"
        kubeconfig.write_text(yaml.safe_dump(config))
        api.faults.required_token = "rotated"
        # 404 (the voice does not exist), not 401: the client logged in again.
        assert await client.get(TTSVOICES, "default", "absent") is None
    finally:
        await client.close()
