"""A pod that knows its voices before tritonserver starts (`voxfleet serve`) has its voice host
start their architectures at once (`VoiceHost.prepare`, `--prepare`): the warmup, most of a GPU
pod's start, runs beside tritonserver's and its backend's own start. The voice's load then
finds its architecture ready and its weights loaded."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from known_costs import TEXT, KnownCosts, Listener

from engines.contract.plan import ServingPlan
from engines.pod.voice_host import host as host_module
from engines.pod.voice_host import server as server_module
from engines.pod.voice_host.host import LoadRefused, VoiceHost
from engines.streaming import SynthesisParams


class Started:
    """load_stages, counted, each start taking `delay_s` more (a GPU's warmup, shortened)."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.starts = 0

    def __call__(self, *args, **kwargs) -> KnownCosts:
        self.starts += 1
        time.sleep(self.delay_s)
        return KnownCosts()


def test_a_prepared_architecture_serves_its_voice_without_starting_again(
    joe_plan: ServingPlan, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = Started()
    monkeypatch.setattr(host_module, "load_stages", started)
    host = VoiceHost(frontend_workers=0)
    try:
        host.prepare(joe_plan)
        assert started.starts == 1
        assert host.voice_names() == []  # no voice until it is loaded
        handle = host.load(joe_plan)
        assert started.starts == 1  # its load found the architecture ready
        assert host.voice_names() == [joe_plan.name]
        listener = Listener()
        host.start_stream(handle, TEXT, SynthesisParams(), listener)
        assert listener.done.wait(30) and listener.error is None
        assert listener.received_s > 1.0
        # A second voice of the architecture loads as it always did.
        host.load(replace(joe_plan, name="second"))
        assert host.voice_names() == [joe_plan.name, "second"]
    finally:
        host.close()


def test_a_load_that_comes_while_its_architecture_starts_waits_for_that_start(
    joe_plan: ServingPlan, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = Started(delay_s=1.0)
    monkeypatch.setattr(host_module, "load_stages", started)
    host = VoiceHost(frontend_workers=0)
    try:
        preparing = threading.Thread(target=host.prepare, args=(joe_plan,))
        preparing.start()
        time.sleep(0.2)  # the voice's load arrives during the architecture's start
        host.load(joe_plan)
        preparing.join()
        assert started.starts == 1
    finally:
        host.close()


def test_a_prepare_that_fails_leaves_the_voices_load_to_say_why(
    joe_plan: ServingPlan, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broken = replace(joe_plan, engine_dir=str(tmp_path / "no-engines"))
    host = VoiceHost(frontend_workers=0)
    try:
        host.prepare(broken)  # logged, not raised: it ran in a thread of its own
        assert f"preparing {joe_plan.name} before its load failed" in caplog.text
        with pytest.raises(LoadRefused, match="its stages cannot run"):
            host.load(broken)
    finally:
        host.close()


def test_the_voice_host_refuses_a_prepare_file_that_is_not_a_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "plan.json"
    bad.write_text('{"name": "joe"')
    code = server_module.main(["--socket", str(tmp_path / "s.sock"), "--prepare", str(bad)])
    assert code == 2
    assert f"--prepare {bad}: not a serving plan" in capsys.readouterr().err
