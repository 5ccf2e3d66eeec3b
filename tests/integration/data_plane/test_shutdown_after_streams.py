"""A server that has streamed to many clients still stops promptly: nothing its clients did
(finishing streams, or hanging up mid-stream) may hold the model past Triton's shutdown."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from engines.bench.systems import TritonSystem
from engines.client.tts import stream_tts, synthesize
from engines.commands.local_serving import local_server, plan_local_voices

pytestmark = pytest.mark.triton


def test_the_server_stops_promptly_after_streams_end_and_hang_up(
    engine_cache: Path, tmp_path: Path
) -> None:
    plan = plan_local_voices(["joe"], engine_cache)
    server = local_server(plan, work_dir=tmp_path)
    server.start()
    try:

        async def listeners() -> None:  # the benchmark's own gRPC client, as `voxfleet bench`
            system = TritonSystem("voxfleet", server.grpc_url, "joe", streaming=True)
            # Four at once: a server that has not measured what it holds yet takes four new
            # streams every 2 s (engines/pod/voice_host/host.py, SLOW_START_STREAMS).
            await system.prepare(4)

            async def listen(n: int) -> None:
                async for _ in system.open_stream(f"Listener {n} hears a short sentence."):
                    pass

            await asyncio.gather(*(listen(n) for n in range(4)))
            await system.close()

        asyncio.run(listeners())
        assert synthesize(server.grpc_url, "And one more.").audio_seconds > 0.3
        chunks = stream_tts(server.grpc_url, "A long story that nobody hears to the end. " * 6)
        next(chunks)
        chunks.close()  # one client hangs up mid-stream
    finally:
        started = time.monotonic()
        server.stop()
        stopped_in = time.monotonic() - started
    # Triton's own exit timeout is 30 s; a model kept alive by a stream waits all of it.
    assert stopped_in < 15, f"the server took {stopped_in:.1f} s to stop"
