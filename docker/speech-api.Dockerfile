# syntax=docker/dockerfile:1
# The speech API gateway (`voxfleet api`, docs/speech-api.md): the `voxfleet` command with
# the gateway's dependencies only (Starlette, uvicorn, PyAV, soxr, gRPC). No Triton, no
# onnxruntime: the gateway relays audio from the pools' pods.
#
# Build from the repository root (BuildKit reads speech-api.Dockerfile.dockerignore):
#   docker build -f docker/speech-api.Dockerfile -t REGISTRY/voxfleet-speech-api:0.1.0 .
# Not built in this project's CI: its machines have no Docker engine.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY engines ./engines
COPY operator ./operator
# --no-deps, then the gateway's own list: the data plane's other dependencies (onnxruntime,
# piper-tts, nvidia-pytriton, ...) are hundreds of megabytes the gateway never imports.
RUN python -m venv /opt/voxfleet \
    && /opt/voxfleet/bin/pip install --no-cache-dir --no-deps . \
    && /opt/voxfleet/bin/pip install --no-cache-dir \
        "starlette>=0.40" "uvicorn>=0.30" "httptools>=0.6" "websockets>=13" "av>=12" \
        "soxr>=0.4" "tritonclient[grpc]>=2.50" "numpy>=1.24,<2" "pydantic>=2.6" "pyyaml>=6"

FROM python:3.11-slim
COPY --from=build /opt/voxfleet /opt/voxfleet
ENV PATH=/opt/voxfleet/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# The operator runs it as this uid with a read-only root filesystem and /tmp as an emptyDir.
USER 65532:65532
ENTRYPOINT ["voxfleet"]
CMD ["api", "--help"]
