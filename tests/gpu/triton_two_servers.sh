#!/usr/bin/env bash
# Two batched stream-model servers (two tritonservers, one Python stub each) on one GPU, each
# loaded by its own `voxfleet bench` at the same time: does a second process per GPU add
# real-time streams where one process's host work is the limit? Run after
# tests/gpu/triton_session.sh has installed what the stub needs (same machine).
#   bash tests/gpu/triton_two_servers.sh PER_SERVER_CONCURRENCY
# Output: $OUT, default results/runs/triton_two_servers-<UTC time>/ (results/README.md).
set -uo pipefail
OUT=${OUT:-results/runs/triton_two_servers-$(date -u +%Y%m%dT%H%M%SZ)}
CONCURRENCY=${1:-250,500}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 VOXFLEET_CACHE=/tmp/voxfleet-cache
RUN_TMP=$(mktemp -d -t voxfleet-two-servers-XXXXXX)
export TMPDIR=$RUN_TMP
PIDS=()
trap 'kill -TERM "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null' EXIT
for port in 18000 18001 18002 18010 18011 18012; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "triton_two_servers: port $port is in use; stop the server on it first" >&2
        exit 1
    fi
done
for base in 18000 18010; do
    python3 -m engines.cli serve --runtime torch-cuda --max-batch-windows 128 \
        --max-encoder-batch 32 --voice joe --grpc-port $base --metrics-port $((base + 1)) \
        --http-port $((base + 2)) --health-port $((base + 3)) >"$OUT/triton-$base.log" 2>&1 &
    PIDS+=($!)
    # One server warms up at a time: cuDNN's autotuning of two at once can take the whole GPU.
    for _ in $(seq 1 300); do
        curl -fsS "http://127.0.0.1:$((base + 2))/v2/health/ready" >/dev/null 2>&1 && break
        kill -0 "${PIDS[-1]}" 2>/dev/null || { tail -n 30 "$OUT/triton-$base.log"; exit 1; }
        sleep 1
    done
    curl -fsS "http://127.0.0.1:$((base + 2))/v2/health/ready" || exit 1
done
nvidia-smi --query-gpu=memory.used,memory.total --format=csv | tee "$OUT/gpu-memory.txt"
# One level at a time, both benches started together, so their levels overlap in time.
for level in ${CONCURRENCY//,/ }; do
    BENCH=()
    for base in 18000 18010; do
        timeout 200 python3 -m engines.cli bench --url 127.0.0.1:$base --systems voxfleet \
            --concurrency "$level" --duration 10 --drain 15 --p95-bound-ms 150 \
            --limit-sentences 1 --json "$OUT/bench-$level-$base.json" \
            --note "one of two batched servers on one GPU, loaded at the same time" \
            >"$OUT/bench-$level-$base.log" 2>&1 &
        BENCH+=($!)
    done
    wait "${BENCH[@]}"
    grep -h "voxfleet c=" "$OUT"/bench-"$level"-*.log
done
