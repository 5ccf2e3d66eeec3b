"""Where a server's Python spends its time during a run: py-spy on the pod's voice host and
its Triton backend stubs.

The voice host runs every voice's stages and scheduler; the stubs (the Python that runs
model.py) pass requests and audio between Triton and it. Both are sampled; the summary is the
share of samples in which each function was on the stack (inclusive), for the functions of
the `engines` package and onnxruntime's `Session.run`, plus the busiest leaf frames.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from engines.bench.resources import ProcessTree, pod_of, runs_voice_host

_OURS = ("engines.", "onnxruntime", "model.py")
_FRAME = re.compile(r"^(?P<function>.+?) \((?P<file>[^()]*?):(?P<line>\d+)\)$")


_THREAD = re.compile(r"^thread \(\w+\): (?P<name>.+)$")


def thread_shares(text: str, samples_expected: float = 0.0) -> dict[str, Any]:
    """py-spy's raw output recorded with `--threads` → each thread name's share of the samples
    (threads of one name summed: a voice host has a connection thread per stream model). Of
    a recording with `--gil`, whose samples are only of the thread holding the interpreter's
    lock, that is each thread's share of the lock's held time; with `samples_expected` (the
    rate times the seconds), `held` is the share of the time anyone held it."""
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, count_text = line.strip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        match = _THREAD.match(stack.split(";", 1)[0])
        counts[match["name"] if match else "?"] += int(count_text)
    samples = sum(counts.values())
    result: dict[str, Any] = {
        "samples": samples,
        "threads": {name: round(n / samples, 4) for name, n in counts.most_common()}
        if samples
        else {},
    }
    if samples_expected > 0:
        result["held"] = round(min(1.0, samples / samples_expected), 4)
    return result


def summarise_raw(text: str, top: int = 12) -> dict[str, Any]:
    """py-spy's raw (collapsed stack) output → shares of samples per function."""
    inclusive: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    samples = 0
    for line in text.splitlines():
        stack, _, count_text = line.strip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        samples += count
        functions = []
        for frame in stack.split(";"):
            match = _FRAME.match(frame)
            if match:  # thread and process header frames have no file
                functions.append(_name(match["function"], match["file"]))
        if functions:
            leaves[functions[-1]] += count
        for function in set(functions):
            inclusive[function] += count

    def share(counter: Counter[str], keep: Any) -> list[dict[str, Any]]:
        rows = [(name, n) for name, n in counter.most_common() if keep(name)][:top]
        return [{"function": name, "share": n / samples} for name, n in rows]

    return {
        "samples": samples,
        "inclusive": share(inclusive, lambda name: name.startswith(_OURS)),
        "leaves": share(leaves, lambda name: True),
    }


# The files `tests/gpu/triton_session.sh` writes with PROFILE_DELAY, by what `server_profile`
# calls them: py-spy's raw samples of the stub (every busy thread, the thread holding the GIL,
# every thread idle or not), nvidia-smi's utilisation lines, top's process and thread views.
PROFILE_SAMPLES = {"stub": "stub.txt", "stub_gil": "stub-gil.txt", "stub_idle": "stub-idle.txt"}
PROFILE_TEXTS = {"processes": "profile-processes.txt", "stub_threads": "profile-stub-threads.txt"}
GPU_UTILIZATION = "gpu-utilization.txt"


def server_profile(directory: Path, top: int = 30) -> dict[str, Any]:
    """One record of a server profiled under load (the files above, where present): each
    py-spy view summarised (`summarise_raw`), the GPU's utilisation samples and their mean,
    and top's views as text; a file that is missing or empty is None."""

    def text(name: str) -> str | None:
        path = directory / name
        content = path.read_text(errors="replace") if path.is_file() else ""
        return content if content.strip() else None

    profile: dict[str, Any] = {}
    for key, name in PROFILE_SAMPLES.items():
        samples = text(name)
        profile[key] = summarise_raw(samples, top) if samples is not None else None
    lines = (text(GPU_UTILIZATION) or "").splitlines()
    utilisation = [int(m.group(1)) for line in lines if (m := re.match(r"\s*(\d+)\s*%", line))]
    profile["gpu_utilization_percent"] = utilisation
    profile["gpu_utilization_mean_percent"] = (
        round(sum(utilisation) / len(utilisation), 1) if utilisation else None
    )
    for key, name in PROFILE_TEXTS.items():
        profile[key] = text(name)
    return profile


CALL_LOG_MARK = "voxfleet-costs "


def call_log_records(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(model, record) of each line a server's call log (VOXFLEET_COSTS_LOG_S,
    engines/pod/triton_model/model.py) wrote among its other output, in order; a line may carry
    a prefix of the process that relayed it. Where a voice runs as several instances
    (`voxfleet serve --instances`), the model is the instance's name (``joe_0_1``)."""
    records = []
    for line in text.splitlines():
        if CALL_LOG_MARK in line:
            model, record = line.split(CALL_LOG_MARK, 1)[1].split(" ", 1)
            records.append((model, json.loads(record)))
    return records


def call_log_models(text: str) -> list[str]:
    """The models (or instances) a call log has lines of, in the order they first wrote."""
    return _models(call_log_records(text))


def _models(records: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return list(dict.fromkeys(model for model, _ in records))


def call_log_steps(text: str, intervals: int = 7, model: str | None = None) -> dict[str, Any]:
    """The scheduler thread's steps over the last `intervals` intervals of a server's call log
    (VOXFLEET_COSTS_LOG_S) before its last line: the last level of a `voxfleet bench` run, up
    to the server's stop. Per step: wall milliseconds by part and the thread's CPU; windows
    (vocoder rows, padding rows filled included) and sentences encoded; and the share of the
    wall time the encoder's and the vocoder's calls spanned on the device (their CUDA events:
    an encoder call's span also holds the device's wait for the host inside it). One model's
    or instance's lines are read (each has a scheduler of its own): `model`, else the first
    to write."""
    return _steps(call_log_records(text), intervals, model)


def _steps(
    records: list[tuple[str, dict[str, Any]]], intervals: int, model: str | None
) -> dict[str, Any]:
    if not records:
        raise ValueError("the text has no call-log line")
    model = model or records[0][0]
    lines = [record for name, record in records if name == model]
    if len(lines) < intervals + 2:
        raise ValueError(
            f"the call log has {len(lines)} lines of {model}, fewer than {intervals + 2}"
        )
    first, last = lines[-intervals - 2], lines[-2]
    before, after = first["scheduler"], last["scheduler"]
    steps = after["steps"] - before["steps"]
    if steps < 1:
        raise ValueError("the scheduler ran no step in those intervals")
    wall = sum(after[k] - before[k] for k in after if k.endswith("_s") and k != "cpu_s")

    def change(stage: str, total: str) -> float:
        return float(last[stage][total] - first[stage][total])

    return {
        "steps_per_s": round(steps / wall, 1),
        "ms_per_step": {
            key.removesuffix("_s"): round((after[key] - before[key]) / steps * 1e3, 1)
            for key in after
            if key.endswith("_s")
        },
        "windows_per_step": round(change("vocoder", "rows") / steps, 1),
        "sentences_per_step": round(change("encoder", "rows") / steps, 1),
        "encoder_span_share": round(change("encoder", "seconds") / wall, 2),
        "vocoder_span_share": round(change("vocoder", "seconds") / wall, 2),
        "first_audio_ms": _first_audio(lines[-intervals - 1 : -1]),
    }


def _first_audio(lines: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first-audio path of those intervals (engines.streaming.types.FirstAudioPaths): the
    streams counted, and per part the median over the intervals of their p50 and of their
    p95 (ms); None where the log has no path (a server before it, or no new stream)."""
    summaries = [
        line["first_audio_ms"] for line in lines if line.get("first_audio_ms", {}).get("n")
    ]
    if not summaries:
        return None
    parts = [key for key in summaries[0] if key != "n"]
    return {
        "n": sum(summary["n"] for summary in summaries),
        **{
            part: [round(float(np.median([s[part][i] for s in summaries])), 1) for i in (0, 1)]
            for part in parts
        },
    }


def _name(function: str, file: str) -> str:
    path = file.replace("\\", "/")
    if "onnxruntime/" in path:
        return f"onnxruntime {function}"
    marker = path.rfind("engines/")
    if marker >= 0:
        module = path[marker:].removesuffix(".py").replace("/", ".")
        return f"{module}.{function}"
    if path == "model.py" or path.endswith("/model.py"):  # the Triton model's own file
        return f"model.py {function}"
    return f"{Path(path).stem}.{function}"


def _py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def profiled_processes(tree: ProcessTree) -> dict[int, str]:
    """The Python processes of the pod around `tree` to sample, by pid: its voice host and
    its backend stubs (a server started without a voice host has only stubs)."""
    found: dict[int, str] = {}
    for process in pod_of(tree).processes():
        try:
            if runs_voice_host(process):
                found[process.pid] = "voice host"
            elif "triton_python_backend_stub" in " ".join(process.cmdline()):
                found[process.pid] = "backend stub"
        except psutil.Error:
            continue
    return found


@dataclass
class Profiler:
    """py-spy record on a server's voice host and backend stubs (`profiled_processes`), for
    `duration_s` seconds."""

    tree: ProcessTree
    duration_s: float
    work_dir: Path
    _running: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)
    sampled: list[str] = field(default_factory=list)
    error: str | None = None

    def start(self) -> None:
        executable = _py_spy()
        if executable is None:
            self.error = "py-spy is not installed (pip install py-spy)"
            return
        processes = profiled_processes(self.tree)
        if not processes:
            self.error = "no voice host or Python backend stub in the server's pod"
            return
        self.sampled = sorted(set(processes.values()), reverse=True)  # the voice host first
        self.work_dir.mkdir(parents=True, exist_ok=True)
        for pid in processes:
            out = self.work_dir / f"py-spy-{pid}.txt"
            command = [
                executable,
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(max(1, int(self.duration_s))),
                "--rate",
                "50",
                "--format",
                "raw",
                "--nonblocking",
                "--output",
                str(out),
            ]
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            self._running.append((process, out))

    def stop(self) -> dict[str, Any]:
        if self.error:
            return {"error": self.error}
        texts = []
        errors = []
        for process, out in self._running:
            try:
                _, stderr = process.communicate(timeout=self.duration_s + 30)
            except subprocess.TimeoutExpired:
                process.kill()
                _, stderr = process.communicate()
            if out.exists():
                texts.append(out.read_text(errors="replace"))
            else:
                errors.append(stderr.decode(errors="replace").strip()[-300:])
        if not texts:
            return {"error": "; ".join(errors) or "py-spy wrote nothing"}
        summary = summarise_raw("\n".join(texts))
        summary["duration_s"] = self.duration_s
        summary["sampled"] = self.sampled
        return summary


if __name__ == "__main__":  # python -m engines.bench.profile CALL_LOG...
    for name in sys.argv[1:]:
        records = call_log_records(Path(name).read_text())
        for model in _models(records):  # a line per model or instance
            try:
                figures = _steps(records, 7, model)
            except ValueError as error:  # e.g. a model that wrote too few lines
                figures = {"error": str(error)}
            print(name, model, json.dumps(figures))
