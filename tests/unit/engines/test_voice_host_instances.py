"""A voice run as several instances (`voxfleet serve --instances`: a stream-model process each)
is loaded once into the pod's voice host: its instances share its weights, so a further
instance costs no memory, and the weights stay until the last instance unloads."""

from __future__ import annotations

from dataclasses import replace

from known_costs import TEXT, Listener

from engines.contract.plan import ServingPlan
from engines.pod.voice_host.host import VoiceHost
from engines.streaming import SynthesisParams


def spoken(host: VoiceHost, handle: int) -> Listener:
    listener = Listener()
    host.start_stream(handle, TEXT, SynthesisParams(), listener)
    assert listener.done.wait(60), "the stream never finished"
    return listener


def test_a_voices_instances_share_its_weights_and_the_last_one_keeps_them(
    joe_plan: ServingPlan,
) -> None:
    host = VoiceHost(frontend_workers=0)
    try:
        host.load(joe_plan)  # the architecture, with its own first voice
        kate = replace(joe_plan, name="kate")
        first = host.load(kate)
        one_copy = host.memory().voices["kate"]
        assert one_copy > 0
        second = host.load(kate)
        assert host.memory().voices["kate"] == one_copy  # the second instance added nothing
        host.unload(first)
        assert host.memory().voices["kate"] == one_copy  # counted by the instance left
        listener = spoken(host, second)
        assert listener.error is None and listener.received_s > 1.0
        host.unload(second)
        assert "kate" not in host.memory().voices
        # A voice loaded again after its last instance went gets weights of its own.
        third = host.load(kate)
        assert host.memory().voices["kate"] > 0.5 * one_copy
        assert spoken(host, third).error is None
    finally:
        host.close()
