"""A CPU pod reports each voice's own footprint, whatever was loaded and unloaded before it:
the operator places voices by these numbers (GET /memory)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from engines.pod.voice_host.host import MIB, VoiceHost
from engines.runtimes.onnx import onnx_bytes


def test_a_voice_loaded_where_another_was_unloaded_reports_its_whole_footprint(
    joe_plan,
) -> None:
    """A rolling update or a heal unloads a voice and loads one in the memory it freed: that
    voice holds as much as the first one did, not the pages it did not have to add."""
    files = onnx_bytes(Path(joe_plan.engine_dir))
    host = VoiceHost()
    try:
        host.load(joe_plan)  # the architecture
        first = host.load(replace(joe_plan, name="first"))
        before = host.memory().voices["first"]
        host.unload(first)
        assert "first" not in host.memory().voices
        host.load(replace(joe_plan, name="second"))
        after = host.memory().voices["second"]
        # onnxruntime's sessions hold more than the graphs' files (docs/gpu.md)
        assert before > 0.8 * files, (before / MIB, files / MIB)
        assert abs(after - before) <= 0.1 * before, (before / MIB, after / MIB)
    finally:
        host.close()
