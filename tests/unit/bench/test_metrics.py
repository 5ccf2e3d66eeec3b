"""Vocoder batch counts read from a Triton metrics page."""

from __future__ import annotations

from engines.bench.metrics import parse_batch_counts
from engines.bench.runner import batching_delta

PAGE = """\
# HELP nv_inference_count Number of inferences performed
nv_inference_count{model="joe",version="1"} 12
# TYPE voxfleet_vocoder_batches_total counter
voxfleet_vocoder_batches_total{batch_size="1",model="joe"} 7
voxfleet_vocoder_batches_total{model="joe",batch_size="4"} 3
voxfleet_vocoder_batches_total{model="amy",batch_size="2"} 5
voxfleet_live_streams{model="joe"} 2
"""


def test_batch_counts_per_model_and_size() -> None:
    assert parse_batch_counts(PAGE) == {"joe (vocoder)": {1: 7, 4: 3}, "amy (vocoder)": {2: 5}}
    assert parse_batch_counts("nv_inference_count 3\n") == {}


def test_batch_counts_of_a_voices_instances_add_up() -> None:
    page = (
        'voxfleet_vocoder_batches_total{batch_size="4",model="joe",model_instance="joe_0"} 3\n'
        'voxfleet_vocoder_batches_total{batch_size="4",model="joe",model_instance="joe_1"} 2\n'
    )
    assert parse_batch_counts(page) == {"joe (vocoder)": {4: 5}}


def test_batching_delta_counts_only_the_run() -> None:
    before = {"joe (vocoder)": {1: 7, 4: 3}, "idle": {1: 4}}
    after = {"joe (vocoder)": {1: 9, 4: 5, 8: 1}, "idle": {1: 4}}
    delta = batching_delta(before, after)
    joe = delta["joe (vocoder)"]
    assert joe["executions_by_batch_size"] == {"1": 2, "4": 2, "8": 1}
    assert joe["mean_batch_size"] == (2 + 8 + 8) / 5
    assert joe["max_batch_size"] == 8
    assert "idle" not in delta


def test_profile_summary_shares_per_function() -> None:
    from engines.bench.profile import summarise_raw

    raw = (
        "thread (1): scheduler;Thread.run (threading.py:982);StreamScheduler.step "
        "(engines/streaming.py:217);Session.run (onnxruntime/capi/session.py:395) 6\n"
        "thread (1): scheduler;Thread.run (threading.py:982);StreamScheduler.step "
        "(engines/streaming.py:217);_ResponseSink.audio (model.py:59) 2\n"
        "thread (2): MainThread;TritonPythonModel.execute (model.py:230) 2\n"
    )
    summary = summarise_raw(raw)
    assert summary["samples"] == 10
    shares = {row["function"]: row["share"] for row in summary["inclusive"]}
    assert shares["engines.streaming.StreamScheduler.step"] == 0.8
    assert shares["onnxruntime Session.run"] == 0.6
    assert shares["model.py TritonPythonModel.execute"] == 0.2
    assert "threading.Thread.run" not in shares
    assert summary["leaves"][0] == {"function": "onnxruntime Session.run", "share": 0.6}


def test_a_gil_profile_says_which_threads_hold_the_lock_and_how_much_of_the_time() -> None:
    """tests/gpu/pace_session.sh STAGE=gil: py-spy --gil --threads on the voice host; the
    threads of one name (a connection thread per stream model) count together."""
    from engines.bench.profile import thread_shares

    raw = (
        "thread (11): voxfleet-scheduler;StreamScheduler.step (streaming/scheduler.py:3) 60\n"
        "thread (12): voxfleet-host-read;_Connection.serve (voice_host/server.py:9) 15\n"
        "thread (13): voxfleet-host-read;_Connection.serve (voice_host/server.py:9) 5\n"
        "thread (14): voxfleet-delivery;AudioDelivery._run (engines/streaming/delivery.py:7) 20\n"
    )
    shares = thread_shares(raw, samples_expected=200)
    assert shares["samples"] == 100 and shares["held"] == 0.5
    assert shares["threads"] == {
        "voxfleet-scheduler": 0.6,
        "voxfleet-host-read": 0.2,
        "voxfleet-delivery": 0.2,
    }
    assert thread_shares("") == {"samples": 0, "threads": {}}


def test_a_profiled_server_is_one_record_with_what_was_sampled(tmp_path) -> None:
    """tests/gpu/triton_session.sh with PROFILE_DELAY: every view in one profile.json, and a
    view whose samples did not come (py-spy failed, say) is None rather than an error."""
    from engines.bench.profile import server_profile

    (tmp_path / "stub.txt").write_text(
        "thread (1): scheduler;StreamScheduler.step (engines/streaming/scheduler.py:3) 3\n"
        "thread (2): sender;Senders._run (engines/pod/triton_model/responses.py:9) 1\n"
    )
    (tmp_path / "stub-idle.txt").write_text(
        "thread (1): scheduler;PendingAudio.wait (engines/runtimes/device_frames.py:5) 4\n"
    )
    (tmp_path / "gpu-utilization.txt").write_text("64 %\n31 %\nN/A\n35 %\n")
    (tmp_path / "profile-processes.txt").write_text("server 1 stub 2\n")
    profile = server_profile(tmp_path)
    shares = {row["function"]: row["share"] for row in profile["stub"]["inclusive"]}
    assert shares["engines.streaming.scheduler.StreamScheduler.step"] == 0.75
    idle = profile["stub_idle"]["leaves"][0]
    assert idle == {"function": "engines.runtimes.device_frames.PendingAudio.wait", "share": 1.0}
    assert profile["stub_gil"] is None  # no file: not sampled
    assert profile["gpu_utilization_percent"] == [64, 31, 35]
    assert profile["gpu_utilization_mean_percent"] == 43.3
    assert profile["processes"] == "server 1 stub 2\n" and profile["stub_threads"] is None


def call_log_line(model: str, n: int, steps: int, first_audio: dict | None = None) -> str:
    """A call-log line of a server's `n`th interval (totals that only grow), with `steps`
    scheduler steps so far and, where given, that interval's first-audio path."""
    import json

    stages = {
        "encoder": {"calls": n, "seconds": 0.9 * n, "rows": 25 * n, "frames": 0},
        "vocoder": {"calls": 3 * n, "seconds": 0.8 * n, "rows": 120 * n, "frames": 0},
    }
    parts = dict.fromkeys(("prepare_s", "publish_s", "wait_s", "idle_s"), 0.0)
    parts.update(plan_s=0.2 * n, windows_s=0.3 * n, encode_s=1.5 * n)
    record: dict = {**stages, "scheduler": {"steps": steps, "cpu_s": 1.6 * n, **parts}}
    if first_audio is not None:
        record["first_audio_ms"] = first_audio
    return f"voxfleet-costs {model} " + json.dumps(record)


def test_a_call_log_says_what_each_step_of_the_last_level_took() -> None:
    """The per-step figures of docs/benchmarks.md's GPU runs come from the server's call log
    (VOXFLEET_COSTS_LOG_S): totals that only grow, differenced over the last level."""
    import pytest

    from engines.bench.profile import call_log_models, call_log_steps

    # Two instances of the voice, each two seconds and 40 (20) steps an interval, their lines
    # interleaved; the last line is left out (the server stopping part-way through an
    # interval).
    log = []
    for n in range(12):
        log += [call_log_line("joe_0_0", n, 40 * n), call_log_line("joe_0_1", n, 20 * n)]
    log.append("I1124 some other server output")
    log.append(call_log_line("joe_0_0", 12, 40 * 11 + 3))
    assert call_log_models("\n".join(log)) == ["joe_0_0", "joe_0_1"]
    assert call_log_steps("\n".join(log), intervals=7, model="joe_0_1")["steps_per_s"] == 10.0
    steps = call_log_steps("\n".join(log), intervals=7)  # the first to write
    assert steps["steps_per_s"] == 20.0
    assert steps["ms_per_step"] == {
        "cpu": 40.0,
        "prepare": 0.0,
        "plan": 5.0,
        "windows": 7.5,
        "encode": 37.5,
        "publish": 0.0,
        "wait": 0.0,
        "idle": 0.0,
    }
    assert steps["windows_per_step"] == 3.0 and steps["sentences_per_step"] == 0.6
    assert steps["encoder_span_share"] == 0.45 and steps["vocoder_span_share"] == 0.4
    with pytest.raises(ValueError, match="4 lines of joe_0_0, fewer than 9"):
        call_log_steps("\n".join(log[:8]), intervals=7)


def test_a_call_log_says_where_the_last_levels_first_audio_went() -> None:
    """Each call-log line carries the first-audio path of the streams whose first audio came in
    its interval; the last level's figure is the median over its intervals, and a log from
    before the path existed says None."""
    from engines.bench.profile import call_log_steps

    def line(n: int, path: dict | None) -> str:
        return call_log_line("joe", n, 10 * n, path)

    def path(n: int, admission: float) -> dict:
        return {"n": n, "frontend": [2.0, 5.0], "admission": [admission, 3 * admission]}

    # An earlier level (admission 10 ms) and the last one (30, 50, 40 ms), one interval with
    # no new stream, and the server's last line.
    log = [line(n, path(5, 10.0)) for n in range(4)]
    log += [
        line(4, path(7, 30.0)),
        line(5, {"n": 0}),
        line(6, path(3, 50.0)),
        line(7, path(2, 40.0)),
    ]
    log.append(line(8, path(9, 999.0)))
    steps = call_log_steps("\n".join(log), intervals=4)
    assert steps["first_audio_ms"] == {"n": 12, "frontend": [2.0, 5.0], "admission": [40.0, 120.0]}
    old = [line(n, None) for n in range(9)]
    assert call_log_steps("\n".join(old), intervals=4)["first_audio_ms"] is None
