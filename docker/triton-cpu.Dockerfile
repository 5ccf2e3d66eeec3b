# syntax=docker/dockerfile:1
# A CPU-only Triton image for kind and other clusters without GPUs: the whole `voxfleet`
# package with its own dependencies, whose nvidia-pytriton wheel bundles `tritonserver`
# (Triton 2.51, CPU, Python backend). CPU pools (`runtime: onnxruntime`) run
# `voxfleet triton`, which starts that tritonserver; engine Jobs run `voxfleet build-engines`.
#
# Build from the repository root (BuildKit reads triton.Dockerfile.dockerignore):
#   docker build -f docker/triton-cpu.Dockerfile -t voxfleet-triton-cpu:e2e .
# Used by `make e2e-kind` (scripts/e2e-kind.sh). Not built in this project's CI: its machines
# have no Docker engine.
FROM python:3.11-slim-bookworm
# tritonserver's shared libraries that slim images lack.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libnuma1 libarchive13 libgomp1 \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md /tmp/voxfleet-src/
COPY engines /tmp/voxfleet-src/engines
COPY operator /tmp/voxfleet-src/operator
RUN python -m venv /opt/voxfleet \
    && /opt/voxfleet/bin/pip install --no-cache-dir /tmp/voxfleet-src \
    && rm -rf /tmp/voxfleet-src
ENV PATH=/opt/voxfleet/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# The uid the operator's pool pods and engine Jobs run as.
RUN useradd --uid 1000 --create-home triton-server
USER 1000:1000
