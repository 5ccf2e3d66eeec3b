"""The onnxruntime stage runtime: the three split graphs on the CPU, on every machine."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from engines.contract.plan import WindowConfig
from engines.streaming.stages import StageRuntime

__all__ = ["OnnxStages", "load_onnx", "onnx_bytes"]


def cpu_threads() -> int:
    """Threads for each onnxruntime call where none are given (a pool pod's voice host is
    given its CPU request: `voxfleet triton --voice-host-cpu-threads`): as many as the CPUs
    this process may run on. Never onnxruntime's own default (0): that is one thread per
    physical core of the machine, each pinned to its core, which escapes a CPU set (taskset,
    a cpuset container) and oversubscribes a pod limited by CPU quota."""
    return len(os.sched_getaffinity(0))


def onnx_bytes(engine_dir: Path) -> int:
    """The size of a voice's ONNX stage files."""
    return sum(f.stat().st_size for f in Path(engine_dir).glob("*.onnx"))


class OnnxStages:
    """The three split graphs on onnxruntime's CPU provider.

    Another voice is another `OnnxStages` (`load_voice`): sessions of its own, with the same
    threads; the stream backend runs each call on the voice's own
    (`engines.streaming.frames.HostBackend`).
    """

    name = "onnxruntime"

    def __init__(self, engine_dir: Path, threads: int | None = None) -> None:
        import onnxruntime as ort

        self.engine_dir = Path(engine_dir)
        self.threads = threads or cpu_threads()
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        # Spinning workers of one stage's pool steal the cores the next stage needs: measured
        # on 2 cores, the three stages run 18-25% slower with spinning on (docs/streaming.md).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._sessions = {
            stage: ort.InferenceSession(
                str(engine_dir / f"{stage}.onnx"), options, providers=["CPUExecutionProvider"]
            )
            for stage in ("encoder", "flow", "vocoder")
        }
        self._inputs = {
            stage: {value.name for value in session.get_inputs()}
            for stage, session in self._sessions.items()
        }
        self.multi_speaker = "sid" in self._inputs["encoder"]

    @property
    def default_voice(self) -> OnnxStages:
        return self

    def load_voice(self, engine_dir: Path, name: str = "") -> OnnxStages:
        """Another voice's sessions; ValueError where its stages do not take the same inputs."""
        other = OnnxStages(engine_dir, self.threads)
        if other._inputs != self._inputs:
            raise ValueError("its stage graphs take other inputs than this architecture's")
        return other

    def unload_voice(self, voice: OnnxStages) -> None:
        return None  # its sessions go with the last reference to them

    def weights_bytes(self) -> int:
        """An estimate of a voice's footprint: its ONNX files (the host measures what later
        voices' loads allocate instead)."""
        return onnx_bytes(self.engine_dir)

    def _run(self, stage: str, feeds: dict[str, np.ndarray], speaker_ids: np.ndarray | None):
        if "sid" in self._inputs[stage]:
            batch = next(iter(feeds.values())).shape[0]
            feeds["sid"] = (
                speaker_ids.astype(np.int64)
                if speaker_ids is not None
                else np.zeros((batch,), dtype=np.int64)
            )
        return self._sessions[stage].run(None, feeds)

    def encode(self, ids, lengths, scales, speaker_ids=None):
        prior, mask = self._run(
            "encoder",
            {"input": ids, "input_lengths": lengths, "scales": scales.astype(np.float32)},
            speaker_ids,
        )
        return prior, mask

    def flow(self, prior, mask, speaker_ids=None):
        return self._run("flow", {"prior": prior, "mask": mask}, speaker_ids)[0]

    def vocode(self, latent, speaker_ids=None):
        audio = self._run("vocoder", {"latent": latent}, speaker_ids)[0]
        return audio.reshape(audio.shape[0], -1)


def load_onnx(
    engine_dir: Path, windows: WindowConfig, cpu_threads: int | None = None
) -> StageRuntime:
    """onnxruntime's loader (the registry's): shape-free, so the windows change nothing."""
    return OnnxStages(engine_dir, cpu_threads)
