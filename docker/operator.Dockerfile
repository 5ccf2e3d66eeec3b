# syntax=docker/dockerfile:1
# The voxfleet operator: the `voxfleet` command with its `operator` extra only (kopf, the
# official Kubernetes client for its children, pydantic, tritonclient's gRPC client for the
# repository API, prometheus-api-client for the voices' status figures). No GPU, no Triton.
#
# Build from the repository root (BuildKit and buildah read operator.Dockerfile.dockerignore):
#   docker build -f docker/operator.Dockerfile -t REGISTRY/voxfleet-operator:0.1.0 .
# `make images` builds it without Docker, over a Debian bookworm base (docs/images.md).
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY engines ./engines
COPY operator ./operator
# Only the operator's extra: the data plane's dependencies (onnxruntime, piper-tts,
# nvidia-pytriton, ...) are hundreds of megabytes the operator never imports.
RUN python3 -m venv /opt/voxfleet \
    && /opt/voxfleet/bin/pip install --no-cache-dir --disable-pip-version-check ".[operator]"

FROM ${BASE}
COPY --from=build /opt/voxfleet /opt/voxfleet
# A name for the uid below: kopf (and Python's getpass) look the user up, and fail without one.
RUN groupadd --gid 65532 nonroot \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp \
        --shell /usr/sbin/nologin nonroot
ENV PATH=/opt/voxfleet/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# The chart runs it as this uid with a read-only root filesystem and /tmp as an emptyDir.
USER 65532:65532
ENTRYPOINT ["voxfleet"]
CMD ["operator", "--liveness=http://0.0.0.0:8080/healthz"]
