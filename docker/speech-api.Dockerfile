# syntax=docker/dockerfile:1
# The speech API gateway (`voxfleet api`, docs/speech-api.md): the `voxfleet` command with its
# `gateway` extra only (Starlette, uvicorn, PyAV, soxr, gRPC). No Triton, no onnxruntime: the
# gateway relays audio from the pools' pods.
#
# Build from the repository root (BuildKit and buildah read speech-api.Dockerfile.dockerignore):
#   docker build -f docker/speech-api.Dockerfile -t REGISTRY/voxfleet-speech-api:0.1.0 .
# `make images` builds it without Docker, over a Debian bookworm base (docs/images.md).
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY engines ./engines
COPY operator ./operator
RUN python3 -m venv /opt/voxfleet \
    && /opt/voxfleet/bin/pip install --no-cache-dir --disable-pip-version-check ".[gateway]"

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
# The operator runs it as this uid with a read-only root filesystem and /tmp as an emptyDir.
USER 65532:65532
ENTRYPOINT ["voxfleet"]
CMD ["api", "--help"]
