"""The streaming core: per-stream state and the cross-stream window scheduler.

- `types`: a request's parameters, its sink, and the state of live streams and sentences.
- `costs`: the cost model the planner budgets steps with.
- `planner`: which sentences to encode and which windows to decode in a step (pure).
- `scheduler`: the thread that runs the planned calls on a backend and sends the audio.
- `delivery`: where a backend's calls are asynchronous (a GPU), the thread that sends each
  launched call's audio once it is on the host.
"""

from engines.contract.plan import WindowConfig
from engines.streaming.costs import CostModel
from engines.streaming.scheduler import StreamScheduler
from engines.streaming.types import (
    FirstAudioPaths,
    SchedulerStats,
    Stream,
    StreamCancelled,
    StreamSink,
    SynthesisParams,
    VoiceSlot,
)

__all__ = [
    "CostModel",
    "FirstAudioPaths",
    "SchedulerStats",
    "Stream",
    "StreamCancelled",
    "StreamScheduler",
    "StreamSink",
    "SynthesisParams",
    "VoiceSlot",
    "WindowConfig",
]
