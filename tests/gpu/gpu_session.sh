#!/usr/bin/env bash
# One GPU session: the GPU tests, then the torch-cuda benchmark (lab/gpu_bench.py).
# Usage, from the repository root on a machine with CUDA PyTorch and onnxruntime:
#   bash tests/gpu/gpu_session.sh [extra gpu_bench arguments]
# Output goes to $OUT (default results/runs/gpu_session-<UTC time>/, which git ignores);
# what a page quotes is copied into results/ and indexed there (results/README.md).
# Wheels in .whl/ (the joe voice at least) are installed into /tmp/site first when present.
set -uo pipefail
OUT=${OUT:-results/runs/gpu_session-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch, onnxruntime; print("torch", torch.__version__, "cuda", torch.version.cuda, "onnxruntime", onnxruntime.__version__)' | tee -a "$OUT/gpu.txt"
ENTRY=$(python3 - <<'PY'
from engines.build.engine_build import build_engines, resolve_voice_model
entry = build_engines(resolve_voice_model("joe"), "torch-cuda", "fp16", "/tmp/voxfleet-cache")
print(entry.path)
PY
) || exit 1
echo "engine entry: $ENTRY"
timeout 240 python3 -m pytest -q -m gpu tests/gpu -s -p no:cacheprovider \
    2>&1 | tee "$OUT/pytest-gpu.log"
python3 -m lab.gpu_bench --engine-dir "$ENTRY" \
    --corpus-ids tests/gpu/data/corpus_ids.json --out "$OUT/bench-gpu-torch.json" "$@" \
    2>&1 | tee "$OUT/gpu-bench.log"
