# syntax=docker/dockerfile:1
# Triton Inference Server with the voxfleet stream model: the official NGC image plus the
# `engines` package (text frontend, streaming scheduler, model repository, engine builds).
# Pool pods run `tritonserver` from it; engine-build Jobs run `voxfleet build-engines`.
#
# Build from the repository root (BuildKit reads triton.Dockerfile.dockerignore):
#   docker build -f docker/triton.Dockerfile -t REGISTRY/voxfleet-triton:0.1.0 .
# Not built by `make images`: its base cannot be pulled where no registry can be reached
# (docs/images.md).
#
# 24.10 is Triton 2.51, the release the project tests against locally (nvidia-pytriton 0.7),
# with TensorRT 10.5 and Python 3.10 for the Python backend.
ARG TRITON_TAG=24.10-py3
FROM nvcr.io/nvidia/tritonserver:${TRITON_TAG}

COPY pyproject.toml README.md /tmp/voxfleet-src/
COPY engines /tmp/voxfleet-src/engines
COPY operator /tmp/voxfleet-src/operator
# The Python backend runs models with the image's python3, so everything goes there: the
# `gpu` extra (onnxruntime-gpu, TensorRT's Python bindings matching the image's TensorRT 10.5,
# so engines built in a Job load in the pool pods), and piper-tts without its dependencies,
# because it asks for the CPU onnxruntime, which would shadow onnxruntime-gpu (both install
# the `onnxruntime` module).
RUN python3 -m pip install --no-cache-dir --no-deps "piper-tts>=1.3" \
    && python3 -m pip install --no-cache-dir "/tmp/voxfleet-src[gpu]" \
    && rm -rf /tmp/voxfleet-src

# The official image's unprivileged user (uid 1000), which the operator's pods run as.
USER triton-server
WORKDIR /tmp
