# syntax=docker/dockerfile:1
# A CPU-only Triton image for kind and other clusters without GPUs: the `voxfleet` command with
# its `pod` extra, whose nvidia-pytriton wheel bundles `tritonserver` (Triton 2.51, CPU, Python
# backend). CPU pools (`runtime: onnxruntime`) run `voxfleet triton`, which starts that
# tritonserver; engine Jobs run `voxfleet build-engines`.
#
# Build from the repository root (BuildKit and buildah read triton-cpu.Dockerfile.dockerignore):
#   docker build -f docker/triton-cpu.Dockerfile -t voxfleet-triton-cpu:e2e .
# `make images` builds it without Docker, over a Debian bookworm base (docs/images.md); the e2e
# suite's node runs it, and `make e2e-kind` loads it into kind.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
# tritonserver's shared libraries that slim images lack.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libnuma1 libarchive13 libgomp1 \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md /tmp/voxfleet-src/
COPY engines /tmp/voxfleet-src/engines
COPY operator /tmp/voxfleet-src/operator
RUN python3 -m venv /opt/voxfleet \
    && /opt/voxfleet/bin/pip install --no-cache-dir --disable-pip-version-check \
        "/tmp/voxfleet-src[pod]" \
    && rm -rf /tmp/voxfleet-src
ENV PATH=/opt/voxfleet/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# The uid the operator's pool pods and engine Jobs run as.
RUN useradd --uid 1000 --create-home triton-server
USER 1000:1000
