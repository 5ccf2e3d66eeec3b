#!/usr/bin/env bash
# The speech API gateway against direct gRPC, on fresh servers (docs/speech-api.md):
# for each run, a new `voxfleet serve --voice joe` and a new `voxfleet api` in front of it;
# then `python -m engines.bench.gateway paired` (listeners sending each sentence both ways,
# directly and through the gateway) and `python -m lab.speech_socket` (the WebSocket:
# first audio after a sentence ends, clear). Raw JSON goes to results/ (gzip-compressed), then the summary.
#
# Knobs (environment): RUNS (3), LEVELS (concurrency levels, "1,12"), DURATION (seconds per
# level, 60), TRIALS (WebSocket trials per run, 20; 0: none), OUT (results), TAG (file name
# part, the date by default).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
VOXFLEET=.venv/bin/voxfleet
RUNS=${RUNS:-3}
LEVELS=${LEVELS:-1,12}
DURATION=${DURATION:-60}
TRIALS=${TRIALS:-20}
OUT=${OUT:-results}
TAG=${TAG:-$(date -u +%Y-%m-%d)}
WORK=$(mktemp -d -t voxfleet-gateway-XXXXXX)
PIDS=()

stop_servers() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=()
}
trap 'stop_servers; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

read -r GRPC HTTP METRICS HEALTH API < <("$PY" - <<'PYEOF'
import socket
ports = []
while len(ports) < 5:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if port not in ports:
        ports.append(port)
print(*ports)
PYEOF
)

"$PY" -c 'from engines.commands.local_serving import plan_local_voices; plan_local_voices(["joe"])'
mkdir -p "$OUT"
FILES=()
for run in $(seq 1 "$RUNS"); do
  "$VOXFLEET" serve --voice joe --grpc-port "$GRPC" --http-port "$HTTP" --metrics-port "$METRICS" \
    --health-port "$HEALTH" --api-port 0 >"$WORK/serve-$run.log" 2>&1 &
  PIDS+=($!)
  "$VOXFLEET" api --upstream "127.0.0.1:$GRPC" --host 127.0.0.1 --port "$API" \
    >"$WORK/api-$run.log" 2>&1 &
  PIDS+=($!)
  deadline=$((SECONDS + 300))
  until curl -fsS "http://127.0.0.1:$API/v1/audio/voices" 2>/dev/null | grep -q '"ready_endpoints":[1-9]'; do
    if ((SECONDS > deadline)); then
      echo "gateway-overhead: servers not ready; logs:" >&2
      tail -n 20 "$WORK/serve-$run.log" "$WORK/api-$run.log" >&2
      exit 1
    fi
    sleep 1
  done
  file="$OUT/gateway-overhead-$TAG-run$run.json.gz"
  "$PY" -m engines.bench.gateway paired --grpc-url "127.0.0.1:$GRPC" \
    --api-url "http://127.0.0.1:$API" --concurrency "$LEVELS" --duration "$DURATION" --json "$file"
  if ((TRIALS > 0)); then
    "$PY" -m lab.speech_socket --url "http://127.0.0.1:$API" --trials "$TRIALS" \
      --json "$OUT/gateway-socket-$TAG-run$run.json.gz"
  fi
  FILES+=("$file")
  stop_servers
done
"$PY" -m engines.bench.gateway summary "${FILES[@]}" | gzip -9 -n \
  >"$OUT/gateway-overhead-$TAG-summary.json.gz"
echo "gateway-overhead: wrote ${FILES[*]} and $OUT/gateway-overhead-$TAG-summary.json.gz" >&2
