#!/usr/bin/env bash
# `make bench`: start every server the benchmark needs, run the short sweep, write the raw
# results to results/benchmarks-cpu.json.gz and the plot to docs/img/benchmarks-cpu.png, rewrite
# the generated part of docs/benchmarks.md (table, plot, date, machine; the hand-written
# analysis and GPU sections are kept), stop the servers.
#
# Servers (each a real tritonserver from the nvidia-pytriton wheel, on free local ports):
#   voxfleet          voxfleet serve --voice joe
#   voxfleet-nobatch  voxfleet serve --voice joe --no-batching
#   voxfleet-paced    voxfleet serve --voice joe --max-lead-ms BENCH_LEAD_MS (1000): the
#                     setting for listeners who play the audio as it comes; the real-time
#                     goal is read from it
#   triton-naive      python -m engines.bench.naive   (monolithic voice, dynamic batching)
#   voxfleet-api      voxfleet api --upstream <the voxfleet server>   (the speech API gateway,
#                     in front of the same server the voxfleet system streams from directly)
# piper runs inside the benchmark process. Only the servers of BENCH_SYSTEMS are started.
#
# Knobs (environment): BENCH_CONCURRENCY (default "auto": 1, 2, 4 and levels around the
# machine's measured limit), BENCH_DURATION (seconds per point, default 10), BENCH_SYSTEMS,
# BENCH_NOTE (a line for the page, e.g. what else was running), BENCH_OUT (folder of the raw
# JSON and the plot, default docs), BENCH_MARKDOWN (the page to rewrite, default
# docs/benchmarks.md; "none": no page), BENCH_PROFILE and BENCH_STAGE_COSTS (1 by default;
# 0 leaves out the py-spy profile of one voxfleet level and the stage timings), BENCH_LEAD_MS
# (the voxfleet-paced server's lead limit, default 1000, as `make autoscale`'s voices).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
VOXFLEET=.venv/bin/voxfleet
RESULTS=${BENCH_OUT:-results}
IMG=docs/img
MARKDOWN=${BENCH_MARKDOWN:-docs/benchmarks.md}
SYSTEMS=${BENCH_SYSTEMS:-piper,triton-naive,voxfleet-nobatch,voxfleet,voxfleet-paced,voxfleet-api}
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
while len(found) < 5:
    if all(free(base + i) for i in range(4)):
        found.append(base)
    base += 10
print(" ".join(str(b) for b in found))
PYEOF
}
read -r VOX NOBATCH NAIVE API PACED < <(free_ports)

wants() {  # system name: whether BENCH_SYSTEMS has it
  [[ ",$SYSTEMS," == *",$1,"* ]]
}

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
"$PY" -c 'from engines.commands.local_serving import plan_local_voices; plan_local_voices(["joe"])'

# The gateway streams from the voxfleet server, so that one needs starting for either.
if wants voxfleet || wants voxfleet-api; then
  start voxfleet "$VOX" "$VOXFLEET" serve --voice joe --health-port $((VOX + 3)) --api-port 0
fi
if wants voxfleet-nobatch; then
  start voxfleet-nobatch "$NOBATCH" "$VOXFLEET" serve --voice joe --no-batching \
    --health-port $((NOBATCH + 3)) --api-port 0
fi
if wants voxfleet-paced; then
  start voxfleet-paced "$PACED" "$VOXFLEET" serve --voice joe --max-lead-ms "${BENCH_LEAD_MS:-1000}" \
    --health-port $((PACED + 3)) --api-port 0
fi
if wants triton-naive; then
  start triton-naive "$NAIVE" "$PY" -m engines.bench.naive
fi
if wants voxfleet-api; then
  "$VOXFLEET" api --upstream "127.0.0.1:$VOX" --host 127.0.0.1 --port "$API" \
    >"$WORK/voxfleet-api.log" 2>&1 &
  PIDS+=($!)
fi
if wants voxfleet || wants voxfleet-api; then wait_ready voxfleet "$VOX"; fi
if wants voxfleet-nobatch; then wait_ready voxfleet-nobatch "$NOBATCH"; fi
if wants voxfleet-paced; then wait_ready voxfleet-paced "$PACED"; fi
if wants triton-naive; then wait_ready triton-naive "$NAIVE"; fi
if wants voxfleet-api; then
  deadline=$((SECONDS + 60))
  until curl -fsS "http://127.0.0.1:$API/v1/audio/voices" 2>/dev/null | grep -q '"ready_endpoints":[1-9]'; do
    if ((SECONDS > deadline)); then
      echo "bench: voxfleet-api did not become ready; its log:" >&2
      tail -n 40 "$WORK/voxfleet-api.log" >&2
      exit 1
    fi
    sleep 1
  done
  echo "bench: voxfleet-api ready on http://127.0.0.1:$API" >&2
fi

mkdir -p "$RESULTS" "$IMG"
EXTRA=()
if [[ -n "${BENCH_NOTE:-}" ]]; then
  EXTRA+=(--note "$BENCH_NOTE")
fi
if [[ "${BENCH_PROFILE:-1}" != 0 ]]; then EXTRA+=(--profile); fi
if [[ "${BENCH_STAGE_COSTS:-1}" != 0 ]]; then EXTRA+=(--stage-costs); fi
if [[ "$MARKDOWN" != none ]]; then EXTRA+=(--markdown "$MARKDOWN"); fi

"$VOXFLEET" bench \
  --url "127.0.0.1:$VOX" --nobatch-url "127.0.0.1:$NOBATCH" --naive-url "127.0.0.1:$NAIVE" \
  --paced-url "127.0.0.1:$PACED" \
  --api-url "http://127.0.0.1:$API" --systems "$SYSTEMS" \
  --concurrency "${BENCH_CONCURRENCY:-auto}" --duration "${BENCH_DURATION:-10}" \
  --json "$RESULTS/benchmarks-cpu.json.gz" --plot "$IMG/benchmarks-cpu.png" "${EXTRA[@]}"

stop_servers
echo "bench: wrote $IMG/benchmarks-cpu.png, $RESULTS/benchmarks-cpu.json.gz" >&2
if [[ "$MARKDOWN" != none ]]; then echo "bench: rewrote $MARKDOWN" >&2; fi
