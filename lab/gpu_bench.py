"""Measure the torch-cuda runtime on a GPU: stage throughput, FP16 quality, stream capacity.

    python -m lab.gpu_bench --engine-dir ENTRY \\
        --corpus-ids tests/gpu/data/corpus_ids.json --out bench.json

Four parts, each written into one JSON document (``--skip`` leaves parts out):
- ``stages``: each stage alone at rising batch with CUDA graphs (median of timed calls with
  the host copies in and out included): seconds of audio per second of GPU time;
- ``quality``: FP16 flow+vocoder against FP32 on the corpus, SNR in dB (noise scales 0);
- ``streams``: the real `StreamScheduler` in-process with this runtime and closed-loop
  simulated listeners (no Triton, no network): first-audio p50/p95, streams that ran dry
  (a chunk arrived after the audio before it had finished playing), audio seconds per second,
  and the vocoder batch-size histogram, at each concurrency, with and without batching;
- ``encoder_profile``: the encoder's kernels under torch.profiler at batch 16, and its
  captured core and eager expansion timed apart.
The Triton benchmark (`voxfleet bench` against `voxfleet serve --runtime torch-cuda`) is the
end-to-end figure; this one isolates the GPU data plane.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engines.runtimes.torch_cuda.stages import TorchCudaStages, padded_phonemes

SAMPLE_RATE = 22050
HOP = 256


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def median_seconds(call: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        call()
    _sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        _sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def load_corpus_ids(path: Path) -> list[list[int]]:
    return [entry["ids"] for entry in json.loads(path.read_text())["sentences"]]


def padded_ids(sentences: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Sentences' phoneme ids as one zero-padded batch, and their lengths."""
    longest = max(len(ids) for ids in sentences)
    ids = torch.zeros(len(sentences), longest, dtype=torch.int64)
    for row, sentence in enumerate(sentences):
        ids[row, : len(sentence)] = torch.tensor(sentence)
    return ids, torch.tensor([len(s) for s in sentences], dtype=torch.int64)


def bench_stages(
    stages: TorchCudaStages,
    corpus: list[list[int]],
    batches: Sequence[int] = (1, 8, 32, 64, 128, 256),
    vocoder_frames: Sequence[int] = (40, 144),
    flow_frames: Sequence[int] = (64, 304),
    encoder_batches: Sequence[int] = (1, 8, 32, 64),
    repeats: int = 20,
) -> dict[str, Any]:
    device = stages.device
    generator = torch.Generator(device=device).manual_seed(0)
    rows: list[dict[str, Any]] = []
    # Time exactly the frames asked for (no padding to the serving frame multiple).
    multiples = (stages.flow_stage.frame_multiple, stages.vocoder_stage.frame_multiple)
    stages.flow_stage.frame_multiple = stages.vocoder_stage.frame_multiple = 8
    # Largest first, as a pod's warmup captures them: a stage's first graph is the one that
    # times cuDNN's autotuning against its heuristics (TorchCudaStages).
    for frames in sorted(vocoder_frames, reverse=True):
        for batch in sorted(batches, reverse=True):
            latent = torch.randn(batch, 192, frames, device=device, generator=generator)
            seconds = median_seconds(partial(stages.vocode_tensor, latent), repeats)
            audio = batch * frames * HOP / SAMPLE_RATE
            rows.append(
                {
                    "stage": "vocoder",
                    "batch": batch,
                    "frames": frames,
                    "ms": round(seconds * 1e3, 3),
                    "audio_seconds_per_second": round(audio / seconds, 1),
                }
            )
    for frames in sorted(flow_frames, reverse=True):
        for batch in sorted(batches, reverse=True):
            prior = torch.randn(batch, 192, frames, device=device, generator=generator)
            mask = torch.ones(batch, 1, frames, device=device)
            seconds = median_seconds(partial(stages.flow_tensor, prior, mask), repeats)
            audio = batch * frames * HOP / SAMPLE_RATE
            rows.append(
                {
                    "stage": "flow",
                    "batch": batch,
                    "frames": frames,
                    "ms": round(seconds * 1e3, 3),
                    "audio_seconds_per_second": round(audio / seconds, 1),
                }
            )
    scales = torch.tensor([0.667, 1.0, 0.8])
    for batch in sorted(encoder_batches, reverse=True):
        picked = [corpus[i % len(corpus)] for i in range(batch)]
        ids, lengths = padded_ids(picked)
        frames_out: list[int] = []

        def encode(
            ids: torch.Tensor = ids, lengths: torch.Tensor = lengths, out: list[int] = frames_out
        ) -> None:
            _, mask = stages.encode_tensor(ids, lengths, scales)
            out.append(int(mask.sum()))

        seconds = median_seconds(encode, max(5, repeats // 4))
        audio = statistics.median(frames_out) * HOP / SAMPLE_RATE
        rows.append(
            {
                "stage": "encoder",
                "batch": batch,
                "phonemes": int(ids.shape[1]),
                "ms": round(seconds * 1e3, 3),
                "audio_seconds_per_second": round(audio / seconds, 1),
            }
        )
    stages.flow_stage.frame_multiple, stages.vocoder_stage.frame_multiple = multiples
    return {
        "rows": rows,
        "graphs": len(stages.flow_stage.graphs) + len(stages.vocoder_stage.graphs),
        "warmup": stages.warmup_report(),
    }


def stage_limit(rows: Sequence[dict[str, Any]], max_windows: int, max_sentences: int) -> dict:
    """The audio a second the three stages make together, each at its best batch within the
    plan's limits (`max_windows` windows a flow or vocoder call, `max_sentences` sentences an
    encoder call) and at the steady window's shapes (the widest frames timed): the ceiling a
    pod's scheduler could reach if the host cost nothing. Each stage's device time per second
    of audio adds up: 1 / sum(1 / rate)."""
    best: dict[str, float] = {}
    for stage, limit in (
        ("encoder", max_sentences),
        ("flow", max_windows),
        ("vocoder", max_windows),
    ):
        picked = [r for r in rows if r["stage"] == stage and r["batch"] <= limit]
        if stage != "encoder" and picked:
            widest = max(r["frames"] for r in picked)
            picked = [r for r in picked if r["frames"] == widest]
        if picked:
            best[stage] = max(r["audio_seconds_per_second"] for r in picked)
    together = 1.0 / sum(1.0 / rate for rate in best.values()) if len(best) == 3 else None
    return {
        "per_stage": best,
        "audio_seconds_per_second": round(together, 1) if together else None,
        "max_windows": max_windows,
        "max_sentences": max_sentences,
    }


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    noise = float(np.sum((reference.astype(np.float64) - test) ** 2))
    signal = float(np.sum(reference.astype(np.float64) ** 2))
    return float("inf") if noise == 0 else 10.0 * np.log10(signal / noise)


def fp16_quality(
    engine_dir: Path, corpus: list[list[int]], sentences: int = 40, device: str = "cuda"
) -> dict[str, Any]:
    """FP16 flow+vocoder against FP32, whole sentences, noise scales 0 (deterministic)."""
    fp32 = TorchCudaStages(engine_dir, device=device, precision="fp32", use_graphs=False)
    fp16 = TorchCudaStages(engine_dir, device=device, precision="fp16", use_graphs=False)
    scales = torch.tensor([0.0, 1.0, 0.0])
    per_sentence: list[float] = []
    references, tests = [], []
    for ids_list in corpus[:sentences]:
        ids, lengths = padded_ids([ids_list])
        prior, mask = fp32.encode_tensor(ids, lengths, scales)
        reference = fp32.vocode_tensor(fp32.flow_tensor(prior, mask)).float().cpu().numpy()[0]
        test = fp16.vocode_tensor(fp16.flow_tensor(prior, mask)).float().cpu().numpy()[0]
        per_sentence.append(snr_db(reference, test))
        references.append(reference)
        tests.append(test)
    return {
        "sentences": len(per_sentence),
        "snr_db_all": round(snr_db(np.concatenate(references), np.concatenate(tests)), 2),
        "snr_db_min": round(min(per_sentence), 2),
        "snr_db_median": round(statistics.median(per_sentence), 2),
    }


# -- in-process stream capacity -----------------------------------------------------------


@dataclass
class _Listener:
    submitted: float
    chunk_times: list[float] = field(default_factory=list)
    chunk_seconds: list[float] = field(default_factory=list)
    finished: float | None = None
    error: str | None = None

    def late_chunks(self) -> int:
        """Chunks that found the player silent (it resumes from each), as `voxfleet bench`."""
        if not self.chunk_times:
            return 0
        late, playing_until = 0, self.chunk_times[0] + self.chunk_seconds[0]
        for arrived, seconds in zip(self.chunk_times[1:], self.chunk_seconds[1:], strict=True):
            if arrived > playing_until:
                late += 1
                playing_until = arrived
            playing_until += seconds
        return late

    def ran_dry(self, slack_seconds: float = 0.0) -> bool:
        """A chunk arrived after everything before it had played (playback from chunk 0)."""
        if not self.chunk_times:
            return False
        start, played = self.chunk_times[0], 0.0
        for arrived, seconds in zip(self.chunk_times, self.chunk_seconds, strict=True):
            if arrived > start + played + slack_seconds:
                return True
            played += seconds
        return False


def simulate_streams(
    stages: TorchCudaStages,
    corpus: list[list[int]],
    streams: int,
    seconds: float,
    batching: bool = True,
    windows: Any = None,
    ramp_seconds: float = 3.0,
    host_frames: bool = False,
) -> dict[str, Any]:
    """Keep `streams` listeners connected for `seconds`; each asks for one corpus sentence."""
    from engines.streaming import StreamScheduler, StreamSink, SynthesisParams
    from engines.text.frontend import Sentence

    scheduler = StreamScheduler(
        stages, SAMPLE_RATE, HOP, windows=windows, cross_stream_batching=batching
    )
    if host_frames:  # the frame stores in host memory, as for a CPU runtime (A/B)
        from engines.streaming.frames import HostBackend

        scheduler.backend = HostBackend(stages)
    warm_started = time.monotonic()
    shapes = scheduler.warmup(max_phonemes=32 * (1 + max(len(ids) for ids in corpus) // 32))
    warm_seconds = time.monotonic() - warm_started
    listeners: list[_Listener] = []
    lock = threading.Lock()
    counter = iter(range(10**9))
    stop_at = [float("inf")]
    params = SynthesisParams()

    class Sink(StreamSink):
        def __init__(self, listener: _Listener) -> None:
            self.listener = listener

        def audio(self, pcm: np.ndarray) -> None:
            self.listener.chunk_times.append(time.monotonic())
            self.listener.chunk_seconds.append(len(pcm) / SAMPLE_RATE)

        def finish(self, error: Exception | None = None) -> None:
            self.listener.finished = time.monotonic()
            self.listener.error = None if error is None else str(error)
            if time.monotonic() < stop_at[0]:
                submit()

    def submit() -> None:
        index = next(counter)
        ids = corpus[index % len(corpus)]
        listener = _Listener(submitted=time.monotonic())
        with lock:
            listeners.append(listener)
        scheduler.submit([Sentence(text="", ids=list(ids))], params, Sink(listener))

    scheduler.start()
    started = time.monotonic()
    stop_at[0] = started + ramp_seconds + seconds
    try:
        for n in range(streams):
            target = started + ramp_seconds * n / streams
            delay = target - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            submit()
        while time.monotonic() < stop_at[0]:
            time.sleep(0.05)
    finally:
        ended = time.monotonic()
        scheduler.stop()
    measure_from = started + ramp_seconds
    with lock:
        measured = [
            lis
            for lis in listeners
            if lis.submitted >= measure_from and lis.finished is not None and lis.error is None
        ]
        audio_in_window = sum(
            seconds_
            for lis in listeners
            for at, seconds_ in zip(lis.chunk_times, lis.chunk_seconds, strict=True)
            if measure_from <= at <= ended
        )
    first_audio = sorted(lis.chunk_times[0] - lis.submitted for lis in measured if lis.chunk_times)
    dry = sum(1 for lis in measured if lis.ran_dry())
    late_chunks = sum(lis.late_chunks() for lis in measured)

    def percentile(values: list[float], q: float) -> float | None:
        if not values:
            return None
        return round(values[min(len(values) - 1, int(q * len(values)))] * 1e3, 1)

    histogram = dict(sorted(scheduler.stats.vocoder_batches.items()))
    return {
        "streams": streams,
        "batching": batching,
        "seconds": round(ended - measure_from, 2),
        "completed_streams": len(measured),
        "first_audio_ms_p50": percentile(first_audio, 0.50),
        "first_audio_ms_p95": percentile(first_audio, 0.95),
        "streams_ran_dry": dry,
        "late_chunks": late_chunks,
        "chunks": sum(len(lis.chunk_times) for lis in measured),
        "zero_underruns": dry == 0 and len(measured) > 0,
        "audio_seconds_per_second": round(audio_in_window / max(1e-9, ended - measure_from), 1),
        "vocoder_batch_histogram": {str(k): v for k, v in histogram.items()},
        "windows": asdict(scheduler.windows),
        "frames": "host" if host_frames else "device",
        "stage_totals": {
            stage: dict(zip(("calls", "seconds", "rows", "frames"), total, strict=True))
            for stage, total in scheduler.costs.totals.items()
        },
        "graphs": shapes,
        "warmup_seconds": round(warm_seconds, 1),
    }


def profile_encoder(
    stages: TorchCudaStages, corpus: list[list[int]], batch: int = 16
) -> dict[str, Any]:
    """Where the encoder's GPU time goes: its core run eagerly under torch.profiler, then
    the captured core and the eager expansion timed apart."""
    from torch.profiler import ProfilerActivity, profile

    from engines.runtimes.torch_cuda import acoustic

    core = stages.encoder_core
    if core is None:
        return {"error": "this voice has no captured encoder core"}
    ids, lengths = padded_ids([corpus[i % len(corpus)] for i in range(batch)])
    padded = padded_phonemes(ids.shape[1])
    ids = torch.nn.functional.pad(ids, (0, padded - ids.shape[1])).to(stages.device)
    lengths = lengths.to(stages.device)
    noise = torch.randn(batch, 2, padded, device=stages.device) * 0.8
    with torch.backends.cudnn.flags(enabled=True, benchmark=True, allow_tf32=False):
        for _ in range(3):
            outputs = core(ids, lengths, noise)
        m_p, logs_p, x_mask, logw = outputs
        _sync()
        on_gpu = stages.device.type == "cuda"
        activity = ProfilerActivity.CUDA if on_gpu else ProfilerActivity.CPU
        with profile(activities=[activity]) as prof:
            for _ in range(5):
                core(ids, lengths, noise)
            _sync()
        eager_ms = median_seconds(lambda: core(ids, lengths, noise), 10) * 1e3
        expand_ms = 1e3 * median_seconds(
            lambda: acoustic.expand(m_p, logs_p, x_mask, logw, 1.0, 0.667), 10
        )
    scales = torch.tensor([0.667, 1.0, 0.8])
    graphed_ms = (
        median_seconds(lambda: stages.encode_tensor(ids.cpu(), lengths.cpu(), scales), 10) * 1e3
    )
    rows = []
    for event in prof.key_averages():
        if stages.device.type == "cuda":
            total = getattr(event, "self_device_time_total", 0)
        else:
            total = event.self_cpu_time_total
        if total:
            rows.append({"kernel": event.key[:120], "calls": event.count // 5, "ms": total / 5e3})
    rows.sort(key=lambda row: -row["ms"])
    return {
        "batch": batch,
        "phonemes_padded": padded,
        "core_eager_ms": round(eager_ms, 3),
        "expand_ms": round(expand_ms, 3),
        "encode_tensor_graphed_ms": round(graphed_ms, 3),
        "kernels_per_call": sum(row["calls"] for row in rows),
        "top_kernels": rows[:25],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine-dir", type=Path, required=True)
    parser.add_argument("--corpus-ids", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--streams", default="250,500,1000,1500,2000,2500,3000")
    parser.add_argument("--unbatched-streams", default="25,50,100")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument(
        "--configs",
        default="64x8,128x32",
        help="scheduler configurations to run batched: WINDOWSxSENTENCES (most windows and "
        "sentences per step); 64x8 is the stream model's default",
    )
    parser.add_argument(
        "--frames",
        default="device",
        help="comma list: where batched runs keep the frame stores (device, host)",
    )
    parser.add_argument("--skip", default="", help="comma list of parts to skip")
    parser.add_argument(
        "--stop-when-saturated",
        action="store_true",
        help="skip a configuration's larger stream counts once more than half of a level's "
        "streams ran dry (by default every level asked for runs)",
    )
    parser.add_argument("--quality-sentences", type=int, default=40)
    args = parser.parse_args(argv)
    from engines.streaming import WindowConfig

    corpus = load_corpus_ids(args.corpus_ids)
    skip = set(filter(None, args.skip.split(",")))
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }

    def save() -> None:
        args.out.write_text(json.dumps(result, indent=1))

    stages = TorchCudaStages(args.engine_dir, precision="fp16")
    if "quality" not in skip:
        result["quality"] = fp16_quality(args.engine_dir, corpus, args.quality_sentences)
        print("quality", result["quality"], flush=True)
        save()
    if "encoder-profile" not in skip:
        result["encoder_profile"] = profile_encoder(stages, corpus)
        print(json.dumps(result["encoder_profile"], indent=1), flush=True)
        save()
    if "stages" not in skip:
        result["stages"] = bench_stages(stages, corpus)
        for row in result["stages"]["rows"]:
            print(row, flush=True)
        plan = WindowConfig()
        result["stage_limit"] = stage_limit(
            result["stages"]["rows"], plan.max_batch_windows, plan.max_encoder_batch
        )
        print("stage limit", json.dumps(result["stage_limit"]), flush=True)
        print("warmup", json.dumps(result["stages"]["warmup"]), flush=True)
        save()
    if "streams" not in skip:
        runs = result.setdefault("streams", [])
        plans = []
        for config in filter(None, args.configs.split(",")):
            windows_per_step, sentences_per_step = (int(x) for x in config.split("x"))
            windows = WindowConfig(
                max_batch_windows=windows_per_step, max_encoder_batch=sentences_per_step
            )
            for frames in args.frames.split(","):
                plans.append((f"batched-{config}-{frames}", windows, args.streams, True, frames))
        plans.append(("unbatched", WindowConfig(), args.unbatched_streams, False, "device"))
        for label, windows, counts, batching, frames in plans:
            for count in filter(None, counts.split(",")):
                row = simulate_streams(
                    stages,
                    corpus,
                    int(count),
                    args.seconds,
                    batching=batching,
                    windows=windows,
                    host_frames=frames == "host",
                )
                row["label"] = label
                runs.append(row)
                print({k: v for k, v in row.items() if k not in ("windows",)}, flush=True)
                save()
                saturated = row["streams_ran_dry"] > 0.5 * row["completed_streams"]
                if args.stop_when_saturated and batching and saturated:
                    break  # far past capacity: larger counts only take time
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
