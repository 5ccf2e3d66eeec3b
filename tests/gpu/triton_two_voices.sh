#!/usr/bin/env bash
# Two voices in one Triton on one GPU: the joe voice served twice, as `joe` and as `joe2` (a
# copy of its files under another name), one batched stream model each, and the two loaded
# evenly by two `voxfleet bench` runs at the same time. Compare the aggregate with one voice
# (tests/gpu/triton_session.sh). Run after triton_session.sh has installed what the stub needs.
#   OUT=results bash tests/gpu/triton_two_voices.sh TOTAL_CONCURRENCY   (split evenly)
set -uo pipefail
OUT=${OUT:-gpu-results}
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
SECOND=$RUN_TMP/joe2
mkdir -p "$SECOND"
read -r MODEL CONFIG < <(python3 -c 'from engines.voice import load_voice; v = load_voice("joe"); print(v.model_path, v.config_path)')
cp "$MODEL" "$SECOND/joe2.onnx" && cp "$CONFIG" "$SECOND/joe2.onnx.json" || exit 1
python3 -m engines.cli serve --runtime torch-cuda --max-batch-windows 128 --max-encoder-batch 32 \
    --voice joe --voice "$SECOND/joe2.onnx" --grpc-port 18000 --metrics-port 18001 \
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
    for model in joe joe2; do
        timeout 200 python3 -m engines.cli bench --url 127.0.0.1:18000 --model $model \
            --systems voxfleet --concurrency $((level / 2)) --duration 10 --drain 15 \
            --p95-bound-ms 150 --limit-sentences 1 --json "$OUT/bench-$level-$model.json" \
            --note "voice $model of two in one Triton, $level streams in all, loaded at once" \
            >"$OUT/bench-$level-$model.log" 2>&1 &
        BENCH+=($!)
    done
    wait "${BENCH[@]}"
    grep -h "voxfleet c=" "$OUT"/bench-"$level"-*.log
done
