#!/usr/bin/env bash
# Several voices in one Triton on one GPU: the joe voice served VOICES times (default 2), as
# `joe`, `joe2`, ... (copies of its files under other names), one batched stream model each,
# all loaded evenly by one `voxfleet bench` per voice at the same time. Compare the aggregate
# with one voice (tests/gpu/triton_session.sh). Run after triton_session.sh has installed
# what the stub needs.
#   VOICES=2 bash tests/gpu/triton_two_voices.sh TOTAL_CONCURRENCY  (split evenly)
# Output: $OUT, default results/runs/triton_two_voices-<UTC time>/ (results/README.md).
set -uo pipefail
OUT=${OUT:-results/runs/triton_two_voices-$(date -u +%Y%m%dT%H%M%SZ)}
CONCURRENCY=${1:-250,500}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 VOXFLEET_CACHE=/tmp/voxfleet-cache
RUN_TMP=$(mktemp -d -t voxfleet-two-voices-XXXXXX)
export TMPDIR=$RUN_TMP
for port in 18000 18001 18002; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "triton_two_voices: port $port is in use; stop the server on it first" >&2
        exit 1
    fi
done
read -r MODEL CONFIG < <(python3 -c 'from engines.text.voice import load_voice; v = load_voice("joe"); print(v.model_path, v.config_path)')
MODELS=(joe)
VOICE_ARGS=(--voice joe)
for n in $(seq 2 "${VOICES:-2}"); do
    mkdir -p "$RUN_TMP/joe$n"
    cp "$MODEL" "$RUN_TMP/joe$n/joe$n.onnx" && cp "$CONFIG" "$RUN_TMP/joe$n/joe$n.onnx.json" || exit 1
    MODELS+=("joe$n")
    VOICE_ARGS+=(--voice "$RUN_TMP/joe$n/joe$n.onnx")
done
python3 -m engines.cli serve --runtime torch-cuda --max-batch-windows 128 --max-encoder-batch 32 \
    "${VOICE_ARGS[@]}" --grpc-port 18000 --metrics-port 18001 \
    --http-port 18002 >"$OUT/triton-two-voices.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq 1 400); do
    curl -fsS "http://127.0.0.1:18002/v2/health/ready" >/dev/null 2>&1 && break
    kill -0 $SERVER 2>/dev/null || { tail -n 30 "$OUT/triton-two-voices.log"; exit 1; }
    sleep 1
done
curl -fsS "http://127.0.0.1:18002/v2/health/ready" || { tail -n 30 "$OUT/triton-two-voices.log"; exit 1; }
nvidia-smi --query-gpu=memory.used,memory.total --format=csv | tee "$OUT/gpu-memory.txt"
for level in ${CONCURRENCY//,/ }; do
    BENCH=()
    for model in "${MODELS[@]}"; do
        timeout 200 python3 -m engines.cli bench --url 127.0.0.1:18000 --model $model \
            --systems voxfleet --concurrency $((level / ${#MODELS[@]})) --duration 10 --drain 15 \
            --p95-bound-ms 150 --limit-sentences 1 --json "$OUT/bench-$level-$model.json" \
            --note "voice $model of ${#MODELS[@]} in one Triton, $level streams in all, loaded at once" \
            >"$OUT/bench-$level-$model.log" 2>&1 &
        BENCH+=($!)
    done
    wait "${BENCH[@]}"
    grep -h "voxfleet c=" "$OUT"/bench-"$level"-*.log
done
