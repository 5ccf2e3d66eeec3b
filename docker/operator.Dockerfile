# syntax=docker/dockerfile:1
# The voxfleet operator: the `voxfleet` command with the control plane's dependencies only
# (kopf, the official Kubernetes client for its children, pydantic, tritonclient's gRPC client
# for the repository API, prometheus-api-client for the voices' status figures). No GPU, no
# Triton.
#
# Build from the repository root (BuildKit reads operator.Dockerfile.dockerignore):
#   docker build -f docker/operator.Dockerfile -t REGISTRY/voxfleet-operator:0.1.0 .
# Not built in this project's CI: its machines have no Docker engine.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY engines ./engines
COPY operator ./operator
# --no-deps, then the control plane's own list: the data plane's dependencies (onnxruntime,
# piper-tts, nvidia-pytriton, ...) are hundreds of megabytes the operator never imports.
RUN python -m venv /opt/voxfleet \
    && /opt/voxfleet/bin/pip install --no-cache-dir --no-deps . \
    && /opt/voxfleet/bin/pip install --no-cache-dir \
        "kopf>=1.45,<1.46" "kubernetes>=37" "pydantic>=2.6" "pyyaml>=6" "aiohttp>=3.9" \
        "tritonclient[grpc]>=2.50" "numpy>=1.24,<2" "prometheus-api-client>=0.5"

FROM python:3.11-slim
COPY --from=build /opt/voxfleet /opt/voxfleet
ENV PATH=/opt/voxfleet/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# The chart runs it as this uid with a read-only root filesystem and /tmp as an emptyDir.
USER 65532:65532
ENTRYPOINT ["voxfleet"]
CMD ["operator", "--liveness=http://0.0.0.0:8080/healthz"]
