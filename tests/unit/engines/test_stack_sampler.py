"""The voice host's in-process sampler (VOXFLEET_STACKS_FILE): where a named thread spends its
time, in the raw format the bench's profile summary reads."""

from __future__ import annotations

import threading
import time

from engines.bench.profile import summarise_raw
from engines.streaming.threads import NamedThread, StackSampler


def _busy_part(until: float) -> None:
    while time.monotonic() < until:
        sum(range(200))


def _waiting_part(seconds: float) -> None:
    time.sleep(seconds)


def _worker(stop: threading.Event, spent: dict[str, float], inside: threading.Event) -> None:
    """Three parts busy to one waiting, each part's wall time added up in `spent` (a loaded
    machine stretches the waits); `inside` is set once the thread runs this loop. The parts
    are long against the interpreter's switch interval (5 ms): a sample taken as the thread
    leaves its busy part for the wait weighs busy time it cannot see, up to a switch interval
    a turn, and with parts of 30 and 10 ms a loaded machine put that bias past the bound
    below (0.11 once in a full `make test`)."""
    inside.set()
    while not stop.is_set():
        started = time.monotonic()
        _busy_part(started + 0.06)
        middle = time.monotonic()
        _waiting_part(0.02)
        spent["busy"] += middle - started
        spent["waiting"] += time.monotonic() - middle


def test_the_sampler_finds_where_the_named_thread_spends_its_time() -> None:
    stop = threading.Event()
    spent = {"busy": 0.0, "waiting": 0.0}
    inside = threading.Event()
    worker = NamedThread(
        target=_worker, args=(stop, spent, inside), name="voxfleet-scheduler", daemon=True
    )
    other = NamedThread(target=_waiting_part, args=(2.0,), name="voxfleet-delivery", daemon=True)
    worker.start()
    other.start()
    # Sampled from inside its loop on: a sample of the thread still starting is not the
    # loop's (it failed "every sample of it is inside its loop" now and then).
    assert inside.wait(10)
    sampler = StackSampler("voxfleet-scheduler", interval_s=0.002).start()
    time.sleep(1.2)
    sampler.stop()
    stop.set()
    worker.join()
    text = sampler.collapsed()
    assert 0.9 < sampler.sampled_s() < 1.5
    summary = summarise_raw(text, top=50)
    shares = {row["function"]: row["share"] for row in summary["inclusive"]}
    # Only the named thread is sampled, and every sample of it is inside its loop.
    assert not any("delivery" in line for line in text.splitlines())
    worker_share = next(s for f, s in shares.items() if f.endswith("test_stack_sampler._worker"))
    assert worker_share == 1.0
    busy = next(s for f, s in shares.items() if f.endswith("._busy_part"))
    waiting = next((s for f, s in shares.items() if f.endswith("._waiting_part")), 0.0)
    # Each sample weighs the time since the last, so a part that keeps the interpreter lock
    # is not under-counted: the shares are the parts' own shares of the wall time.
    truth = spent["busy"] / (spent["busy"] + spent["waiting"])
    assert waiting > 0.0 and abs(busy - truth) < 0.1, (shares, spent)


def test_a_voice_host_writes_its_schedulers_stacks_where_it_is_told(
    monkeypatch, tmp_path, joe_plan
) -> None:
    from known_costs import TEXT, KnownCosts, Listener

    from engines.pod.voice_host import host as host_module
    from engines.streaming import SynthesisParams

    stacks = tmp_path / "stacks.txt"
    monkeypatch.setenv(host_module.STACKS_FILE_ENV, str(stacks))
    monkeypatch.setattr(host_module, "STACKS_WRITE_S", 0.2)
    monkeypatch.setattr(host_module, "load_stages", lambda *args, **kwargs: KnownCosts())
    host = host_module.VoiceHost(frontend_workers=0)
    try:
        handle = host.load(joe_plan)
        listener = Listener()
        host.start_stream(handle, TEXT, SynthesisParams(), listener)
        assert listener.done.wait(60) and listener.error is None
        time.sleep(0.5)
    finally:
        host.close()
    summary = summarise_raw(stacks.read_text(), top=100)
    functions = {row["function"] for row in summary["inclusive"]}
    assert "engines.streaming.scheduler._loop" in functions
    assert "engines.streaming.scheduler.step" in functions  # it ran the stream's steps
