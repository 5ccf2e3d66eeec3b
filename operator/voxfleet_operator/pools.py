"""Pools: the operator's configuration of where Triton pods may run and on which runtime.

The chart mounts a YAML file and points `VOXFLEET_POOLS_FILE` at it:

    defaultPool: t4
    pools:
      - name: t4
        runtime: tensorrt
        nodeSelector: {cloud.google.com/gke-accelerator: nvidia-tesla-t4}
        tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
        gpuProduct: Tesla-T4
        gpusPerPod: 1
        tritonImage: ghcr.io/voxfleet/triton:0.1.0
        maxPods: 8
      - name: cpu          # kind, a laptop, CI: no GPU requested, no GPU node selector
        runtime: onnxruntime
        maxPods: 4

Without a file the operator runs with `default_pools_config()`: one T4 pool named `t4`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from engines.contract.plan import RUNTIME_NAMES, RuntimeInfo, check_mps, runtime_info

DEFAULT_TRITON_IMAGE = "ghcr.io/voxfleet/triton:0.1.0"


class PoolsConfigError(ValueError):
    """The pools file is missing or wrong; the message names the file and the field."""


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


DEFAULT_RUNTIME = "torch-cuda"
# GPU memory (MiB) by `nvidia.com/gpu.product`, as GPU feature discovery's `nvidia.com/gpu.memory`
# label gives it for these products.
KNOWN_GPU_MEMORY_MIB = {"Tesla-T4": 15360, "NVIDIA-L4": 23034, "NVIDIA-A10G": 23028}
# Requests of a pool pod where the pool sets none: a GPU pod feeds its GPU from two cores; a
# CPU pod runs one voice's stages on one core.
GPU_POD_CPU, GPU_POD_MEMORY = "2", "8Gi"
CPU_POD_CPU, CPU_POD_MEMORY = "1", "2Gi"


class Pool(_Model):
    name: str = Field(
        min_length=1,
        max_length=40,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Pool name; voices refer to it and it is part of child object names.",
    )
    runtime: str = Field(
        default=DEFAULT_RUNTIME,
        description="Stage runtime of the pool's pods and engine builds: "
        + ", ".join(RUNTIME_NAMES)
        + ". A CPU runtime (onnxruntime) requests no GPU and needs no GPU node.",
    )
    cpu: str | None = Field(
        default=None,
        description="CPU request of a pool pod (default 2 on GPU pools, 1 on CPU pools).",
    )
    memory: str | None = Field(
        default=None,
        description="Memory request of a pool pod (default 8Gi on GPU pools, 2Gi on CPU "
        "pools); the limit is twice the request.",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the pool's pods (and engine Jobs) need."
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list, description="Tolerations for the pool's GPU node taints."
    )
    gpu_product: str = Field(
        default="Tesla-T4",
        min_length=1,
        description="Value of the node label `nvidia.com/gpu.product` (GPU feature "
        "discovery); engines are built on, and only valid for, this product.",
    )
    gpus_per_pod: int = Field(default=1, ge=1, le=16, description="`nvidia.com/gpu` per pod.")
    triton_image: str = Field(
        default=DEFAULT_TRITON_IMAGE,
        min_length=1,
        description="Triton image with the voxfleet engines package; also runs engine builds.",
    )
    max_pods: int = Field(default=8, ge=1, le=1000, description="Most Triton pods in the pool.")
    gpu_memory_mib: int | None = Field(
        default=None,
        ge=1024,
        description="GPU memory of one pool pod, in MiB, that voices are placed in. Default: "
        "the pool nodes' `nvidia.com/gpu.memory` label (GPU feature discovery), else the GPU "
        "product's own (15360 for Tesla-T4). A pod never places more than its GPU has.",
    )
    mps: bool = Field(
        default=False,
        description="Run each pod's Triton backend processes (every voice and instance) on its "
        "GPU through a CUDA MPS daemon of the pod's own, so that they run at once instead of in "
        "turns. GPU runtimes only; needs nvidia-cuda-mps-control in the Triton container and "
        "the GPU for the pod alone (docs/gpu.md).",
    )

    @field_validator("runtime")
    @classmethod
    def _known_runtime(cls, value: str) -> str:
        runtime_info(value)  # ValueError naming the registered runtimes
        return value

    @model_validator(mode="after")
    def _mps_on_a_gpu(self) -> Pool:
        if self.mps:
            check_mps(self.runtime, "mps")
        return self

    @property
    def runtime_info(self) -> RuntimeInfo:
        return runtime_info(self.runtime)

    @property
    def needs_gpu(self) -> bool:
        return self.runtime_info.needs_gpu

    @property
    def target_product(self) -> str:
        """What the pool's engines are built for: its GPU product, or `cpu`."""
        return self.gpu_product if self.needs_gpu else "cpu"

    @property
    def declared_gpu_memory_mib(self) -> int:
        """The GPU memory the pool's config gives, else its product's known size, else 0
        (then the nodes' label, or what each pod's GPU has)."""
        if not self.needs_gpu:
            return 0
        return self.gpu_memory_mib or KNOWN_GPU_MEMORY_MIB.get(self.gpu_product, 0)

    @property
    def cpu_request(self) -> str:
        return self.cpu or (GPU_POD_CPU if self.needs_gpu else CPU_POD_CPU)

    @property
    def memory_request(self) -> str:
        return self.memory or (GPU_POD_MEMORY if self.needs_gpu else CPU_POD_MEMORY)


class PoolsConfig(_Model):
    default_pool: str = Field(description="Pool of voices that name none.")
    pools: list[Pool] = Field(min_length=1, description="The GPU pools.")

    @model_validator(mode="after")
    def _names(self) -> PoolsConfig:
        names = [p.name for p in self.pools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"pool names must be unique, repeated: {', '.join(duplicates)}")
        if self.default_pool not in names:
            raise ValueError(
                f"defaultPool {self.default_pool!r} is not one of the pools: {', '.join(names)}"
            )
        return self

    def get(self, name: str | None) -> Pool:
        """The named pool, or the default one for `None`; KeyError names the known pools."""
        wanted = name or self.default_pool
        for pool in self.pools:
            if pool.name == wanted:
                return pool
        known = ", ".join(p.name for p in self.pools)
        raise KeyError(f"pool {wanted!r} is not configured; known pools: {known}")


def default_pools_config() -> PoolsConfig:
    return PoolsConfig(default_pool="t4", pools=[Pool(name="t4")])


def parse_pools(data: Any, source: str = "pools config") -> PoolsConfig:
    if not isinstance(data, dict):
        raise PoolsConfigError(f"{source}: expected a mapping with defaultPool and pools")
    try:
        return PoolsConfig.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in error.errors()
        )
        raise PoolsConfigError(f"{source}: {problems}") from None


def load_pools(path: str | os.PathLike[str] | None = None) -> PoolsConfig:
    """Pools from the YAML file `path` (the chart's `VOXFLEET_POOLS_FILE`), else the built-in
    T4 pool."""
    if path is None:
        return default_pools_config()
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as error:
        raise PoolsConfigError(f"cannot read pools file {file}: {error.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise PoolsConfigError(f"pools file {file} is not valid YAML: {error}") from None
    return parse_pools(data, str(file))
