"""Pools from the operator's configuration file, with errors that name the problem."""

from __future__ import annotations

from pathlib import Path

import pytest
from voxfleet_operator.pools import PoolsConfigError, load_pools


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pools.yaml"
    path.write_text(text)
    return path


def test_pools_file_with_defaults_filled_in(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "defaultPool: t4\n"
        "pools:\n"
        "  - name: t4\n"
        "    nodeSelector: {cloud.google.com/gke-accelerator: nvidia-tesla-t4}\n"
        "    tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]\n"
        "  - {name: l4, gpuProduct: NVIDIA-L4, runtime: torch-cuda, gpusPerPod: 2, maxPods: 3}\n"
        "  - {name: cpu, runtime: onnxruntime}\n",
    )
    pools = load_pools(path)
    assert pools.get(None).name == "t4"
    t4 = pools.get("t4")
    # A GPU pool runs the runtime that has served audio on a GPU unless told otherwise, and
    # places voices in its product's memory.
    assert t4.gpu_product == "Tesla-T4" and t4.runtime == "torch-cuda" and t4.gpus_per_pod == 1
    assert t4.declared_gpu_memory_mib == 15360 and pools.get("cpu").declared_gpu_memory_mib == 0
    assert t4.node_selector == {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}
    assert pools.get("l4").gpus_per_pod == 2 and pools.get("l4").max_pods == 3
    assert not t4.mps  # MPS is asked for, never assumed
    cpu = pools.get("cpu")
    assert not cpu.needs_gpu and cpu.target_product == "cpu"
    assert (cpu.cpu_request, cpu.memory_request) == ("1", "2Gi")
    assert (t4.cpu_request, t4.memory_request) == ("2", "8Gi")


def test_an_unknown_runtime_names_the_registered_ones(tmp_path: Path) -> None:
    path = write(tmp_path, "defaultPool: a\npools: [{name: a, runtime: cuda}]\n")
    with pytest.raises(PoolsConfigError, match="unknown runtime 'cuda'; choose one of onnxruntime"):
        load_pools(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("defaultPool: x\npools: [{name: a}]\n", "defaultPool 'x' is not one of the pools: a"),
        ("defaultPool: a\npools: [{name: a}, {name: a}]\n", "repeated: a"),
        ("defaultPool: a\npools: []\n", "pools: List should have at least 1 item"),
        ("defaultPool: a\npools: [{name: a, gpusPerPod: 0}]\n", "pools.0.gpusPerPod"),
        ("defaultPool: a\npools: [{name: A_B}]\n", "pools.0.name: String should match"),
        ("defaultPool: a\npools: [{name: a, gpu: 1}]\n", "pools.0.gpu: Extra inputs"),
        (
            "defaultPool: a\npools: [{name: a, runtime: onnxruntime, mps: true}]\n",
            "mps shares a GPU between backend processes; the onnxruntime runtime runs on the CPU",
        ),
        ("- a\n- b\n", "expected a mapping with defaultPool and pools"),
        ("pools: [\n", "is not valid YAML"),
    ],
)
def test_bad_pools_files_are_rejected_with_the_reason(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(PoolsConfigError) as caught:
        load_pools(path)
    assert message in str(caught.value)
    assert str(path) in str(caught.value)


def test_missing_file_and_unknown_pool(tmp_path: Path) -> None:
    with pytest.raises(PoolsConfigError, match="cannot read pools file"):
        load_pools(tmp_path / "absent.yaml")
    pools = load_pools(write(tmp_path, "defaultPool: a\npools: [{name: a}, {name: b}]\n"))
    with pytest.raises(KeyError, match="pool 'c' is not configured; known pools: a, b"):
        pools.get("c")
