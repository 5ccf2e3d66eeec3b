#!/usr/bin/env bash
# `make bench`: start every server the benchmark needs, run the short sweep, write the raw
# results to results/benchmarks-cpu.json and the plot to docs/img/benchmarks-cpu.png, rewrite
# the generated part of docs/benchmarks.md (table, plot, date, machine; the hand-written
# analysis and GPU sections are kept), stop the servers.
#
# Servers (each a real tritonserver from the nvidia-pytriton wheel, on free local ports):
#   voxfleet          voxfleet serve --voice joe
#   voxfleet-nobatch  voxfleet serve --voice joe --no-batching
#   triton-naive      python -m engines.bench.naive   (monolithic voice, dynamic batching)
# piper runs inside the benchmark process.
#
# Knobs (environment): BENCH_CONCURRENCY (default "auto": 1, 2, 4 and levels around the
# machine's measured limit), BENCH_DURATION (seconds per point, default 10), BENCH_SYSTEMS,
# BENCH_NOTE (a line for the page, e.g. what else was running).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
VOXFLEET=.venv/bin/voxfleet
RESULTS=results
IMG=docs/img
WORK=$(mktemp -d -t voxfleet-bench-XXXXXX)
PIDS=()

stop_servers() {
  local pid
  for pid in "${PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  PIDS=()
}
trap 'stop_servers; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

# Four consecutive free ports (gRPC, metrics, HTTP, health) per server: metrics = gRPC + 1
# keeps `voxfleet bench`'s default metrics address right; each `voxfleet serve` needs its own
# health port (the default, 8003, would be taken by the first).
free_ports() {
  "$PY" - <<'PYEOF'
import socket
def free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
base = 18000
found = []
while len(found) < 3:
    if all(free(base + i) for i in range(4)):
        found.append(base)
    base += 10
print(" ".join(str(b) for b in found))
PYEOF
}
read -r VOX NOBATCH NAIVE < <(free_ports)

start() {  # name, grpc port, command...
  local name=$1 grpc=$2
  shift 2
  "$@" --grpc-port "$grpc" --http-port $((grpc + 2)) --metrics-port $((grpc + 1)) \
    >"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
}

wait_ready() {  # name, grpc port
  local name=$1 http=$(($2 + 2)) deadline=$((SECONDS + 300))
  until curl -fsS "http://127.0.0.1:$http/v2/health/ready" >/dev/null 2>&1; do
    if ((SECONDS > deadline)); then
      echo "bench: $name did not become ready; its log:" >&2
      tail -n 40 "$WORK/$name.log" >&2
      exit 1
    fi
    sleep 1
  done
  echo "bench: $name ready on gRPC 127.0.0.1:$2" >&2
}

# Build the voice's engines once, before two servers race to do it.
"$PY" -c 'from engines.serving import plan_local_voices; plan_local_voices(["joe"])'

start voxfleet "$VOX" "$VOXFLEET" serve --voice joe --health-port $((VOX + 3))
start voxfleet-nobatch "$NOBATCH" "$VOXFLEET" serve --voice joe --no-batching --health-port $((NOBATCH + 3))
start triton-naive "$NAIVE" "$PY" -m engines.bench.naive
wait_ready voxfleet "$VOX"
wait_ready voxfleet-nobatch "$NOBATCH"
wait_ready triton-naive "$NAIVE"

mkdir -p "$RESULTS" "$IMG"
NOTES=()
if [[ -n "${BENCH_NOTE:-}" ]]; then
  NOTES+=(--note "$BENCH_NOTE")
fi

"$VOXFLEET" bench \
  --url "127.0.0.1:$VOX" --nobatch-url "127.0.0.1:$NOBATCH" --naive-url "127.0.0.1:$NAIVE" \
  --systems "${BENCH_SYSTEMS:-piper,triton-naive,voxfleet-nobatch,voxfleet}" \
  --concurrency "${BENCH_CONCURRENCY:-auto}" --duration "${BENCH_DURATION:-10}" --profile --stage-costs \
  --json "$RESULTS/benchmarks-cpu.json" --plot "$IMG/benchmarks-cpu.png" \
  --markdown docs/benchmarks.md "${NOTES[@]}"

stop_servers
echo "bench: wrote docs/benchmarks.md, $IMG/benchmarks-cpu.png, $RESULTS/benchmarks-cpu.json" >&2
