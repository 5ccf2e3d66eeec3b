"""Whether a stage's small calls run side by side on several CUDA streams:
`python -m lab.stream_overlap --engine-dir ENTRY --out stream-overlap.json` (a CUDA GPU).

A packed pod's voices each make calls of their own (docs/gpu.md): at Zipf(1.1) over 100
voices a step makes about one encoder call of 5 sentences and five vocoder calls of 3 to 4
windows, each with a fixed part that leaves most of the GPU idle. Whether calls of several
voices would overlap on streams of their own is a property of the device and the stage, and
this measures it without a pod: for each stage (the encoder at FP32, the vocoder at the
entry's precision), each call size, and each count of streams (1, 2, 4, 8), `--calls` calls
of that size, each replayed from a CUDA graph of its own (its own inputs, outputs and memory
pool, as a stream's graphs would be), launched in turn over the streams; the median wall
time of the whole batch over `--repeats` batches. All calls read one voice's weights: a
voice's calls on a stream of their own would read their own lane, the same bytes.

Printed and written: per stage and size, one call's time, the batch's on each count of
streams, and the batch on one stream over the batch on k (the speedup side by side gives);
then a whole encoder call as the scheduler launches it (`encode_launch`), its device time
between its events and the host's time to launch it, beside its graph's replay alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

STREAMS = (1, 2, 4, 8)


def _capture(torch: Any, function: Any, feeds: dict[str, Any]) -> Any:
    """A graph of `function` over copies of `feeds`, in a memory pool of its own."""
    static = {name: tensor.clone() for name, tensor in feeds.items()}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            function(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        function(static)
    return graph


def _batch_seconds(torch: Any, graphs: list, streams: list, calls: int, repeats: int) -> float:
    main = torch.cuda.current_stream()

    def batch() -> None:
        for stream in streams:
            stream.wait_stream(main)
        for i in range(calls):
            with torch.cuda.stream(streams[i % len(streams)]):
                graphs[i % len(graphs)].replay()
        for stream in streams:
            main.wait_stream(stream)

    for _ in range(3):
        batch()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        batch()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(engine_dir: Path, calls: int, repeats: int) -> dict[str, Any]:
    import torch

    from engines.contract.plan import WindowConfig
    from engines.runtimes.torch_cuda import load

    runtime: Any = load(engine_dir, WindowConfig())
    sizes = {
        "encoder": [(rows, 128) for rows in (1, 4, 8)],
        "vocoder": [(rows, 144) for rows in (2, 4, 16)],
    }
    stages = {"encoder": runtime.encoder_stage, "vocoder": runtime.vocoder_stage}
    report: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "calls": calls,
        "repeats": repeats,
        "stages": {},
    }
    for name, stage in stages.items():
        rows_report = []
        for rows, width in sizes[name]:
            feeds = runtime._lane_feeds(stage, rows, width)  # (a warmup call's inputs)
            with torch.no_grad():
                graphs = [_capture(torch, stage.function, feeds) for _ in range(max(STREAMS))]
            one = _batch_seconds(torch, graphs[:1], [torch.cuda.Stream()], 1, repeats)
            batches = {}
            for count in STREAMS:
                streams = [torch.cuda.Stream() for _ in range(count)]
                batches[count] = _batch_seconds(torch, graphs[:count], streams, calls, repeats)
            entry = {
                "rows": rows,
                "width": width,
                "one_call_ms": round(one * 1e3, 3),
                "batch_ms": {str(k): round(v * 1e3, 3) for k, v in batches.items()},
                "speedup": {str(k): round(batches[1] / v, 2) for k, v in batches.items()},
            }
            print(name, json.dumps(entry), flush=True)
            rows_report.append(entry)
            del graphs
            torch.cuda.empty_cache()
        report["stages"][name] = rows_report
    report["encoder_launch"] = [_launch_costs(torch, runtime, rows, repeats) for rows in (1, 4, 8)]
    return report


def _launch_costs(torch: Any, runtime: Any, rows: int, repeats: int) -> dict[str, Any]:
    """A whole encoder call as the scheduler launches it (`encode_launch`: the ids' upload,
    the noise, the graph, the durations, their copy to the host) on an idle stream, against
    its graph's replay alone above: its events' device time and the host's time to launch."""
    import numpy as np

    ids = torch.from_numpy(np.random.default_rng(rows).integers(1, 100, (rows, 128)))
    lengths = torch.full((rows,), 128, dtype=torch.int64)
    scales = torch.tensor([0.667, 1.0, 0.8])
    device, host = [], []
    for attempt in range(repeats + 3):
        torch.cuda.synchronize()
        started = time.perf_counter()
        call = runtime.encode_launch(ids, lengths, scales)
        launched = time.perf_counter() - started
        seconds = call.seconds()
        if attempt >= 3:  # (the first calls capture the graph)
            device.append(seconds)
            host.append(launched)
    entry = {
        "rows": rows,
        "width": 128,
        "device_ms": round(statistics.median(device) * 1e3, 3),
        "host_launch_ms": round(statistics.median(host) * 1e3, 3),
    }
    print("encoder-launch", json.dumps(entry), flush=True)
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine-dir", type=Path, required=True)
    parser.add_argument("--calls", type=int, default=8, help="calls a batch (8)")
    parser.add_argument("--repeats", type=int, default=30, help="batches timed (30)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.calls < 1 or args.repeats < 1:
        parser.error("--calls and --repeats are whole numbers from 1")
    report = measure(args.engine_dir, args.calls, args.repeats)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
