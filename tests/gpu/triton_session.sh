#!/usr/bin/env bash
# The GPU benchmark with real Triton: two tritonservers from the nvidia-pytriton wheel, the
# torch-cuda runtime (with and without cross-stream batching), `voxfleet bench` against them.
# Usage (repository root, CUDA PyTorch machine, wheels in .whl/ or already in /tmp/site).
# The Python-backend stub does not see PYTHONPATH: what the model imports (piper-tts, NumPy 1.x)
# must be installed in the Python environment itself, not only in /tmp/site.
#   OUT=results bash tests/gpu/triton_session.sh [CONCURRENCY]
set -uo pipefail
OUT=${OUT:-gpu-results}
CONCURRENCY=${1:-100,250,500,1000,2000}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
# Only the tritonserver binary and backends of the nvidia-pytriton wheel are used; its own
# client (pyzmq, sh, ...) is not, so a bare environment may lack what its __init__ imports.
python3 -c 'import pytriton' 2>/dev/null || : > /tmp/site/pytriton/__init__.py
export VOXFLEET_CACHE=/tmp/voxfleet-cache
# Triton 2.51's Python-backend stub needs NumPy 1.x: under NumPy 2 it misreads BYTES inputs
# (the TEXT tensor) and dies. The stub imports the environment's own NumPy.
python3 -c 'import numpy, sys; print("numpy", numpy.__version__, numpy.__file__); sys.exit(numpy.__version__ >= "2")' \
    || echo "warning: NumPy 2 in this environment; the Triton Python backend will fail on TEXT"
python3 -c 'from engines.plan import ServingPlan; from engines.serving import plan_local_voices; plan_local_voices(["joe"], None, ServingPlan("template", "", runtime="torch-cuda"))' || exit 1
pkill -f tritonserver && sleep 3  # servers of an earlier, interrupted session
python3 -m engines.cli serve --runtime torch-cuda --max-batch-windows 128 --max-encoder-batch 32 --voice joe --grpc-port 18000 --metrics-port 18001 --http-port 18002 >"$OUT/triton-batched.log" 2>&1 &
P1=$!
trap 'kill -TERM $P1 ${P2:-} 2>/dev/null; wait 2>/dev/null' EXIT
# One server warms up at a time: cuDNN's autotuning of two at once can take the whole GPU.
for _ in $(seq 1 300); do
    curl -fsS "http://127.0.0.1:18002/v2/health/ready" >/dev/null 2>&1 && break
    kill -0 $P1 2>/dev/null || break
    sleep 1
done
if [[ "${NOBATCH:-1}" == 1 ]]; then
    python3 -m engines.cli serve --runtime torch-cuda --max-batch-windows 128 --max-encoder-batch 32 --voice joe --grpc-port 18010 --metrics-port 18011 --http-port 18012 --no-batching \
        >"$OUT/triton-nobatch.log" 2>&1 &
    P2=$!
    PORTS="18002 18012"
    SYSTEMS=voxfleet-nobatch,voxfleet
    NOBATCH_URL=(--nobatch-url 127.0.0.1:18010)
else
    P2=$P1
    PORTS=18002
    SYSTEMS=voxfleet
    NOBATCH_URL=()
fi
for port in $PORTS; do
    for _ in $(seq 1 300); do
        curl -fsS "http://127.0.0.1:$port/v2/health/ready" >/dev/null 2>&1 && break
        kill -0 $P1 2>/dev/null && kill -0 $P2 2>/dev/null || break  # a server died
        sleep 1
    done
done
keep_logs() {  # the servers' own logs, whole, for a failed start
    for f in /tmp/voxfleet-serve-*/tritonserver.log; do
        sed 's/  */ /g' "$f" > "$OUT/$(basename "$(dirname "$f")").log"
    done
}
curl -fsS http://127.0.0.1:18002/v2/health/ready && echo "batched ready" || { keep_logs; grep -E "UNAVAILABLE|Error|error" /tmp/voxfleet-serve-*/tritonserver.log | sed 's/  */ /g' | cut -c1-600 | tail -n 12; exit 1; }
if [[ "${NOBATCH:-1}" == 1 ]]; then
    curl -fsS http://127.0.0.1:18012/v2/health/ready && echo "nobatch ready" || { keep_logs; tail -n 30 "$OUT/triton-nobatch.log"; exit 1; }
fi
nvidia-smi --query-gpu=memory.used,memory.total --format=csv | tee "$OUT/gpu-memory.txt"
timeout 60 python3 -m engines.cli say --url 127.0.0.1:18000 --json -o "$OUT/smoke.wav" \
    "Four score and seven years ago." || {
    for f in /tmp/voxfleet-serve-*/tritonserver.log; do grep -iE "terminate|error" -A3 "$f" | tail -6; done
    exit 1
}
if [[ -n "${PROFILE_DELAY:-}" ]]; then
    # Where the batched server's processes spend their CPU under load: per-process CPU (the
    # tritonserver and its Python stub), per-thread CPU of the stub, and py-spy on the stub's
    # busy threads, summarised by engines.bench.profile.
    (
        sleep "$PROFILE_DELAY"
        server=$(pgrep -P "$P1" | head -n 1)  # the serve command.s child: the batched tritonserver
        stub=$(pgrep -P "$server" | head -n 1)
        echo "server $server stub $stub" >"$OUT/profile-processes.txt"
        top -b -n 2 -d 5 -p "$server,$stub" | tail -n 4 >>"$OUT/profile-processes.txt"
        top -H -b -n 2 -d 5 -p "$stub" | tail -n 25 >"$OUT/profile-stub-threads.txt"
        py-spy record --pid "$stub" --duration 10 --rate 100 --format raw --nonblocking \
            --output "$OUT/stub.txt" >"$OUT/py-spy.log" 2>&1
        python3 -c 'import json, sys; from engines.bench.profile import summarise_raw; print(json.dumps(summarise_raw(open(sys.argv[1]).read(), top=30), indent=1))' \
            "$OUT/stub.txt" >"$OUT/stub-summary.json"
    ) &
fi
timeout 380 python3 -m engines.cli bench --url 127.0.0.1:18000 "${NOBATCH_URL[@]}" \
    --systems "$SYSTEMS" --concurrency "$CONCURRENCY" --duration 10 --drain 15 \
    --p95-bound-ms 150 --json "$OUT/bench-gpu.json" \
    --note "torch-cuda runtime, FP16 flow+vocoder, CUDA graphs; scheduler 128 windows / 32 sentences per step" \
    2>&1 | tee "$OUT/bench.log"
kill -TERM $P1 $P2 2>/dev/null; wait $P1 $P2 2>/dev/null
find /tmp -name 'tritonserver.log' -newer "$OUT/bench.log" -o -name 'tritonserver.log' 2>/dev/null | head -2 | while read -r f; do tail -n 40 "$f" > "$OUT/$(basename "$(dirname "$f")")-tritonserver-tail.log"; done
